// Accounts: per-uid caps on sessions and ring memory, refused with the cap
// named and nothing charged.
#include "accounts.h"

#include <gtest/gtest.h>

namespace loaderx::daemon {
namespace {

Config Caps(uint32_t sessions, uint64_t per_uid, uint64_t limit) {
  Config c;
  c.sessions_per_uid = sessions;
  c.memory_per_uid = per_uid;
  c.memory_limit = limit;
  return c;
}

TEST(AccountsTest, SessionsPerUidCapRefusesNamingTheCap) {
  Accounts a(Caps(2, 100, 100));
  ASSERT_TRUE(a.AddSession(5).ok());
  ASSERT_TRUE(a.AddSession(5).ok());
  Status third = a.AddSession(5);
  EXPECT_EQ(third.code(), Status::Code::kResourceExhausted);
  EXPECT_NE(third.message().find("uid 5 already has 2"), std::string::npos) << third.message();
  EXPECT_NE(third.message().find("--sessions-per-uid=2"), std::string::npos);
  EXPECT_TRUE(a.AddSession(6).ok());  // another uid has its own cap
  EXPECT_EQ(a.Read(5, false).sessions, 3u);
  EXPECT_EQ(a.Read(5, false).mine.sessions, 2u);
  a.RemoveSession(5);
  EXPECT_TRUE(a.AddSession(5).ok());
}

TEST(AccountsTest, RingMemoryPerUidAndTotalCaps) {
  Accounts a(Caps(8, 60, 100));
  Result<RingCharge> one = a.ChargeRing(1, 60);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->uid(), 1u);
  EXPECT_EQ(one->bytes(), 60u);
  Result<RingCharge> per_uid = a.ChargeRing(1, 1);
  ASSERT_FALSE(per_uid.ok());
  EXPECT_EQ(per_uid.status().code(), Status::Code::kResourceExhausted);
  EXPECT_NE(per_uid.status().message().find("uid 1 holds 60 of 60 bytes, --memory-per-uid"),
            std::string::npos)
      << per_uid.status().message();
  Result<RingCharge> two = a.ChargeRing(2, 40);
  ASSERT_TRUE(two.ok());
  Result<RingCharge> total = a.ChargeRing(3, 1);
  ASSERT_FALSE(total.ok());
  EXPECT_EQ(total.status().code(), Status::Code::kResourceExhausted);
  EXPECT_NE(total.status().message().find("100 of 100 bytes in use, --memory-limit"),
            std::string::npos)
      << total.status().message();
  Accounts::Snapshot s = a.Read(1, /*all_uids=*/true);
  EXPECT_EQ(s.ring_bytes, 100u);  // the refused charges changed nothing
  EXPECT_EQ(s.mine.ring_bytes, 60u);
  EXPECT_EQ(s.uids.at(1).ring_bytes, 60u);
  EXPECT_EQ(s.uids.at(2).ring_bytes, 40u);
  one = Status::Cancelled("dropped");  // the charge goes with its handle
  EXPECT_EQ(a.Read(1, false).ring_bytes, 40u);
  EXPECT_EQ(a.Read(1, false).mine.ring_bytes, 0u);
  EXPECT_TRUE(a.ChargeRing(3, 60).ok());  // a temporary: given back at once
  EXPECT_EQ(a.Read(3, false).ring_bytes, 40u);
}

TEST(AccountsTest, RingChargeIsGivenBackExactlyOnce) {
  Accounts a(Caps(8, 100, 100));
  RingCharge held = std::move(a.ChargeRing(7, 10).value());
  RingCharge moved(std::move(held));
  held.Reset();  // moved-from: holds nothing
  EXPECT_EQ(a.Read(7, false).ring_bytes, 10u);
  RingCharge other = std::move(a.ChargeRing(7, 5).value());
  EXPECT_EQ(a.Read(7, false).ring_bytes, 15u);
  other = std::move(moved);  // other's own 5 bytes go back; it now holds the 10
  EXPECT_EQ(a.Read(7, false).ring_bytes, 10u);
  EXPECT_EQ(other.bytes(), 10u);
  other.Reset();
  EXPECT_EQ(a.Read(7, false).ring_bytes, 0u);
  other.Reset();
  EXPECT_EQ(a.Read(7, false).ring_bytes, 0u);
  EXPECT_EQ(a.Read(7, false).mine.ring_bytes, 0u);
  {
    RingCharge scoped = std::move(a.ChargeRing(7, 100).value());
    EXPECT_FALSE(a.ChargeRing(8, 1).ok());
  }
  EXPECT_TRUE(a.ChargeRing(8, 100).ok());
}

}  // namespace
}  // namespace loaderx::daemon
