#!/usr/bin/env bash
# Builds loaderx for Linux aarch64 and tests it under emulation
# (docs/platforms.md, "Linux aarch64"; `make test-aarch64`):
#
#  1. Debian packages: qemu-user-static, debootstrap, g++-aarch64-linux-gnu;
#  2. binfmt_misc mounted and qemu-aarch64 registered with the kernel (as root),
#     so that an arm64 program started by another (loaderxd from a test, the
#     root's own programs during debootstrap) runs under qemu too;
#  3. an arm64 Debian 12 root, build-aarch64-root/root (debootstrap, made once
#     and kept: remade only when ROOT_PACKAGES changes), with the arm64
#     libraries and headers of the build and python3 with NumPy, pytest...;
#  4. the engine, loaderxd, the C++ client and the gtests cross-compiled into
#     build-aarch64 (cmake/aarch64-linux-gnu.cmake: the root as sysroot);
#  5. ctest under qemu-aarch64-static with the root as the loader's prefix;
#  6. the Python extension cross-compiled for the root's python3 (3.11) into
#     build-aarch64-py, and the smoke subset of the Python suite
#     (tests/smoke_subset.txt) run by that python3 under qemu against the
#     aarch64 loaderxd.
#
# Environment: CMAKE, CMAKE_ARGS (generator, launchers), JOBS, CTEST_ARGS
# (default: every test, 600 s each), ROOT_ONLY=1 (steps 1-3 only: the root,
# as scripts/wheel_aarch64.sh needs it), SKIP_PYTHON=1 (steps 1-5 only),
# PYTEST_SECONDS (the bound of step 7, default 1800).
# Must run as root (debootstrap, binfmt_misc). Idempotent: a second run
# rebuilds only what changed.
set -euo pipefail
cd "$(dirname "$0")/.."
src=$PWD
cmake=${CMAKE:-.venv/bin/cmake}
jobs=${JOBS:-$(nproc)}

if [ "$(id -u)" -ne 0 ]; then
  echo "test-aarch64: needs root (debootstrap, binfmt_misc)" >&2
  exit 1
fi
t0=$(date +%s)
stage() { echo "test-aarch64: [$(($(date +%s) - t0)) s] $*"; }

# 1. The host's tools.
scripts/apt-install.sh test-aarch64 qemu-user-static debootstrap g++-aarch64-linux-gnu

# 2. binfmt_misc: the kernel runs arm64 ELF files with qemu-aarch64-static
#    (the handler Debian's qemu-user-static ships, flags OPF: the interpreter
#    is opened at registration, so it works inside the root as well).
binfmt=/proc/sys/fs/binfmt_misc
if [ ! -e "$binfmt/register" ]; then
  mount -t binfmt_misc binfmt_misc "$binfmt"
fi
if [ ! -e "$binfmt/qemu-aarch64" ]; then
  grep -v '^#' /usr/lib/binfmt.d/qemu-aarch64.conf | head -1 > "$binfmt/register"
fi
[ "$(head -1 "$binfmt/qemu-aarch64")" = enabled ] || echo 1 > "$binfmt/qemu-aarch64"

