// UniqueFd, MappedRegion and OpenFile on Linux and macOS (loaderx/fd.h).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "loaderx/fd.h"

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

Status MappedRegion::AdviseHugePages() {
  if (data_ == nullptr) return Status::OK();
#if defined(MADV_HUGEPAGE)  // Linux; macOS has no transparent huge pages
  if (::madvise(data_, size_, MADV_HUGEPAGE) != 0) return Status::FromErrno("madvise", errno);
#endif
  return Status::OK();
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

}  // namespace loaderx
