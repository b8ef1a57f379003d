#!/usr/bin/env bash
# make test-noclient (docs/platforms.md, "The extension without the client"):
# the Python extension as macOS and Windows get it, built and checked on Linux.
#
#  1. configures build-noclient with -DLOADERX_PYTHON_CLIENT=OFF (and no
#     loaderxd, gtests or benchmarks) and builds the _loaderx target only; the
#     module goes to build-noclient/pkg/loaderx/ (LOADERX_PYTHON_MODULE_DIR),
#     next to links to the package's Python files, so python/loaderx/ keeps
#     the build of `make build`;
#  2. runs tests/integration/test_noclient.py with LOADERX_NOCLIENT_PKG set:
#     the module's undefined symbols (nm) hold none of the daemon transport's
#     Linux calls, and in a subprocess importing that package, an embedded
#     DataLoader round trip is exact, daemon= raises DaemonError naming the
#     platform even with a real loaderxd answering, and daemon="auto" falls
#     back with a warning.
#
# Environment: CMAKE, CMAKE_ARGS (generator, launchers), JOBS, PY (the
# interpreter: the project venv's), LOADERXD (the daemon of step 2).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/package_links.sh
. scripts/package_links.sh
cmake=${CMAKE:-.venv/bin/cmake}
py=${PY:-.venv/bin/python}
out=$PWD/build-noclient
t0=$(date +%s)
stage() { echo "test-noclient: [$(($(date +%s) - t0)) s] $*"; }

stage "building _loaderx without the client into $out"
mkdir -p "$out/pkg/loaderx"
# shellcheck disable=SC2086
"$cmake" -S . -B "$out" ${CMAKE_ARGS:-} -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DLOADERX_PYTHON_CLIENT=OFF -DLOADERX_BUILD_DAEMON=OFF -DLOADERX_BUILD_TESTS=OFF \
  -DLOADERX_BUILD_BENCH=OFF -DLOADERX_BUILD_PYTHON=ON -DLOADERX_PYTHON_MODULE_DIR="$out/pkg/loaderx" \
  >"$out/configure.log" 2>&1 || { cat "$out/configure.log"; exit 1; }
"$cmake" --build "$out" -j "${JOBS:-$(nproc)}" --target _loaderx
# The package's Python files, linked (a change to them needs no re-run of step 1).
link_package_sources "$out/pkg"

stage "checking it (tests/integration/test_noclient.py)"
PYTHONPATH=python LOADERX_NOCLIENT_PKG="$out/pkg" LOADERXD="${LOADERXD:-$PWD/build/daemon/loaderxd}" \
  "$py" -m pytest -q -p no:cacheprovider --timeout 600 tests/integration/test_noclient.py
stage "done"
