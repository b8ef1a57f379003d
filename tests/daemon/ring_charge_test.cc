// A ring's memory charge (accounts.h) is owned by the ring: it is given back
// exactly once, when the ring's last holder goes -- its group's last member
// or the last lease of one of its batches, in whichever order, however the
// client ends. A charge given back twice would wrap the unsigned counters;
// one never given back would stay; both fail the exact values below.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "daemon_fixture.h"

namespace loaderx::testing {
namespace {

using client::LoaderSpec;

class RingChargeTest : public DaemonFixture {
 protected:
  LoaderSpec Spec(const std::string& group = "") {
    if (store_.empty()) store_ = MakeDenseStore(dir_.Sub("dense"), 100);
    LoaderSpec s;
    s.stores = {store_};
    s.batch_size = 8;
    s.seed = 3;
    s.group = group;
    s.group_mode = GroupMode::kBroadcast;
    return s;
  }
  // ring_bytes and uid_ring_bytes, once settled at `want`.
  void ExpectCharged(uint64_t want) {
    EXPECT_EQ(SettledStat("ring_bytes", want), want);
    EXPECT_EQ(Stat("uid_ring_bytes"), want);
  }
  std::string store_;
};

TEST_F(RingChargeTest, LoaderClosedFirstStaysChargedUntilItsLastLeaseGoes) {
  auto c = Connect();
  auto loader = c->OpenLoader(Spec()).value();
  const uint64_t bytes = loader->ring_bytes();
  ASSERT_GT(bytes, 0u);
  ExpectCharged(bytes);
  auto first = loader->Next().value();
  auto second = loader->Next().value();
  loader->Close();
  EXPECT_TRUE(WaitStat("loaders", 0));
  ExpectCharged(bytes);  // the closed loader's batches still view the ring
  first.Reset();
  ExpectCharged(bytes);
  second.Reset();  // the last lease: the ring goes, and its charge once
  ExpectCharged(0);
  EXPECT_EQ(SettledStat("slots_held", 0), 0u);
  // Charged again from zero: nothing was given back twice.
  auto again = Connect()->OpenLoader(Spec()).value();
  ExpectCharged(again->ring_bytes());
  again->Close();
  ExpectCharged(0);
}

TEST_F(RingChargeTest, LoaderClosedWithoutLeasesGivesItsRingBackAtOnce) {
  auto c = Connect();
  auto loader = c->OpenLoader(Spec()).value();
  ExpectCharged(loader->ring_bytes());
  loader->Next().value().Reset();
  loader->Close();
  ExpectCharged(0);
  EXPECT_EQ(SettledStat("slots_held", 0), 0u);
}

TEST_F(RingChargeTest, KilledClientHoldingLeasesGivesItsRingBackOnce) {
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(ready[0]);
    auto c = Client::Connect(socket_);
    if (!c.ok()) ::_exit(1);
    auto loader = (*c)->OpenLoader(Spec());
    if (!loader.ok()) ::_exit(2);
    auto held = (*loader)->Next();
    if (!held.ok()) ::_exit(3);
    const uint64_t bytes = (*loader)->ring_bytes();
    if (::write(ready[1], &bytes, sizeof(bytes)) != sizeof(bytes)) ::_exit(4);
    ::pause();  // until killed, holding its batch and its open loader
    ::_exit(5);
  }
  ASSERT_GT(pid, 0);
  ::close(ready[1]);
  uint64_t bytes = 0;
  ASSERT_EQ(::read(ready[0], &bytes, sizeof(bytes)), static_cast<ssize_t>(sizeof(bytes)));
  ::close(ready[0]);
  ExpectCharged(bytes);
  ASSERT_EQ(::kill(pid, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  ExpectCharged(0);
  EXPECT_EQ(SettledStat("slots_held", 0), 0u);
  EXPECT_EQ(Stat("loaders"), 0u);
}

TEST_F(RingChargeTest, GroupOfTwoStaysChargedWhileALeftMemberStillLeasesABatch) {
  auto a = Connect();
  auto b = Connect();
  auto la = a->OpenLoader(Spec("g")).value();  // creates the group and its ring
  auto lb = b->OpenLoader(Spec("g")).value();  // joins: one ring, charged once
  const uint64_t bytes = la->ring_bytes();
  EXPECT_EQ(lb->ring_bytes(), bytes);
  ExpectCharged(bytes);
  auto held = la->Next().value();
  la->Close();  // the creator leaves first, holding a batch
  EXPECT_TRUE(WaitStat("group_members", 1));
  ExpectCharged(bytes);
  lb->Close();  // the last member: the group closes...
  EXPECT_TRUE(WaitStat("groups", 0));
  ExpectCharged(bytes);  // ...but its ring is still viewed by `held`
  held.Reset();
  ExpectCharged(0);
}

TEST_F(RingChargeTest, GroupOfTwoBothHoldingBatchesIsGivenBackWithTheLastLease) {
  auto a = Connect();
  auto b = Connect();
  auto la = a->OpenLoader(Spec("g")).value();
  auto lb = b->OpenLoader(Spec("g")).value();
  const uint64_t bytes = la->ring_bytes();
  auto xa = la->Next().value();
  auto xb = lb->Next().value();
  lb->Close();  // the joiner leaves first this time
  la->Close();
  EXPECT_TRUE(WaitStat("groups", 0));
  EXPECT_TRUE(WaitStat("loaders", 0));
  ExpectCharged(bytes);
  xb.Reset();
  ExpectCharged(bytes);
  b.reset();  // a hang-up after the release changes nothing more
  ExpectCharged(bytes);
  xa.Reset();
  ExpectCharged(0);
  // A new group of the same name gets a fresh ring, charged from zero.
  auto c = Connect();
  auto fresh = c->OpenLoader(Spec("g")).value();
  ExpectCharged(fresh->ring_bytes());
}

}  // namespace
}  // namespace loaderx::testing
