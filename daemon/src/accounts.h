// Accounts: what each uid may hold in loaderxd, and what it holds now
// (docs/daemon.md "Limits and security").
//
// Two things are charged per uid: sessions (connections past their hello,
// capped by --sessions-per-uid) and ring memory (the bytes of the rings of
// the groups the uid's loaders created, capped by --memory-per-uid and, over
// all uids, by --memory-limit). A charge that would exceed a cap is refused
// with ResourceExhausted naming the cap, the uid and what it holds, and
// changes nothing.
//
// A ring's charge is a RingCharge handle that the ring itself owns
// (ring_allocator.h): it is taken before the ring is made and given back
// when the ring is destroyed, i.e. when its group has closed (last member
// gone) and the last lease of one of its batches is released or dropped, in
// whatever order those happen. No other path releases ring memory, so none
// can leak or double-release it.
//
// Thread-safety: all methods are thread-safe (one mutex).
// Ownership: the Accounts must outlive every charge taken from it.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

#include "config.h"
#include "loaderx/status.h"

namespace loaderx::daemon {

class Accounts;

// `bytes` of ring memory charged to `uid`, given back exactly once: when the
// handle is destroyed or Reset(). Move-only; a default-constructed or
// moved-from handle holds nothing.
class RingCharge {
 public:
  RingCharge() = default;
  ~RingCharge() { Reset(); }
  RingCharge(RingCharge&& other) noexcept;
  RingCharge& operator=(RingCharge&& other) noexcept;
  RingCharge(const RingCharge&) = delete;
  RingCharge& operator=(const RingCharge&) = delete;

  // Gives the bytes back now; the handle then holds nothing.
  void Reset();
  uint32_t uid() const { return uid_; }
  uint64_t bytes() const { return bytes_; }

 private:
  friend class Accounts;
  RingCharge(Accounts* accounts, uint32_t uid, uint64_t bytes)
      : accounts_(accounts), uid_(uid), bytes_(bytes) {}

  Accounts* accounts_ = nullptr;  // null: holds nothing
  uint32_t uid_ = 0;
  uint64_t bytes_ = 0;
};

class Accounts {
 public:
  // What one uid holds.
  struct Usage {
    uint64_t sessions = 0;
    uint64_t ring_bytes = 0;
  };
  // A consistent picture for stats: the totals, and `uid`'s own usage.
  struct Snapshot {
    uint64_t sessions = 0;
    uint64_t ring_bytes = 0;
    Usage mine;
    std::map<uint32_t, Usage> uids;  // every uid seen (only if asked for)
  };

  // The caps are config's sessions_per_uid, memory_per_uid and memory_limit.
  explicit Accounts(const Config& config);
  Accounts(const Accounts&) = delete;
  Accounts& operator=(const Accounts&) = delete;

  // One more session of `uid`; ResourceExhausted at its cap.
  Status AddSession(uint32_t uid);
  // REQUIRES: a matching AddSession succeeded.
  void RemoveSession(uint32_t uid);
  // `bytes` more ring memory for `uid`, held until the charge goes;
  // ResourceExhausted past the per-uid cap or the daemon's limit.
  Result<RingCharge> ChargeRing(uint32_t uid, uint64_t bytes);

  // With `all_uids`, also every uid's usage (the status document).
  Snapshot Read(uint32_t uid, bool all_uids) const;

 private:
  friend class RingCharge;
  void ReleaseRing(uint32_t uid, uint64_t bytes);

  const uint64_t sessions_per_uid_;
  const uint64_t memory_per_uid_;
  const uint64_t memory_limit_;

  mutable std::mutex mu_;
  std::map<uint32_t, Usage> uids_;  // guarded by mu_
  uint64_t sessions_ = 0;           // guarded by mu_
  uint64_t ring_bytes_ = 0;         // guarded by mu_
};

}  // namespace loaderx::daemon
