// Tests of the loader pipeline (common/include/loaderx/loader.h): batch
// layout, ordered deterministic delivery, errors per step, Seek, Close and
// memory bounds. Stores are in-memory fakes so tests can inject errors and
// delays; the sampler is the real one.
#include "loaderx/loader.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <numeric>
#include <set>
#include <thread>

#include "loaderx/thread_pool.h"
#include "source_test_util.h"
#include "store_test_util.h"

namespace loaderx {
namespace {

using namespace std::chrono_literals;
using testing::MemoryOf;
using testing::NextBatch;
using testing::SeekTo;
using Clock = BatchSource::Clock;

// Dense: record i is item_elems uint16 values i*7+e. Ragged (ndim 2): record
// i has shape (1 + i % 3, 2 + i % 4) of int32 values i*1000+e.
class FakeStore final : public Store {
 public:
  static std::shared_ptr<FakeStore> Dense(uint64_t n, std::vector<uint64_t> item_shape) {
    auto s = std::shared_ptr<FakeStore>(new FakeStore(n));
    s->schema_.kind = Kind::kDense;
    s->schema_.dtype = DType{"<u2", 'u', 2};
    s->schema_.ndim = static_cast<uint32_t>(item_shape.size());
    s->schema_.item_shape = std::move(item_shape);
    return s;
  }
  static std::shared_ptr<FakeStore> Ragged(uint64_t n) {
    auto s = std::shared_ptr<FakeStore>(new FakeStore(n));
    s->schema_.kind = Kind::kRagged;
    s->schema_.dtype = DType{"<i4", 'i', 4};
    s->schema_.ndim = 2;
    return s;
  }

  // Records in `bad` fail to gather with Corruption.
  std::set<uint64_t> bad;
  // The threads that read records (guarded by readers_mu).
  mutable std::mutex readers_mu;
  mutable std::set<std::thread::id> readers;
  // Every Gather sleeps this long first (to keep batches in flight).
  std::chrono::milliseconds delay{0};
  // Every record read sleeps this long (so no single thread can take every
  // record of a batch before the others start).
  std::chrono::microseconds read_delay{0};
  mutable std::atomic<int> gathers{0};

  const Schema& schema() const override { return schema_; }
  Codec codec() const override { return Codec::kRaw; }
  uint32_t data_shards() const override { return 1; }
  uint64_t size() const override { return n_; }
  uint64_t nbytes() const override { return 0; }
  uint64_t stored_bytes() const override { return 0; }
  const std::string& label() const override { return label_; }
  Result<RecordRef> Locate(uint64_t i) const override { return Status::Internal("unused"); }
  Status Verify(const std::function<void(uint64_t, uint64_t)>&) const override {
    return Status::OK();
  }

  Status RecordShape(uint64_t i, uint64_t* dims) const override {
    if (i >= n_) return Status::IndexError("fake: index");
    if (schema_.kind == Kind::kDense) {
      std::copy(schema_.item_shape.begin(), schema_.item_shape.end(), dims);
    } else {
      dims[0] = 1 + i % 3;
      dims[1] = 2 + i % 4;
    }
    return Status::OK();
  }
  Result<uint64_t> RecordBytes(uint64_t i) const override {
    if (i >= n_) return Status::IndexError("fake: index");
    if (schema_.kind == Kind::kDense) return schema_.DenseItemBytes();
    return (1 + i % 3) * (2 + i % 4) * 4;
  }
  Status ReadRecord(uint64_t i, void* out, uint64_t out_len) const override {
    {
      std::lock_guard<std::mutex> lock(readers_mu);
      readers.insert(std::this_thread::get_id());
    }
    if (read_delay.count() > 0) std::this_thread::sleep_for(read_delay);
    if (bad.contains(i)) return Status::Corruption("fake: record " + std::to_string(i) + " is bad");
    LX_ASSIGN_OR_RETURN(uint64_t bytes, RecordBytes(i));
    if (out_len != bytes) return Status::InvalidArgument("fake: wrong out_len");
    Expected(i, out);
    return Status::OK();
  }
  Status Gather(std::span<const uint64_t> indices, std::span<void* const> outs,
                ThreadPool* pool) const override {
    ++gathers;
    if (delay.count() > 0) std::this_thread::sleep_for(delay);
    std::vector<Status> st(indices.size());
    auto one = [&](size_t k) {
      auto bytes = RecordBytes(indices[k]);
      st[k] = bytes.ok() ? ReadRecord(indices[k], outs[k], *bytes) : bytes.status();
    };
    if (pool != nullptr) {
      pool->ParallelFor(indices.size(), one);
    } else {
      for (size_t k = 0; k < indices.size(); ++k) one(k);
    }
    for (auto& s : st) LX_RETURN_IF_ERROR(s);
    return Status::OK();
  }

