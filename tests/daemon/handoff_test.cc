// The batch hand-off between a real in-process loaderxd and the C++ client:
// the publish stamp every batch carries (ring layout 1.1) and the push of
// protocol 1.2: batches pushed under the credit (the lease cap) must be the
// same ones in order, stop at the credit, and those of an older generation
// are released unread after a seek.
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "daemon/daemon_fixture.h"
#include "loaderx/push_queue.h"
#include "loaderx/ring.h"
#include "loaderx/store.h"
#include "loaderx/unix_socket.h"
#include "loaderx/wire.h"
#include "serving_group.h"

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
    s.shared_view = true;  // views of the shared ring, never moved out at the cap
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
    auto b = TakeBatch(*loader);
    const uint64_t holding = MonotonicNowNs();
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    // Published after the loader existed, before this process held it, and
    // never earlier than the batch before it.
    EXPECT_GE(b->publish_ns(), last) << "step " << b->step();
    EXPECT_LE(b->publish_ns(), holding) << "step " << b->step();
    last = b->publish_ns();
  }
}

TEST_F(HandoffTest, PushedBatchesAreTheEmbeddedOnesInOrder) {
  auto c = Connect();
  auto eager = c->OpenLoader(Spec()).value();
  auto late = c->OpenLoader(Spec()).value();
  ASSERT_TRUE(WaitStat("slots_held", 2));  // both push windows (one batch each) pushed
  for (uint64_t s = 0; s < 30; ++s) {
    auto a = TakeBatch(*eager);
    auto p = TakeBatch(*late);
    ASSERT_TRUE(a.ok() && p.ok());
    EXPECT_EQ(a->step(), s);
    EXPECT_EQ(p->step(), s);
    EXPECT_EQ(Values(*a), Values(*p)) << "step " << s;
  }
  EXPECT_EQ(eager->step(), 30u);
}

TEST_F(HandoffTest, PushedBatchIsPublishedBeforeTheCallerAsks) {
  auto c = Connect();
  auto loader = c->OpenLoader(Spec()).value();
  ASSERT_TRUE(WaitStat("slots_held", 1));  // the push window, pushed unasked
  const uint64_t asked = MonotonicNowNs();
  auto first = TakeBatch(*loader).value();
  EXPECT_EQ(first.step(), 0u);
  EXPECT_LT(first.publish_ns(), asked);
}

TEST_F(HandoffTest, PushStopsAtTheCredit) {
  auto c = Connect();
  auto loader = c->OpenLoader(Spec(/*leases=*/2)).value();
  // Unasked, the push window (one batch) goes out, no more.
  EXPECT_EQ(SettledStat("slots_held", daemon::Group::kPushAhead), daemon::Group::kPushAhead);
  EXPECT_EQ(Stat("batches_gathered"), 1u);
  EXPECT_EQ(Stat("batches_served"), 0u);  // served counts what the caller took
  auto b0 = TakeBatch(*loader).value();
  auto b1 = TakeBatch(*loader).value();
  EXPECT_EQ(b1.step(), 1u);
  // Holding both, the client is at its credit of 2: nothing more is pushed.
  EXPECT_EQ(SettledStat("slots_held", 2), 2u);
  EXPECT_EQ(Stat("batches_gathered"), 2u);
  auto refused = TakeBatch(*loader);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), Status::Code::kResourceExhausted);
  EXPECT_EQ(loader->step(), 2u);
  b0.Reset();  // one credit back, and the take of b1 with it: step 2 is pushed
  auto b2 = TakeBatch(*loader);
  ASSERT_TRUE(b2.ok()) << b2.status().ToString();
  EXPECT_EQ(b2->step(), 2u);
  // b2 was taken while b1 was held: its take goes with b1's release.
  EXPECT_EQ(SettledStat("batches_served", 2), 2u);
  EXPECT_EQ(SettledStat("batches_gathered", 3), 3u);  // b1 and b2 hold the credit
  b1.Reset();
  EXPECT_EQ(SettledStat("batches_served", 3), 3u);
}

// A take while an earlier batch is held is reported with that batch's
// release (one sendmmsg), so next() sends nothing; the daemon pushes the
// next batch then. A caller that comes back for the next batch before
// releasing anything finds nothing pushed: it waits one round trip, and its
// takes are reported at once from then on.
TEST_F(HandoffTest, ATakeWhileHoldingABatchIsReportedWithItsRelease) {
  auto c = Connect();
  auto loader = c->OpenLoader(Spec(/*leases=*/4)).value();
  auto b0 = TakeBatch(*loader).value();  // nothing else held: reported at once
  EXPECT_EQ(SettledStat("batches_served", 1), 1u);
  EXPECT_EQ(SettledStat("slots_held", 2), 2u);  // b0 and step 1 pushed
  auto b1 = TakeBatch(*loader).value();         // b0 held: deferred
  EXPECT_EQ(b1.step(), 1u);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // time to (wrongly) push
  EXPECT_EQ(Stat("batches_served"), 1u);
  EXPECT_EQ(Stat("slots_held"), 2u);  // step 2 not pushed
  b0.Reset();                         // release + take, together
  EXPECT_EQ(SettledStat("batches_served", 2), 2u);
  EXPECT_EQ(SettledStat("slots_held", 2), 2u);  // b1 and step 2 pushed
  // Holding b1, take b2 (deferred), then b3 without releasing anything:
  // b3 was not pushed, so next() waits for it; the wait reports b2's take.
  auto b2 = TakeBatch(*loader).value();
  EXPECT_EQ(b2.step(), 2u);
  auto b3 = TakeBatch(*loader);
  ASSERT_TRUE(b3.ok()) << b3.status().ToString();
  EXPECT_EQ(b3->step(), 3u);
  // From now on takes are reported at once: step 4 is pushed unasked.
  EXPECT_EQ(SettledStat("batches_served", 4), 4u);
  EXPECT_EQ(SettledStat("slots_held", 4), 4u);  // b1, b2, b3 and step 4
}

