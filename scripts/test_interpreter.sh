#!/usr/bin/env bash
# Builds the _loaderx extension for one more CPython and runs the smoke subset
# of the Python suite (tests/smoke_subset.txt) on it:
#
#   scripts/test_interpreter.sh 3.13        (make test-interpreters PYTHONS="3.10 3.12 3.13")
#
# The interpreter is pyenv's newest 3.X.* ($PYENV_ROOT, default ~/.pyenv),
# else python3.X on PATH; none is installed here. Its venv is
# build-py3X/.venv (NumPy, pybind11, pytest... at the bounds of
# requirements-dev.txt); CMake configures build-py3X with it and builds only
# the module, which lands in python/loaderx/ under its own ABI-tagged name
# (_loaderx.cpython-3X-<arch>-linux-gnu.so) beside the other interpreters'
# builds, so PYTHONPATH=python imports the right one for each. The engine and
# the client come from the same sources (ccache shares their objects with
# build/); the daemon tests use build/daemon/loaderxd ($LOADERXD).
#
# Environment: CMAKE (cmake binary), CMAKE_ARGS (generator, launcher...),
# JOBS, LOADERXD (LOADERXD=own builds build-py3X/daemon/loaderxd with this
# interpreter's build and uses it). Needs `make build` (setup's venv, zstd,
# loaderxd) first, unless LOADERXD=own. pip's own variables (PIP_NO_INDEX,
# PIP_FIND_LINKS) choose where the packages come from (scripts/test_py314.sh).
#
#   scripts/test_interpreter.sh --requirements   prints what the venv gets
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

# The packages the module's build and the smoke subset need, at the bounds
# requirements-dev.txt gives them (one place for versions).
needed='numpy|msgpack|tqdm|pybind11|pytest|pytest-timeout|hypothesis'
reqs=$(grep -E "^($needed)([<>=!~ ]|$)" requirements-dev.txt | sed 's/ *#.*//')
if [ "${1:-}" = --requirements ]; then
  echo "$reqs"
  exit 0
fi

version=${1:?usage: scripts/test_interpreter.sh 3.X}
if ! [[ $version =~ ^3\.[0-9]+$ ]]; then
  echo "test-interpreters: '$version' is not a CPython version like 3.12" >&2
  exit 2
fi
tag=${version/./}
pyenv_root=${PYENV_ROOT:-$HOME/.pyenv}

# pyenv's newest 3.X.N (not 3.X-dev, not a free-threaded 3.Xt build), else PATH.
interp=""
for d in $(ls -d "$pyenv_root"/versions/"$version".* 2>/dev/null | grep -E "/$version\.[0-9]+$" | sort -V); do
  [ -x "$d/bin/python$version" ] && interp=$d/bin/python$version
done
if [ -z "$interp" ]; then
  interp=$(command -v "python$version" || true)
fi
if [ -z "$interp" ]; then
  echo "test-interpreters: no CPython $version (looked in $pyenv_root/versions/$version.* and for" \
       "python$version on PATH); install it, e.g. 'pyenv install $version'" >&2
  exit 1
fi

bdir=build-py$tag
venv=$bdir/.venv
cmake=${CMAKE:-.venv/bin/cmake}
jobs=${JOBS:-$(nproc)}
loaderxd=${LOADERXD:-$root/build/daemon/loaderxd}
targets=(_loaderx)
if [ "$loaderxd" = own ]; then
  targets+=(loaderxd)
  loaderxd=$root/$bdir/daemon/loaderxd
else
  [ -x "$loaderxd" ] || { echo "test-interpreters: $loaderxd is not built (make build)" >&2; exit 1; }
fi

# A venv made by another interpreter (a pyenv upgrade) is made anew.
if [ ! -x "$venv/bin/python" ] || [ "$(readlink -f "$venv/bin/python")" != "$(readlink -f "$interp")" ]; then
  echo "test-interpreters: $version: creating $venv with $interp"
  rm -rf "$venv"
  "$interp" -m venv "$venv"
fi
stamp=$venv/.requirements.stamp
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$reqs" ]; then
  echo "test-interpreters: $version: installing $(echo $reqs | tr '\n' ' ')"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check $reqs
  echo "$reqs" > "$stamp"
fi
py=$root/$venv/bin/python
"$py" -c 'import sys; print("test-interpreters: using", sys.version.split()[0], sys.executable)'

# Only the module (and the engine and client it links; loaderxd with
# LOADERXD=own): no gtests or benchmarks. A later -DPython_EXECUTABLE overrides one in CMAKE_ARGS.
# shellcheck disable=SC2086
"$cmake" -S . -B "$bdir" ${CMAKE_ARGS:-} -DPython_EXECUTABLE="$py" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DLOADERX_BUILD_TESTS=OFF -DLOADERX_BUILD_BENCH=OFF -DLOADERX_BUILD_PYTHON=ON -DLOADERX_BUILD_DAEMON=ON \
  >"$bdir/configure.log" 2>&1 || { cat "$bdir/configure.log"; exit 1; }
"$cmake" --build "$bdir" -j "$jobs" --target "${targets[@]}"

# The module imported is this interpreter's own build, from python/loaderx/.
suffix=$("$py" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
got=$(PYTHONPATH=python "$py" -c 'import loaderx._loaderx as m; print(m.__file__)')
if [ "$got" != "$root/python/loaderx/_loaderx$suffix" ]; then
  echo "test-interpreters: $version imported $got, not python/loaderx/_loaderx$suffix" >&2
  exit 1
fi

# The smoke subset: one pytest node id or file per line of tests/smoke_subset.txt.
mapfile -t subset < <(sed -e 's/#.*//' -e 's/[[:space:]]*$//' tests/smoke_subset.txt | grep -v '^$')
report=$bdir/pytest-report.xml
rm -f "$report"
PYTHONPATH=python LOADERXD=$loaderxd "$py" -m pytest -q -p no:cacheprovider --timeout 300 \
  --junitxml="$report" "${subset[@]}"
# As test-py: a session that ended early (os._exit) wrote no report.
test -s "$report" || { echo "test-interpreters: $version: pytest ended without finishing its session" >&2; exit 1; }
