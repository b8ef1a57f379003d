# Cross-compiles loaderx for Linux aarch64 (docs/platforms.md, "Linux aarch64"):
# Debian's aarch64-linux-gnu-gcc/g++ (g++-aarch64-linux-gnu) against an arm64
# Debian root used as the sysroot, which holds the arm64 libraries and headers
# of the build (libc6-dev, libstdc++-12-dev, libxxhash-dev, libgtest-dev,
# libmsgpack-cxx-dev with Boost, python3-dev, python3-numpy:
# scripts/test_aarch64.sh makes it with debootstrap). Programs built here run
# under qemu-aarch64-static with the root as the prefix of their loader and
# libraries (CMAKE_CROSSCOMPILING_EMULATOR: ctest and gtest_discover_tests use
# it).
#
#   cmake -S . -B build-aarch64 -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake \
#         -DLOADERX_AARCH64_ROOT=$PWD/build-aarch64-root/root
#
# LOADERX_AARCH64_ROOT may also come from the environment of the same name.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)

# try_compile projects re-read this file: pass the root on to them.
list(APPEND CMAKE_TRY_COMPILE_PLATFORM_VARIABLES LOADERX_AARCH64_ROOT)
if(NOT LOADERX_AARCH64_ROOT AND DEFINED ENV{LOADERX_AARCH64_ROOT})
  set(LOADERX_AARCH64_ROOT "$ENV{LOADERX_AARCH64_ROOT}")
endif()
if(NOT LOADERX_AARCH64_ROOT OR NOT EXISTS "${LOADERX_AARCH64_ROOT}/usr/lib/aarch64-linux-gnu/libc.so")
  message(FATAL_ERROR "LOADERX_AARCH64_ROOT ('${LOADERX_AARCH64_ROOT}') is not an arm64 Debian root "
                      "with libc6-dev: make one with scripts/test_aarch64.sh (make test-aarch64)")
endif()
set(LOADERX_AARCH64_ROOT "${LOADERX_AARCH64_ROOT}" CACHE PATH "The arm64 Debian root (sysroot and qemu prefix)")

set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_SYSROOT "${LOADERX_AARCH64_ROOT}")
set(CMAKE_FIND_ROOT_PATH "${LOADERX_AARCH64_ROOT}")
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

# pkg-config (libxxhash) reads the root's .pc files and prefixes their paths.
set(ENV{PKG_CONFIG_SYSROOT_DIR} "${LOADERX_AARCH64_ROOT}")
set(ENV{PKG_CONFIG_LIBDIR}
    "${LOADERX_AARCH64_ROOT}/usr/lib/aarch64-linux-gnu/pkgconfig:${LOADERX_AARCH64_ROOT}/usr/share/pkgconfig")

find_program(LOADERX_QEMU_AARCH64 qemu-aarch64-static)
if(LOADERX_QEMU_AARCH64)
  # Through the environment, not -L: a test that starts another program
  # (loaderxd, a forked child's exec) runs it under the same prefix.
  set(CMAKE_CROSSCOMPILING_EMULATOR "env;QEMU_LD_PREFIX=${LOADERX_AARCH64_ROOT};${LOADERX_QEMU_AARCH64}")
endif()