  // The decoded bytes of record i.
  void Expected(uint64_t i, void* out) const {
    if (schema_.kind == Kind::kDense) {
      auto* v = static_cast<uint16_t*>(out);
      const uint64_t elems = schema_.DenseItemBytes() / 2;
      for (uint64_t e = 0; e < elems; ++e) v[e] = static_cast<uint16_t>(i * 7 + e);
    } else {
      auto* v = static_cast<int32_t*>(out);
      const uint64_t elems = (1 + i % 3) * (2 + i % 4);
      for (uint64_t e = 0; e < elems; ++e) v[e] = static_cast<int32_t>(i * 1000 + e);
    }
  }
  std::vector<uint8_t> ExpectedBytes(uint64_t i) const {
    std::vector<uint8_t> out(RecordBytes(i).value());
    Expected(i, out.data());
    return out;
  }

 private:
  explicit FakeStore(uint64_t n) : n_(n) {}
  uint64_t n_;
  Schema schema_;
  std::string label_ = "fake";
};

using Streams = std::vector<std::shared_ptr<const Store>>;

SamplerSpec Spec(uint64_t n, uint64_t batch, SamplerMode mode = SamplerMode::kIID,
                 uint64_t seed = 7) {
  SamplerSpec spec;
  spec.n = n;
  spec.batch_size = batch;
  spec.mode = mode;
  spec.seed = seed;
  return spec;
}

std::unique_ptr<Pipeline> MakePipeline(const Streams& streams, const SamplerSpec& spec,
                                       PipelineOptions options = {},
                                       std::shared_ptr<BatchAllocator> alloc = nullptr) {
  auto p = Pipeline::Create(streams, spec, options, std::move(alloc));
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  return std::move(p).value();
}

std::vector<uint64_t> IndicesOf(const SamplerSpec& spec, uint64_t step) {
  auto s = Sampler::Make(spec);
  EXPECT_TRUE(s.ok());
  std::vector<uint64_t> out(spec.batch_size);
  s->Fill(step, out.data());
  return out;
}

// Checks that `batch` holds exactly the records the sampler names for `step`,
// laid out as loader.h's diagram says: its views are the planned sections of
// its memory.
void ExpectBatchIs(const BatchView& batch, uint64_t step, const SamplerSpec& spec,
                   const std::vector<std::shared_ptr<FakeStore>>& stores) {
  ASSERT_EQ(batch.step, step);
  const auto indices = IndicesOf(spec, step);
  ASSERT_EQ(batch.batch_size, indices.size());
  ASSERT_TRUE(batch.writable);
  const auto layout = PlanBatch(Streams(stores.begin(), stores.end()), indices);
  ASSERT_TRUE(layout.ok()) << layout.status().ToString();
  const uint8_t* base = testing::MemoryOf(batch).data();
  ASSERT_EQ(batch.streams.size(), stores.size());
  for (size_t j = 0; j < stores.size(); ++j) {
    const StreamLayout& s = layout->streams[j];
    const StreamView& v = batch.streams[j];
    ASSERT_EQ(s.values_offset % kBatchAlignment, 0u);
    ASSERT_EQ(v.values, base + s.values_offset);
    uint64_t off = 0;
    for (size_t k = 0; k < indices.size(); ++k) {
      const auto want = stores[j]->ExpectedBytes(indices[k]);
      if (s.kind == Kind::kRagged) {
        ASSERT_EQ(reinterpret_cast<const uint8_t*>(v.offsets), base + s.offsets_offset);
        ASSERT_EQ(reinterpret_cast<const uint8_t*>(v.shapes), base + s.shapes_offset);
        ASSERT_EQ(v.offsets[k], off);
        EXPECT_EQ(v.shapes[2 * k], 1 + indices[k] % 3);
        EXPECT_EQ(v.shapes[2 * k + 1], 2 + indices[k] % 4);
      }
      ASSERT_EQ(std::memcmp(v.values + off, want.data(), want.size()), 0)
          << "stream " << j << " record " << k << " of step " << step;
      off += want.size();
    }
    ASSERT_EQ(off, s.values_bytes);
  }
}

TEST(StreamViewsTest, HoldsFourInPlaceAndAllOnTheHeapBeyond) {
  std::vector<uint8_t> bytes(8);
  StreamViews views;
  for (size_t j = 0; j < 6; ++j) {
    views.push_back(StreamView{&bytes[j], nullptr, nullptr});
    ASSERT_EQ(views.size(), j + 1);
    for (size_t k = 0; k <= j; ++k) ASSERT_EQ(views[k].values, &bytes[k]) << j << " " << k;
    ASSERT_EQ(views.end() - views.begin(), static_cast<ptrdiff_t>(j + 1));
  }
  StreamViews moved = std::move(views);
  EXPECT_TRUE(views.empty());  // NOLINT(bugprone-use-after-move): a moved-from list is empty
  EXPECT_EQ(moved.size(), 6u);
  EXPECT_EQ(moved[5].values, &bytes[5]);
  StreamViews few;
  few.push_back(StreamView{&bytes[7], nullptr, nullptr});
  StreamViews copy = few;
  few = std::move(moved);
  EXPECT_EQ(few.size(), 6u);
  EXPECT_EQ(few[4].values, &bytes[4]);
  EXPECT_EQ(copy.size(), 1u);
  EXPECT_EQ(copy[0].values, &bytes[7]);
}

TEST(PlanBatchTest, SectionsAreAlignedAndSizedFromShapes) {
  auto dense = FakeStore::Dense(100, {3});  // 6 bytes per record
  auto ragged = FakeStore::Ragged(100);
  const std::vector<uint64_t> indices = {0, 5, 10};  // ragged (1,2) (3,3) (2,4): 8, 36, 32 bytes
  auto layout = PlanBatch({dense, ragged}, indices);
  ASSERT_TRUE(layout.ok()) << layout.status().ToString();
  EXPECT_EQ(layout->batch_size, 3u);
  ASSERT_EQ(layout->streams.size(), 2u);
  const auto& d = layout->streams[0];
  EXPECT_EQ(d.kind, Kind::kDense);
  EXPECT_EQ(d.values_offset, 0u);
  EXPECT_EQ(d.values_bytes, 18u);
  const auto& r = layout->streams[1];
  EXPECT_EQ(r.kind, Kind::kRagged);
  EXPECT_EQ(r.values_offset, 64u);
  EXPECT_EQ(r.values_bytes, 8u + 36u + 32u);
  EXPECT_EQ(r.shapes_offset, 64u + 128u);      // 76 bytes rounded up to 128
  EXPECT_EQ(r.offsets_offset, 192u + 64u);     // 3*2*8 = 48 bytes rounded to 64
  EXPECT_EQ(layout->total_bytes, 256u + 64u);  // 4*8 = 32 bytes rounded to 64
}

TEST(PlanBatchTest, OutOfRangeIndexIsIndexErrorNamingTheStream) {
  auto a = FakeStore::Dense(10, {2});
  auto layout = PlanBatch({a}, {1, 10});
  ASSERT_FALSE(layout.ok());
  EXPECT_EQ(layout.status().code(), Status::Code::kIndexError);
  EXPECT_NE(layout.status().message().find("stream 0 (fake): record index 10"), std::string::npos)
      << layout.status().message();
}

TEST(PlanBatchTest, EmptyStreamsOrIndicesAreInvalid) {
  auto a = FakeStore::Dense(10, {2});
  EXPECT_EQ(PlanBatch({}, {1}).status().code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(PlanBatch({a}, {}).status().code(), Status::Code::kInvalidArgument);
}

TEST(PlanBatchTest, OverflowingBatchBytesIsResourceExhausted) {
  auto huge = FakeStore::Dense(10, {uint64_t{1} << 61});
  auto layout = PlanBatch({huge}, {1, 2, 3, 4});
  EXPECT_EQ(layout.status().code(), Status::Code::kResourceExhausted);
}

TEST(FillBatchTest, WritesValuesShapesOffsetsAndZeroPadding) {
  auto dense = FakeStore::Dense(100, {3});
  auto ragged = FakeStore::Ragged(100);
  const std::vector<uint64_t> indices = {10, 0, 5, 5};
  auto layout = PlanBatch({dense, ragged}, indices);
  ASSERT_TRUE(layout.ok());
  auto mem = HeapAllocator()->Allocate(0, layout->total_bytes);
  ASSERT_TRUE(mem.ok());
  uint8_t* base = (*mem)->data();
  std::memset(base, 0xAB, layout->total_bytes);
  ThreadPool pool(2);
  ASSERT_TRUE(FillBatch({dense, ragged}, indices, *layout, base, &pool).ok());
  uint64_t dims[8];
  std::memcpy(dims, base + layout->streams[1].shapes_offset, sizeof dims);
  EXPECT_EQ(std::vector<uint64_t>(dims, dims + 8), (std::vector<uint64_t>{2, 4, 1, 2, 3, 3, 3, 3}));
  uint16_t dense_first[3];
  std::memcpy(dense_first, base, sizeof dense_first);  // record 10: 70, 71, 72
  EXPECT_EQ(dense_first[0], 70);
  EXPECT_EQ(dense_first[2], 72);
  const auto& r = layout->streams[1];
  uint64_t offsets[5];
  std::memcpy(offsets, base + r.offsets_offset, sizeof offsets);
  EXPECT_EQ(offsets[0], 0u);
  EXPECT_EQ(offsets[1], 32u);        // record 10: 2x4 int32
  EXPECT_EQ(offsets[2], 32u + 8u);   // record 0: 1x2
  EXPECT_EQ(offsets[3], 40u + 36u);  // record 5: 3x3
  EXPECT_EQ(offsets[4], 76u + 36u);  // record 5 again
  int32_t first;
  std::memcpy(&first, base + r.values_offset + offsets[3], 4);
  EXPECT_EQ(first, 5000);
  // Padding between sections is zeroed, not left over.
  const auto& d = layout->streams[0];
  for (uint64_t b = d.values_bytes; b < r.values_offset; ++b) ASSERT_EQ(base[b], 0) << b;
}

TEST(FillBatchTest, MisalignedMemoryIsRejected) {
  auto dense = FakeStore::Dense(10, {3});
  auto layout = PlanBatch({dense}, {1});
  ASSERT_TRUE(layout.ok());
  std::vector<uint8_t> buf(layout->total_bytes + 128);
  uint8_t* p = buf.data();
  while (reinterpret_cast<uintptr_t>(p) % 64 != 1) ++p;
  EXPECT_EQ(FillBatch({dense}, {1}, *layout, p, nullptr).code(), Status::Code::kInvalidArgument);
}

TEST(HeapAllocatorTest, ReusesAFreedBufferOfASimilarSize) {
  auto alloc = HeapAllocator();
  auto a = alloc->Allocate(0, 8 << 20);
  ASSERT_TRUE(a.ok());
  uint8_t* first = (*a)->data();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(first) % kBatchAlignment, 0u);
  EXPECT_EQ((*a)->size(), uint64_t{8} << 20);
  a = Status::Cancelled("drop");  // frees the batch: its buffer goes to the cache
  auto b = alloc->Allocate(1, (8 << 20) - 1000);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ((*b)->data(), first);
  EXPECT_EQ((*b)->size(), (uint64_t{8} << 20) - 1000);
  // Much smaller or larger requests get their own buffer.
  auto small = alloc->Allocate(2, 1000);
  auto large = alloc->Allocate(3, 64 << 20);
  ASSERT_TRUE(small.ok() && large.ok());
  EXPECT_NE((*small)->data(), first);
  EXPECT_NE((*large)->data(), first);
  std::memset((*large)->data(), 1, 64 << 20);  // the whole size is usable
}

TEST(HeapAllocatorTest, StaleSizesAreEvictedSoANewSizeIsReused) {
  auto alloc = HeapAllocator();
  // Fill the cache with buffers of a size the workload then stops using.
  {
    std::vector<std::shared_ptr<BatchMemory>> old;
    for (int i = 0; i < 4; ++i) {
      auto m = alloc->Allocate(i, 1 << 20);
      ASSERT_TRUE(m.ok());
      old.push_back(*m);
    }
  }
  auto a = alloc->Allocate(10, 16 << 20);
  ASSERT_TRUE(a.ok());
  uint8_t* big = (*a)->data();
  a = Status::Cancelled("drop");  // must enter the full cache, evicting a 1 MiB buffer
  // Had the buffer been freed instead, this allocation would likely take its
  // address, and the allocator's would get a different one.
  std::vector<uint8_t> decoy(16 << 20, 1);
  auto b = alloc->Allocate(11, 16 << 20);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ((*b)->data(), big);
}

// A pipeline frees its batches in bursts; every buffer of a burst must be
// reused while batches are live (a cache of two freed the rest, and the next
// steps took fresh pages, a page fault each), and only two kept once none is.
TEST(HeapAllocatorTest, KeepsABurstOfFreedBuffersWhileBatchesAreLive) {
  constexpr uint64_t kBytes = uint64_t{8} << 20;
  // Allocations of the allocator's own shape (2 MiB-aligned): a buffer it
  // freed to the system would be given to one of these, not to it again.
  struct Decoys {
    std::vector<void*> p;
    explicit Decoys(int n) {
      for (int i = 0; i < n; ++i) {
        p.push_back(::operator new(kBytes, std::align_val_t(uint64_t{2} << 20)));
        std::memset(p.back(), 1, kBytes);
      }
    }
    ~Decoys() {
      for (void* q : p) ::operator delete(q, std::align_val_t(uint64_t{2} << 20));
    }
  };
  auto alloc = HeapAllocator();
  std::vector<std::shared_ptr<BatchMemory>> live;
  for (uint64_t i = 0; i < 6; ++i) {
    auto m = alloc->Allocate(i, kBytes);
    ASSERT_TRUE(m.ok());
    live.push_back(*m);
  }
  std::set<uint8_t*> freed;
  for (size_t i = 1; i < live.size(); ++i) freed.insert(live[i]->data());
  live.resize(1);  // five freed at once; one batch stays live
  Decoys decoys(5);
  std::set<uint8_t*> again;
  for (uint64_t i = 6; i < 11; ++i) {
    auto m = alloc->Allocate(i, kBytes);
    ASSERT_TRUE(m.ok());
    again.insert((*m)->data());
    live.push_back(*m);
  }
  EXPECT_EQ(again, freed);
  // Everything freed: two buffers are kept for the next loader, not six.
  std::set<uint8_t*> all;
  for (const auto& m : live) all.insert(m->data());
  live.clear();
  Decoys more(6);
  size_t reused = 0;
  for (uint64_t i = 11; i < 17; ++i) {
    auto m = alloc->Allocate(i, kBytes);
    ASSERT_TRUE(m.ok());
    reused += all.count((*m)->data());
    live.push_back(*m);
  }
  EXPECT_EQ(reused, 2u);
}

TEST(HeapAllocatorTest, BatchesOutliveTheAllocator) {
  std::shared_ptr<BatchMemory> kept;
  {
    auto alloc = HeapAllocator();
    auto a = alloc->Allocate(0, 100);
    ASSERT_TRUE(a.ok());
    kept = *a;
  }
  std::memset(kept->data(), 7, 100);
  EXPECT_EQ(kept->data()[99], 7);
}

TEST(PipelineTest, DeliversStepsInOrderIdenticalToHandGatherForAnyThreadsAndPrefetch) {
  auto dense = FakeStore::Dense(1000, {2, 3});
  auto ragged = FakeStore::Ragged(1000);
  const auto spec = Spec(1000, 16);
  for (uint32_t threads : {1u, 2u, 8u}) {
    for (uint32_t prefetch : {1u, 3u, 8u}) {
      PipelineOptions opt;
      opt.start_step = 5;
      opt.num_threads = threads;
      opt.prefetch = prefetch;
      auto p = MakePipeline({dense, ragged}, spec, opt);
      for (uint64_t k = 0; k < 12; ++k) {
        EXPECT_EQ(p->step(), 5 + k);
        auto b = NextBatch(*p);
        ASSERT_TRUE(b.ok()) << b.status().ToString();
        ExpectBatchIs(*b, 5 + k, spec, {dense, ragged});
      }
    }
  }
}

TEST(PipelineTest, BatchBytesDoNotDependOnThreadsOrPrefetch) {
  auto ragged = FakeStore::Ragged(500);
  const auto spec = Spec(500, 32, SamplerMode::kCyclic, 3);
  std::vector<std::vector<uint8_t>> reference;
  for (uint32_t threads : {1u, 2u, 8u}) {
    PipelineOptions opt;
    opt.num_threads = threads;
    opt.prefetch = threads;
    auto p = MakePipeline({ragged}, spec, opt);
    for (size_t k = 0; k < 6; ++k) {
      auto b = NextBatch(*p);
      ASSERT_TRUE(b.ok());
      BatchMemory& m = MemoryOf(*b);
      std::vector<uint8_t> bytes(m.data(), m.data() + m.size());
      if (threads == 1) {
        reference.push_back(std::move(bytes));
      } else {
        ASSERT_EQ(bytes, reference[k]) << "threads " << threads << " batch " << k;
      }
    }
  }
}

TEST(PipelineTest, GatherErrorIsReturnedForItsStepAndPipelineGoesOn) {
  auto dense = FakeStore::Dense(50, {4});
  const auto spec = Spec(50, 5, SamplerMode::kSequential);
  dense->bad = {12};  // in step 2 (records 10..14)
  PipelineOptions opt;
  opt.prefetch = 4;
  auto p = MakePipeline({dense}, spec, opt);
  ASSERT_TRUE(NextBatch(*p).ok());
  ASSERT_TRUE(NextBatch(*p).ok());
  auto bad = NextBatch(*p);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), Status::Code::kCorruption);
  EXPECT_NE(bad.status().message().find("step 2"), std::string::npos) << bad.status().message();
  EXPECT_NE(bad.status().message().find("record 12 is bad"), std::string::npos);
  EXPECT_EQ(p->step(), 3u);
  auto next = NextBatch(*p);
  ASSERT_TRUE(next.ok());
  ExpectBatchIs(*next, 3, spec, {dense});
}

