#include "loaderx/fd.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

namespace loaderx {

void UniqueFd::Reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

Result<UniqueFd> UniqueFd::Dup() const {
  int d = ::fcntl(fd_, F_DUPFD_CLOEXEC, 0);
  if (d < 0) return Status::FromErrno("dup", errno);
  return UniqueFd(d);
}

Result<MappedRegion> MappedRegion::Map(int fd, size_t length, off_t offset, bool writable) {
  MappedRegion r;
  if (length == 0) return r;
  int prot = PROT_READ | (writable ? PROT_WRITE : 0);
  void* p = ::mmap(nullptr, length, prot, MAP_SHARED, fd, offset);
  if (p == MAP_FAILED) return Status::FromErrno("mmap", errno);
  r.data_ = p;
  r.size_ = length;
  return r;
}

Result<MappedRegion> MappedRegion::MapPrivate(int fd, size_t length, off_t offset) {
  MappedRegion r;
  if (length == 0) return r;
  void* p = ::mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, offset);
  if (p == MAP_FAILED) return Status::FromErrno("mmap(MAP_PRIVATE)", errno);
  r.data_ = p;
  r.size_ = length;
  return r;
}

void MappedRegion::Reset() {
  if (data_ != nullptr) ::munmap(data_, size_);
  data_ = nullptr;
  size_ = 0;
}

Result<UniqueFd> OpenFile(const std::string& path, int flags, mode_t mode) {
  int fd;
  do {
    fd = ::open(path.c_str(), flags | O_CLOEXEC, mode);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) return Status::FromErrno(path, errno);
  return UniqueFd(fd);
}

Result<uint64_t> FileSize(int fd) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return Status::FromErrno("fstat", errno);
  return static_cast<uint64_t>(st.st_size);
}

Status PWriteAll(int fd, const void* data, size_t len, uint64_t offset, const std::string& what) {
  const char* p = static_cast<const char*>(data);
  while (len > 0) {
    size_t chunk = len > (1u << 30) ? (1u << 30) : len;
    ssize_t n = ::pwrite(fd, p, chunk, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::FromErrno(what, errno);
    }
    p += n;
    len -= static_cast<size_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return Status::OK();
}

Status PReadAll(int fd, void* data, size_t len, uint64_t offset, const std::string& what) {
  char* p = static_cast<char*>(data);
  while (len > 0) {
    size_t chunk = len > (1u << 30) ? (1u << 30) : len;
    ssize_t n = ::pread(fd, p, chunk, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::FromErrno(what, errno);
    }
    if (n == 0) return Status::Corruption(what + ": truncated (short read)");
    p += n;
    len -= static_cast<size_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return Status::OK();
}

}  // namespace loaderx
