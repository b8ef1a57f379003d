#!/usr/bin/env bash
# make test-wheel-aarch64 (docs/platforms.md, "An aarch64 wheel"), as root:
#
#  1. the arm64 Debian 12 root of `make test-aarch64` (made if missing, with
#     binfmt_misc set up: `ROOT_ONLY=1 scripts/test_aarch64.sh`);
#  2. the aarch64 wheel, cross-compiled and repaired into dist/ as
#     `make wheel ARCH=aarch64` does (scripts/wheel.py --arch aarch64);
#  3. inside the root (chroot, the checkout mounted at its own path in a
#     mount namespace that ends with the run), the root's python3 under
#     qemu-aarch64 runs test_a_built_wheel_runs_the_readme_in_a_bare_venv of
#     tests/python/test_packaging.py: a fresh venv (NumPy, msgpack and tqdm
#     from the root's Debian packages: no package index), no compiler on its
#     PATH, the wheel installed with pip, the README example run embedded
#     and through the wheel's own loaderxd.
#
# Environment: JOBS (the build's jobs), PYTEST_SECONDS (bound of step 3,
# default 1200).
set -euo pipefail
cd "$(dirname "$0")/.."
src=$PWD
if [ "$(id -u)" -ne 0 ]; then
  echo "test-wheel-aarch64: needs root (debootstrap, binfmt_misc, chroot)" >&2
  exit 1
fi
t0=$(date +%s)
stage() { echo "test-wheel-aarch64: [$(($(date +%s) - t0)) s] $*"; }

stage "the arm64 root"
ROOT_ONLY=1 scripts/test_aarch64.sh
root=$src/build-aarch64-root/root

stage "the aarch64 wheel (scripts/wheel.py dist --arch aarch64)"
wheel=$(CMAKE_BUILD_PARALLEL_LEVEL=${JOBS:-$(nproc)} .venv/bin/python scripts/wheel.py dist --arch aarch64 | tail -1)
stage "built $wheel"

stage "installing and running it in a bare venv in the root, under qemu-aarch64"
# shellcheck disable=SC2016
timeout --kill-after=30 "${PYTEST_SECONDS:-1200}" unshare --mount --propagation private bash -euc '
  root=$1 src=$2 wheel=$3
  mkdir -p "$root$src" "$root/proc" "$root/dev"
  mount -t proc proc "$root/proc"
  mount --rbind /dev "$root/dev"
  mount --bind "$src" "$root$src"
  exec chroot "$root" /usr/bin/env -i -C "$src" PATH=/usr/bin:/bin HOME=/root LANG=C.UTF-8 \
    PYTHONPATH="$src/python" LOADERX_TEST_WHEEL="$wheel" LOADERX_TEST_WHEEL_OFFLINE=1 \
    python3 -m pytest -q -p no:cacheprovider -rs --timeout 1200 \
    tests/python/test_packaging.py::test_a_built_wheel_runs_the_readme_in_a_bare_venv
' bash "$root" "$src" "$wheel" | tee build-wheel-aarch64/pytest.log
# A skip would exit 0 as well: the one test must have passed.
grep -q "1 passed" build-wheel-aarch64/pytest.log || { echo "test-wheel-aarch64: the test did not pass" >&2; exit 1; }
stage "done"
