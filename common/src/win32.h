// Helpers of the Windows implementations (env_win32.cc, fd_win32.cc):
// descriptors are C runtime descriptors over Win32 handles, paths are UTF-8,
// and Win32 errors become the errno values the POSIX Env reports, so every
// platform's errors read the same ("pwrite: No space left on device").
// Private to common/. Thread-safety: pure functions.
#pragma once

#include <windows.h>

#include <string>

namespace loaderx::win32 {

// The errno value closest to a Win32 error (EIO if none is).
int ErrnoOf(DWORD err);
// UTF-8 to UTF-16; "/" separators are accepted by Win32 as they are.
std::wstring Wide(const std::string& utf8);
// The Win32 handle of a C runtime descriptor (INVALID_HANDLE_VALUE if none).
HANDLE HandleOf(int fd);

}  // namespace loaderx::win32
