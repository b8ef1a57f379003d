// The Windows Env (loaderx/env.h): each call is the Win32 call closest to the
// POSIX one, on the handle behind the C runtime descriptor.
//   pread/pwrite       ReadFile/WriteFile at an OVERLAPPED offset (the file
//                      position is not used, as with pread)
//   pwritev            one WriteFile per buffer (no gather write on Windows)
//   ftruncate          SetFileInformationByHandle(FileEndOfFileInfo)
//   fdatasync/fsync    FlushFileBuffers (directories: nothing to flush)
//   sync_file_range    nothing (a hint)
//   flock              LockFileEx(EXCLUSIVE | FAIL_IMMEDIATELY) on files; a
//                      directory cannot be locked on Windows: it is reported
//                      locked by its opener (no cross-process exclusion)
//   renameat2(NOREPLACE)  MoveFileExW without MOVEFILE_REPLACE_EXISTING
// Paths are UTF-8 (converted to UTF-16).
#include <fcntl.h>
#include <io.h>
#include <windows.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <system_error>
#include <vector>

#include "loaderx/env.h"
#include "win32.h"

namespace loaderx {
namespace {

constexpr size_t kMaxIoBytes = size_t{1} << 30;

Status Win32Error(const std::string& what, DWORD err) {
  return Status::FromErrno(what, win32::ErrnoOf(err));
}

OVERLAPPED At(uint64_t offset) {
  OVERLAPPED o;
  std::memset(&o, 0, sizeof(o));
  o.Offset = static_cast<DWORD>(offset & 0xffffffffu);
  o.OffsetHigh = static_cast<DWORD>(offset >> 32);
  return o;
}

std::string Narrow(const wchar_t* w) {
  const int n = ::WideCharToMultiByte(CP_UTF8, 0, w, -1, nullptr, 0, nullptr, nullptr);
  std::string s(static_cast<size_t>(n > 0 ? n - 1 : 0), '\0');
  if (n > 1) ::WideCharToMultiByte(CP_UTF8, 0, w, -1, s.data(), n, nullptr, nullptr);
  return s;
}

bool IsDirectory(HANDLE h) {
  BY_HANDLE_FILE_INFORMATION info;
  return ::GetFileInformationByHandle(h, &info) &&
         (info.dwFileAttributes & FILE_ATTRIBUTE_DIRECTORY);
}

class Win32Env final : public Env {
 public:
  Result<UniqueFd> Open(const std::string& path, int flags, mode_t mode) override {
    return OpenFile(path, flags, mode);
  }

  Result<size_t> PWrite(int fd, const void* data, size_t len, uint64_t offset) override {
    return WriteAt(fd, data, len, offset, "pwrite");
  }

  Result<size_t> PWriteV(int fd, const struct iovec* iov, int iovcnt, uint64_t offset) override {
    size_t total = 0;
    for (int i = 0; i < iovcnt; ++i) {
      if (iov[i].iov_len == 0) continue;
      Result<size_t> n = WriteAt(fd, iov[i].iov_base, iov[i].iov_len, offset + total, "pwritev");
      if (!n.ok()) {
        if (total > 0) break;  // report what was written, as a short pwritev
        return n.status();
      }
      total += *n;
      if (*n < iov[i].iov_len) break;
    }
    return total;
  }

  Result<size_t> PRead(int fd, void* data, size_t len, uint64_t offset) override {
    OVERLAPPED o = At(offset);
    DWORD n = 0;
    if (!::ReadFile(win32::HandleOf(fd), data, static_cast<DWORD>(std::min(len, kMaxIoBytes)), &n,
                    &o)) {
      const DWORD err = ::GetLastError();
      if (err == ERROR_HANDLE_EOF) return size_t{0};
      return Win32Error("pread", err);
    }
    return static_cast<size_t>(n);
  }

  Status Truncate(int fd, uint64_t size) override {
    FILE_END_OF_FILE_INFO info;
    info.EndOfFile.QuadPart = static_cast<LONGLONG>(size);
    if (!::SetFileInformationByHandle(win32::HandleOf(fd), FileEndOfFileInfo, &info,
                                      sizeof(info))) {
      return Win32Error("ftruncate", ::GetLastError());
    }
    return Status::OK();
  }

  Status DataSync(int fd) override { return Flush(fd, "fdatasync"); }
  Status Sync(int fd) override { return Flush(fd, "fsync"); }

  void StartWriteback(int fd, uint64_t offset, uint64_t len) override {}

