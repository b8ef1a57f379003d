#!/usr/bin/env bash
# make test-windows (docs/platforms.md, "Windows"): cross-compiles the
# embedded engine and its portable gtests with mingw-w64 into build-mingw/
# and runs them under wine64, bounded by TIMEOUT seconds (default 900).
# Installs the Debian packages it needs (mingw-w64's posix-thread g++, wine64,
# GoogleTest's source) when they are missing and it runs as root.
set -euo pipefail
cd "$(dirname "$0")/.."
CMAKE=${CMAKE:-.venv/bin/cmake}
NINJA=${NINJA:-$PWD/.venv/bin/ninja}
JOBS=${JOBS:-$(nproc)}
TIMEOUT=${TIMEOUT:-900}
CTEST=${CTEST:-$PWD/.venv/bin/ctest}
CXX_MINGW=x86_64-w64-mingw32-g++-posix
WINE=$(command -v wine64 || echo /usr/lib/wine/wine64)

missing=()
command -v "$CXX_MINGW" >/dev/null || missing+=(g++-mingw-w64-x86-64-posix)
[ -x "$WINE" ] || missing+=(wine64)
[ -f /usr/src/googletest/CMakeLists.txt ] || missing+=(googletest)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "test-windows: missing Debian packages: ${missing[*]} (apt-get install them as root)" >&2
    exit 1
  fi
  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
fi
"$CMAKE" -S . -B build-mingw -G Ninja -DCMAKE_MAKE_PROGRAM="$NINJA" \
  -DCMAKE_TOOLCHAIN_FILE=cmake/mingw-w64.cmake -DLOADERX_WINE="$WINE" \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLOADERX_BUILD_PYTHON=OFF -DLOADERX_BUILD_DAEMON=OFF \
  -DLOADERX_BUILD_BENCH=OFF -DLOADERX_FETCH_ZSTD=OFF "${launcher[@]}" >/dev/null
"$CMAKE" --build build-mingw -j "$JOBS"
# A wine prefix of the build's own (made on the first run, ~10 s), quiet.
export WINEPREFIX="$PWD/build-mingw/wineprefix" WINEDEBUG=-all
cd build-mingw
"$CTEST" --output-on-failure --timeout "$TIMEOUT"