// After a miss (next() before anything carried the deferred take) takes are
// reported at once for a back-off of takes: 8 after the first miss, doubled
// by each miss, halved after 64 deferrals in a row that paid (a training
// loop), so a loop defers again soon and a caller that keeps missing rarely
// pays (client/src/connection.h kDeferCooldownMin).
TEST_F(HandoffTest, AMissedDeferralReportsTakesAtOnceForABackOffThatDoublesAndDecays) {
  auto c = Connect();
  auto loader = c->OpenLoader(Spec(/*leases=*/40)).value();
  std::vector<client::Batch> held;
  uint64_t step = 0;  // taken so far
  auto take = [&] {
    auto b = TakeBatch(*loader);
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    ASSERT_EQ(b->step(), step);
    ++step;
    held.push_back(std::move(*b));
  };
  auto deferred = [&] {  // the last take is not reported yet
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    EXPECT_EQ(Stat("batches_served"), step - 1) << "after step " << step - 1;
  };
  // A miss, then `cooldown` takes reported at once (the miss's own take
  // among them), then a deferred one.
  auto miss_then_cooldown = [&](uint32_t cooldown) {
    for (uint32_t i = 0; i < cooldown; ++i) {
      take();
      ASSERT_TRUE(WaitStat("batches_served", step)) << "cooldown " << cooldown << ", take " << i;
    }
    take();
    deferred();
  };
  take();  // nothing else held: at once
  ASSERT_TRUE(WaitStat("batches_served", 1));
  take();  // deferred
  deferred();
  ASSERT_NO_FATAL_FAILURE(miss_then_cooldown(8));
  ASSERT_NO_FATAL_FAILURE(miss_then_cooldown(16));  // the back-off is now 32
  // A training loop (hold the previous batch, drop it after next()): every
  // take is deferred and carried by the release; 64 of them halve the back-off.
  client::Batch prev = std::move(held.back());
  held.clear();
  for (int i = 0; i < 64; ++i) {
    take();
    prev = std::move(held.back());
    held.clear();
  }
  ASSERT_TRUE(WaitStat("batches_served", step));
  held.push_back(std::move(prev));
  take();  // deferred, holding two
  deferred();
  ASSERT_NO_FATAL_FAILURE(miss_then_cooldown(16));
}

