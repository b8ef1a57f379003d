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
  ASSERT_TRUE(a.ReserveRing(1, 60).ok());
  Status per_uid = a.ReserveRing(1, 1);
  EXPECT_EQ(per_uid.code(), Status::Code::kResourceExhausted);
  EXPECT_NE(per_uid.message().find("--memory-per-uid"), std::string::npos) << per_uid.message();
  ASSERT_TRUE(a.ReserveRing(2, 40).ok());
  Status total = a.ReserveRing(3, 1);
  EXPECT_EQ(total.code(), Status::Code::kResourceExhausted);
  EXPECT_NE(total.message().find("--memory-limit"), std::string::npos) << total.message();
  Accounts::Snapshot s = a.Read(1, /*all_uids=*/true);
  EXPECT_EQ(s.ring_bytes, 100u);
  EXPECT_EQ(s.mine.ring_bytes, 60u);
  EXPECT_EQ(s.uids.at(1).ring_bytes, 60u);
  EXPECT_EQ(s.uids.at(2).ring_bytes, 40u);
  a.ReleaseRing(1, 60);
  EXPECT_EQ(a.Read(1, false).ring_bytes, 40u);
  EXPECT_TRUE(a.ReserveRing(3, 60).ok());
}

}  // namespace
}  // namespace loaderx::daemon
