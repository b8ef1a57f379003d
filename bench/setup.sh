#!/usr/bin/env bash
# Benchmark set-up (benchmark engineer): the Debian packages that hold the real
# data and the bench-only Python packages (bench/requirements.txt) into the
# project venv. Idempotent; installs only what is missing. Then prepares data.
set -euo pipefail
cd "$(dirname "$0")/.."

BENCH_APT=(
  plasma-workspace-wallpapers visp-images-data   # real photos (vision workloads)
  linux-doc-6.1                                  # real text (token workloads)
  dataset-fashion-mnist                          # real 28x28 images
)

scripts/apt-install.sh bench/setup "${BENCH_APT[@]}"

[ -x .venv/bin/python ] || scripts/setup.sh
stamp=.venv/.bench-requirements.stamp
if [ ! -f "$stamp" ] || ! cmp -s bench/requirements.txt "$stamp"; then
  echo "bench/setup: installing bench Python packages into .venv"
  .venv/bin/python -m pip install -q -r bench/requirements.txt
  cp bench/requirements.txt "$stamp"
fi

.venv/bin/python bench/prepare_vision.py
.venv/bin/python bench/prepare_tokens.py
