// The shared-memory batch ring: byte layout of one loaderxd session's memfd.
//
// One ring per open loader. The daemon creates it (memfd.h), maps it
// read-write, seals it and passes the fd to the client, which maps it
// READ-ONLY. Only the daemon ever writes into the ring, so every shared word
// has exactly one writer; the client reports releases over the socket, never
// through shared memory. There are no locks, condition variables or
// pointers in here: a crash on either side can leave nothing
// locked, and every position is an offset from the start of the ring.
//
//   offset 0                +---------------------------------------------+
//                           | RingHeader (64 B, padded to kRingHeaderBytes)|
//                           |  magic "LXRING\0\1", version, geometry,     |
//                           |  daemon incarnation, session id             |
//   slot_table_offset       +---------------------------------------------+
//   (= kRingHeaderBytes)    | SlotEntry[0]     64 B, one cache line each   |
//                           | SlotEntry[1]     seq | step | offset | bytes |
//                           |                  | publish_ns | reserved[3]  |
//                           | ...                                          |
//                           | SlotEntry[slot_count - 1]                    |
//   payload_offset          +---------------------------------------------+
//   (page aligned)          | payload: batches, each at a 64-byte aligned |
//                           | offset, laid out exactly as loader.h draws  |
//                           | a batch (dense values, ragged values,       |
//                           | shapes, offsets).                            |
//   total_bytes             +---------------------------------------------+
//
// Slot life cycle (daemon side): a slot is taken when the pipeline allocates
// payload for a step; when the batch is complete the daemon writes step,
// offset, bytes and the publish time (publish_ns), then stores a new, never reused sequence number
// with release ordering, then sends the client a "batch" message naming (slot, seq). The sequence
// number is the slot's epoch: a release naming an old seq (a stale or duplicated release, a forked
// child's release) is ignored, and a client that checks `seq` before building views can never
// mistake a recycled slot for the batch it was told about.
//
// Versions: 1.0 had no stamp (publish_ns was reserved, always 0). 1.1 stamps
// every publish with CLOCK_MONOTONIC nanoseconds, a system-wide clock, so a
// client can measure the hand-off (publish -> holding the arrays) against
// its own clock_gettime. A 1.1 client accepts a 1.0 ring (stamp reported as
// 0); in a 1.1 ring a published slot without a stamp, or stamped later than
// the client's "now", is refused as inconsistent.
//
// Thread-safety: the layout is plain data; see the ordering notes on
// SlotEntry::seq. Ownership: functions here never own the mapping.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "loaderx/loader.h"  // kBatchAlignment: batches keep the loader's alignment
#include "loaderx/status.h"

