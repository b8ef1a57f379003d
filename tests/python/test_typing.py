"""Typing and lint gates: stubtest, mypy and ruff over the Python package.

Each tool runs as a subprocess of this interpreter (the project venv's) from
the repository root, exactly as ``make lint`` runs it (keep the two in step);
a failure shows the tool's own report. Tool configuration lives in
pyproject.toml ([tool.mypy], [tool.ruff]); the stubtest allowlist holds only
pybind11 artefacts a stub cannot express, each with its reason.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import loaderx
from loaderx import _loaderx

REPO = Path(__file__).resolve().parents[2]
PKG_ROOT = Path(loaderx.__file__).resolve().parent.parent  # the directory holding loaderx/
ALLOWLIST = Path(__file__).resolve().parent / "stubtest_allowlist.txt"

# What each gate covers (the same paths as `make lint`).
MYPY_PATHS = ["python/loaderx"]
RUFF_PATHS = ["python/loaderx", "tests/python", "tests/compat", "bench"]

# Names bind_client.cc defines only when the daemon client is compiled in.
_CLIENT_ONLY = ["loaderx._loaderx.DaemonLoader", "loaderx._loaderx.daemon_stats"]


def _run(args: list[str]) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PKG_ROOT), env.get("PYTHONPATH")) if p)
    return subprocess.run(
        [sys.executable, "-m", *args],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False,
    )


def _report(proc: subprocess.CompletedProcess[str]) -> str:
    return f"$ {' '.join(map(str, proc.args))}\n{proc.stdout}{proc.stderr}"


def test_stub_matches_native_module(tmp_path: Path) -> None:
    allowlists = ["--allowlist", str(ALLOWLIST)]
    if not _loaderx.HAVE_DAEMON_CLIENT:  # built without the client: the stub still declares it
        extra = tmp_path / "no_client_allowlist.txt"
        extra.write_text("\n".join(_CLIENT_ONLY) + "\n")
        allowlists += ["--allowlist", str(extra)]
    proc = _run(["mypy.stubtest", "loaderx._loaderx", "--mypy-config-file", "pyproject.toml",
                 *allowlists])
    assert proc.returncode == 0, _report(proc)


def test_package_is_mypy_clean(tmp_path: Path) -> None:
    # A private cache: mypy's incremental cache can miss a newly added stub.
    proc = _run(["mypy", "--cache-dir", str(tmp_path / "mypy_cache"), *MYPY_PATHS])
    assert proc.returncode == 0, _report(proc)


def test_python_sources_are_ruff_clean() -> None:
    proc = _run(["ruff", "check", "--no-cache", *RUFF_PATHS])
    assert proc.returncode == 0, _report(proc)
