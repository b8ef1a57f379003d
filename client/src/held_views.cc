#include "held_views.h"

#include <atomic>
#include <cstdint>

#include "private_rings.h"

namespace loaderx::client {
namespace {

// Writes every page of [begin, end) with the value it holds (a CAS that
// succeeds, so a concurrent writer's bytes stay theirs): each page of a
// private file mapping becomes an anonymous copy, no longer the file's.
void CopyPagesOut(uint8_t* begin, uint8_t* end) {
  const auto page = static_cast<uintptr_t>(PrivateRings::PageBytes());
  for (uintptr_t p = reinterpret_cast<uintptr_t>(begin) & ~(page - 1);
       p < reinterpret_cast<uintptr_t>(end); p += page) {
    std::atomic_ref<uint64_t> word(*reinterpret_cast<uint64_t*>(p));
    uint64_t v = word.load(std::memory_order_relaxed);
    while (!word.compare_exchange_weak(v, v, std::memory_order_relaxed)) {
    }
  }
}

}  // namespace

void HeldViews::List(Lease* lease) {
  std::lock_guard<std::mutex> lock(mu_);
  lease->view_prev_ = tail_;
  lease->view_next_ = nullptr;
  (tail_ != nullptr ? tail_->view_next_ : head_) = lease;
  tail_ = lease;
  lease->listed_ = true;
}

void HeldViews::Unlink(Lease* lease) {
  (lease->view_prev_ != nullptr ? lease->view_prev_->view_next_ : head_) = lease->view_next_;
  (lease->view_next_ != nullptr ? lease->view_next_->view_prev_ : tail_) = lease->view_prev_;
  lease->view_prev_ = lease->view_next_ = nullptr;
  lease->listed_ = false;
}

void HeldViews::Unlist(Lease* lease) {
  std::lock_guard<std::mutex> lock(mu_);
  if (lease->listed_) Unlink(lease);
}

bool HeldViews::MoveOutOldest(const std::function<void(Lease*)>& give_back) {
  std::lock_guard<std::mutex> lock(mu_);
  Lease* lease = head_;
  if (lease == nullptr) return false;
  Unlink(lease);
  // The view's extent: its own mapping, or its pages of a private ring.
  uint8_t* begin = lease->copy_.mutable_data();
  uint8_t* end = begin + lease->copy_.size();
  if (lease->copy_.size() == 0) {
    // base_ - offset_ is the private mapping's ring byte 0; the view's
    // pages may start before base_ (its first page) or after it (a shard
    // member's rows start past the node batch's first byte).
    begin = const_cast<uint8_t*>(lease->base_) - lease->offset_ + lease->ring_pages_.first;
    end = begin + (lease->ring_pages_.second - lease->ring_pages_.first);
  }
  CopyPagesOut(begin, end);
  lease->moved_out_.store(true, std::memory_order_release);
  give_back(lease);
  return true;
}

}  // namespace loaderx::client