namespace loaderx {

inline constexpr uint64_t kRingMagic = 0x0100474E4952584CULL;  // "LXRING\0\1" LE
inline constexpr uint16_t kRingVersionMajor = 1;
inline constexpr uint16_t kRingVersionMinor = 1;  // 1.1: SlotEntry::publish_ns
inline constexpr uint64_t kRingHeaderBytes = 4096;
inline constexpr uint64_t kRingPageBytes = 4096;
inline constexpr uint32_t kMaxRingSlots = 4096;

struct RingHeader {
  uint64_t magic;          // kRingMagic
  uint16_t version_major;  // kRingVersionMajor; a client refuses another major
  uint16_t version_minor;
  uint32_t slot_count;         // entries in the slot table, 1..kMaxRingSlots
  uint64_t slot_table_offset;  // == kRingHeaderBytes
  uint64_t payload_offset;     // page aligned, after the slot table
  uint64_t payload_bytes;      // multiple of kRingPageBytes
  uint64_t total_bytes;        // == payload_offset + payload_bytes == memfd size
  uint64_t incarnation;        // random per daemon start (liveness / restarts)
  uint64_t session;            // the daemon's id of the owning session
};
static_assert(std::is_standard_layout_v<RingHeader>);
static_assert(sizeof(RingHeader) == 64);
static_assert(offsetof(RingHeader, slot_count) == 12);
static_assert(offsetof(RingHeader, session) == 56);
static_assert(sizeof(RingHeader) <= kRingHeaderBytes);
static_assert(kRingPageBytes % kBatchAlignment == 0, "payload start keeps batch alignment");

struct alignas(64) SlotEntry {
  // Epoch of the batch now in this slot; 0 = never published. Written by the
  // daemon with memory_order_release AFTER step/offset/bytes and the batch
  // bytes; a reader that loads it with acquire and sees the value it was told
  // may read those fields and the batch. (The socket message that announces
  // it is itself a full barrier; the atomic documents and enforces the rule.)
  std::atomic<uint64_t> seq;
  uint64_t step;    // sampler step of the batch
  uint64_t offset;  // from the start of the ring, 64-byte aligned, inside payload
  uint64_t bytes;   // BatchLayout::total_bytes
  // CLOCK_MONOTONIC ns when the daemon published this seq (layout 1.1;
  // written before `seq` like the fields above). Never 0 once published.
  uint64_t publish_ns;
  uint64_t reserved[3];
};
static_assert(std::atomic<uint64_t>::is_always_lock_free,
              "slot epochs must be lock-free to live in shared memory");
static_assert(std::is_standard_layout_v<SlotEntry>);
static_assert(sizeof(SlotEntry) == 64);
static_assert(offsetof(SlotEntry, step) == 8);
static_assert(offsetof(SlotEntry, offset) == 16);
static_assert(offsetof(SlotEntry, bytes) == 24);
static_assert(offsetof(SlotEntry, publish_ns) == 32);

// CLOCK_MONOTONIC in nanoseconds: the clock of SlotEntry::publish_ns. The
// same clock in every process of the machine (Python: time.monotonic_ns()).
uint64_t MonotonicNowNs();

// Where everything is in a ring of `slot_count` slots and at least
// `min_payload_bytes` of payload.
struct RingGeometry {
  uint32_t slot_count = 0;
  uint64_t slot_table_offset = 0;
  uint64_t payload_offset = 0;
  uint64_t payload_bytes = 0;
  uint64_t total_bytes = 0;

  static Result<RingGeometry> Compute(uint32_t slot_count, uint64_t min_payload_bytes);
};

// Daemon: writes the header and zeroes the slot table of a fresh ring.
// REQUIRES: `base` maps geometry.total_bytes writable bytes.
void InitRing(uint8_t* base, const RingGeometry& geometry, uint64_t incarnation, uint64_t session);

// Client: validates the header of a mapped ring of `size` bytes (magic,
// major version, every offset in bounds) and returns its geometry.
// Protocol error naming the first bad field otherwise.
Result<RingGeometry> ValidateRing(const uint8_t* base, uint64_t size);

inline SlotEntry* SlotAt(uint8_t* base, const RingGeometry& g, uint32_t slot) {
  return reinterpret_cast<SlotEntry*>(base + g.slot_table_offset) + slot;
}
inline const SlotEntry* SlotAt(const uint8_t* base, const RingGeometry& g, uint32_t slot) {
  return reinterpret_cast<const SlotEntry*>(base + g.slot_table_offset) + slot;
}

// Daemon: publishes a finished batch in `slot` (fields and the publish_ns
// stamp of MonotonicNowNs(), then seq with release).
void PublishSlot(uint8_t* base, const RingGeometry& g, uint32_t slot, uint64_t seq, uint64_t step,
                 uint64_t offset, uint64_t bytes);

// Client: checks that the announced (slot, seq, step, offset, bytes) is what
// the slot table holds and lies inside the payload, and (ring layout >= 1.1)
// that the slot carries a publish stamp no later than now. Protocol error
// otherwise. On success `*publish_ns` (if given) is the slot's stamp, 0 for
// a 1.0 ring.
Status CheckSlot(const uint8_t* base, const RingGeometry& g, uint32_t slot, uint64_t seq,
                 uint64_t step, uint64_t offset, uint64_t bytes, uint64_t* publish_ns = nullptr);

}  // namespace loaderx
