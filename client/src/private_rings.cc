#include "private_rings.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>

namespace loaderx::client {

uint64_t PrivateRings::PageBytes() {
  static const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  return page;
}

PrivateRings::PageRange PrivateRings::PagesOf(uint64_t offset, uint64_t bytes) {
  const uint64_t page = PageBytes();
  const uint64_t first = offset / page * page;
  const uint64_t end = (offset + std::max<uint64_t>(bytes, 1) + page - 1) / page * page;
  return PageRange{first, end};
}

void PrivateRings::Attach(int ring_fd, uint64_t ring_bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  ring_fd_ = ring_fd;
  ring_bytes_ = ring_bytes;
  const int fd = ::open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) pagemap_ = UniqueFd(fd);
}

bool PrivateRings::DropCopiesLocked(uint8_t* begin, uint64_t bytes) {
  // pagemap entry bits (Documentation/admin-guide/mm/pagemap.rst): 63 present,
  // 62 swapped, 61 a file page or shared anonymous page. In a private mapping
  // of the ring a page that is present or swapped and not a file page is a
  // copy made by a write.
  constexpr uint64_t kPresent = uint64_t{1} << 63, kSwapped = uint64_t{1} << 62;
  constexpr uint64_t kFilePage = uint64_t{1} << 61;
  const uint64_t page = PageBytes();
  const uint64_t n = bytes / page;
  const auto whole = [&] { return ::madvise(begin, bytes, MADV_DONTNEED) == 0; };
  if (!pagemap_.valid()) return whole();
  entries_.resize(n);
  const auto at = static_cast<off_t>(reinterpret_cast<uintptr_t>(begin) / page * sizeof(uint64_t));
  const ssize_t got = ::pread(pagemap_.get(), entries_.data(), n * sizeof(uint64_t), at);
  if (got != static_cast<ssize_t>(n * sizeof(uint64_t))) return whole();
  const auto copy = [&](uint64_t k) {
    return (entries_[k] & (kPresent | kSwapped)) != 0 && (entries_[k] & kFilePage) == 0;
  };
  for (uint64_t k = 0; k < n;) {
    if (!copy(k)) {
      ++k;
      continue;
    }
    uint64_t e = k + 1;
    while (e < n && copy(e)) ++e;
    if (::madvise(begin + k * page, (e - k) * page, MADV_DONTNEED) != 0) return false;
    k = e;
  }
  return true;
}

Result<PrivateRings::Pages> PrivateRings::Acquire(uint64_t offset, uint64_t bytes) {
  const uint64_t page = PageBytes();
  const PageRange pages = PagesOf(offset, bytes);
  const uint64_t first = pages.first, end = pages.end;
  std::lock_guard<std::mutex> lock(mu_);
  if (broken_ || ring_fd_ < 0 || end > (ring_bytes_ + page - 1) / page * page) return Pages{};
  for (uint32_t i = 0; i < kCount; ++i) {
    Mapping& r = rings_[i];
    const bool taken = std::any_of(r.views.begin(), r.views.end(), [&](const auto& v) {
      return v.first < end && first < v.second;
    });
    if (taken) continue;
    if (r.map.size() == 0) {
      LX_ASSIGN_OR_RETURN(r.map, MappedRegion::MapPrivate(ring_fd_, ring_bytes_, 0));
    }
    r.views.emplace_back(first, end);
    return Pages{r.map.mutable_data() + offset, i, pages};
  }
  return Pages{};
}

void PrivateRings::Release(uint32_t ring, uint64_t first, uint64_t end) {
  std::lock_guard<std::mutex> lock(mu_);
  if (ring >= kCount) return;
  Mapping& r = rings_[ring];
  auto it = std::find(r.views.begin(), r.views.end(), std::make_pair(first, end));
  if (it == r.views.end()) return;
  *it = r.views.back();
  r.views.pop_back();
  if (!DropCopiesLocked(r.map.mutable_data() + first, end - first)) broken_ = true;
}

}  // namespace loaderx::client