TEST(PipelineTest, NextUntilTimesOutWhileTheBatchIsNotReady) {
  auto dense = FakeStore::Dense(50, {4});
  dense->delay = 300ms;
  auto p = MakePipeline({dense}, Spec(50, 5));
  auto r = p->NextUntil(Clock::now() + 1ms);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->has_value());
  EXPECT_EQ(p->step(), 0u);
  auto r2 = p->NextUntil(Clock::now() + 5s);
  ASSERT_TRUE(r2.ok());
  ASSERT_TRUE(r2->has_value());
  EXPECT_EQ((*r2)->step, 0u);
}

TEST(PipelineTest, SeekDeliversTheRequestedStepNext) {
  auto dense = FakeStore::Dense(300, {3});
  const auto spec = Spec(300, 8);
  auto p = MakePipeline({dense}, spec);
  for (int k = 0; k < 3; ++k) ASSERT_TRUE(NextBatch(*p).ok());
  ASSERT_TRUE(SeekTo(*p, 1000).ok());
  EXPECT_EQ(p->step(), 1000u);
  auto b = NextBatch(*p);
  ASSERT_TRUE(b.ok());
  ExpectBatchIs(*b, 1000, spec, {dense});
  ASSERT_TRUE(SeekTo(*p, 1).ok());
  b = NextBatch(*p);
  ASSERT_TRUE(b.ok());
  ExpectBatchIs(*b, 1, spec, {dense});
}

