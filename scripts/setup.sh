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
# whose compressor is ~20 % slower on photo-sized records. scripts/fetch_zstd.py
# takes the single-file library from the PyPI sdist of `zstandard` (the
# registry this machine has), checked against its sha256, and unpacks it into
# .deps/ (git-ignored; an sdist carries it).
if [ ! -f .deps/zstd-1.5.7/zstd.c ]; then
  echo "setup: fetching zstd 1.5.7 (the zstandard sdist from PyPI) into .deps/zstd-1.5.7"
  .venv/bin/python scripts/fetch_zstd.py .deps/zstd-1.5.7
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
