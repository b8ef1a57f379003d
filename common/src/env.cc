// The helpers every Env shares (loaderx/env.h). Each platform's Env is in
// env_posix.cc or env_win32.cc.
#include "loaderx/env.h"

#include <fcntl.h>

#include <algorithm>
#include <vector>

#include "loaderx/platform.h"

namespace loaderx {

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