  Status Stat(int fd, struct stat* st) override {
    if (::fstat(fd, st) != 0) return Status::FromErrno("fstat", errno);
    return Status::OK();
  }

  Result<bool> TryLock(int fd) override {
    HANDLE h = win32::HandleOf(fd);
    if (IsDirectory(h)) return true;
    OVERLAPPED o = At(0);
    if (::LockFileEx(h, LOCKFILE_EXCLUSIVE_LOCK | LOCKFILE_FAIL_IMMEDIATELY, 0, MAXDWORD, MAXDWORD,
                     &o)) {
      return true;
    }
    const DWORD err = ::GetLastError();
    if (err == ERROR_LOCK_VIOLATION) return false;
    return Win32Error("flock", err);
  }

  Result<MappedRegion> Map(int fd, size_t length) override { return MappedRegion::Map(fd, length); }

  Status StatPath(const std::string& path, bool follow, struct stat* st) override {
    if (::stat(path.c_str(), st) == 0) return Status::OK();
    if (errno == ENOENT || errno == ENOTDIR) {
      return Status::NotFound(path + ": " + std::generic_category().message(errno));
    }
    return Status::FromErrno(path, errno);
  }

  Status Mkdir(const std::string& path, mode_t mode) override {
    if (!::CreateDirectoryW(win32::Wide(path).c_str(), nullptr)) {
      return Win32Error(path + ": mkdir", ::GetLastError());
    }
    return Status::OK();
  }

  Status Unlink(const std::string& path) override {
    if (!::DeleteFileW(win32::Wide(path).c_str())) {
      return Win32Error(path + ": unlink", ::GetLastError());
    }
    return Status::OK();
  }

  Status Rmdir(const std::string& path) override {
    if (!::RemoveDirectoryW(win32::Wide(path).c_str())) {
      return Win32Error(path + ": rmdir", ::GetLastError());
    }
    return Status::OK();
  }

  Result<std::vector<std::string>> ListDir(const std::string& dir) override {
    WIN32_FIND_DATAW found;
    HANDLE h = ::FindFirstFileW(win32::Wide(dir + "/*").c_str(), &found);
    if (h == INVALID_HANDLE_VALUE) {
      const DWORD err = ::GetLastError();
      if (err == ERROR_FILE_NOT_FOUND || err == ERROR_PATH_NOT_FOUND || err == ERROR_DIRECTORY) {
        return Status::NotFound(dir + ": " + std::generic_category().message(win32::ErrnoOf(err)));
      }
      return Win32Error(dir + ": opendir", err);
    }
    std::vector<std::string> names;
    do {
      if (std::wcscmp(found.cFileName, L".") != 0 && std::wcscmp(found.cFileName, L"..") != 0) {
        names.push_back(Narrow(found.cFileName));
      }
    } while (::FindNextFileW(h, &found));
    const DWORD err = ::GetLastError();
    ::FindClose(h);
    if (err != ERROR_NO_MORE_FILES) return Win32Error(dir + ": readdir", err);
    return names;
  }

  Status RenameNoReplace(const std::string& from, const std::string& to) override {
    if (::MoveFileExW(win32::Wide(from).c_str(), win32::Wide(to).c_str(), 0)) return Status::OK();
    const DWORD err = ::GetLastError();
    if (err == ERROR_ALREADY_EXISTS || err == ERROR_FILE_EXISTS) {
      return Status::AlreadyExists(to + ": already exists");
    }
    return Win32Error(from + " -> " + to + ": rename", err);
  }

 private:
  // One WriteFile of at most kMaxIoBytes at `offset`; errors name `what`.
  static Result<size_t> WriteAt(int fd, const void* data, size_t len, uint64_t offset,
                                const char* what) {
    OVERLAPPED o = At(offset);
    DWORD n = 0;
    if (!::WriteFile(win32::HandleOf(fd), data, static_cast<DWORD>(std::min(len, kMaxIoBytes)), &n,
                     &o)) {
      return Win32Error(what, ::GetLastError());
    }
    return static_cast<size_t>(n);
  }

  static Status Flush(int fd, const char* what) {
    HANDLE h = win32::HandleOf(fd);
    if (IsDirectory(h)) return Status::OK();  // directory entries: nothing to flush
    if (!::FlushFileBuffers(h)) return Win32Error(what, ::GetLastError());
    return Status::OK();
  }
};

}  // namespace

Env* Env::Default() {
  static Env* const env = new Win32Env();  // never destroyed: usable during exit
  return env;
}

}  // namespace loaderx
