#include "ring_allocator.h"

#include <string>

#include "loaderx/memfd.h"

namespace loaderx::daemon {

RingMemory::RingMemory(std::shared_ptr<RingAllocator> ring, uint32_t slot, uint64_t offset,
                       uint64_t size)
    : ring_(std::move(ring)), slot_(slot), offset_(offset), size_(size) {}

RingMemory::~RingMemory() { ring_->Free(slot_, offset_); }

uint8_t* RingMemory::data() { return ring_->map_.mutable_data() + offset_; }

RingAllocator::RingAllocator(RingCharge charge, UniqueFd fd, MappedRegion map,
                             const RingGeometry& g)
    : charge_(std::move(charge)),
      fd_(std::move(fd)),
      map_(std::move(map)),
      geometry_(g),
      payload_(g.payload_bytes, kBatchAlignment) {
  published_.assign(g.slot_count, false);
  retained_.assign(g.slot_count, false);
  free_slots_.reserve(g.slot_count);
  for (uint32_t s = g.slot_count; s-- > 0;) free_slots_.push_back(s);  // slot 0 first
}

Result<std::shared_ptr<RingAllocator>> RingAllocator::Create(uint32_t slot_count,
                                                             uint64_t payload_bytes,
                                                             uint64_t incarnation, uint64_t session,
                                                             RingCharge charge) {
  LX_ASSIGN_OR_RETURN(RingGeometry g, RingGeometry::Compute(slot_count, payload_bytes));
  LX_ASSIGN_OR_RETURN(UniqueFd fd,
                      CreateMemfd("loaderx-ring-" + std::to_string(session), g.total_bytes));
  LX_ASSIGN_OR_RETURN(MappedRegion map, MappedRegion::Map(fd.get(), g.total_bytes, 0, true));
  InitRing(map.mutable_data(), g, incarnation, session);
  // Seal only after our writable mapping exists (FUTURE_WRITE forbids new ones).
  LX_RETURN_IF_ERROR(SealMemfd(fd.get(), kRingSeals));
  return std::shared_ptr<RingAllocator>(
      new RingAllocator(std::move(charge), std::move(fd), std::move(map), g));
}

Result<std::shared_ptr<BatchMemory>> RingAllocator::Allocate(uint64_t step, uint64_t bytes) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!payload_.Fits(bytes)) {
    return Status::ResourceExhausted(
        "step " + std::to_string(step) + ": batch of " + std::to_string(bytes) +
        " bytes does not fit the ring payload of " + std::to_string(payload_.capacity()) +
        " bytes; open the loader with a larger ring_bytes");
  }
  std::optional<uint64_t> region;
  bool stalled = false;
  freed_cv_.wait(lock, [&] {
    if (cancelled_) return true;
    if (!free_slots_.empty()) {
      region = payload_.Allocate(bytes);
      if (region) return true;
    }
    // Everything live is published and only clients hold it: nothing the
    // daemon holds can free room, so waiting could last forever. Only the
    // client can resolve it; tell it rather than hang.
    const uint32_t live = geometry_.slot_count - static_cast<uint32_t>(free_slots_.size());
    stalled = live > 0 && live == client_held_;
    return stalled;
  });
  if (cancelled_) {
    if (region) payload_.Free(*region);
    return Status::Cancelled("loader closed");
  }
  if (!region) {
    return Status::ResourceExhausted("step " + std::to_string(step) + ": the ring is full of the " +
                                     std::to_string(client_held_) +
                                     " batches the client holds and a batch of " +
                                     std::to_string(bytes) +
                                     " bytes does not fit beside them; hold fewer batches or open "
                                     "the loader with a larger ring_bytes");
  }
  uint32_t slot = free_slots_.back();
  free_slots_.pop_back();
  return std::shared_ptr<BatchMemory>(std::make_shared<RingMemory>(
      shared_from_this(), slot, geometry_.payload_offset + *region, bytes));
}

void RingAllocator::Cancel() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled_ = true;
  }
  freed_cv_.notify_all();
}

void RingAllocator::Free(uint32_t slot, uint64_t ring_offset) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (published_[slot] && !retained_[slot]) --client_held_;
    published_[slot] = false;
    retained_[slot] = false;
    payload_.Free(ring_offset - geometry_.payload_offset);
    free_slots_.push_back(slot);
  }
  freed_cv_.notify_all();
  // Read without the lock: written once, before the ring was shared.
  if (free_hook_) free_hook_();
}

void RingAllocator::SetFreeHook(std::function<void()> hook) { free_hook_ = std::move(hook); }

uint64_t RingAllocator::Publish(const RingMemory& memory, uint64_t step, uint64_t bytes,
                                bool retained) {
  uint64_t seq;
  {
    std::lock_guard<std::mutex> lock(mu_);
    seq = next_seq_++;
    const uint32_t slot = memory.slot();
    const bool was_client_held = published_[slot] && !retained_[slot];
    published_[slot] = true;
    retained_[slot] = retained;
    if (was_client_held && retained) --client_held_;
    if (!was_client_held && !retained) ++client_held_;
  }
  PublishSlot(map_.mutable_data(), geometry_, memory.slot(), seq, step, memory.ring_offset(),
              bytes);
  freed_cv_.notify_all();  // a waiting producer re-checks for a stall
  return seq;
}

void RingAllocator::EndRetain(uint32_t slot) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (slot >= retained_.size() || !retained_[slot]) return;
    retained_[slot] = false;
    if (published_[slot]) ++client_held_;
  }
  freed_cv_.notify_all();  // a waiting producer re-checks for a stall
}

uint64_t RingAllocator::bytes_in_use() const {
  std::lock_guard<std::mutex> lock(mu_);
  return payload_.used();
}

uint32_t RingAllocator::slots_in_use() const {
  std::lock_guard<std::mutex> lock(mu_);
  return geometry_.slot_count - static_cast<uint32_t>(free_slots_.size());
}

}  // namespace loaderx::daemon
