#include "accounts.h"

#include <string>
#include <utility>

namespace loaderx::daemon {

Accounts::Accounts(const Config& config)
    : sessions_per_uid_(config.sessions_per_uid),
      memory_per_uid_(config.memory_per_uid),
      memory_limit_(config.memory_limit) {}

Status Accounts::AddSession(uint32_t uid) {
  std::lock_guard<std::mutex> lock(mu_);
  Usage& a = uids_[uid];
  if (a.sessions >= sessions_per_uid_) {
    return Status::ResourceExhausted(
        "uid " + std::to_string(uid) + " already has " + std::to_string(a.sessions) +
        " loaderxd sessions (cap --sessions-per-uid=" + std::to_string(sessions_per_uid_) + ")");
  }
  ++a.sessions;
  ++sessions_;
  return Status::OK();
}

void Accounts::RemoveSession(uint32_t uid) {
  std::lock_guard<std::mutex> lock(mu_);
  --uids_[uid].sessions;
  --sessions_;
}

RingCharge::RingCharge(RingCharge&& other) noexcept
    : accounts_(std::exchange(other.accounts_, nullptr)), uid_(other.uid_), bytes_(other.bytes_) {}

RingCharge& RingCharge::operator=(RingCharge&& other) noexcept {
  if (this != &other) {
    Reset();
    accounts_ = std::exchange(other.accounts_, nullptr);
    uid_ = other.uid_;
    bytes_ = other.bytes_;
  }
  return *this;
}

void RingCharge::Reset() {
  if (Accounts* a = std::exchange(accounts_, nullptr)) a->ReleaseRing(uid_, bytes_);
}

Result<RingCharge> Accounts::ChargeRing(uint32_t uid, uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  Usage& a = uids_[uid];
  if (a.ring_bytes + bytes > memory_per_uid_) {
    return Status::ResourceExhausted("a ring of " + std::to_string(bytes) +
                                     " bytes would exceed the per-uid ring memory cap (uid " +
                                     std::to_string(uid) + " holds " +
                                     std::to_string(a.ring_bytes) + " of " +
                                     std::to_string(memory_per_uid_) + " bytes, --memory-per-uid)");
  }
  if (ring_bytes_ + bytes > memory_limit_) {
    return Status::ResourceExhausted(
        "a ring of " + std::to_string(bytes) + " bytes would exceed loaderxd's memory limit (" +
        std::to_string(ring_bytes_) + " of " + std::to_string(memory_limit_) +
        " bytes in use, --memory-limit)");
  }
  a.ring_bytes += bytes;
  ring_bytes_ += bytes;
  return RingCharge(this, uid, bytes);
}

void Accounts::ReleaseRing(uint32_t uid, uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  uids_[uid].ring_bytes -= bytes;
  ring_bytes_ -= bytes;
}

Accounts::Snapshot Accounts::Read(uint32_t uid, bool all_uids) const {
  std::lock_guard<std::mutex> lock(mu_);
  Snapshot s;
  s.sessions = sessions_;
  s.ring_bytes = ring_bytes_;
  auto it = uids_.find(uid);
  if (it != uids_.end()) s.mine = it->second;
  if (all_uids) s.uids = uids_;
  return s;
}

}  // namespace loaderx::daemon
