#include "loaderx/ring.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

namespace loaderx {
namespace {

struct RingBuffer {
  explicit RingBuffer(const RingGeometry& g) : bytes(g.total_bytes + 64) {
    base = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(bytes.data()) + 63) &
                                      ~uintptr_t{63});
  }
  std::vector<uint8_t> bytes;
  uint8_t* base;
};

TEST(RingGeometryTest, PlacesSlotTableAfterHeaderAndPayloadOnPageBoundary) {
  auto g = RingGeometry::Compute(3, 5000);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->slot_count, 3u);
  EXPECT_EQ(g->slot_table_offset, 4096u);
  EXPECT_EQ(g->payload_offset, 8192u);  // 4096 + 3*64 rounded to a page
  EXPECT_EQ(g->payload_bytes, 8192u);   // 5000 rounded to a page
  EXPECT_EQ(g->total_bytes, 16384u);
}

TEST(RingGeometryTest, ManySlotsPushPayloadFurther) {
  auto g = RingGeometry::Compute(65, 4096);
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->payload_offset, 4096u + 8192u);  // 65*64 = 4160 -> 2 pages
}

TEST(RingGeometryTest, RejectsZeroAndTooManySlotsAndEmptyPayload) {
  EXPECT_EQ(RingGeometry::Compute(0, 4096).status().code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(RingGeometry::Compute(kMaxRingSlots + 1, 4096).status().code(),
            Status::Code::kInvalidArgument);
  EXPECT_EQ(RingGeometry::Compute(1, 0).status().code(), Status::Code::kInvalidArgument);
}

TEST(RingTest, InitThenValidateRoundTripsGeometry) {
  auto g = RingGeometry::Compute(4, 1 << 16).value();
  RingBuffer rb(g);
  InitRing(rb.base, g, /*incarnation=*/77, /*session=*/5);
  auto v = ValidateRing(rb.base, g.total_bytes);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(v->payload_offset, g.payload_offset);
  EXPECT_EQ(v->slot_count, 4u);
  const RingHeader* h = reinterpret_cast<const RingHeader*>(rb.base);
  EXPECT_EQ(h->incarnation, 77u);
  EXPECT_EQ(h->session, 5u);
  EXPECT_EQ(SlotAt(static_cast<const uint8_t*>(rb.base), g, 3)->seq.load(), 0u);
}

TEST(RingTest, ValidateRejectsBadMagicWrongMajorAndSizeMismatch) {
  auto g = RingGeometry::Compute(2, 4096).value();
  RingBuffer rb(g);
  InitRing(rb.base, g, 1, 1);
  RingHeader* h = reinterpret_cast<RingHeader*>(rb.base);

  EXPECT_EQ(ValidateRing(rb.base, g.total_bytes - 4096).status().code(), Status::Code::kProtocol);
  EXPECT_EQ(ValidateRing(rb.base, 100).status().code(), Status::Code::kProtocol);

  h->version_major = kRingVersionMajor + 1;
  Status st = ValidateRing(rb.base, g.total_bytes).status();
  EXPECT_EQ(st.code(), Status::Code::kProtocol);
  EXPECT_NE(st.message().find("major version"), std::string::npos) << st.message();
  h->version_major = kRingVersionMajor;

  h->payload_offset += 4096;
  EXPECT_EQ(ValidateRing(rb.base, g.total_bytes).status().code(), Status::Code::kProtocol);
  h->payload_offset -= 4096;

  h->magic ^= 1;
  EXPECT_EQ(ValidateRing(rb.base, g.total_bytes).status().code(), Status::Code::kProtocol);
}

TEST(RingTest, PublishedSlotPassesCheckWithItsOwnSeqOnly) {
  auto g = RingGeometry::Compute(2, 1 << 14).value();
  RingBuffer rb(g);
  InitRing(rb.base, g, 1, 1);
  PublishSlot(rb.base, g, 1, /*seq=*/9, /*step=*/4, g.payload_offset + 128, 256);
  EXPECT_TRUE(CheckSlot(rb.base, g, 1, 9, 4, g.payload_offset + 128, 256).ok());
  // A stale announcement (old seq) of a recycled slot is refused.
  EXPECT_EQ(CheckSlot(rb.base, g, 1, 8, 4, g.payload_offset + 128, 256).code(),
            Status::Code::kProtocol);
  EXPECT_EQ(CheckSlot(rb.base, g, 1, 9, 5, g.payload_offset + 128, 256).code(),
            Status::Code::kProtocol);
}

TEST(RingTest, CheckSlotRejectsOutOfRangeSlotAndRegions) {
  auto g = RingGeometry::Compute(2, 1 << 14).value();
  RingBuffer rb(g);
  InitRing(rb.base, g, 1, 1);
  EXPECT_EQ(CheckSlot(rb.base, g, 2, 1, 0, g.payload_offset, 64).code(), Status::Code::kProtocol);
  // Inside the header / slot table.
  EXPECT_EQ(CheckSlot(rb.base, g, 0, 1, 0, 0, 64).code(), Status::Code::kProtocol);
  // Misaligned.
  EXPECT_EQ(CheckSlot(rb.base, g, 0, 1, 0, g.payload_offset + 8, 64).code(),
            Status::Code::kProtocol);
  // Past the end, including an overflowing length.
  EXPECT_EQ(CheckSlot(rb.base, g, 0, 1, 0, g.total_bytes - 64, 128).code(),
            Status::Code::kProtocol);
  EXPECT_EQ(CheckSlot(rb.base, g, 0, 1, 0, g.payload_offset, UINT64_MAX).code(),
            Status::Code::kProtocol);
}

TEST(RingTest, PublishStampsMonotonicClockAndCheckReportsIt) {
  auto g = RingGeometry::Compute(2, 1 << 14).value();
  RingBuffer rb(g);
  InitRing(rb.base, g, 1, 1);
  const uint64_t before = MonotonicNowNs();
  PublishSlot(rb.base, g, 0, /*seq=*/1, /*step=*/0, g.payload_offset, 64);
  const uint64_t after = MonotonicNowNs();
  uint64_t stamp = 0;
  ASSERT_TRUE(CheckSlot(rb.base, g, 0, 1, 0, g.payload_offset, 64, &stamp).ok());
  EXPECT_GE(stamp, before);
  EXPECT_LE(stamp, after);
  EXPECT_EQ(stamp, SlotAt(static_cast<const uint8_t*>(rb.base), g, 0)->publish_ns);
}

TEST(RingTest, SuccessivePublishStampsNeverDecrease) {
  auto g = RingGeometry::Compute(1, 1 << 14).value();
  RingBuffer rb(g);
  InitRing(rb.base, g, 1, 1);
  uint64_t last = 0;
  for (uint64_t seq = 1; seq <= 100; ++seq) {
    PublishSlot(rb.base, g, 0, seq, seq, g.payload_offset, 64);
    uint64_t stamp = 0;
    ASSERT_TRUE(CheckSlot(rb.base, g, 0, seq, seq, g.payload_offset, 64, &stamp).ok());
    EXPECT_GE(stamp, last) << "seq " << seq;
    last = stamp;
  }
}

TEST(RingTest, CheckSlotRefusesMissingOrFutureStampInLayout11) {
  auto g = RingGeometry::Compute(2, 1 << 14).value();
  RingBuffer rb(g);
  InitRing(rb.base, g, 1, 1);
  PublishSlot(rb.base, g, 1, 3, 0, g.payload_offset, 64);
  SlotEntry* e = SlotAt(rb.base, g, 1);

  e->publish_ns = 0;
  Status st = CheckSlot(rb.base, g, 1, 3, 0, g.payload_offset, 64);
  EXPECT_EQ(st.code(), Status::Code::kProtocol);
  EXPECT_NE(st.message().find("no publish stamp"), std::string::npos) << st.message();

  e->publish_ns = MonotonicNowNs() + 60'000'000'000ull;  // a minute ahead
  st = CheckSlot(rb.base, g, 1, 3, 0, g.payload_offset, 64);
  EXPECT_EQ(st.code(), Status::Code::kProtocol);
  EXPECT_NE(st.message().find("in the future"), std::string::npos) << st.message();
}

TEST(RingTest, Layout10RingWithoutStampsIsAcceptedAndReportsZero) {
  auto g = RingGeometry::Compute(2, 1 << 14).value();
  RingBuffer rb(g);
  InitRing(rb.base, g, 1, 1);
  reinterpret_cast<RingHeader*>(rb.base)->version_minor = 0;  // an older daemon
  PublishSlot(rb.base, g, 0, 5, 2, g.payload_offset, 64);
  SlotAt(rb.base, g, 0)->publish_ns = 0;  // 1.0 left the word reserved (zero)
  ASSERT_TRUE(ValidateRing(rb.base, g.total_bytes).ok());
  uint64_t stamp = 123;
  EXPECT_TRUE(CheckSlot(rb.base, g, 0, 5, 2, g.payload_offset, 64, &stamp).ok());
  EXPECT_EQ(stamp, 0u);
}

}  // namespace
}  // namespace loaderx
