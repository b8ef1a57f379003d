// The BatchSource seam (batch_source.h) on both implementations: the
// embedded Pipeline and the client Loader served by a real in-process
// loaderxd deliver the same bytes through the same views; a daemon batch is
// a private copy-on-write view unless shared_view is asked for; a deadline
// that passes consumes nothing; SeekUntil never sends a seek twice.
#include "loaderx/batch_source.h"

#include <condition_variable>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "daemon/daemon_fixture.h"

namespace loaderx::testing {
namespace {

using client::LoaderSpec;
using Clock = std::chrono::steady_clock;

class BatchSourceTest : public DaemonFixture {
 protected:
  LoaderSpec Spec() {
    if (dense_.empty()) {
      dense_ = MakeDenseStore(dir_.Sub("dense"), 100);
      ragged_ = MakeRaggedStore(dir_.Sub("ragged"), 100);
    }
    LoaderSpec s;
    s.stores = {dense_, ragged_};
    s.batch_size = 8;
    s.mode = SamplerMode::kCyclic;
    s.seed = 5;
    s.prefetch = 2;
    s.leases = 4;
    return s;
  }
  std::unique_ptr<BatchSource> Embedded(const LoaderSpec& spec) {
    std::vector<std::shared_ptr<const Store>> streams;
    for (auto& p : spec.stores) streams.push_back(Store::Open(p).value());
    SamplerSpec ss{streams[0]->size(), spec.batch_size, spec.mode, spec.seed, 0, 1, {}};
    PipelineOptions opt;
    opt.prefetch = 2;
    opt.num_threads = 2;
    return Pipeline::Create(streams, ss, opt).value();
  }
  // Every value byte of a view, stream by stream, records in order.
  static std::vector<uint8_t> Bytes(const BatchSource& src, const BatchView& v) {
    std::vector<uint8_t> out;
    for (size_t j = 0; j < v.streams.size(); ++j) {
      const StreamInfo& s = src.streams()[j];
      const StreamView& sv = v.streams[j];
      if (s.kind == Kind::kDense) {
        uint64_t bytes = v.batch_size * s.itemsize;
        for (uint64_t d : s.item_shape) bytes *= d;
        out.insert(out.end(), sv.values, sv.values + bytes);
        continue;
      }
      for (uint64_t k = 0; k < v.batch_size; ++k) {
        uint64_t bytes = s.itemsize;
        for (uint32_t d = 0; d < s.ndim; ++d) bytes *= sv.shapes[k * s.ndim + d];
        const uint8_t* rec = sv.values + (sv.offsets[k] - sv.offsets[0]);
        EXPECT_EQ(sv.offsets[k + 1] - sv.offsets[k], bytes);
        out.insert(out.end(), rec, rec + bytes);
      }
    }
    return out;
  }
  static BatchView Take(BatchSource& src) {
    auto r = src.NextUntil(Clock::now() + std::chrono::seconds(10));
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_TRUE(r->has_value());
    return std::move(**r);
  }
  std::string dense_, ragged_;
};

TEST_F(BatchSourceTest, BothHostsDeliverTheSameBytesThroughTheSameViews) {
  auto c = Connect();
  std::unique_ptr<BatchSource> daemon = c->OpenLoader(Spec()).value();
  std::unique_ptr<BatchSource> embedded = Embedded(Spec());
  ASSERT_EQ(daemon->streams().size(), 2u);
  for (size_t j = 0; j < 2; ++j) {
    EXPECT_EQ(daemon->streams()[j].kind, embedded->streams()[j].kind);
    EXPECT_EQ(daemon->streams()[j].dtype, embedded->streams()[j].dtype);
    EXPECT_EQ(daemon->streams()[j].item_shape, embedded->streams()[j].item_shape);
  }
  for (uint64_t s = 0; s < 30; ++s) {
    BatchView a = Take(*daemon);
    BatchView b = Take(*embedded);
    ASSERT_EQ(a.step, s);
    ASSERT_EQ(b.step, s);
    EXPECT_TRUE(a.writable && b.writable);
    EXPECT_EQ(Bytes(*daemon, a), Bytes(*embedded, b)) << "step " << s;
  }
  EXPECT_EQ(daemon->step(), 30u);
  EXPECT_EQ(embedded->step(), 30u);
}

TEST_F(BatchSourceTest, AWriteToADaemonBatchStaysInThisProcess) {
  auto c = Connect();
  LoaderSpec spec = Spec();
  spec.leases = 1;  // one slot: the next batch of step 0 reuses it
  std::unique_ptr<BatchSource> src = c->OpenLoader(spec).value();
  std::unique_ptr<BatchSource> ref = Embedded(spec);
  const std::vector<uint8_t> want = Bytes(*ref, Take(*ref));
  {
    BatchView v = Take(*src);
    ASSERT_TRUE(v.writable);
    std::memset(v.streams[0].values, 0xAB, 8 * 16);  // all of the dense stream
    EXPECT_EQ(v.streams[0].values[3], 0xAB);
  }  // the lease ends: the slot goes back unchanged
  ASSERT_TRUE(src->SeekUntil(0, Clock::now() + std::chrono::seconds(10)).value());
  BatchView again = Take(*src);
  EXPECT_EQ(Bytes(*src, again), want);
}

TEST_F(BatchSourceTest, SharedViewIsTheReadOnlyRingItself) {
  auto c = Connect();
  LoaderSpec spec = Spec();
  spec.shared_view = true;
  std::unique_ptr<client::Loader> loader = c->OpenLoader(spec).value();
  BatchView v = Take(*loader);
  EXPECT_FALSE(v.writable);
  std::unique_ptr<BatchSource> ref = Embedded(spec);
  EXPECT_EQ(Bytes(*loader, v), Bytes(*ref, Take(*ref)));
}

TEST_F(BatchSourceTest, APassedDeadlineConsumesNothing) {
  auto c = Connect();
  std::unique_ptr<BatchSource> src = c->OpenLoader(Spec()).value();
  // A poll: a batch already there may be returned, else nothing is consumed.
  for (int i = 0; i < 3; ++i) {
    auto polled = src->NextUntil(Clock::now() - std::chrono::seconds(1));
    ASSERT_TRUE(polled.ok()) << polled.status().ToString();
    if (polled->has_value()) {
      EXPECT_EQ((*polled)->step, 0u);
      return;
    }
    EXPECT_EQ(src->step(), 0u);
  }
  EXPECT_EQ(Take(*src).step, 0u);
}

TEST_F(BatchSourceTest, SeekUntilAnExpiredDeadlineIsSettledWithoutResending) {
  auto c = Connect();
  std::unique_ptr<BatchSource> src = c->OpenLoader(Spec()).value();
  EXPECT_EQ(Take(*src).step, 0u);
  // A deadline already passed: the seek goes out, its answer is not awaited.
  Result<bool> first = src->SeekUntil(40, Clock::now() - std::chrono::seconds(1));
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  if (!*first) {
    Result<bool> settled = src->SeekUntil(40, Clock::now() + std::chrono::seconds(10));
    ASSERT_TRUE(settled.ok()) << settled.status().ToString();
    EXPECT_TRUE(*settled);
  }
  EXPECT_EQ(src->step(), 40u);
  EXPECT_EQ(Take(*src).step, 40u);
  EXPECT_EQ(Take(*src).step, 41u);
}

TEST_F(BatchSourceTest, CloseEndsABlockedNextOnBothHosts) {
  auto c = Connect();
  std::vector<std::unique_ptr<BatchSource>> sources;
  sources.push_back(c->OpenLoader(Spec()).value());
  sources.push_back(Embedded(Spec()));
  for (auto& src : sources) {
    src->Close();
    auto r = src->NextUntil(Clock::now() + std::chrono::seconds(10));
    EXPECT_EQ(r.status().code(), Status::Code::kCancelled);
  }
}

// Writable views are dropped on another thread (as Python's GC may) after
// every value byte was written, while this thread draws on: each batch, in
// the slots and pages those views left, reads exactly the embedded bytes.
TEST_F(BatchSourceTest, WritableViewsWrittenAndDroppedOnAnotherThreadNeverLeak) {
  auto c = Connect();
  LoaderSpec spec = Spec();
  std::unique_ptr<BatchSource> src = c->OpenLoader(spec).value();
  std::unique_ptr<BatchSource> ref = Embedded(spec);
  std::mutex mu;
  std::condition_variable cv;
  std::deque<BatchView> handed;
  bool done = false;
  std::thread dropper([&] {
    std::unique_lock<std::mutex> lock(mu);
    while (true) {
      cv.wait(lock, [&] { return done || !handed.empty(); });
      if (handed.empty()) return;
      BatchView v = std::move(handed.front());
      handed.pop_front();
      lock.unlock();
      for (size_t j = 0; j < v.streams.size(); ++j) {
        const StreamView& sv = v.streams[j];
        const StreamInfo& s = src->streams()[j];
        uint64_t bytes = v.batch_size * s.itemsize;
        if (s.kind == Kind::kDense) {
          for (uint64_t d : s.item_shape) bytes *= d;
        } else {
          bytes = sv.offsets[v.batch_size] - sv.offsets[0];
        }
        std::memset(sv.values, 0xAB, bytes);
      }
      v = BatchView{};  // the lease ends on this thread
      lock.lock();
      cv.notify_all();
    }
  });
  for (uint64_t s = 0; s < 60; ++s) {
    BatchView v = Take(*src);
    ASSERT_EQ(v.step, s);
    ASSERT_TRUE(v.writable);
    ASSERT_EQ(Bytes(*src, v), Bytes(*ref, Take(*ref))) << "step " << s;
    std::unique_lock<std::mutex> lock(mu);
    // Two batches at most with the dropper (the credit is 4: one is pushed
    // ahead, one is drawn next).
    cv.wait(lock, [&] { return handed.size() < 2; });
    handed.push_back(std::move(v));
    cv.notify_all();
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    done = true;
  }
  cv.notify_all();
  dropper.join();
}

}  // namespace
}  // namespace loaderx::testing
