#include "payload_allocator.h"

#include <gtest/gtest.h>

namespace loaderx::daemon {
namespace {

TEST(PayloadAllocatorTest, FirstFitRoundsToAlignmentAndZeroTakesOneUnit) {
  PayloadAllocator a(1024, 64);
  EXPECT_EQ(a.Allocate(1), 0u);
  EXPECT_EQ(a.Allocate(65), 64u);  // 128 bytes
  EXPECT_EQ(a.Allocate(0), 192u);  // one unit
  EXPECT_EQ(a.used(), 256u);
}

TEST(PayloadAllocatorTest, EqualSizedBatchesFillTheRingExactly) {
  PayloadAllocator a(4 * 256, 64);
  for (uint64_t i = 0; i < 4; ++i) EXPECT_EQ(a.Allocate(256), i * 256);
  EXPECT_FALSE(a.Allocate(1).has_value());
  a.Free(256);
  EXPECT_EQ(a.Allocate(256), 256u);
}

TEST(PayloadAllocatorTest, FreedNeighboursCoalesce) {
  PayloadAllocator a(512, 64);
  auto x = a.Allocate(128), y = a.Allocate(128), z = a.Allocate(256);
  ASSERT_TRUE(x && y && z);
  a.Free(*x);
  a.Free(*z);
  EXPECT_FALSE(a.Allocate(384).has_value());  // holes of 128 and 256, not adjacent
  a.Free(*y);
  EXPECT_EQ(a.Allocate(512), 0u);  // all three merged
  EXPECT_EQ(a.used(), 512u);
}

TEST(PayloadAllocatorTest, FitsOnlyWhatTheWholePayloadCouldHold) {
  PayloadAllocator a(1024, 64);
  EXPECT_TRUE(a.Fits(1024));
  EXPECT_FALSE(a.Fits(1025));
  EXPECT_FALSE(a.Fits(UINT64_MAX));
  EXPECT_FALSE(a.Allocate(UINT64_MAX).has_value());
}

}  // namespace
}  // namespace loaderx::daemon
