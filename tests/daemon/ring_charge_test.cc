// A ring's memory charge (accounts.h) is owned by the ring: it is given back
// exactly once, when the ring's last holder goes -- its group's last member
// or the last lease of one of its batches, in whichever order, however the
// client ends. A charge given back twice would wrap the unsigned counters;
// one never given back would stay; both fail the exact values below.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "daemon_fixture.h"

namespace loaderx::testing {
namespace {

using client::LoaderSpec;

// Set in the environment of the child that KilledClient... spawns.
constexpr const char* kChildEnv = "LOADERX_RING_CHARGE_CHILD";

class RingChargeTest : public DaemonFixture {
 protected:
  // The spawned child is a client only: no daemon of its own.
  void SetUp() override {
    if (std::getenv(kChildEnv) == nullptr) DaemonFixture::SetUp();
  }
  void TearDown() override {
    if (std::getenv(kChildEnv) == nullptr) DaemonFixture::TearDown();
  }
  LoaderSpec Spec(const std::string& group = "") {
    if (store_.empty()) store_ = MakeDenseStore(dir_.Sub("dense"), 100);
    LoaderSpec s;
    s.stores = {store_};
    s.batch_size = 8;
    s.seed = 3;
    s.group = group;
    s.group_mode = GroupMode::kBroadcast;
    s.shared_view = true;  // views of the shared ring, never moved out at the cap
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
  auto first = TakeBatch(*loader).value();
  auto second = TakeBatch(*loader).value();
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
  TakeBatch(*loader).value().Reset();
  loader->Close();
  ExpectCharged(0);
  EXPECT_EQ(SettledStat("slots_held", 0), 0u);
}

// The killed client is this test binary run again as a child (spawned, not
// forked: a forked child of a threaded process may not start the client's
// threads, and TSan refuses it), told its role by kChildEnv.
TEST_F(RingChargeTest, KilledClientHoldingLeasesGivesItsRingBackOnce) {
  if (const char* role = std::getenv(kChildEnv)) {
    // "socket store fd": open a loader, take a batch, say how big the ring
    // is, then hold both until killed.
    std::istringstream in(role);
    std::string socket, store;
    int fd = -1;
    in >> socket >> store >> fd;
    store_ = store;
    auto c = Client::Connect(socket);
    if (!c.ok()) ::_exit(1);
    auto loader = (*c)->OpenLoader(Spec());
    if (!loader.ok()) ::_exit(2);
    auto held = TakeBatch(**loader);
    if (!held.ok()) ::_exit(3);
    const uint64_t bytes = (*loader)->ring_bytes();
    if (::write(fd, &bytes, sizeof(bytes)) != sizeof(bytes)) ::_exit(4);
    ::pause();
    ::_exit(5);
  }
  Spec();  // makes the store
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const std::string role = socket_ + " " + store_ + " " + std::to_string(ready[1]);
  const std::string env = std::string(kChildEnv) + "=" + role;
  std::vector<char*> envp;
  for (char** e = environ; *e != nullptr; ++e) envp.push_back(*e);
  envp.push_back(const_cast<char*>(env.c_str()));
  envp.push_back(nullptr);
  std::string exe = "/proc/self/exe";
  std::string filter =
      "--gtest_filter=RingChargeTest.KilledClientHoldingLeasesGivesItsRingBackOnce";
  char* argv[] = {exe.data(), filter.data(), nullptr};
  pid_t pid = 0;
  ASSERT_EQ(::posix_spawn(&pid, exe.c_str(), nullptr, nullptr, argv, envp.data()), 0);
  ::close(ready[1]);
  uint64_t bytes = 0;
  ASSERT_EQ(::read(ready[0], &bytes, sizeof(bytes)), static_cast<ssize_t>(sizeof(bytes)));
  ::close(ready[0]);
  ExpectCharged(bytes);
  EXPECT_EQ(Stat("loaders"), 1u);
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
  auto held = TakeBatch(*la).value();
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
  auto xa = TakeBatch(*la).value();
  auto xb = TakeBatch(*lb).value();
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
