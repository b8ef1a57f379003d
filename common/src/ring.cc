#include "loaderx/ring.h"

#include <time.h>

#include <cstring>
#include <new>
#include <string>

namespace loaderx {

namespace {
uint64_t RoundUp(uint64_t v, uint64_t align) { return (v + align - 1) / align * align; }
}  // namespace

uint64_t MonotonicNowNs() {
  timespec ts;
  ::clock_gettime(CLOCK_MONOTONIC, &ts);  // vDSO: no syscall on the hand-off path
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000u + static_cast<uint64_t>(ts.tv_nsec);
}

Result<RingGeometry> RingGeometry::Compute(uint32_t slot_count, uint64_t min_payload_bytes) {
  if (slot_count == 0 || slot_count > kMaxRingSlots) {
    return Status::InvalidArgument("ring slot count " + std::to_string(slot_count) +
                                   " outside 1.." + std::to_string(kMaxRingSlots));
  }
  if (min_payload_bytes == 0 || min_payload_bytes > (uint64_t{1} << 46)) {
    return Status::InvalidArgument("ring payload of " + std::to_string(min_payload_bytes) +
                                   " bytes outside 1..2^46");
  }
  RingGeometry g;
  g.slot_count = slot_count;
  g.slot_table_offset = kRingHeaderBytes;
  g.payload_offset =
      RoundUp(g.slot_table_offset + uint64_t{slot_count} * sizeof(SlotEntry), kRingPageBytes);
  g.payload_bytes = RoundUp(min_payload_bytes, kRingPageBytes);
  g.total_bytes = g.payload_offset + g.payload_bytes;
  return g;
}

void InitRing(uint8_t* base, const RingGeometry& g, uint64_t incarnation, uint64_t session) {
  std::memset(base, 0, g.payload_offset);
  RingHeader* h = reinterpret_cast<RingHeader*>(base);
  h->magic = kRingMagic;
  h->version_major = kRingVersionMajor;
  h->version_minor = kRingVersionMinor;
  h->slot_count = g.slot_count;
  h->slot_table_offset = g.slot_table_offset;
  h->payload_offset = g.payload_offset;
  h->payload_bytes = g.payload_bytes;
  h->total_bytes = g.total_bytes;
  h->incarnation = incarnation;
  h->session = session;
  for (uint32_t i = 0; i < g.slot_count; ++i) {
    // The memory is zeroed; placement-new makes the atomic's lifetime explicit.
    new (SlotAt(base, g, i)) SlotEntry{};
  }
}

Result<RingGeometry> ValidateRing(const uint8_t* base, uint64_t size) {
  if (size < kRingHeaderBytes) {
    return Status::Protocol("ring of " + std::to_string(size) +
                            " bytes is smaller than its header");
  }
  RingHeader h;
  std::memcpy(&h, base, sizeof(h));
  if (h.magic != kRingMagic) return Status::Protocol("ring: bad magic");
  if (h.version_major != kRingVersionMajor) {
    return Status::Protocol("ring: layout major version " + std::to_string(h.version_major) +
                            ", this client understands " + std::to_string(kRingVersionMajor));
  }
  Result<RingGeometry> expect = RingGeometry::Compute(h.slot_count, h.payload_bytes);
  if (!expect.ok()) return Status::Protocol("ring: " + expect.status().message());
  const RingGeometry& g = expect.value();
  if (h.slot_table_offset != g.slot_table_offset || h.payload_offset != g.payload_offset ||
      h.payload_bytes != g.payload_bytes || h.total_bytes != g.total_bytes) {
    return Status::Protocol("ring: inconsistent geometry in header");
  }
  if (h.total_bytes != size) {
    return Status::Protocol("ring: header says " + std::to_string(h.total_bytes) +
                            " bytes, mapping has " + std::to_string(size));
  }
  return g;
}

void PublishSlot(uint8_t* base, const RingGeometry& g, uint32_t slot, uint64_t seq, uint64_t step,
                 uint64_t offset, uint64_t bytes) {
  SlotEntry* e = SlotAt(base, g, slot);
  e->step = step;
  e->offset = offset;
  e->bytes = bytes;
  e->publish_ns = MonotonicNowNs();
  // Orders the fields above and the batch bytes before the epoch (see SlotEntry).
  e->seq.store(seq, std::memory_order_release);
}

Status CheckSlot(const uint8_t* base, const RingGeometry& g, uint32_t slot, uint64_t seq,
                 uint64_t step, uint64_t offset, uint64_t bytes, uint64_t* publish_ns) {
  if (slot >= g.slot_count) {
    return Status::Protocol("batch names slot " + std::to_string(slot) + " of " +
                            std::to_string(g.slot_count));
  }
  if (offset < g.payload_offset || offset % kBatchAlignment != 0 || bytes > g.total_bytes ||
      offset > g.total_bytes - bytes) {
    return Status::Protocol("batch [" + std::to_string(offset) + ", +" + std::to_string(bytes) +
                            ") is not inside the ring payload");
  }
  const SlotEntry* e = SlotAt(base, g, slot);
  // Pairs with the release store in PublishSlot.
  uint64_t now = e->seq.load(std::memory_order_acquire);
  if (now != seq || e->step != step || e->offset != offset || e->bytes != bytes) {
    return Status::Protocol("slot " + std::to_string(slot) + " holds seq " + std::to_string(now) +
                            ", message announced seq " + std::to_string(seq));
  }
  // The header is immutable after InitRing; ValidateRing checked the major.
  uint16_t minor;
  std::memcpy(&minor, base + offsetof(RingHeader, version_minor), sizeof(minor));
  const uint64_t stamp = e->publish_ns;
  if (minor >= 1) {
    // The stamp was written before the epoch we just acquired, so it is in
    // this process's past on the shared clock: 0 or a future time means the
    // slot table does not hold what the daemon published.
    if (stamp == 0) {
      return Status::Protocol("slot " + std::to_string(slot) + " seq " + std::to_string(seq) +
                              " carries no publish stamp (ring layout 1." + std::to_string(minor) +
                              ")");
    }
    const uint64_t clock_now = MonotonicNowNs();
    if (stamp > clock_now) {
      return Status::Protocol("slot " + std::to_string(slot) + " seq " + std::to_string(seq) +
                              " is stamped " + std::to_string(stamp - clock_now) +
                              " ns in the future");
    }
  }
  if (publish_ns != nullptr) *publish_ns = minor >= 1 ? stamp : 0;
  return Status::OK();
}

}  // namespace loaderx
