# shellcheck shell=bash
# Sourced by scripts/test_noclient.sh and scripts/test_tsan_py.sh: a second
# build of _loaderx goes to DIR/loaderx/ (LOADERX_PYTHON_MODULE_DIR), next to
# links to the package's Python files, so python/loaderx/ keeps the module of
# `make build` and a change to a Python file needs no rebuild.
link_package_sources() {
  local dir=$1 f
  for f in python/loaderx/*; do
    case $f in *.so) continue ;; esac
    ln -sfn "$PWD/$f" "$dir/loaderx/"
  done
}
