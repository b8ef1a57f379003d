// UniqueFd, MappedRegion and OpenFile on Windows (loaderx/fd.h): descriptors
// are C runtime descriptors over handles opened with CreateFileW (shared for
// reading, writing and deletion, as POSIX files are), mappings are views of
// file mappings. Huge-page advice is a no-op: Windows has no transparent
// huge pages for file views.
#include <fcntl.h>
#include <io.h>
#include <windows.h>

#include <cerrno>

#include "loaderx/fd.h"
#include "loaderx/platform.h"
#include "win32.h"

namespace loaderx {
namespace win32 {

int ErrnoOf(DWORD err) {
  switch (err) {
    case ERROR_FILE_NOT_FOUND:
    case ERROR_PATH_NOT_FOUND:
    case ERROR_INVALID_DRIVE:
      return ENOENT;
    case ERROR_ALREADY_EXISTS:
    case ERROR_FILE_EXISTS:
      return EEXIST;
    case ERROR_ACCESS_DENIED:
    case ERROR_SHARING_VIOLATION:
    case ERROR_WRITE_PROTECT:
      return EACCES;
    case ERROR_DISK_FULL:
    case ERROR_HANDLE_DISK_FULL:
      return ENOSPC;
    case ERROR_DIR_NOT_EMPTY:
      return ENOTEMPTY;
    case ERROR_DIRECTORY:
      return ENOTDIR;
    case ERROR_INVALID_HANDLE:
      return EBADF;
    case ERROR_NOT_ENOUGH_MEMORY:
    case ERROR_OUTOFMEMORY:
      return ENOMEM;
    case ERROR_LOCK_VIOLATION:
      return EWOULDBLOCK;
    case ERROR_INVALID_PARAMETER:
      return EINVAL;
    case ERROR_FILENAME_EXCED_RANGE:
      return ENAMETOOLONG;
    default:
      return EIO;
  }
}

std::wstring Wide(const std::string& utf8) {
  if (utf8.empty()) return {};
  const int n =
      ::MultiByteToWideChar(CP_UTF8, 0, utf8.data(), static_cast<int>(utf8.size()), nullptr, 0);
  std::wstring w(static_cast<size_t>(n), L'\0');
  ::MultiByteToWideChar(CP_UTF8, 0, utf8.data(), static_cast<int>(utf8.size()), w.data(), n);
  return w;
}

HANDLE HandleOf(int fd) { return reinterpret_cast<HANDLE>(::_get_osfhandle(fd)); }

}  // namespace win32

void UniqueFd::Reset(int fd) {
  if (fd_ >= 0) ::_close(fd_);
  fd_ = fd;
}

Result<UniqueFd> UniqueFd::Dup() const {
  int d = ::_dup(fd_);
  if (d < 0) return Status::FromErrno("dup", errno);
  return UniqueFd(d);
}

namespace {

Status MapView(int fd, size_t length, uint64_t offset, DWORD protect, DWORD access,
               const char* what, void** data) {
  HANDLE map = ::CreateFileMappingW(win32::HandleOf(fd), nullptr, protect, 0, 0, nullptr);
  if (map == nullptr) return Status::FromErrno(what, win32::ErrnoOf(::GetLastError()));
  *data = ::MapViewOfFile(map, access, static_cast<DWORD>(offset >> 32),
                          static_cast<DWORD>(offset & 0xffffffffu), length);
  const DWORD err = ::GetLastError();
  ::CloseHandle(map);  // the view keeps the mapping alive
  if (*data == nullptr) return Status::FromErrno(what, win32::ErrnoOf(err));
  return Status::OK();
}

}  // namespace

Result<MappedRegion> MappedRegion::Map(int fd, size_t length, off_t offset, bool writable) {
  MappedRegion r;
  if (length == 0) return r;
  void* p = nullptr;
  LX_RETURN_IF_ERROR(MapView(fd, length, static_cast<uint64_t>(offset),
                             writable ? PAGE_READWRITE : PAGE_READONLY,
                             writable ? FILE_MAP_WRITE : FILE_MAP_READ, "mmap", &p));
  r.data_ = p;
  r.size_ = length;
  return r;
}

Result<MappedRegion> MappedRegion::MapPrivate(int fd, size_t length, off_t offset) {
  MappedRegion r;
  if (length == 0) return r;
  void* p = nullptr;
  LX_RETURN_IF_ERROR(MapView(fd, length, static_cast<uint64_t>(offset), PAGE_WRITECOPY,
                             FILE_MAP_COPY, "mmap(MAP_PRIVATE)", &p));
  r.data_ = p;
  r.size_ = length;
  return r;
}

Status MappedRegion::AdviseHugePages() { return Status::OK(); }

void MappedRegion::Reset() {
  if (data_ != nullptr) ::UnmapViewOfFile(data_);
  data_ = nullptr;
  size_ = 0;
}

Result<UniqueFd> OpenFile(const std::string& path, int flags, mode_t mode) {
  DWORD access = GENERIC_READ;
  if ((flags & O_ACCMODE) == O_WRONLY) access = GENERIC_WRITE;
  if ((flags & O_ACCMODE) == O_RDWR) access = GENERIC_READ | GENERIC_WRITE;
  DWORD disposition = OPEN_EXISTING;
  if ((flags & O_CREAT) && (flags & O_EXCL)) {
    disposition = CREATE_NEW;
  } else if ((flags & O_CREAT) && (flags & O_TRUNC)) {
    disposition = CREATE_ALWAYS;
  } else if (flags & O_CREAT) {
    disposition = OPEN_ALWAYS;
  } else if (flags & O_TRUNC) {
    disposition = TRUNCATE_EXISTING;
  }
  DWORD attributes = FILE_ATTRIBUTE_NORMAL;
  // Directories open only with backup semantics (for Sync and TryLock).
  if (flags & O_DIRECTORY) attributes = FILE_FLAG_BACKUP_SEMANTICS;
  if (flags & O_NOFOLLOW) attributes |= FILE_FLAG_OPEN_REPARSE_POINT;
  HANDLE h = ::CreateFileW(win32::Wide(path).c_str(), access,
                           FILE_SHARE_READ | FILE_SHARE_WRITE | FILE_SHARE_DELETE, nullptr,
                           disposition, attributes, nullptr);
  if (h == INVALID_HANDLE_VALUE) return Status::FromErrno(path, win32::ErrnoOf(::GetLastError()));
  if (flags & O_DIRECTORY) {
    BY_HANDLE_FILE_INFORMATION info;
    if (!::GetFileInformationByHandle(h, &info) ||
        !(info.dwFileAttributes & FILE_ATTRIBUTE_DIRECTORY)) {
      ::CloseHandle(h);
      return Status::FromErrno(path, ENOTDIR);
    }
  }
  const int fd = ::_open_osfhandle(reinterpret_cast<intptr_t>(h), _O_BINARY);
  if (fd < 0) {
    const int err = errno;
    ::CloseHandle(h);
    return Status::FromErrno(path, err);
  }
  return UniqueFd(fd);
}

}  // namespace loaderx
