#!/usr/bin/env bash
# CPython 3.14 in a Debian unstable (sid) root: builds the _loaderx extension
# and loaderxd with sid's python3.14 and g++ and runs the smoke subset
# (tests/smoke_subset.txt) there. `make test-py314` (docs/platforms.md).
#
#   scripts/test_py314.sh            build the root if needed, then build and test
#   scripts/test_py314.sh --clean    remove the root, its wheels and build-py314
#
# Needs root (debootstrap, mount, chroot) and the project venv (make setup):
# its pip fetches the wheels for the root. Everything lands under build-sid/
# (git-ignored) and is kept, so a second run only rebuilds what changed:
#
#   build-sid/root     the sid root: debootstrap --variant=minbase with
#                      python3.14 (-venv, -dev) and the build's Debian packages
#                      (the same ones scripts/setup.sh installs on Debian 12);
#                      made once, remade when that package list changes
#   build-sid/wheels   NumPy, pybind11, pytest... for cp314, downloaded on the
#                      host by the project venv's pip (pip inside the root has
#                      neither the host's certificates nor its pip settings)
#
# The checkout is bind-mounted into the root at its own path (and .deps, where
# zstd 1.5.7 lies, at its own if it is a link out of the checkout), with /proc
# and /dev; all are unmounted on exit. Inside, scripts/test_interpreter.sh 3.14
# does the rest as for the other CPythons, offline from build-sid/wheels, with
# the root's cmake and ninja, and with its own loaderxd (LOADERXD=own):
# build-py314/.venv, build-py314/, and
# python/loaderx/_loaderx.cpython-314-x86_64-linux-gnu.so.
#
# Environment: JOBS (default nproc), DEBIAN_MIRROR (default deb.debian.org).
set -euo pipefail
cd "$(dirname "$0")/.."
src=$PWD
sid=$src/build-sid
root=$sid/root
wheels=$sid/wheels

say() { echo "test-py314 [$((SECONDS / 60))m$((SECONDS % 60))s]: $*"; }
die() { echo "test-py314: $*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || die "needs root (debootstrap, mount and chroot)"

# The sid packages: the interpreter, and what scripts/setup.sh installs for
# the build on Debian 12 (g++, pkg-config, ninja, Boost, msgpack-c, xxHash;
# zstd 1.5.7 is the vendored one in .deps), plus cmake (the host's is a pip
# wheel in .venv).
PACKAGES=(python3.14 python3.14-venv python3.14-dev g++ pkg-config cmake ninja-build
          libboost-dev libmsgpack-cxx-dev libxxhash-dev)
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

# Refuses to delete a root that still has something mounted in it (the
# checkout is bind-mounted there during a run: rm -rf would go through it).
mounted_under() { findmnt -rn -o TARGET | grep -E "^$1(/|$)" || true; }
remove_root() {
  local dir=$1
  [ -e "$dir" ] || return 0
  if [ -n "$(mounted_under "$dir")" ]; then
    die "$dir still has mounts (a run in progress, or one killed hard); unmount them first:
$(mounted_under "$dir")"
  fi
  rm -rf "$dir"
}

if [ "${1:-}" = --clean ]; then
  remove_root "$root"
  remove_root "$root.new"
  rm -rf "$wheels" "$sid" build-py314 python/loaderx/_loaderx.cpython-314-*.so
  exit 0
fi
[ $# -eq 0 ] || die "usage: scripts/test_py314.sh [--clean]"

[ -x .venv/bin/python ] || die "no project venv (.venv): run make setup first"
[ -f .deps/zstd-1.5.7/zstd.c ] || die ".deps/zstd-1.5.7 is missing: run make setup first"
scripts/apt-install.sh test-py314 debootstrap

# 1. The root: made into root.new and renamed when complete, so an
#    interrupted debootstrap is never taken for a root.
stamp=$root/.loaderx-packages
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "${PACKAGES[*]}" ]; then
  remove_root "$root.new"
  remove_root "$root"
  mkdir -p "$sid"
  say "debootstrap sid into $root (${PACKAGES[*]})"
  start=$SECONDS
  if ! debootstrap --variant=minbase --include="$(IFS=,; echo "${PACKAGES[*]}")" \
      sid "$root.new" "$mirror" >"$sid/debootstrap.log" 2>&1; then
    tail -20 "$sid/debootstrap.log"
    die "debootstrap failed (log: $sid/debootstrap.log)"
  fi
  echo "${PACKAGES[*]}" > "$root.new/.loaderx-packages"
  mv "$root.new" "$root"
  say "root made in $((SECONDS - start)) s"
fi
# shellcheck disable=SC2016  # dpkg-query's own ${Package} fields
say "$(chroot "$root" dpkg-query -W -f='${Package} ${Version}' python3.14)," \
    "$(chroot "$root" dpkg-query -W -f='${Package} ${Version}' g++)"

# 2. The wheels, for cp314 on manylinux x86-64 (pure-Python ones as they
#    are), at the bounds scripts/test_interpreter.sh takes from
#    requirements-dev.txt.
reqs=$(scripts/test_interpreter.sh --requirements)
wstamp=$wheels/.requirements
if [ ! -f "$wstamp" ] || [ "$(cat "$wstamp")" != "$reqs" ]; then
  say "downloading wheels for cp314: $(tr '\n' ' ' <<<"$reqs")"
  rm -rf "$wheels"
  # shellcheck disable=SC2086
  .venv/bin/python -m pip download -q --disable-pip-version-check -d "$wheels" \
    --only-binary=:all: --implementation cp --python-version 3.14 --abi cp314 \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    $reqs
  echo "$reqs" > "$wstamp"
fi

# 3. Mounts, undone on any exit.
mounts=()
cleanup() {
  local i
  for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do
    umount -R "${mounts[i]}" 2>/dev/null || umount -R -l "${mounts[i]}" || true
  done
}
trap cleanup EXIT
trap 'exit 130' INT TERM
bind() {  # bind SOURCE: at the same path inside the root
  mkdir -p "$root$1"
  mount --bind "$1" "$root$1"
  mounts+=("$root$1")
}
mount -t proc proc "$root/proc"
mounts+=("$root/proc")
mount --rbind /dev "$root/dev"
mount --make-rslave "$root/dev"
mounts+=("$root/dev")
bind "$src"
deps=$(readlink -f .deps)
case $deps in
  "$src"/*) ;;
  *) bind "$deps" ;;
esac

# 4. Inside: the same steps as for every other CPython, offline.
say "building and running the smoke subset in the sid root"
chroot "$root" /usr/bin/env -i HOME=/root LANG=C.UTF-8 TERM="${TERM:-dumb}" \
  PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  PIP_NO_INDEX=1 PIP_FIND_LINKS="$wheels" PIP_DISABLE_PIP_VERSION_CHECK=1 \
  CMAKE=cmake CMAKE_ARGS="-G Ninja" JOBS="${JOBS:-$(nproc)}" LOADERXD=own \
  "$src/scripts/test_interpreter.sh" 3.14
say "done"
