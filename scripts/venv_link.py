#!/usr/bin/env python3
"""Makes this checkout's loaderx usable from the venv that runs this script
(`make build` runs it with .venv/bin/python): ``import loaderx`` and
``python -m loaderx`` without PYTHONPATH, and ``loaderx`` and ``loaderxd`` on
the venv's PATH, as ``pip install .`` would give, without a second build.

Writes ``loaderx-checkout.pth`` (the checkout's python/ folder) into the
venv's site-packages, a ``loaderx`` script into its bin/ and a ``loaderxd``
symlink to build/daemon/loaderxd there. Each is rewritten only when it
differs, so a re-run costs nothing. Refuses an interpreter that is not a venv.

Usage: python scripts/venv_link.py [BUILD_DIR]   (default: build)
"""

from __future__ import annotations

import os
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SHIM = """#!{python}
# loaderx from the checkout {root} (scripts/venv_link.py; `make build` writes it).
import sys

from loaderx.cli import main

if __name__ == "__main__":
    sys.exit(main())
"""


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    if path.is_file() and not path.is_symlink() and path.read_text(encoding="utf-8") == text:
        return
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.chmod(mode)
    os.replace(tmp, path)


def link(build_dir: Path) -> list[Path]:
    if sys.prefix == sys.base_prefix:
        raise SystemExit(f"venv_link: {sys.executable} is not a venv's interpreter; nothing written")
    site = Path(sysconfig.get_path("purelib"))
    bindir = Path(sysconfig.get_path("scripts"))
    pth = site / "loaderx-checkout.pth"
    _write(pth, f"{ROOT / 'python'}\n")
    shim = bindir / "loaderx"
    _write(shim, SHIM.format(python=sys.executable, root=ROOT), 0o755)
    written = [pth, shim]
    daemon = (build_dir if build_dir.is_absolute() else ROOT / build_dir) / "daemon" / "loaderxd"
    if daemon.is_file():
        target = bindir / "loaderxd"
        if not (target.is_symlink() and Path(os.readlink(target)) == daemon):
            tmp = target.with_name(".loaderxd.tmp")
            tmp.unlink(missing_ok=True)
            tmp.symlink_to(daemon)
            os.replace(tmp, target)
        written.append(target)
    return written


if __name__ == "__main__":
    link(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("build"))
