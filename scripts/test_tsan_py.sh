#!/usr/bin/env bash
# make test-tsan-py (docs/platforms.md, "Thread safety"): the Python thread
# stress test with the extension and loaderxd built under ThreadSanitizer.
#
#  1. configures build-tsan-py with -DLOADERX_SANITIZE=thread and builds the
#     _loaderx and loaderxd targets; the module goes to
#     build-tsan-py/pkg/loaderx/ (LOADERX_PYTHON_MODULE_DIR) next to links to
#     the package's Python files, so python/loaderx/ keeps the build of
#     `make build`;
#  2. runs tests/integration/test_thread_stress.py in an interpreter with
#     the TSan runtime preloaded (CPython and NumPy are not instrumented: the
#     runtime sees the GIL and every other pthread lock through its
#     interceptors, and checks every access of the engine's code), against
#     that package and that loaderxd. Any report fails the run.
#
# Environment: CMAKE, CMAKE_ARGS (generator, launchers), JOBS, PY (the
# interpreter: the project venv's), CXX (the compiler whose TSan runtime is
# preloaded: g++ unless the build says otherwise).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/package_links.sh
. scripts/package_links.sh
cmake=${CMAKE:-.venv/bin/cmake}
py=${PY:-.venv/bin/python}
out=$PWD/build-tsan-py
t0=$(date +%s)
stage() { echo "test-tsan-py: [$(($(date +%s) - t0)) s] $*"; }

stage "building _loaderx and loaderxd with -fsanitize=thread into $out"
mkdir -p "$out/pkg/loaderx"
# shellcheck disable=SC2086
"$cmake" -S . -B "$out" ${CMAKE_ARGS:-} -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLOADERX_SANITIZE=thread \
  -DLOADERX_BUILD_TESTS=OFF -DLOADERX_BUILD_BENCH=OFF -DLOADERX_BUILD_PYTHON=ON \
  -DLOADERX_PYTHON_MODULE_DIR="$out/pkg/loaderx" \
  >"$out/configure.log" 2>&1 || { cat "$out/configure.log"; exit 1; }
"$cmake" --build "$out" -j "${JOBS:-$(nproc)}" --target _loaderx loaderxd
link_package_sources "$out/pkg"

module=$(ls "$out"/pkg/loaderx/_loaderx*.so)
# grep reads all of nm's output (with -q it would quit early and, under
# pipefail, nm's SIGPIPE would fail the check).
nm -D "$module" | grep __tsan_func_entry >/dev/null || { echo "test-tsan-py: $module is not instrumented" >&2; exit 1; }
runtime=$("${CXX:-g++}" -print-file-name=libtsan.so)
[ -e "$runtime" ] || { echo "test-tsan-py: no TSan runtime ($runtime)" >&2; exit 1; }
stage "tests/integration/test_thread_stress.py under TSan ($runtime)"
# The module is the only instrumented code in the interpreter; a report is
# an error of the engine or of its bindings.
LD_PRELOAD="$runtime" TSAN_OPTIONS="halt_on_error=1 exitcode=66 report_signal_unsafe=0 suppressions=$PWD/tests/tsan-python.supp" \
  PYTHONPATH="$out/pkg" LOADERXD="$out/daemon/loaderxd" \
  "$py" -m pytest -q -p no:cacheprovider --timeout 1800 tests/integration/test_thread_stress.py
stage "done"