TEST(PipelineTest, SeekRacingProductionNeverDeliversStaleBatches) {
  auto dense = FakeStore::Dense(400, {5});
  const auto spec = Spec(400, 4);
  PipelineOptions opt;
  opt.num_threads = 4;
  opt.prefetch = 6;
  auto p = MakePipeline({dense}, spec, opt);
  for (int round = 0; round < 200; ++round) {
    const uint64_t target = (round * 7919u) % 5000;
    ASSERT_TRUE(SeekTo(*p, target).ok());
    for (int k = 0; k < round % 3 + 1; ++k) {
      auto b = NextBatch(*p);
      ASSERT_TRUE(b.ok());
      ExpectBatchIs(*b, target + k, spec, {dense});
    }
  }
}

TEST(PipelineTest, ConcurrentSeekAndNextFromSeveralThreadsStayConsistent) {
  auto dense = FakeStore::Dense(200, {2});
  const auto spec = Spec(200, 3);
  PipelineOptions opt;
  opt.num_threads = 3;
  opt.prefetch = 4;
  auto p = MakePipeline({dense}, spec, opt);
  std::atomic<bool> stop{false};
  std::thread seeker([&] {
    for (uint64_t s = 0; !stop.load(); s += 13) {
      ASSERT_TRUE(SeekTo(*p, s % 1000).ok());
      std::this_thread::sleep_for(100us);
    }
  });
  // Whatever step a batch is, its contents must be that step's.
  for (int k = 0; k < 300; ++k) {
    auto b = NextBatch(*p);
    ASSERT_TRUE(b.ok());
    ExpectBatchIs(*b, b->step, spec, {dense});
  }
  stop = true;
  seeker.join();
}