# 3. The arm64 root. Made in root.tmp and renamed when complete, so a run
#    stopped half-way leaves no root that looks finished.
ROOT_PACKAGES=python3,python3-numpy,python3-dev,python3-venv,libc6-dev,libstdc++-12-dev,libxxhash-dev,libgtest-dev,libmsgpack-cxx-dev,python3-pytest,python3-pytest-timeout,python3-msgpack,python3-tqdm,python3-hypothesis
rootdir=$src/build-aarch64-root
root=$rootdir/root
if [ ! -f "$rootdir/packages" ] || [ "$(cat "$rootdir/packages")" != "$ROOT_PACKAGES" ] || [ ! -x "$root/usr/bin/python3" ]; then
  stage "making the arm64 Debian 12 root $root (debootstrap, a few minutes)"
  rm -rf "$root" "$root.tmp" "$rootdir/packages"
  mkdir -p "$rootdir"
  debootstrap --arch=arm64 --variant=minbase --include="$ROOT_PACKAGES" bookworm "$root.tmp" \
    >"$rootdir/debootstrap.log" 2>&1 || { tail -30 "$rootdir/debootstrap.log"; exit 1; }
  rm -rf "$root.tmp"/var/cache/apt/archives/*.deb
  mv "$root.tmp" "$root"
  echo "$ROOT_PACKAGES" > "$rootdir/packages"
fi
export QEMU_LD_PREFIX=$root
[ "${ROOT_ONLY:-0}" = 1 ] && { stage "done (ROOT_ONLY=1: $root)"; exit 0; }

# 4. Cross build of the engine, loaderxd, the client and the gtests.
stage "building build-aarch64 (engine, loaderxd, client, gtests)"
mkdir -p build-aarch64
# shellcheck disable=SC2086
"$cmake" -S . -B build-aarch64 ${CMAKE_ARGS:-} -DCMAKE_TOOLCHAIN_FILE="$src/cmake/aarch64-linux-gnu.cmake" \
  -DLOADERX_AARCH64_ROOT="$root" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DLOADERX_BUILD_PYTHON=OFF -DLOADERX_BUILD_BENCH=OFF >build-aarch64/configure.log 2>&1 \
  || { cat build-aarch64/configure.log; exit 1; }
"$cmake" --build build-aarch64 -j "$jobs"
aarch64-linux-gnu-readelf -h build-aarch64/daemon/loaderxd | grep -q "Machine: *AArch64" \
  || { echo "test-aarch64: build-aarch64/daemon/loaderxd is not an aarch64 program" >&2; exit 1; }

# 5. ctest under qemu (the emulator comes from the toolchain file).
stage "ctest under qemu-aarch64"
# shellcheck disable=SC2086
(cd build-aarch64 && ctest --output-on-failure -j "$jobs" ${CTEST_ARGS:---timeout 600})

[ "${SKIP_PYTHON:-0}" = 1 ] && { stage "done (SKIP_PYTHON=1)"; exit 0; }

# 6. The extension for the root's python3, cross-compiled (the engine's
#    objects come from ccache where build-aarch64 compiled them). The root's
#    interpreter runs under qemu for FindPython; its include directories are
#    named here since CMake would look for them under the sysroot a second time.
stage "building build-aarch64-py (_loaderx for the root's python3)"
py=$root/usr/bin/python3
pyver=$(QEMU_LD_PREFIX=$root "$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
mkdir -p build-aarch64-py
# shellcheck disable=SC2086
"$cmake" -S . -B build-aarch64-py ${CMAKE_ARGS:-} -DCMAKE_TOOLCHAIN_FILE="$src/cmake/aarch64-linux-gnu.cmake" \
  -DLOADERX_AARCH64_ROOT="$root" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DLOADERX_BUILD_PYTHON=ON -DLOADERX_BUILD_TESTS=OFF -DLOADERX_BUILD_BENCH=OFF \
  -DPython_EXECUTABLE="$root/usr/bin/python$pyver" -DPython_INCLUDE_DIR="$root/usr/include/python$pyver" \
  -DPython_NumPy_INCLUDE_DIR="$root/usr/lib/python3/dist-packages/numpy/core/include" \
  -Dpybind11_DIR="$(.venv/bin/python -c 'import pybind11; print(pybind11.get_cmake_dir())')" \
  >build-aarch64-py/configure.log 2>&1 || { cat build-aarch64-py/configure.log; exit 1; }
"$cmake" --build build-aarch64-py -j "$jobs" --target _loaderx

# 7. The smoke subset, run by the root's python3 inside the root (chroot: its
#    libraries resolve through its own /etc/alternatives, as on an arm64
#    machine), with this checkout mounted at the same path. The mounts live in
#    a mount namespace of their own and go away with it.
stage "smoke subset under qemu-aarch64, python$pyver in the root"
mapfile -t subset < <(sed -e 's/#.*//' -e 's/[[:space:]]*$//' tests/smoke_subset.txt | grep -v '^$')
report=build-aarch64-py/pytest-report.xml
rm -f "$report"
unset QEMU_LD_PREFIX
# shellcheck disable=SC2016
timeout --kill-after=30 "${PYTEST_SECONDS:-1800}" unshare --mount --propagation private bash -euc '
  root=$1 src=$2; shift 2
  mkdir -p "$root$src" "$root/proc" "$root/dev"
  mount -t proc proc "$root/proc"
  mount --rbind /dev "$root/dev"
  mount --bind "$src" "$root$src"
  exec chroot "$root" /usr/bin/env -i -C "$src" PATH=/usr/bin:/bin HOME=/root LANG=C.UTF-8 \
    PYTHONPATH="$src/python" LOADERXD="$src/build-aarch64/daemon/loaderxd" \
    python3 -m pytest -q -p no:cacheprovider --timeout 600 \
    --junitxml="$src/build-aarch64-py/pytest-report.xml" "$@"
' bash "$root" "$src" "${subset[@]}"
test -s "$report" || { echo "test-aarch64: pytest ended without finishing its session" >&2; exit 1; }
stage "done"
