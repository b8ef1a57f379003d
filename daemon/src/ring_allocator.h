// RingAllocator: the BatchAllocator that makes a Pipeline gather straight
// into a session's shared-memory ring (common/internal/loaderx/ring.h).
//
// One per open loader. Create() makes the memfd, maps it read-write, writes
// the header and applies the seals, so the fd handed to the client can only
// ever be mapped read-only. Allocate() takes a free slot and a payload region
// and returns a RingMemory whose destructor gives both back; it blocks while
// the ring is full (back-pressure: the pipeline never runs more than the ring
// ahead of the client) and returns Cancelled promptly after Cancel(). If the
// ring is full of published batches only (all at the client, so nothing on
// the daemon side can make room) it returns ResourceExhausted instead of
// waiting forever.
// Publish() stamps a finished batch into its slot with a fresh epoch. A
// batch published `retained` is still held by the daemon (a group keeps it
// for members that have not taken it yet, serving_group.h) until EndRetain(): while
// any live slot is retained, a full ring is not a stall, because the daemon
// side will free room once its slowest member moves on.
//
// The ring owns the charge of its memory to its uid (accounts.h): it is given
// back when the ring is destroyed, after the mapping, once the group that
// made it and every RingMemory of it (held batches, client leases) are gone.
//
// Thread-safety: all methods may be called from any thread (one mutex).
// Ownership: every RingMemory keeps the ring (and its mapping) alive.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "accounts.h"
#include "loaderx/fd.h"
#include "loaderx/loader.h"
#include "loaderx/ring.h"
#include "payload_allocator.h"

namespace loaderx::daemon {

class RingAllocator;

// One batch's region of a ring; returns slot and region on destruction.
class RingMemory final : public BatchMemory {
 public:
  RingMemory(std::shared_ptr<RingAllocator> ring, uint32_t slot, uint64_t offset, uint64_t size);
  ~RingMemory() override;
  RingMemory(const RingMemory&) = delete;
  RingMemory& operator=(const RingMemory&) = delete;
  uint8_t* data() override;
  uint64_t size() const override { return size_; }
  uint32_t slot() const { return slot_; }
  uint64_t ring_offset() const { return offset_; }  // from the ring start

 private:
  std::shared_ptr<RingAllocator> ring_;
  uint32_t slot_;
  uint64_t offset_;
  uint64_t size_;
};

class RingAllocator final : public BatchAllocator,
                            public std::enable_shared_from_this<RingAllocator> {
 public:
  // `charge` (empty: charges nothing) is held until the ring is destroyed.
  static Result<std::shared_ptr<RingAllocator>> Create(uint32_t slot_count, uint64_t payload_bytes,
                                                       uint64_t incarnation, uint64_t session,
                                                       RingCharge charge = RingCharge());
  ~RingAllocator() override = default;

  Result<std::shared_ptr<BatchMemory>> Allocate(uint64_t step, uint64_t bytes) override;
  void Cancel() override;

  // Writes step/offset/bytes of `memory` into its slot and a new epoch
  // (release). Returns the epoch (seq) to announce to the client.
  uint64_t Publish(const RingMemory& memory, uint64_t step, uint64_t bytes, bool retained = false);
  // The daemon no longer holds `slot` for anyone: from now on only client
  // leases keep it (see the header comment). No-op if not retained.
  void EndRetain(uint32_t slot);

  int fd() const { return fd_.get(); }
  const RingGeometry& geometry() const { return geometry_; }
  uint64_t bytes_in_use() const;
  uint32_t slots_in_use() const;
  // Called after every free of a slot, outside the ring's lock, on the
  // freeing thread (a client's release, a member's drop, a seek). REQUIRES:
  // called once, before any other thread can reach the ring (Free reads it
  // without the lock); a group's live bound (serving_group.cc) waits on it.
  void SetFreeHook(std::function<void()> hook);

 private:
  friend class RingMemory;
  RingAllocator(RingCharge charge, UniqueFd fd, MappedRegion map, const RingGeometry& g);
  void Free(uint32_t slot, uint64_t ring_offset);

  RingCharge charge_;  // first member: given back after the memory is unmapped
  const UniqueFd fd_;
  MappedRegion map_;  // read-write, daemon only
  const RingGeometry geometry_;

  mutable std::mutex mu_;
  std::condition_variable freed_cv_;  // a slot/region was freed, or cancelled
  // Guarded by mu_.
  PayloadAllocator payload_;
  std::vector<uint32_t> free_slots_;
  bool cancelled_ = false;
  // Slots whose batch was published and not freed; of those, the ones the
  // daemon still retains. client_held_ counts published && !retained: slots
  // only a client can free.
  std::vector<bool> published_;
  std::vector<bool> retained_;
  uint32_t client_held_ = 0;
  uint64_t next_seq_ = 1;            // epochs are never reused within a ring
  std::function<void()> free_hook_;  // set once before sharing (SetFreeHook)
};

}  // namespace loaderx::daemon
