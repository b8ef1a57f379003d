// libFuzzer target: the client's validation of what a (buggy or hostile)
// daemon puts in a shared ring: the header (ValidateRing) and a batch
// announcement against the slot table (CheckSlot). The input picks a valid
// geometry, mutates bytes of the header and slot table, and names the
// announcement; validation must accept only what lies inside the ring and
// never read outside the mapped bytes (ASan checks the latter: the ring is
// a heap buffer of exactly its size).
//
// An input whose first byte has its top bit set fuzzes the push queue's
// reader instead (PushQueueReader, protocol 1.4): the tail word and the
// data area come from the input, and every entry Peek accepts must lie
// within what the tail says is written.
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "loaderx/push_queue.h"
#include "loaderx/ring.h"

namespace {
struct Input {
  const uint8_t* p;
  size_t n;
  template <typename T>
  T Take() {
    T v{};
    const size_t k = n < sizeof v ? n : sizeof v;
    std::memcpy(&v, p, k);
    p += k;
    n -= k;
    return v;
  }
};
int FuzzQueue(Input in) {
  constexpr uint64_t kData = 4096;
  auto w = loaderx::PushQueueWriter::Create(kData);
  if (!w.ok()) std::abort();
  auto raw = loaderx::MappedRegion::Map(w->fd(), w->total_bytes(), 0, /*writable=*/true);
  if (!raw.ok()) std::abort();
  const uint64_t tail = in.Take<uint16_t>() % (2 * kData + 1);  // past a whole area too
  std::memcpy(raw->mutable_data() + 64, &tail, 8);
  const size_t n = std::min<size_t>(in.n, kData);
  std::memcpy(raw->mutable_data() + loaderx::kPushQueueHeaderBytes, in.p, n);
  auto r = loaderx::PushQueueReader::Attach(loaderx::UniqueFd(::dup(w->fd())), w->total_bytes());
  if (!r.ok()) std::abort();  // a queue the daemon's side made
  std::vector<uint8_t> frame;
  uint64_t read = 0;
  for (int k = 0; k < 512; ++k) {
    auto got = r->Peek(&frame);
    if (!got.ok() || !*got) break;
    read += loaderx::kPushQueueEntryHeader + (frame.size() + 7) / 8 * 8;
    if (frame.empty() || read > tail || tail > kData) std::abort();  // past what was written
    r->Pop();
  }
  return 0;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in{data, size};
  if (size > 0 && (data[0] & 0x80) != 0) {
    in.Take<uint8_t>();
    return FuzzQueue(in);
  }
  const uint32_t slots = 1 + in.Take<uint8_t>() % 16;
  const uint64_t payload = (in.Take<uint16_t>() % 4096) * uint64_t{64};
  auto g = loaderx::RingGeometry::Compute(slots, payload);
  if (!g.ok()) return 0;
  // Keep rings small so every input runs quickly.
  if (g->total_bytes > (uint64_t{1} << 19)) return 0;
  // The mapped size may differ from what the header claims (shrunk or grown).
  const int64_t delta = in.Take<int16_t>();
  const uint64_t mapped =
      static_cast<uint64_t>(std::max<int64_t>(0, static_cast<int64_t>(g->total_bytes) + delta));
  std::vector<uint8_t> ring(g->total_bytes);
  loaderx::InitRing(ring.data(), *g, 7, 9);
  const uint32_t pub_slot = in.Take<uint8_t>() % slots;
  loaderx::PublishSlot(ring.data(), *g, pub_slot, 1 + in.Take<uint8_t>(), in.Take<uint16_t>(),
                       g->payload_offset, in.Take<uint16_t>() % (g->payload_bytes + 1));
  // Byte edits of the header and slot table: (u16 position, u8 xor) pairs.
  const uint8_t edits = in.Take<uint8_t>() % 32;
  const uint64_t editable = g->payload_offset;
  for (uint8_t e = 0; e < edits && in.n >= 3; ++e) {
    const uint64_t at = in.Take<uint16_t>() % editable;
    ring[at] ^= in.Take<uint8_t>();
  }
  // At least one byte allocated so data() is never null; `mapped` is the size.
  std::vector<uint8_t> view(std::max<uint64_t>(mapped, 1));
  std::memcpy(view.data(), ring.data(), std::min<uint64_t>(mapped, ring.size()));
  view.resize(mapped);
  auto v = loaderx::ValidateRing(view.data(), mapped);
  if (!v.ok()) return 0;
  if (v->total_bytes > view.size() || v->payload_offset + v->payload_bytes > v->total_bytes) {
    std::abort();  // accepted a geometry that does not fit the mapping
  }
  // Announcements: the daemon's message fields, arbitrary.
  for (int k = 0; k < 4 && in.n > 0; ++k) {
    const uint32_t slot = in.Take<uint32_t>();
    const uint64_t seq = in.Take<uint64_t>();
    const uint64_t step = in.Take<uint64_t>();
    const uint64_t offset = in.Take<uint64_t>();
    const uint64_t bytes = in.Take<uint64_t>();
    if (loaderx::CheckSlot(view.data(), *v, slot, seq, step, offset, bytes).ok()) {
      if (slot >= v->slot_count || offset < v->payload_offset ||
          offset - v->payload_offset > v->payload_bytes ||
          bytes > v->payload_bytes - (offset - v->payload_offset)) {
        std::abort();  // accepted a batch outside the payload
      }
      volatile uint8_t sink = 0;
      for (uint64_t i = 0; i < bytes; i += 4096)
        sink = static_cast<uint8_t>(sink + view[offset + i]);
      (void)sink;
    }
  }
  return 0;
}
