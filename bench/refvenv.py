"""The reference ``loaderx`` wheel in its own venv, for side-by-side benchmarks.

The reference package (PyPI ``loaderx``, the version whose README is our API
spec) has the same import name as ours, so it cannot share an interpreter with
this repository's ``python/loaderx``. This module creates ``bench/.venv-ref`` on
demand (``python -m venv`` + ``pip install loaderx==2.5.4 numpy``, falling back
to the newest ``loaderx`` that installs) and runs Python snippets there, each in
a fresh subprocess whose last stdout line is JSON.

Reuse from any benchmark::

    from refvenv import ensure, run, version
    info = ensure()                  # {"python": ..., "version": "2.5.4"}
    out = run("import json, loaderx; print(json.dumps(loaderx.__name__))")

``run_python(python, snippet, pythonpath=...)`` runs the same kind of snippet in
another interpreter (e.g. this venv with ``PYTHONPATH=python``), so both sides
of a comparison execute identical code. ``python bench/refvenv.py`` creates the
venv and prints the installed version.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
VENV = BENCH_DIR / ".venv-ref"
PYTHON = VENV / "bin" / "python"
PIN = "loaderx==2.5.4"
_LOCK = Path(tempfile.gettempdir()) / "loaderx-bench-venv-ref.lock"


class RefVenvError(RuntimeError):
    """The reference venv could not be created or a snippet failed in it."""


def _installed_version() -> str | None:
    if not PYTHON.exists():
        return None
    proc = subprocess.run(
        [str(PYTHON), "-c", "import importlib.metadata as m; print(m.version('loaderx'))"],
        capture_output=True,
        text=True,
        check=False,
        env=_clean_env(None),
        cwd=tempfile.gettempdir(),
    )
    return proc.stdout.strip() if proc.returncode == 0 else None


def ensure(quiet: bool = True) -> dict[str, str]:
    """Creates bench/.venv-ref if needed; returns ``{"python", "version"}``.

    Safe to call from several benchmarks at once (a file lock serialises the
    creation). Raises :class:`RefVenvError` when no ``loaderx`` installs.
    """
    with open(_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        version = _installed_version()
        if version is None:
            if not PYTHON.exists():
                subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
            pip = [str(PYTHON), "-m", "pip", "install", "--disable-pip-version-check"]
            if quiet:
                pip.append("-q")
            # When the pinned version is unavailable, take the newest that
            # installs; version() records which one it was.
            if (subprocess.run(pip + [PIN, "numpy"], check=False).returncode != 0
                    and subprocess.run(pip + ["loaderx", "numpy"], check=False).returncode != 0):
                raise RefVenvError("pip could not install loaderx into bench/.venv-ref")
            version = _installed_version()
            if version is None:
                raise RefVenvError("loaderx installed into bench/.venv-ref but cannot be imported")
    return {"python": str(PYTHON), "version": version}


def version() -> str:
    """The installed reference version (creating the venv if needed)."""
    return ensure()["version"]


def _clean_env(pythonpath: str | None) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    env.pop("VIRTUAL_ENV", None)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    return env


def run_python(python: str, snippet: str, *, pythonpath: str | None = None,
               timeout: float = 600.0) -> Any:
    """Runs ``snippet`` with ``python`` and returns its last stdout line parsed as JSON.

    ``PYTHONPATH`` is exactly ``pythonpath`` (unset when None) and the working
    directory is a temporary one, so no ``loaderx`` is imported by accident.
    """
    with tempfile.TemporaryDirectory(prefix="loaderx-bench-") as cwd:
        try:
            proc = subprocess.run(
                [python, "-c", snippet],
                capture_output=True,
                text=True,
                check=False,
                env=_clean_env(pythonpath),
                cwd=cwd,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired as e:
            raise RefVenvError(f"{python}: snippet timed out after {timeout:.0f} s") from e
    if proc.returncode != 0:
        raise RefVenvError(f"{python}: snippet failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    lines = proc.stdout.strip().splitlines()
    if not lines:
        raise RefVenvError(f"{python}: snippet printed nothing")
    return json.loads(lines[-1])


def run(snippet: str, timeout: float = 600.0) -> Any:
    """Runs ``snippet`` in the reference venv (created on demand); returns its JSON output."""
    return run_python(ensure()["python"], snippet, timeout=timeout)


if __name__ == "__main__":
    info = ensure(quiet=False)
    print(f"reference loaderx {info['version']} at {info['python']}")
