// LeaseLedger: the batches one session's client holds (docs/protocol.md
// "Leases"), iceoryx-style: the daemon's record of every slot it pushed to
// the client and the client has not released, so that whatever way the
// client ends (close, hang-up, SIGKILL, fork-child exit) the daemon gives
// back exactly what it held.
//
// A lease is a (slot, seq) pair and the ring memory it keeps alive. A member
// may be pushed the same (slot, seq) twice (it sought back to a step its
// group still holds): one lease, counted twice, freed when both deliveries
// are released. A release whose seq does not match what the session holds
// for that slot (stale, duplicated or forged) changes nothing.
//
// The ledger also keeps, oldest first, the batches pushed in the current
// generation that the caller has not taken yet (its `consumed` position is
// below them): a `close` drops those, since the client forgets its queued
// batches without releasing them.
//
// Ring memory is always freed outside the ledger's lock.
// Thread-safety: all methods are thread-safe (one mutex, taken after the
// session's own).
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>

#include "loaderx/loader.h"

namespace loaderx::daemon {

class LeaseLedger {
 public:
  // One more delivery of (slot, seq), pushed as step `step` of generation
  // `gen`. Recorded before the batch leaves, so its release cannot be early.
  void Add(uint64_t gen, uint64_t step, uint32_t slot, uint64_t seq,
           std::shared_ptr<BatchMemory> memory);
  // The client released one delivery of (slot, seq); false if the session
  // holds no such lease (nothing changed).
  bool Release(uint32_t slot, uint64_t seq);
  // The caller takes `step` of `gen` next: the batches before it are no
  // longer unread.
  void Taken(uint64_t gen, uint64_t step);
  // A seek was accepted: the unread batches are of an older generation, the
  // client's to release unread.
  void ForgetUnread();
  // A `close`: drops the deliveries pushed and not taken; returns how many.
  uint32_t DropUnread();
  // The client is gone: drops every lease; returns how many deliveries.
  uint32_t DropAll();

  // Deliveries held (pushed, not released).
  uint32_t held() const;

 private:
  struct Lease {
    uint64_t seq = 0;
    std::shared_ptr<BatchMemory> memory;
    uint32_t count = 0;  // deliveries of this (slot, seq) not yet released
  };
  struct Unread {
    uint64_t gen = 0;
    uint64_t step = 0;
    uint32_t slot = 0;
    uint64_t seq = 0;
  };

  mutable std::mutex mu_;
  std::map<uint32_t, Lease> leases_;  // slot -> lease; guarded by mu_
  uint32_t held_ = 0;                 // sum of the leases' counts; guarded by mu_
  std::deque<Unread> unread_;         // oldest first; guarded by mu_
};

}  // namespace loaderx::daemon