TEST(PipelineTest, CloseWakesABlockedNextWithCancelled) {
  auto dense = FakeStore::Dense(50, {4});
  dense->delay = 200ms;
  PipelineOptions opt;
  opt.num_threads = 2;
  auto p = MakePipeline({dense}, Spec(50, 5), opt);
  std::atomic<int> code{-1};
  std::thread consumer([&] {
    auto b = NextBatch(*p);
    code = static_cast<int>(b.status().code());
  });
  std::this_thread::sleep_for(20ms);
  const auto t0 = std::chrono::steady_clock::now();
  p->Close();
  const auto took = std::chrono::steady_clock::now() - t0;
  consumer.join();
  EXPECT_EQ(code.load(), static_cast<int>(Status::Code::kCancelled));
  // Close waits for the gathers already running (one 200 ms delay), no more.
  EXPECT_LT(took, 5s);
}

TEST(PipelineTest, CloseIsIdempotentAndSafeFromSeveralThreads) {
  auto dense = FakeStore::Dense(50, {4});
  dense->delay = 10ms;
  auto p = MakePipeline({dense}, Spec(50, 5));
  std::vector<std::thread> closers;
  for (int t = 0; t < 4; ++t) closers.emplace_back([&] { p->Close(); });
  for (auto& t : closers) t.join();
  p->Close();
  EXPECT_EQ(NextBatch(*p).status().code(), Status::Code::kCancelled);
  EXPECT_EQ(p->NextUntil(Clock::now() + 1ms).status().code(), Status::Code::kCancelled);
  EXPECT_EQ(p->SeekUntil(3, Clock::now()).status().code(), Status::Code::kCancelled);
}

