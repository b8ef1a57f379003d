#include "private_rings.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>

namespace loaderx::client {

namespace {

uint64_t PageBytes() {
  static const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  return page;
}

}  // namespace

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
  if (::madvise(r.map.mutable_data() + first, end - first, MADV_DONTNEED) != 0) broken_ = true;
}

}  // namespace loaderx::client
