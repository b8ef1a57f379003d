#include "lease_ledger.h"

#include <utility>
#include <vector>

namespace loaderx::daemon {

void LeaseLedger::Add(uint64_t gen, uint64_t step, uint32_t slot, uint64_t seq,
                      std::shared_ptr<BatchMemory> memory) {
  std::shared_ptr<BatchMemory> drop;  // a replaced lease's memory, freed outside mu_
  std::lock_guard<std::mutex> lock(mu_);
  Lease& lease = leases_[slot];
  if (lease.count != 0 && lease.seq == seq) {
    ++lease.count;
  } else {
    drop = std::exchange(lease.memory, std::move(memory));
    lease.seq = seq;
    lease.count = 1;
  }
  ++held_;
  unread_.push_back(Unread{gen, step, slot, seq});
}

bool LeaseLedger::Release(uint32_t slot, uint64_t seq) {
  std::shared_ptr<BatchMemory> drop;  // freed outside mu_
  std::lock_guard<std::mutex> lock(mu_);
  auto it = leases_.find(slot);
  // Stale, duplicated or forged: the epoch does not match what this
  // session holds, so the slot (maybe already reused) is left alone.
  if (it == leases_.end() || it->second.seq != seq) return false;
  if (--it->second.count == 0) {
    drop = std::move(it->second.memory);
    leases_.erase(it);
  }
  --held_;
  return true;
}

void LeaseLedger::Taken(uint64_t gen, uint64_t step) {
  std::lock_guard<std::mutex> lock(mu_);
  while (!unread_.empty() && unread_.front().gen == gen && unread_.front().step < step) {
    unread_.pop_front();
  }
}

void LeaseLedger::ForgetUnread() {
  std::lock_guard<std::mutex> lock(mu_);
  unread_.clear();
}

uint32_t LeaseLedger::DropUnread() {
  std::vector<std::shared_ptr<BatchMemory>> drop;  // freed outside mu_
  uint32_t dropped = 0;
  std::lock_guard<std::mutex> lock(mu_);
  for (const Unread& u : unread_) {
    auto it = leases_.find(u.slot);
    if (it == leases_.end() || it->second.seq != u.seq) continue;  // released meanwhile
    ++dropped;
    --held_;
    if (--it->second.count == 0) {
      drop.push_back(std::move(it->second.memory));
      leases_.erase(it);
    }
  }
  unread_.clear();
  return dropped;
}

uint32_t LeaseLedger::DropAll() {
  std::map<uint32_t, Lease> drop;  // freed outside mu_
  std::lock_guard<std::mutex> lock(mu_);
  drop.swap(leases_);
  unread_.clear();
  return std::exchange(held_, 0);
}

uint32_t LeaseLedger::held() const {
  std::lock_guard<std::mutex> lock(mu_);
  return held_;
}

}  // namespace loaderx::daemon