TEST(PipelineTest, CloseRacingNextAndSeekFromOtherThreads) {
  for (int round = 0; round < 20; ++round) {
    auto dense = FakeStore::Dense(100, {8});
    auto p = MakePipeline({dense}, Spec(100, 4), {.prefetch = 3, .num_threads = 2});
    std::atomic<bool> done{false};
    std::thread consumer([&] {
      while (true) {
        auto b = NextBatch(*p);
        if (!b.ok()) {
          EXPECT_EQ(b.status().code(), Status::Code::kCancelled);
          break;
        }
      }
      done = true;
    });
    std::thread seeker([&] {
      for (uint64_t s = 0; SeekTo(*p, s).ok(); ++s) std::this_thread::yield();
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(round % 5));
    p->Close();
    consumer.join();
    seeker.join();
    EXPECT_TRUE(done.load());
  }
}

TEST(PipelineTest, BatchMemoryOutlivesThePipeline) {
  auto dense = FakeStore::Dense(100, {8});
  const auto spec = Spec(100, 4);
  BatchView kept;
  {
    auto p = MakePipeline({dense}, spec);
    auto b = NextBatch(*p);
    ASSERT_TRUE(b.ok());
    kept = std::move(b).value();
  }  // destructor closes without an explicit Close()
  ExpectBatchIs(kept, 0, spec, {dense});
}

// Counts live allocations; optionally blocks in Allocate until cancelled.
class CountingAllocator final : public BatchAllocator {
 public:
  explicit CountingAllocator(bool block = false) : block_(block) {}
  Result<std::shared_ptr<BatchMemory>> Allocate(uint64_t step, uint64_t bytes) override {
    if (block_) {
      std::unique_lock<std::mutex> lock(mu_);
      ++waiting;
      cv_.wait(lock, [&] { return cancelled_; });
      return Status::Cancelled("allocator cancelled");
    }
    if (fail_step == step)
      return Status::ResourceExhausted("no memory for step " + std::to_string(step));
    auto inner = heap_->Allocate(step, bytes);
    if (!inner.ok()) return inner.status();
    const int now = ++live;
    int prev = max_live.load();
    while (now > prev && !max_live.compare_exchange_weak(prev, now)) {
    }
    struct Counted final : BatchMemory {
      std::shared_ptr<BatchMemory> inner;
      std::atomic<int>* live;
      ~Counted() override { --*live; }
      uint8_t* data() override { return inner->data(); }
      uint64_t size() const override { return inner->size(); }
    };
    auto c = std::make_shared<Counted>();
    c->inner = std::move(inner).value();
    c->live = &live;
    return std::shared_ptr<BatchMemory>(c);
  }
  void Cancel() override {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled_ = true;
    cv_.notify_all();
  }

  std::atomic<int> live{0};
  std::atomic<int> max_live{0};
  std::atomic<int> waiting{0};  // guarded writes under mu_, read anywhere
  uint64_t fail_step = UINT64_MAX;

 private:
  bool block_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool cancelled_ = false;
  std::shared_ptr<BatchAllocator> heap_ = HeapAllocator();
};

TEST(PipelineTest, MemoryIsBoundedByPrefetchWithASlowConsumer) {
  auto dense = FakeStore::Dense(100, {64});
  auto alloc = std::make_shared<CountingAllocator>();
  PipelineOptions opt;
  opt.prefetch = 3;
  opt.num_threads = 4;
  auto p = MakePipeline({dense}, Spec(100, 8), opt, alloc);
  std::this_thread::sleep_for(200ms);  // the consumer is idle: production must stop
  EXPECT_EQ(alloc->live.load(), 3);
  for (int k = 0; k < 20; ++k) {
    auto b = NextBatch(*p);
    ASSERT_TRUE(b.ok());
    if (k % 5 == 0) {
      ASSERT_TRUE(SeekTo(*p, k * 3).ok());  // seeks must not double memory
    }
  }
  // The consumer holds nothing now; at most prefetch batches were ever alive
  // besides the one being handed over.
  EXPECT_LE(alloc->max_live.load(), 3 + 1);
}

// num_threads is the number of threads that read records, whatever the
// prefetch depth: min(prefetch, num_threads) producers (the threads that
// allocate batches) gather their own batches, helped by the rest.
TEST(PipelineTest, RecordsAreReadByExactlyTheNumThreadsGatherThreads) {
  class ThreadRecordingAllocator final : public BatchAllocator {
   public:
    Result<std::shared_ptr<BatchMemory>> Allocate(uint64_t step, uint64_t bytes) override {
      {
        std::lock_guard<std::mutex> lock(mu);
        producers.insert(std::this_thread::get_id());
      }
      return heap_->Allocate(step, bytes);
    }
    std::mutex mu;
    std::set<std::thread::id> producers;  // guarded by mu

   private:
    std::shared_ptr<BatchAllocator> heap_ = HeapAllocator();
  };
  constexpr uint32_t kThreads = 3;
  for (uint32_t prefetch : {1u, 2u, 8u}) {
    auto dense = FakeStore::Dense(1000, {16});
    // Without it, idle pool helpers could claim all 64 tiny records before
    // the producer that submitted them claims one (flaky on a busy box).
    dense->read_delay = std::chrono::microseconds(200);
    auto alloc = std::make_shared<ThreadRecordingAllocator>();
    const auto spec = Spec(1000, 64);
    {
      auto p = MakePipeline({dense}, spec, {.prefetch = prefetch, .num_threads = kThreads}, alloc);
      for (uint64_t k = 0; k < 30; ++k) {
        auto b = NextBatch(*p);
        ASSERT_TRUE(b.ok()) << b.status().ToString();
        ExpectBatchIs(*b, k, spec, {dense});
      }
    }  // joined: the sets are complete and no longer written
    EXPECT_LE(dense->readers.size(), kThreads) << "prefetch " << prefetch;
    EXPECT_FALSE(alloc->producers.empty());
    EXPECT_LE(alloc->producers.size(), std::min(prefetch, kThreads)) << "prefetch " << prefetch;
    for (const auto& id : alloc->producers) {
      EXPECT_TRUE(dense->readers.contains(id))
          << "a producer did not gather, prefetch " << prefetch;
    }
    EXPECT_FALSE(dense->readers.contains(std::this_thread::get_id()));
  }
}

TEST(PipelineTest, AllocatorErrorIsReturnedForItsStep) {
  auto dense = FakeStore::Dense(100, {4});
  auto alloc = std::make_shared<CountingAllocator>();
  alloc->fail_step = 1;
  auto p = MakePipeline({dense}, Spec(100, 8), {}, alloc);
  EXPECT_TRUE(NextBatch(*p).ok());
  auto b = NextBatch(*p);
  EXPECT_EQ(b.status().code(), Status::Code::kResourceExhausted);
  EXPECT_TRUE(NextBatch(*p).ok());
}

TEST(PipelineTest, CloseCancelsAProducerBlockedInTheAllocator) {
  auto dense = FakeStore::Dense(100, {4});
  auto alloc = std::make_shared<CountingAllocator>(/*block=*/true);
  auto p = MakePipeline({dense}, Spec(100, 8), {.prefetch = 2, .num_threads = 2}, alloc);
  while (alloc->waiting.load() < 1) std::this_thread::sleep_for(1ms);
  std::thread consumer([&] { EXPECT_EQ(NextBatch(*p).status().code(), Status::Code::kCancelled); });
  std::this_thread::sleep_for(10ms);
  p->Close();  // would hang forever if Cancel() were not called
  consumer.join();
}

TEST(PipelineCreateTest, RejectsBadArguments) {
  auto a = FakeStore::Dense(10, {2});
  auto b = FakeStore::Dense(11, {2});
  EXPECT_EQ(Pipeline::Create({}, Spec(10, 2), {}).status().code(), Status::Code::kInvalidArgument);
  auto diff = Pipeline::Create({a, b}, Spec(10, 2), {});
  EXPECT_EQ(diff.status().code(), Status::Code::kInvalidArgument);
  EXPECT_NE(diff.status().message().find("has 10 records"), std::string::npos);
  EXPECT_NE(diff.status().message().find("has 11"), std::string::npos);
  EXPECT_EQ(Pipeline::Create({a}, Spec(9, 2), {}).status().code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(Pipeline::Create({a}, Spec(10, 2), {.prefetch = 0}).status().code(),
            Status::Code::kInvalidArgument);
  EXPECT_EQ(Pipeline::Create({a}, Spec(10, 0), {}).status().code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(Pipeline::Create({a, nullptr}, Spec(10, 2), {}).status().code(),
            Status::Code::kInvalidArgument);
}

TEST(PipelineTest, ShardedRanksConcatenateToTheGlobalBatch) {
  auto dense = FakeStore::Dense(1000, {2});
  SamplerSpec global = Spec(1000, 12);
  auto whole = MakePipeline({dense}, global, {.start_step = 4});
  auto g = NextBatch(*whole);
  ASSERT_TRUE(g.ok());
  // Record i's bytes name i (FakeStore): the ranks' values joined are the
  // global batch's values exactly when their indices are.
  constexpr uint64_t kRecordBytes = 2 * sizeof(uint16_t);
  std::vector<uint8_t> joined;
  for (uint64_t r = 0; r < 3; ++r) {
    SamplerSpec part = global;
    part.batch_size = 4;
    part.rank = r;
    part.world_size = 3;
    auto p = MakePipeline({dense}, part, {.start_step = 4});
    auto b = NextBatch(*p);
    ASSERT_TRUE(b.ok());
    ASSERT_EQ(b->batch_size, 4u);
    const uint8_t* values = b->streams[0].values;
    joined.insert(joined.end(), values, values + 4 * kRecordBytes);
  }
  const uint8_t* whole_values = g->streams[0].values;
  EXPECT_EQ(joined, std::vector<uint8_t>(whole_values, whole_values + 12 * kRecordBytes));
}

// End to end over real zstd stores written by StoreWriter: every delivered
// batch equals ReadRecord of the sampler's indices, for several thread counts.
TEST(PipelineTest, RealZstdStoresMatchReadRecordOfTheSamplerIndices) {
  testing::TempDir dir;
  const uint64_t n = 300;
  WriteOptions wopt;
  wopt.codec = Codec::kZstd;
  wopt.data_shards = 3;
  auto dense_w = StoreWriter::Create(dir.Sub("dense"), testing::DenseSchema("<u2", {4, 8}), wopt);
  ASSERT_TRUE(dense_w.ok()) << dense_w.status().ToString();
  std::vector<uint8_t> dense_bytes;
  for (uint64_t i = 0; i < n; ++i) {
    auto rec = testing::MakeBytes(64, i);
    dense_bytes.insert(dense_bytes.end(), rec.begin(), rec.end());
  }
  ASSERT_TRUE((*dense_w)->AppendDense(dense_bytes.data(), n).ok());
  ASSERT_TRUE((*dense_w)->Publish().ok());
  auto ragged_w = StoreWriter::Create(dir.Sub("ragged"), testing::RaggedSchema("|u1", 1), wopt);
  ASSERT_TRUE(ragged_w.ok());
  std::vector<uint8_t> ragged_bytes;
  std::vector<uint64_t> shapes;
  for (uint64_t i = 0; i < n; ++i) {
    auto rec = testing::MakeBytes(i % 41, i + 1000);  // includes empty records
    ragged_bytes.insert(ragged_bytes.end(), rec.begin(), rec.end());
    shapes.push_back(rec.size());
  }
  ASSERT_TRUE((*ragged_w)->AppendRagged(ragged_bytes.data(), shapes.data(), n).ok());
  ASSERT_TRUE((*ragged_w)->Publish().ok());
  auto dense = Store::Open(dir.Sub("dense"));
  auto ragged = Store::Open(dir.Sub("ragged"));
  ASSERT_TRUE(dense.ok() && ragged.ok());
  const Streams streams = {*dense, *ragged};
  const auto spec = Spec(n, 32, SamplerMode::kCyclic, 5);
  for (uint32_t threads : {1u, 2u, 8u}) {
    auto p = MakePipeline(streams, spec, {.start_step = 3, .prefetch = 3, .num_threads = threads});
    for (uint64_t k = 0; k < 8; ++k) {
      auto b = NextBatch(*p);
      ASSERT_TRUE(b.ok()) << b.status().ToString();
      ASSERT_EQ(b->step, 3 + k);
      const std::vector<uint64_t> indices = IndicesOf(spec, 3 + k);
      ASSERT_EQ(b->batch_size, indices.size());
      const StreamView& d = b->streams[0];
      const StreamView& r = b->streams[1];
      for (size_t j = 0; j < indices.size(); ++j) {
        const uint64_t i = indices[j];
        ASSERT_EQ(std::memcmp(d.values + 64 * j, dense_bytes.data() + 64 * i, 64), 0);
        const uint64_t off = r.offsets[j];
        const uint64_t next_off = r.offsets[j + 1];
        const uint64_t len = r.shapes[j];
        ASSERT_EQ(len, i % 41);
        ASSERT_EQ(next_off - off, len);
        if (len == 0) continue;  // an empty record: nothing to compare
        std::vector<uint8_t> want(len);
        ASSERT_TRUE((*ragged)->ReadRecord(i, want.data(), len).ok());
        ASSERT_EQ(std::memcmp(r.values + off, want.data(), len), 0);
      }
    }
  }
}

}  // namespace
}  // namespace loaderx
