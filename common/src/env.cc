// The POSIX Env and the helpers every Env shares (loaderx/env.h).
#include "loaderx/env.h"

#include <dirent.h>
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
    if (::fdatasync(fd) != 0) return Status::FromErrno("fdatasync", errno);
    return Status::OK();
  }

  Status Sync(int fd) override {
    if (::fsync(fd) != 0) return Status::FromErrno("fsync", errno);
    return Status::OK();
  }

  void StartWriteback(int fd, uint64_t offset, uint64_t len) override {
    ::sync_file_range(fd, static_cast<off_t>(offset), static_cast<off_t>(len),
                      SYNC_FILE_RANGE_WRITE);
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
    if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_NOREPLACE) == 0) {
      return Status::OK();
    }
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

Status PWriteAll(Env& env, int fd, const void* data, size_t len, uint64_t offset,
                 const std::string& what) {
  const char* p = static_cast<const char*>(data);
  while (len > 0) {
    Result<size_t> n = env.PWrite(fd, p, len, offset);
    if (!n.ok()) return n.status().WithContext(what);
    if (*n == 0) return Status::IOError(what + ": pwrite wrote nothing");
    p += *n;
    len -= *n;
    offset += *n;
  }
  return Status::OK();
}

Status PWriteVAll(Env& env, int fd, const struct iovec* iov, int iovcnt, uint64_t offset,
                  const std::string& what) {
  // A copy of the list, advanced past what each short write wrote.
  std::vector<struct iovec> left(iov, iov + iovcnt);
  size_t first = 0;
  while (first < left.size() && left[first].iov_len == 0) ++first;
  while (first < left.size()) {
    Result<size_t> n =
        env.PWriteV(fd, left.data() + first, static_cast<int>(left.size() - first), offset);
    if (!n.ok()) return n.status().WithContext(what);
    if (*n == 0) return Status::IOError(what + ": pwritev wrote nothing");
    offset += *n;
    for (size_t done = *n; done > 0 && first < left.size();) {
      const size_t take = std::min(done, left[first].iov_len);
      left[first].iov_base = static_cast<char*>(left[first].iov_base) + take;
      left[first].iov_len -= take;
      done -= take;
      if (left[first].iov_len == 0) ++first;
    }
    while (first < left.size() && left[first].iov_len == 0) ++first;
  }
  return Status::OK();
}

Status PReadAll(Env& env, int fd, void* data, size_t len, uint64_t offset,
                const std::string& what) {
  char* p = static_cast<char*>(data);
  while (len > 0) {
    Result<size_t> n = env.PRead(fd, p, len, offset);
    if (!n.ok()) return n.status().WithContext(what);
    if (*n == 0) return Status::Corruption(what + ": truncated (short read)");
    p += *n;
    len -= *n;
    offset += *n;
  }
  return Status::OK();
}

Result<uint64_t> FileSize(Env& env, int fd, const std::string& what) {
  struct stat st;
  Status s = env.Stat(fd, &st);
  if (!s.ok()) return s.WithContext(what);
  return static_cast<uint64_t>(st.st_size);
}

Status SyncDir(Env& env, const std::string& dir) {
  LX_ASSIGN_OR_RETURN(UniqueFd fd, env.Open(dir, O_RDONLY | O_DIRECTORY, 0));
  Status s = env.Sync(fd.get());
  if (!s.ok()) return s.WithContext(dir);
  return Status::OK();
}

Status CreateDirs(Env& env, const std::string& dir) {
  struct stat st;
  Status s = env.StatPath(dir, /*follow=*/true, &st);
  if (s.ok()) {
    if (S_ISDIR(st.st_mode)) return Status::OK();
    return Status::AlreadyExists(dir + ": exists and is not a directory");
  }
  if (s.code() != Status::Code::kNotFound) return s;
  const size_t end = dir.find_last_not_of('/');  // "a/b/" names "a/b"
  const size_t slash = end == std::string::npos ? std::string::npos : dir.rfind('/', end);
  if (slash != std::string::npos && slash > 0) {
    LX_RETURN_IF_ERROR(CreateDirs(env, dir.substr(0, slash)));
  }
  s = env.Mkdir(dir, 0755);
  if (s.code() == Status::Code::kAlreadyExists) {  // made meanwhile by someone else
    if (env.StatPath(dir, true, &st).ok() && S_ISDIR(st.st_mode)) return Status::OK();
  }
  return s;
}

Status RemoveTree(Env& env, const std::string& path) {
  struct stat st;
  Status s = env.StatPath(path, /*follow=*/false, &st);
  if (s.code() == Status::Code::kNotFound) return Status::OK();
  LX_RETURN_IF_ERROR(s);
  if (!S_ISDIR(st.st_mode)) return env.Unlink(path);
  Status first;
  Result<std::vector<std::string>> names = env.ListDir(path);
  if (!names.ok()) {
    first = names.status();
  } else {
    for (const std::string& n : *names) {
      Status c = RemoveTree(env, std::string(path).append("/").append(n));
      if (first.ok() && !c.ok()) first = std::move(c);
    }
  }
  s = env.Rmdir(path);
  if (first.ok()) first = std::move(s);
  return first;
}

}  // namespace loaderx
