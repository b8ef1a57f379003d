// PayloadAllocator: variable-size regions inside one ring's payload.
//
// Daemon-private bookkeeping of where each batch sits in the payload area
// (ring.h). Its state lives in daemon heap memory, NOT in the
// shared ring, so nothing a client maps can corrupt it. First fit over an
// ordered free list with coalescing; all offsets and sizes are multiples of
// `alignment`. When every batch has the same size (dense streams) holes are
// always whole batches, so a ring sized for K batches always fits K.
//
// Thread-safety: none; its owner, RingAllocator (ring_allocator.h), serialises
// access under its mutex.
#pragma once

#include <cstdint>
#include <map>
#include <optional>

namespace loaderx::daemon {

class PayloadAllocator {
 public:
  // Manages [0, capacity). REQUIRES: capacity and alignment > 0, capacity a
  // multiple of alignment.
  PayloadAllocator(uint64_t capacity, uint64_t alignment);

  // Offset of a free region of at least `bytes` (rounded up to the alignment;
  // a zero-byte request still takes one unit), or nullopt if none is free.
  std::optional<uint64_t> Allocate(uint64_t bytes);
  // Returns the region at `offset` to the free list. REQUIRES: `offset` came
  // from Allocate and was not freed since.
  void Free(uint64_t offset);

  uint64_t capacity() const { return capacity_; }
  uint64_t used() const { return used_; }
  // True if a region of `bytes` could ever fit (i.e. when everything is free).
  bool Fits(uint64_t bytes) const { return Round(bytes) <= capacity_; }

 private:
  uint64_t Round(uint64_t bytes) const;

  uint64_t capacity_;
  uint64_t alignment_;
  uint64_t used_ = 0;
  std::map<uint64_t, uint64_t> free_;  // offset -> size, coalesced
  std::map<uint64_t, uint64_t> live_;  // offset -> size
};

}  // namespace loaderx::daemon
