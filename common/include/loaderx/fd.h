// RAII owners of kernel resources: file descriptors and memory mappings.
//
// No raw close()/munmap() outside these classes. Both are move-only; moving
// leaves the source empty. Thread-safety: none (own one from one thread).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "loaderx/status.h"

namespace loaderx {

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() { Reset(); }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  UniqueFd(UniqueFd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) {
      Reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int Release() { return std::exchange(fd_, -1); }
  void Reset(int fd = -1);
  // dup(2) with O_CLOEXEC.
  Result<UniqueFd> Dup() const;

 private:
  int fd_ = -1;
};

// A read-only or read-write mapping of (part of) a file. An empty region
// (length 0) is valid and maps nothing.
class MappedRegion {
 public:
  MappedRegion() = default;
  ~MappedRegion() { Reset(); }
  MappedRegion(const MappedRegion&) = delete;
  MappedRegion& operator=(const MappedRegion&) = delete;
  MappedRegion(MappedRegion&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  MappedRegion& operator=(MappedRegion&& o) noexcept {
    if (this != &o) {
      Reset();
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }

  // Maps `length` bytes of `fd` from `offset` (page aligned). `writable`
  // selects PROT_READ|PROT_WRITE with MAP_SHARED.
  static Result<MappedRegion> Map(int fd, size_t length, off_t offset = 0, bool writable = false);
  // A private copy-on-write mapping (PROT_READ|PROT_WRITE, MAP_PRIVATE):
  // reads see the file's pages, the first write to a page copies it for
  // this mapping alone. Linux also shows later writes to the file through
  // pages not yet written here, so only map ranges nobody else writes while
  // the mapping lives.
  static Result<MappedRegion> MapPrivate(int fd, size_t length, off_t offset);

  // madvise(MADV_HUGEPAGE) on the whole region: faults on pages not in the
  // page cache read whole 2 MiB folios, mapped with 2 MiB pages. A hint.
  Status AdviseHugePages();

  const uint8_t* data() const { return static_cast<const uint8_t*>(data_); }
  uint8_t* mutable_data() { return static_cast<uint8_t*>(data_); }
  size_t size() const { return size_; }
  void Reset();

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
};

// Opens `path` with `flags` (O_CLOEXEC added).
Result<UniqueFd> OpenFile(const std::string& path, int flags, mode_t mode = 0644);
// The reads and writes of store files go through an Env (loaderx/env.h).

}  // namespace loaderx
