#include "payload_allocator.h"

#include <cassert>
#include <iterator>

namespace loaderx::daemon {

PayloadAllocator::PayloadAllocator(uint64_t capacity, uint64_t alignment)
    : capacity_(capacity), alignment_(alignment) {
  assert(capacity > 0 && alignment > 0 && capacity % alignment == 0);
  free_.emplace(0, capacity);
}

uint64_t PayloadAllocator::Round(uint64_t bytes) const {
  if (bytes == 0) return alignment_;
  if (bytes > capacity_) return capacity_ + alignment_;  // never fits; no overflow
  return (bytes + alignment_ - 1) / alignment_ * alignment_;
}

std::optional<uint64_t> PayloadAllocator::Allocate(uint64_t bytes) {
  const uint64_t need = Round(bytes);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < need) continue;
    const uint64_t offset = it->first;
    const uint64_t rest = it->second - need;
    free_.erase(it);
    if (rest > 0) free_.emplace(offset + need, rest);
    live_.emplace(offset, need);
    used_ += need;
    return offset;
  }
  return std::nullopt;
}

void PayloadAllocator::Free(uint64_t offset) {
  auto live = live_.find(offset);
  assert(live != live_.end());
  if (live == live_.end()) return;
  uint64_t start = offset;
  uint64_t size = live->second;
  used_ -= size;
  live_.erase(live);
  auto next = free_.lower_bound(start);
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == start) {
      start = prev->first;
      size += prev->second;
      free_.erase(prev);
    }
  }
  if (next != free_.end() && start + size == next->first) {
    size += next->second;
    free_.erase(next);
  }
  free_.emplace(start, size);
}

}  // namespace loaderx::daemon
