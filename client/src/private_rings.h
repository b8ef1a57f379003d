// PrivateRings: writable (copy-on-write) batch views of a loader's shared
// ring without a mapping per batch.
//
// Up to kCount private mappings (MAP_PRIVATE) of the whole ring, each made
// on first use. A view takes the first mapping in which none of its pages is
// covered by a live view (batches are 64-byte aligned, so neighbours share
// their end pages: a batch and the one next to it take different mappings).
// In a mapping, a page no live view covers holds no private copy (Release
// drops them), so a view reads the ring as published and its writes land in
// pages only it covers. When every mapping is taken at a view's pages,
// Acquire returns a null base and the caller maps the batch on its own.
//
// Thread-safety: every method may be called from any thread (one mutex).
// Ownership: the mappings are this object's; the ring fd is the caller's
// and must outlive it (Connection owns both).
#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <utility>
#include <vector>

#include "loaderx/fd.h"
#include "loaderx/status.h"

namespace loaderx::client {

class PrivateRings {
 public:
  static constexpr uint32_t kCount = 4;
  struct PageRange {
    uint64_t first = 0;  // page-aligned ring byte offsets
    uint64_t end = 0;
  };
  struct Pages {
    uint8_t* base = nullptr;  // the address of ring byte `offset`, or null
    uint32_t ring = 0;        // which mapping, for Release
    PageRange pages;          // PagesOf(offset, bytes)
  };

  // The page size views are made of (sysconf, read once).
  static uint64_t PageBytes();
  // The pages holding ring bytes [offset, offset + max(bytes, 1)).
  static PageRange PagesOf(uint64_t offset, uint64_t bytes);

  // The ring to map: its fd and size (once, before any Acquire).
  void Attach(int ring_fd, uint64_t ring_bytes);
  // A view of ring bytes [offset, offset + bytes) in a private mapping, or a
  // null base if every mapping is taken there.
  Result<Pages> Acquire(uint64_t offset, uint64_t bytes);
  // The view of [first, end) in mapping `ring` ended: its private copies
  // (pages the view wrote) are dropped (MADV_DONTNEED: the next read sees the
  // ring again). Pages it only read stay mapped: they are the ring's own
  // pages, so they show whatever the daemon writes there next, and the next
  // view of them reads without a page fault. Which pages are copies is read
  // from /proc/self/pagemap; without it every page of the view is dropped.
  // Call it before the release that lets the daemon reuse the bytes.
  void Release(uint32_t ring, uint64_t first, uint64_t end);

 private:
  struct Mapping {
    MappedRegion map;  // MAP_PRIVATE of the whole ring, made on first use
    // [first, end) page ranges of the live views through `map` (disjoint).
    std::vector<std::pair<uint64_t, uint64_t>> views;
  };
  std::mutex mu_;
  int ring_fd_ = -1;
  uint64_t ring_bytes_ = 0;
  std::array<Mapping, kCount> rings_;
  // /proc/self/pagemap (opened by Attach; invalid if it cannot be read) and
  // the entries of the view being released (reused).
  UniqueFd pagemap_;
  std::vector<uint64_t> entries_;
  // Drops the private copies among [begin, begin + bytes): false if a drop
  // failed. REQUIRES mu_.
  bool DropCopiesLocked(uint8_t* begin, uint64_t bytes);
  // A drop failed: pages may hold stale copies, so no new view uses the
  // private mappings any more (each batch gets a mapping of its own).
  bool broken_ = false;
};

}  // namespace loaderx::client