// Protocol 1.4 at the frame level: an open with `push_queue` gets the queue
// as its second fd; batches come through the queue and never the socket; a
// client that says it waits is woken by a heartbeat, by the push that fills
// its queue or at once if an entry is already unread; a head the client
// forges past the tail ends its session.
TEST_F(HandoffTest, PushQueueCarriesTheBatchesAndWakesAWaitingClient) {
  LoaderSpec spec = Spec(/*leases=*/1);
  UniqueFd fd = RawHello();
  StoreFiles files = Store::OpenFileSet(store_).value();
  OpenMsg open;
  open.id = 1;
  open.streams = {
      {store_, files.shapes.valid(), files.dict.valid(), static_cast<uint32_t>(files.data.size())}};
  open.batch_size = spec.batch_size;
  open.mode = static_cast<uint32_t>(spec.mode);
  open.seed = spec.seed;
  open.prefetch = 2;
  open.leases = 1;
  open.push_queue = true;
  std::vector<int> fds = {files.meta.get(), files.index.get()};
  if (files.shapes.valid()) fds.push_back(files.shapes.get());
  if (files.dict.valid()) fds.push_back(files.dict.get());
  for (const UniqueFd& d : files.data) fds.push_back(d.get());
  ASSERT_TRUE(SendFrame(fd.get(), EncodeMessage(open), fds).ok());
  Frame reply = RecvFrame(fd.get()).value();
  Message m = DecodeMessage(reply.bytes).value();
  ASSERT_TRUE(std::holds_alternative<OpenedMsg>(m)) << MessageName(m);
  const OpenedMsg& opened = std::get<OpenedMsg>(m);
  ASSERT_EQ(reply.fds.size(), 2u);
  ASSERT_EQ(opened.queue_bytes, kPushQueueHeaderBytes + kPushQueueDataBytes);
  UniqueFd forge_fd(::dup(reply.fds[1].get()));
  PushQueueReader queue =
      PushQueueReader::Attach(std::move(reply.fds[1]), opened.queue_bytes).value();
  // Everything the socket holds is a heartbeat: no pushed item travels there.
  auto socket_has_only_heartbeats = [&] {
    while (true) {
      Frame f = RecvFrame(fd.get(), kMaxFrameBytes, 0, /*nonblocking=*/true).value();
      if (f.would_block) return true;
      if (f.eof) return false;
      Message got = DecodeMessage(f.bytes).value();
      if (!std::holds_alternative<HeartbeatMsg>(got)) {
        ADD_FAILURE() << "a '" << MessageName(got) << "' frame on the socket";
        return false;
      }
    }
  };
  std::vector<uint8_t> frame;
  auto next_entry = [&]() -> BatchMsg {
    for (int i = 0; i < 500; ++i) {
      if (queue.Peek(&frame).value()) {
        Message got = DecodeMessage(frame).value();
        EXPECT_TRUE(std::holds_alternative<BatchMsg>(got)) << MessageName(got);
        queue.Pop();
        return std::holds_alternative<BatchMsg>(got) ? std::get<BatchMsg>(got) : BatchMsg{};
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ADD_FAILURE() << "nothing queued in 5 s";
    return BatchMsg{};
  };
  const BatchMsg b0 = next_entry();
  EXPECT_EQ(b0.step, 0u);
  EXPECT_EQ(b0.gen, 0u);
  EXPECT_TRUE(socket_has_only_heartbeats());
  // Took step 0 and waits for step 1, which the credit (1, held by step 0)
  // keeps back: no wake-up yet. The release lets it through: the push wakes us.
  ASSERT_TRUE(SendFrame(fd.get(), EncodeMessage(ConsumedMsg{0, 1, /*waiting=*/true})).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(Stat("queue_wakeups"), 0u);
  ASSERT_TRUE(SendFrame(fd.get(), EncodeMessage(ReleaseMsg{b0.slot, b0.seq})).ok());
  ASSERT_TRUE(WaitStat("queue_wakeups", 1));
  // Step 1 is unread: a wait announced now is answered at once.
  ASSERT_TRUE(SendFrame(fd.get(), EncodeMessage(ConsumedMsg{0, 1, /*waiting=*/true})).ok());
  ASSERT_TRUE(WaitStat("queue_wakeups", 2));
  EXPECT_EQ(next_entry().step, 1u);
  EXPECT_TRUE(socket_has_only_heartbeats());
  // A head past the tail is a protocol violation: the session ends.
  MappedRegion forge = MappedRegion::Map(forge_fd.get(), opened.queue_bytes, 0, true).value();
  const uint64_t forged = 1 << 20;
  std::memcpy(forge.mutable_data() + 128, &forged, sizeof forged);
  ASSERT_TRUE(SendFrame(fd.get(), EncodeMessage(ConsumedMsg{0, 2, /*waiting=*/true})).ok());
  EXPECT_TRUE(HungUp(fd.get()));
  EXPECT_TRUE(WaitStat("loaders", 0));
  EXPECT_EQ(Stat("protocol_errors"), 1u);
}

TEST_F(HandoffTest, SeekReleasesOlderGenerationsUnreadAndReturnsTheSoughtStep) {
  auto c = Connect();
  auto reference = c->OpenLoader(Spec()).value();
  ASSERT_TRUE(SeekTo(*reference, 7).ok());
  const std::vector<uint32_t> want = Values(TakeBatch(*reference).value());
  reference->Close();
  ASSERT_TRUE(WaitStat("loaders", 0));

  auto loader = c->OpenLoader(Spec()).value();
  auto b0 = TakeBatch(*loader).value();
  ASSERT_TRUE(WaitStat("slots_held", 2));  // b0 and step 1, pushed
  const uint64_t releases = Stat("releases");
  ASSERT_TRUE(SeekTo(*loader, 7).ok());
  EXPECT_EQ(loader->step(), 7u);
  // Step 1 went back unread; 7 is pushed in its place.
  ASSERT_TRUE(WaitStat("releases", releases + 1));
  EXPECT_EQ(SettledStat("slots_held", 2), 2u);
  auto b7 = TakeBatch(*loader).value();
  EXPECT_EQ(b7.step(), 7u);
  EXPECT_EQ(Values(b7), want);
  EXPECT_EQ(TakeBatch(*loader).value().step(), 8u);
  EXPECT_EQ(Stat("stale_releases"), 0u);
}

TEST_F(HandoffTest, ClosingWithPushedBatchesReclaimsEverything) {
  auto c = Connect();
  {
    auto loader = c->OpenLoader(Spec()).value();
    auto b0 = TakeBatch(*loader).value();
    ASSERT_TRUE(WaitStat("slots_held", 2));  // b0 and step 1, pushed
    loader->Close();
    EXPECT_EQ(TakeBatch(*loader).status().code(), Status::Code::kCancelled);
  }
  EXPECT_TRUE(WaitStat("slots_held", 0));
  EXPECT_TRUE(WaitStat("loaders", 0));
  EXPECT_EQ(Stat("stale_releases"), 0u);
}

}  // namespace
}  // namespace loaderx::testing
