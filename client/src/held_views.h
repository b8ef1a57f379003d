// HeldViews: the batches this process holds as private (copy-on-write)
// views of its loader's ring, oldest first, and the move that takes the
// oldest one out of the ring when the caller holds its whole lease count.
//
// A move writes every page of the view in place with the value it holds (an
// atomic compare-and-swap, so a concurrent write by the user is neither lost
// nor torn): the kernel then copies each page of the private mapping into
// anonymous memory, no longer the ring's. The batch keeps its address and
// contents; only then is its slot given back (the caller's `give_back`, run
// under the lock, so a lease being destroyed waits for a move of it under
// way).
//
// Thread-safety: every method may be called from any thread (one mutex).
#pragma once

#include <functional>
#include <mutex>

#include "loaderx/client.h"

namespace loaderx::client {

class HeldViews {
 public:
  HeldViews() = default;
  HeldViews(const HeldViews&) = delete;
  HeldViews& operator=(const HeldViews&) = delete;

  // Lists `lease` (a private view) as the newest.
  void List(Lease* lease);
  // Unlists `lease` if listed (~Lease); waits for a move of it under way.
  void Unlist(Lease* lease);
  // Moves the oldest listed view out of the ring, marks it moved out and
  // calls `give_back(lease)`: false if none is listed.
  bool MoveOutOldest(const std::function<void(Lease*)>& give_back);

 private:
  void Unlink(Lease* lease);  // REQUIRES mu_, lease listed

  std::mutex mu_;
  Lease* head_ = nullptr;
  Lease* tail_ = nullptr;
};

}  // namespace loaderx::client
