// PrivateRings (client/src/private_rings.h) over a real memfd ring: a view's
// writes are its own and are dropped at Release, so the next view of those
// pages reads what the daemon wrote there since; pages a view only read stay
// mapped (no fault on the next view) and show the ring's new contents.
#include "private_rings.h"

#include <gtest/gtest.h>

#include <cstring>
#include <optional>
#include <utility>

#include "client/page_state.h"
#include "loaderx/fd.h"
#include "loaderx/memfd.h"

namespace loaderx::client {
namespace {

constexpr uint64_t kPages = 16;

uint64_t Page() { return PrivateRings::PageBytes(); }

TEST(PrivateRingsTest, WritesAreDroppedAtReleaseAndReadPagesStayMappedToTheRing) {
  const uint64_t bytes = kPages * Page();
  auto fd = CreateMemfd("private-rings-test", bytes);
  ASSERT_TRUE(fd.ok()) << fd.status().ToString();
  auto shared = MappedRegion::Map(fd->get(), bytes, 0, /*writable=*/true);
  ASSERT_TRUE(shared.ok()) << shared.status().ToString();
  uint8_t* ring = shared->mutable_data();
  std::memset(ring, 'A', bytes);

  PrivateRings rings;
  rings.Attach(fd->get(), bytes);
  auto v = rings.Acquire(0, bytes);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  ASSERT_NE(v->base, nullptr);
  uint8_t* view = v->base;
  for (uint64_t k = 0; k < kPages; ++k) ASSERT_EQ(view[k * Page()], 'A');
  view[3 * Page() + 7] = 'W';  // a copy of page 3, this view's own
  EXPECT_EQ(ring[3 * Page() + 7], 'A');
  rings.Release(v->ring, v->pages.first, v->pages.end);

  const auto read_page = loaderx::testing::PageState(view);
  const auto written_page = loaderx::testing::PageState(view + 3 * Page());
  if (read_page && written_page) {
    EXPECT_EQ(*read_page, std::make_pair(true, true));  // still mapped, the ring's page
    EXPECT_FALSE(written_page->first);                  // the copy is gone
  }

  std::memset(ring, 'B', bytes);  // the daemon fills the slot again
  auto again = rings.Acquire(0, bytes);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  ASSERT_EQ(again->base, view);  // the same mapping: no live view covers it
  for (uint64_t k = 0; k < kPages; ++k) {
    for (uint64_t b : {uint64_t{0}, uint64_t{7}, Page() - 1}) {
      ASSERT_EQ(view[k * Page() + b], 'B') << "page " << k << " byte " << b;
    }
  }
  rings.Release(again->ring, again->pages.first, again->pages.end);
}

}  // namespace
}  // namespace loaderx::client
