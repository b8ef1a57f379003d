#!/usr/bin/env bash
# Idempotent set-up: Debian packages (only the missing ones) and the project
# venv (.venv) with the Python build and test dependencies. Safe to re-run;
# a second run with nothing to do takes about a second.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(
  g++ make pkg-config ninja-build
  libboost-dev libzstd-dev libmsgpack-cxx-dev libgtest-dev libxxhash-dev
  dataset-fashion-mnist
  clang libclang-rt-14-dev clang-tidy clang-format
)

scripts/apt-install.sh setup "${APT_PACKAGES[@]}"

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  "$PY" -m venv .venv
fi
stamp=.venv/.requirements.stamp
if [ ! -f "$stamp" ] || ! cmp -s requirements-dev.txt "$stamp"; then
  echo "setup: installing Python packages into .venv"
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -r requirements-dev.txt
  cp requirements-dev.txt "$stamp"
fi

# zstd 1.5.7 (CMakeLists.txt, LOADERX_VENDORED_ZSTD): Debian 12 has 1.5.4,
# whose compressor is ~20 % slower on photo-sized records. The single-file
# library comes from the PyPI sdist of `zstandard` (the registry this machine
# has), checked against its sha256, and is unpacked into .deps/ (git-ignored).
ZSTD_DIR=.deps/zstd-1.5.7
ZSTD_PKG=zstandard-0.25.0
ZSTD_SHA256=7713e1179d162cf5c7906da876ec2ccb9c3a9dcbdffef0cc7f70c3667a205f0b
if [ ! -f "$ZSTD_DIR/zstd.c" ]; then
  echo "setup: fetching zstd 1.5.7 (the $ZSTD_PKG sdist from PyPI) into $ZSTD_DIR"
  dl=$(mktemp -d)
  trap 'rm -rf "$dl"' EXIT
  .venv/bin/python -m pip download -q --no-deps --no-binary :all: -d "$dl" "${ZSTD_PKG/-/==}"
  echo "$ZSTD_SHA256  $dl/$ZSTD_PKG.tar.gz" | sha256sum -c --quiet -
  tar -xzf "$dl/$ZSTD_PKG.tar.gz" -C "$dl" "$ZSTD_PKG/zstd"
  src=$dl/$ZSTD_PKG/zstd
  grep -q '#define ZSTD_VERSION_MINOR    5' "$src/zstd.h"
  grep -q '#define ZSTD_VERSION_RELEASE  7' "$src/zstd.h"
  mkdir -p "$ZSTD_DIR.tmp"
  cp "$src"/{zstd.c,zstd.h,zdict.h,zstd_errors.h,LICENSE,COPYING} "$ZSTD_DIR.tmp/"
  rm -rf "$ZSTD_DIR" && mv "$ZSTD_DIR.tmp" "$ZSTD_DIR"
fi

# PyTorch (optional): loaderx.torch and the torch example are tested when it
# imports. Only a CPU wheel that lies on this machine (pip's find-links) is
# installed; never a multi-GB CUDA build from the registry. Without it those
# tests skip, saying so.
if ! .venv/bin/python -c "import torch" >/dev/null 2>&1; then
  links=$(.venv/bin/python -m pip config get global.find-links 2>/dev/null || true)
  tag=$(.venv/bin/python -c 'import sys; print("cp%d%d" % sys.version_info[:2])')
  wheel=""
  for d in $links; do
    for w in "$d"/torch-*+cpu-"$tag"-"$tag"-*.whl; do [ -f "$w" ] && wheel=$w; done
  done
  if [ -n "$wheel" ]; then
    echo "setup: installing PyTorch from $wheel"
    .venv/bin/python -m pip install -q "$wheel" || echo "setup: PyTorch install failed; torch tests will skip"
  else
    echo "setup: no local CPU PyTorch wheel; torch tests will skip"
  fi
fi
