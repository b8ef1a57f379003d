// The POSIX Env (loaderx/env.h): Linux, and macOS where it lacks a Linux call
// (docs/platforms.md, "macOS").
#include <dirent.h>

#include "loaderx/env.h"
#if defined(__APPLE__)
#include <stdio.h>  // renamex_np
#endif
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <system_error>
#include <vector>

namespace loaderx {
namespace {

// One syscall per call; a single read or write is capped at 1 GiB (Linux
// transfers at most 0x7ffff000 bytes per call anyway).
constexpr size_t kMaxIoBytes = size_t{1} << 30;

Status Missing(const std::string& path, int err) {
  return Status::NotFound(path + ": " + std::generic_category().message(err));
}

class PosixEnv final : public Env {
 public:
  Result<UniqueFd> Open(const std::string& path, int flags, mode_t mode) override {
    return OpenFile(path, flags, mode);
  }

  Result<size_t> PWrite(int fd, const void* data, size_t len, uint64_t offset) override {
    ssize_t n;
    do {
      n = ::pwrite(fd, data, std::min(len, kMaxIoBytes), static_cast<off_t>(offset));
    } while (n < 0 && errno == EINTR);
    if (n < 0) return Status::FromErrno("pwrite", errno);
    return static_cast<size_t>(n);
  }

  Result<size_t> PWriteV(int fd, const struct iovec* iov, int iovcnt, uint64_t offset) override {
    ssize_t n;
    do {
      n = ::pwritev(fd, iov, iovcnt, static_cast<off_t>(offset));
    } while (n < 0 && errno == EINTR);
    if (n < 0) return Status::FromErrno("pwritev", errno);
    return static_cast<size_t>(n);
  }

  Result<size_t> PRead(int fd, void* data, size_t len, uint64_t offset) override {
    ssize_t n;
    do {
      n = ::pread(fd, data, std::min(len, kMaxIoBytes), static_cast<off_t>(offset));
    } while (n < 0 && errno == EINTR);
    if (n < 0) return Status::FromErrno("pread", errno);
    return static_cast<size_t>(n);
  }

  Status Truncate(int fd, uint64_t size) override {
    if (::ftruncate(fd, static_cast<off_t>(size)) != 0)
      return Status::FromErrno("ftruncate", errno);
    return Status::OK();
  }

  Status DataSync(int fd) override {
#if defined(__APPLE__)  // macOS declares no fdatasync: fsync makes content and size durable
    if (::fsync(fd) != 0) return Status::FromErrno("fdatasync", errno);
#else
    if (::fdatasync(fd) != 0) return Status::FromErrno("fdatasync", errno);
#endif
    return Status::OK();
  }

  Status Sync(int fd) override {
    if (::fsync(fd) != 0) return Status::FromErrno("fsync", errno);
    return Status::OK();
  }

  void StartWriteback(int fd, uint64_t offset, uint64_t len) override {
#if defined(__linux__)  // a hint; elsewhere none is given
    ::sync_file_range(fd, static_cast<off_t>(offset), static_cast<off_t>(len),
                      SYNC_FILE_RANGE_WRITE);
#endif
  }

  Status Stat(int fd, struct stat* st) override {
    if (::fstat(fd, st) != 0) return Status::FromErrno("fstat", errno);
    return Status::OK();
  }

  Result<bool> TryLock(int fd) override {
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0) return true;
    if (errno == EWOULDBLOCK) return false;
    return Status::FromErrno("flock", errno);
  }

  Result<MappedRegion> Map(int fd, size_t length) override { return MappedRegion::Map(fd, length); }

  Status StatPath(const std::string& path, bool follow, struct stat* st) override {
    if ((follow ? ::stat(path.c_str(), st) : ::lstat(path.c_str(), st)) == 0) return Status::OK();
    if (errno == ENOENT || errno == ENOTDIR) return Missing(path, errno);
    return Status::FromErrno(path, errno);
  }

  Status Mkdir(const std::string& path, mode_t mode) override {
    if (::mkdir(path.c_str(), mode) != 0) return Status::FromErrno(path + ": mkdir", errno);
    return Status::OK();
  }

  Status Unlink(const std::string& path) override {
    if (::unlink(path.c_str()) != 0) return Status::FromErrno(path + ": unlink", errno);
    return Status::OK();
  }

  Status Rmdir(const std::string& path) override {
    if (::rmdir(path.c_str()) != 0) return Status::FromErrno(path + ": rmdir", errno);
    return Status::OK();
  }

  Result<std::vector<std::string>> ListDir(const std::string& dir) override {
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) {
      if (errno == ENOENT || errno == ENOTDIR) return Missing(dir, errno);
      return Status::FromErrno(dir + ": opendir", errno);
    }
    std::vector<std::string> names;
    errno = 0;
    while (const dirent* e = ::readdir(d)) {
      if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) {
        names.emplace_back(e->d_name);
      }
      errno = 0;
    }
    const int err = errno;
    ::closedir(d);
    if (err != 0) return Status::FromErrno(dir + ": readdir", err);
    return names;
  }

  Status RenameNoReplace(const std::string& from, const std::string& to) override {
#if defined(__APPLE__)  // macOS 10.12+: renamex_np(RENAME_EXCL) is its renameat2(RENAME_NOREPLACE)
    if (::renamex_np(from.c_str(), to.c_str(), RENAME_EXCL) == 0) return Status::OK();
#else
    if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_NOREPLACE) == 0) {
      return Status::OK();
    }
#endif
    const int err = errno;
    if (err == EEXIST || err == ENOTEMPTY) return Status::AlreadyExists(to + ": already exists");
    return Status::FromErrno(from + " -> " + to + ": rename", err);
  }
};

}  // namespace

Env* Env::Default() {
  static Env* const env = new PosixEnv();  // never destroyed: usable during exit
  return env;
}

}  // namespace loaderx
