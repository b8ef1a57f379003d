# Cross-compiling the embedded engine and its gtests for Windows x86-64 with
# Debian's mingw-w64 (the posix-thread variant: std::thread and std::mutex
# need it). `make test-windows` uses it and runs the tests under wine64
# (docs/platforms.md, "Windows").
set(CMAKE_SYSTEM_NAME Windows)
set(CMAKE_SYSTEM_PROCESSOR x86_64)
set(CMAKE_C_COMPILER x86_64-w64-mingw32-gcc-posix)
set(CMAKE_CXX_COMPILER x86_64-w64-mingw32-g++-posix)
set(CMAKE_RC_COMPILER x86_64-w64-mingw32-windres)
set(CMAKE_FIND_ROOT_PATH /usr/x86_64-w64-mingw32)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
# The test programs carry their C++ runtime (no DLLs to copy next to them).
set(CMAKE_EXE_LINKER_FLAGS_INIT "-static")
# Debian's wine64 package installs its loader outside PATH.
find_program(LOADERX_WINE NAMES wine64 PATHS /usr/lib/wine NO_CACHE)
if(LOADERX_WINE)
  set(CMAKE_CROSSCOMPILING_EMULATOR "${LOADERX_WINE}")
endif()
