// The batch hand-off between a real in-process loaderxd and the C++ client:
// the publish stamp every batch carries (ring layout 1.1) and request ahead
// (Loader::set_request_ahead), whose batch must be the same one, counted
// against the lease cap, and discarded by a seek.
#include <chrono>
#include <thread>
#include <vector>

#include "daemon/daemon_fixture.h"
#include "loaderx/ring.h"

namespace loaderx::testing {
namespace {

using client::LoaderSpec;

class HandoffTest : public DaemonFixture {
 protected:
  LoaderSpec Spec(uint32_t leases = 4) {
    if (store_.empty()) store_ = MakeDenseStore(dir_.Sub("dense"), 100);
    LoaderSpec s;
    s.stores = {store_};
    s.batch_size = 8;
    s.mode = SamplerMode::kIID;
    s.seed = 11;
    s.prefetch = 2;
    s.leases = leases;
    return s;
  }
  static std::vector<uint32_t> Values(const client::Batch& b) {
    const auto* p = static_cast<const uint32_t*>(b.Dense(0).data);
    return std::vector<uint32_t>(p, p + b.batch_size() * 4);
  }
  std::string store_;
};

TEST_F(HandoffTest, EveryBatchCarriesAPublishStampFromTheSharedClock) {
  auto c = Connect();
  const uint64_t opened_at = MonotonicNowNs();
  auto loader = c->OpenLoader(Spec()).value();
  uint64_t last = opened_at;
  for (int i = 0; i < 20; ++i) {
    auto b = loader->Next();
    const uint64_t holding = MonotonicNowNs();
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    // Published after the loader existed, before this process held it, and
    // never earlier than the batch before it.
    EXPECT_GE(b->publish_ns(), last) << "step " << b->step();
    EXPECT_LE(b->publish_ns(), holding) << "step " << b->step();
    last = b->publish_ns();
  }
}

TEST_F(HandoffTest, RequestAheadDeliversTheSameBatchesInOrder) {
  auto c = Connect();
  auto plain = c->OpenLoader(Spec()).value();
  auto ahead = c->OpenLoader(Spec()).value();
  ahead->set_request_ahead(true);
  EXPECT_TRUE(ahead->request_ahead());
  for (uint64_t s = 0; s < 30; ++s) {
    auto a = ahead->Next();
    auto p = plain->Next();
    ASSERT_TRUE(a.ok() && p.ok());
    EXPECT_EQ(a->step(), s);
    EXPECT_EQ(Values(*a), Values(*p)) << "step " << s;
  }
  EXPECT_EQ(ahead->step(), 30u);
}

TEST_F(HandoffTest, RequestAheadBatchIsPublishedBeforeTheCallerAsks) {
  auto c = Connect();
  auto loader = c->OpenLoader(Spec()).value();
  loader->set_request_ahead(true);
  auto first = loader->Next().value();
  // The daemon answers the request sent ahead: it holds first + the next.
  ASSERT_TRUE(WaitStat("slots_held", 2));
  const uint64_t asked = MonotonicNowNs();
  auto second = loader->Next().value();
  EXPECT_EQ(second.step(), 1u);
  EXPECT_LT(second.publish_ns(), asked);
}

TEST_F(HandoffTest, RequestAheadStopsAtTheLeaseCap) {
  auto c = Connect();
  auto loader = c->OpenLoader(Spec(/*leases=*/2)).value();
  loader->set_request_ahead(true);
  auto b0 = loader->Next().value();  // holds 1 of 2: asks ahead for step 1
  auto b1 = loader->Next().value();  // holds 2 of 2: asks for nothing more
  EXPECT_EQ(b1.step(), 1u);
  ASSERT_TRUE(WaitStat("slots_held", 2));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(Stat("slots_held"), 2u);
  auto refused = loader->Next();
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), Status::Code::kResourceExhausted);
  EXPECT_EQ(loader->step(), 2u);
  b0.Reset();
  auto b2 = loader->Next();
  ASSERT_TRUE(b2.ok()) << b2.status().ToString();
  EXPECT_EQ(b2->step(), 2u);
}

TEST_F(HandoffTest, SeekReleasesTheBatchRequestedAheadAndReturnsTheSoughtStep) {
  auto c = Connect();
  auto reference = c->OpenLoader(Spec()).value();
  ASSERT_TRUE(reference->Seek(7).ok());
  const std::vector<uint32_t> want = Values(reference->Next().value());
  reference->Close();

  auto loader = c->OpenLoader(Spec()).value();
  loader->set_request_ahead(true);
  auto b0 = loader->Next().value();
  ASSERT_TRUE(WaitStat("slots_held", 2));  // b0 and step 1, requested ahead
  ASSERT_TRUE(loader->Seek(7).ok());
  EXPECT_EQ(loader->step(), 7u);
  ASSERT_TRUE(WaitStat("slots_held", 1));  // step 1 went back unseen
  auto b7 = loader->Next().value();
  EXPECT_EQ(b7.step(), 7u);
  EXPECT_EQ(Values(b7), want);
}

TEST_F(HandoffTest, ClosingWithABatchRequestedAheadReclaimsEverything) {
  auto c = Connect();
  {
    auto loader = c->OpenLoader(Spec()).value();
    loader->set_request_ahead(true);
    auto b0 = loader->Next().value();
    ASSERT_TRUE(WaitStat("slots_held", 2));
    loader->Close();
    EXPECT_EQ(loader->Next().status().code(), Status::Code::kCancelled);
  }
  EXPECT_TRUE(WaitStat("slots_held", 0));
  EXPECT_TRUE(WaitStat("loaders", 0));
}

}  // namespace
}  // namespace loaderx::testing
