// What the engine's headers need from the operating system, the same on
// every platform: on Linux and macOS the POSIX headers; on Windows (mingw-w64)
// the few POSIX names the Env interface uses that Windows lacks: struct iovec
// (for PWriteV), and open(2) flags the Win32 Env understands (O_DIRECTORY,
// O_NOFOLLOW, O_CLOEXEC), given bits no CRT flag uses. docs/platforms.md
// lists what differs per platform.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#if defined(_WIN32)
#include <fcntl.h>

#include <cstddef>

struct iovec {
  void* iov_base;
  size_t iov_len;
};
#ifndef IOV_MAX
#define IOV_MAX 1024
#endif
#ifndef O_DIRECTORY
#define O_DIRECTORY 0x10000000
#endif
#ifndef O_NOFOLLOW
#define O_NOFOLLOW 0x20000000
#endif
#ifndef O_CLOEXEC
#define O_CLOEXEC 0  // Win32 handles are opened not inheritable
#endif
#ifndef S_ISLNK
#define S_ISLNK(m) 0  // StatPath reports no symbolic links on Windows
#endif
#else
#include <sys/uio.h>
#endif
