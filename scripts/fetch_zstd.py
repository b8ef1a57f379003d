#!/usr/bin/env python3
"""Fetches the single-file zstd 1.5.7 into DEST (zstd.c, zstd.h, zdict.h,
zstd_errors.h and the licences).

The files come from the PyPI sdist of ``zstandard`` 0.25.0, which carries
them (its ``zstd/`` folder), downloaded with pip (so pip's own index, proxy
and certificate settings apply), checked against its sha256 and against the
version in ``zstd.h``. Used by scripts/setup.sh (into .deps/) and by the
CMake configure when no vendored copy is present (a ``pip install`` of a
plain clone: into the build tree). Standard library and pip only.

Usage: fetch_zstd.py DEST
Exit status 0 when DEST holds the files (already, or now); 1 with a message
on stderr naming what failed.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

PACKAGE = "zstandard"
VERSION = "0.25.0"
SHA256 = "7713e1179d162cf5c7906da876ec2ccb9c3a9dcbdffef0cc7f70c3667a205f0b"
ZSTD_VERSION = (1, 5, 7)
FILES = ("zstd.c", "zstd.h", "zdict.h", "zstd_errors.h", "LICENSE", "COPYING")


def _zstd_version(header: str) -> tuple[int, ...]:
    """(major, minor, release) from the ``#define ZSTD_VERSION_*`` lines of zstd.h."""
    found = {}
    for line in header.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "#define" and parts[1].startswith("ZSTD_VERSION_"):
            found[parts[1]] = parts[2]
    try:
        return tuple(int(found[f"ZSTD_VERSION_{k}"]) for k in ("MAJOR", "MINOR", "RELEASE"))
    except (KeyError, ValueError):
        return ()


def fetch(dest: Path) -> None:
    if (dest / "zstd.c").is_file():
        return
    with tempfile.TemporaryDirectory(prefix="loaderx-zstd-") as tmp:
        dl = Path(tmp)
        # The sdist, not a wheel: the wheels carry only the compiled module.
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
               "-d", str(dl), f"{PACKAGE}=={VERSION}"]
        r = subprocess.run(cmd, check=False, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"`{' '.join(cmd)}` failed:\n{r.stdout.strip()}")
        archive = dl / f"{PACKAGE}-{VERSION}.tar.gz"
        digest = hashlib.sha256(archive.read_bytes()).hexdigest()
        if digest != SHA256:
            raise RuntimeError(f"{archive.name}: sha256 {digest}, expected {SHA256}")
        out = Path(f"{dest}.tmp")
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        with tarfile.open(archive) as tar:
            for name in FILES:
                member = tar.extractfile(f"{PACKAGE}-{VERSION}/zstd/{name}")
                if member is None:
                    raise RuntimeError(f"{archive.name} has no zstd/{name}")
                (out / name).write_bytes(member.read())
        got = _zstd_version((out / "zstd.h").read_text(encoding="utf-8"))
        if got != ZSTD_VERSION:
            raise RuntimeError(f"{archive.name}: zstd.h is version {got}, expected {ZSTD_VERSION}")
        shutil.rmtree(dest, ignore_errors=True)
        os.replace(out, dest)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    dest = Path(argv[1])
    try:
        fetch(dest)
    except (OSError, RuntimeError, tarfile.TarError) as e:
        print(f"fetch_zstd: zstd {'.'.join(map(str, ZSTD_VERSION))} not fetched: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
