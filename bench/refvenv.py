"""Peers that cannot share the project venv, each in its own venv under bench/.

The reference ``loaderx`` wheel (the version whose README is our API spec) has
the same import name as ours, so it cannot share an interpreter with this
repository's ``python/loaderx``: it lives in ``bench/.venv-ref``
(``pip install loaderx==2.5.4 numpy``, falling back to the newest ``loaderx``
that installs).

``mosaicml-streaming`` cannot either: every release that accepts the project's
NumPy (0.10.0 is the newest) imports ``transformers<5`` at import time, which
needs ``huggingface-hub<1``, while the project's ``datasets`` (the converter's
dependency) needs ``huggingface-hub>=1.31``. It lives in ``bench/.venv-mds``
with the project venv's exact torch and NumPy versions pinned (the torch wheel
comes from the machine's local CPU wheel; nothing else is upgraded).

Each venv is a :class:`SideVenv`, created on demand under a file lock and
queried in fresh subprocesses. Reuse from any benchmark::

    from refvenv import MDS, ensure, run, version
    info = ensure()                  # reference: {"python": ..., "version": "2.5.4"}
    out = run("import json, loaderx; print(json.dumps(loaderx.__name__))")
    mds = MDS.ensure()               # {"python": ..., "version": "0.10.0"}

``run_python(python, snippet, pythonpath=...)`` runs the same kind of snippet in
another interpreter (e.g. this venv with ``PYTHONPATH=python``), so both sides
of a comparison execute identical code. ``python bench/refvenv.py [ref|mds]``
creates the venv(s) and prints the installed version.
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


class RefVenvError(RuntimeError):
    """A side venv could not be created or a snippet failed in it."""


def _project_version(dist: str) -> str | None:
    """``dist``'s version in the running (project) interpreter, without a local label."""
    import importlib.metadata as md
    try:
        return md.version(dist).split("+", 1)[0]
    except md.PackageNotFoundError:
        return None


class SideVenv:
    """One peer's own venv, ``bench/<dirname>``, holding distribution ``dist``.

    ``pins``: what to install (pip requirement strings); ``fallback``: what to
    try when ``pins`` cannot be installed (None: fail). ``same_as_project``:
    distributions pinned to the exact version the project venv has (so the
    peer runs on the same torch/NumPy as the peers in the project venv).
    """

    def __init__(self, dirname: str, dist: str, pins: list[str], fallback: list[str] | None = None,
                 same_as_project: tuple[str, ...] = ()) -> None:
        self.venv = BENCH_DIR / dirname
        self.python = self.venv / "bin" / "python"
        self.dist = dist
        self.pins = pins
        self.fallback = fallback
        self.same_as_project = same_as_project
        self._lock = Path(tempfile.gettempdir()) / f"loaderx-bench-{dirname.lstrip('.')}.lock"

    def installed_version(self) -> str | None:
        if not self.python.exists():
            return None
        proc = subprocess.run(
            [str(self.python), "-c", f"import importlib.metadata as m; print(m.version({self.dist!r}))"],
            capture_output=True,
            text=True,
            check=False,
            env=_clean_env(None),
            cwd=tempfile.gettempdir(),
        )
        return proc.stdout.strip() if proc.returncode == 0 else None

    def requirements(self) -> list[str]:
        """``pins`` plus ``dist==<project version>`` for every ``same_as_project`` dist."""
        extra = []
        for dist in self.same_as_project:
            v = _project_version(dist)
            if v is None:
                raise RefVenvError(f"{dist} is not installed in the project venv; nothing to pin "
                                   f"{self.venv.name} to (run bench/setup.sh)")
            extra.append(f"{dist}=={v}")
        return self.pins + extra

    def ensure(self, quiet: bool = True) -> dict[str, str]:
        """Creates the venv if needed; returns ``{"python", "version"}``.

        Safe to call from several benchmarks at once (a file lock serialises the
        creation). Raises :class:`RefVenvError` when ``dist`` does not install.
        """
        with open(self._lock, "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            version = self.installed_version()
            if version is None:
                if not self.python.exists():
                    subprocess.run([sys.executable, "-m", "venv", str(self.venv)], check=True)
                pip = [str(self.python), "-m", "pip", "install", "--disable-pip-version-check"]
                if quiet:
                    pip.append("-q")
                # When the pinned version is unavailable, take the fallback;
                # installed_version() records which one it was.
                if (subprocess.run(pip + self.requirements(), check=False).returncode != 0
                        and (self.fallback is None
                             or subprocess.run(pip + self.fallback, check=False).returncode != 0)):
                    raise RefVenvError(f"pip could not install {self.dist} into bench/{self.venv.name}")
                version = self.installed_version()
                if version is None:
                    raise RefVenvError(f"{self.dist} installed into bench/{self.venv.name} but is not found")
        return {"python": str(self.python), "version": version}


REF = SideVenv(".venv-ref", "loaderx", ["loaderx==2.5.4", "numpy"], fallback=["loaderx", "numpy"])
MDS = SideVenv(".venv-mds", "mosaicml-streaming", ["mosaicml-streaming==0.10.0"],
               same_as_project=("torch", "numpy"))
# The reference venv under its historical names.
VENV, PYTHON, PIN = REF.venv, REF.python, REF.pins[0]


def ensure(quiet: bool = True) -> dict[str, str]:
    """The reference venv (created on demand): ``{"python", "version"}``."""
    return REF.ensure(quiet)


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
    for which in sys.argv[1:] or ["ref"]:
        venv = {"ref": REF, "mds": MDS}[which]
        info = venv.ensure(quiet=False)
        print(f"{venv.dist} {info['version']} at {info['python']}")
