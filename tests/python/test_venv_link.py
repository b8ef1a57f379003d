"""scripts/venv_link.py (run by `make build`): a venv sees this checkout's
loaderx without PYTHONPATH, and has `loaderx` and `loaderxd` on its PATH."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "venv_link.py"


def _build_dir() -> Path:
    daemon = os.environ.get("LOADERXD")
    return Path(daemon).parent.parent if daemon else ROOT / "build"


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}


def _run(*cmd: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(c) for c in cmd], check=False, capture_output=True, text=True, env=_clean_env(),
                          timeout=120)


def test_a_venv_imports_and_runs_the_checkout(tmp_path: Path) -> None:
    import loaderx

    build = _build_dir()
    if not (build / "daemon" / "loaderxd").is_file():
        pytest.skip(f"loaderxd is not built in {build}")
    venv = tmp_path / "v"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    # Before: the fresh venv does not know the checkout (the failure `make demo` left).
    r = _run(py, "-m", "loaderx", "--version")
    assert r.returncode == 1 and "No module named loaderx" in r.stderr
    for _ in range(2):  # a re-run changes nothing and still works
        r = _run(py, SCRIPT, build)
        assert r.returncode == 0, r.stderr
    want = f"loaderx-engine {loaderx.__version__}\n"
    assert _run(py, "-m", "loaderx", "--version").stdout == want
    assert _run(venv / "bin" / "loaderx", "--version").stdout == want
    assert _run(venv / "bin" / "loaderxd", "--version").stdout == f"loaderxd {loaderx.__version__}\n"
    r = _run(py, "-c", "import loaderx; print(loaderx.__file__)")
    assert r.stdout == f"{ROOT / 'python' / 'loaderx' / '__init__.py'}\n"
    site = (venv / "lib").glob("python3*/site-packages/loaderx-checkout.pth")
    assert [p.read_text() for p in site] == [f"{ROOT / 'python'}\n"]


def test_refuses_an_interpreter_that_is_not_a_venv() -> None:
    base = Path(sys.base_prefix) / "bin" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
    if not base.is_file():
        pytest.skip(f"no base interpreter at {base}")
    r = _run(base, SCRIPT)
    assert r.returncode == 1 and "is not a venv's interpreter; nothing written" in r.stderr
