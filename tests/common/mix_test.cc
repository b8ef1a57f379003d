// Tests of the mixture's virtual stores (common/include/loaderx/mix.h):
// position -> (dataset, record) mapping, gathers split across parts in batch
// order, the dataset-number stream, and the refusals.
#include "loaderx/mix.h"

#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <vector>

#include "loaderx/thread_pool.h"
#include "store_test_util.h"

namespace loaderx {
namespace {

using testing::DenseSchema;
using testing::TempDir;

// A dense int32 store of `n` records {base + i}.
std::shared_ptr<const Store> IntStore(const TempDir& dir, const std::string& name, int32_t base,
                                      int n, const std::string& dtype = "<i4") {
  WriteOptions options;
  options.data_shards = 1;
  auto writer = StoreWriter::Create(dir.Sub(name), DenseSchema(dtype, {}), options);
  EXPECT_TRUE(writer.ok()) << writer.status().ToString();
  std::vector<int32_t> values(n);
  std::iota(values.begin(), values.end(), base);
  EXPECT_TRUE((*writer)->AppendDense(values.data(), n).ok());
  EXPECT_TRUE((*writer)->Publish().ok());
  auto store = Store::Open(dir.Sub(name));
  EXPECT_TRUE(store.ok()) << store.status().ToString();
  return *store;
}

std::vector<int32_t> GatherInts(const Store& s, const std::vector<uint64_t>& idx,
                                ThreadPool* pool = nullptr) {
  std::vector<int32_t> out(idx.size(), -1);
  std::vector<void*> outs;
  for (auto& v : out) outs.push_back(&v);
  Status st = s.Gather(idx, outs, pool);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return out;
}

TEST(MixedStoreTest, PositionsMapToRecordsOfTheirSegmentModuloTheLength) {
  TempDir dir;
  auto mixed = MixedStore({IntStore(dir, "a", 100, 3), IntStore(dir, "b", 200, 5)}, {4, 6});
  ASSERT_TRUE(mixed.ok()) << mixed.status().ToString();
  const Store& m = **mixed;
  EXPECT_EQ(m.size(), 10u);
  // 0..3 -> a: 0 1 2 0; 4..9 -> b: 0 1 2 3 4 0.
  EXPECT_EQ(GatherInts(m, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9}),
            (std::vector<int32_t>{100, 101, 102, 100, 200, 201, 202, 203, 204, 200}));
  ThreadPool pool(3);
  // A batch mixing both parts comes back in batch order, also on a pool.
  EXPECT_EQ(GatherInts(m, {9, 0, 4, 3, 7, 2}, &pool),
            (std::vector<int32_t>{200, 100, 200, 100, 203, 102}));
  int32_t one = 0;
  ASSERT_TRUE(m.ReadRecord(8, &one, 4).ok());
  EXPECT_EQ(one, 204);
  EXPECT_EQ(m.RecordBytes(5).value(), 4u);
  EXPECT_EQ(m.schema().dtype.str, "<i4");
}

TEST(MixedStoreTest, OutOfRangePositionIsAnIndexError) {
  TempDir dir;
  auto m = MixedStore({IntStore(dir, "a", 0, 2)}, {2}).value();
  std::vector<int32_t> out(1);
  std::vector<void*> outs{out.data()};
  std::vector<uint64_t> idx{2};
  EXPECT_EQ(m->Gather(idx, outs, nullptr).code(), Status::Code::kIndexError);
  EXPECT_EQ(m->RecordBytes(2).status().code(), Status::Code::kIndexError);
  EXPECT_EQ(m->Locate(0).status().code(), Status::Code::kInvalidArgument);
}

TEST(MixedStoreTest, PartsOfAnotherSchemaAreRefusedNamingThem) {
  TempDir dir;
  auto a = IntStore(dir, "a", 0, 2);
  auto f = IntStore(dir, "f", 0, 2, "<f4");
  auto r = MixedStore({a, f}, {2, 2});
  ASSERT_EQ(r.status().code(), Status::Code::kSchemaError);
  EXPECT_NE(r.status().message().find(dir.Sub("f")), std::string::npos);
  EXPECT_EQ(MixedStore({a}, {2, 2}).status().code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(MixedStore({a, nullptr}, {2, 2}).status().code(), Status::Code::kInvalidArgument);
}

TEST(MixCountsTest, ZeroEmptyAndOverflowingCountsAreRefused) {
  EXPECT_EQ(ValidateMixCounts({}).code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(ValidateMixCounts({3, 0}).code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(ValidateMixCounts({uint64_t{1} << 62, uint64_t{1} << 62}).code(),
            Status::Code::kInvalidArgument);
  EXPECT_EQ(ValidateMixCounts({~uint64_t{0}, 2}).code(), Status::Code::kInvalidArgument);
  EXPECT_TRUE(ValidateMixCounts({1, 2, 3}).ok());
}

TEST(MixSourceStoreTest, EveryPositionNamesItsDataset) {
  auto s = MixSourceStore({2, 1, 3}).value();
  EXPECT_EQ(s->size(), 6u);
  EXPECT_EQ(s->schema().dtype.str, "<i8");
  EXPECT_TRUE(s->schema().item_shape.empty());
  std::vector<int64_t> out(6, -1);
  std::vector<void*> outs;
  for (auto& v : out) outs.push_back(&v);
  std::vector<uint64_t> idx{5, 0, 2, 1, 3, 4};
  ASSERT_TRUE(s->Gather(idx, outs, nullptr).ok());
  EXPECT_EQ(out, (std::vector<int64_t>{2, 0, 1, 0, 2, 2}));
}

// A schedule: S segments of K counts each, one after the other; entry e is
// dataset e % K, a zero count leaves its dataset out of that segment.
TEST(MixedStoreTest, ScheduleSegmentsFollowOneAnother) {
  TempDir dir;
  auto mixed =
      MixedStore({IntStore(dir, "a", 100, 3), IntStore(dir, "b", 200, 5)}, {2, 1, 0, 4}, 2);
  ASSERT_TRUE(mixed.ok()) << mixed.status().ToString();
  EXPECT_EQ((*mixed)->size(), 7u);
  // 0..1 -> a 0 1; 2 -> b 0; (segment 1) 3..6 -> b 0 1 2 3.
  EXPECT_EQ(GatherInts(**mixed, {0, 1, 2, 3, 4, 5, 6}),
            (std::vector<int32_t>{100, 101, 200, 200, 201, 202, 203}));
  EXPECT_EQ(MixedStore({IntStore(dir, "c", 0, 2)}, {2, 1, 0, 4}, 2).status().message(),
            "a mixture needs one store per dataset and segment: 1 stores, 4 counts, 2 segment(s)");
  auto s = MixSourceStore({2, 1, 0, 4}, 2).value();
  std::vector<int64_t> out(7, -1);
  std::vector<void*> outs;
  outs.reserve(out.size());
  for (auto& v : out) outs.push_back(&v);
  std::vector<uint64_t> idx{0, 1, 2, 3, 4, 5, 6};
  ASSERT_TRUE(s->Gather(idx, outs, nullptr).ok());
  EXPECT_EQ(out, (std::vector<int64_t>{0, 0, 1, 1, 1, 1, 1}));
}

TEST(MixCountsTest, ScheduleCountsAreCheckedPerSegmentAndDataset) {
  EXPECT_TRUE(ValidateMixCounts({2, 1, 0, 4}, 2).ok());
  auto message = [](const Status& s) {
    EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
    return s.message();
  };
  EXPECT_EQ(message(ValidateMixCounts({2, 1, 0}, 2)),
            "a mixture schedule needs 1..65536 segments of 2 counts, got 3 counts");
  EXPECT_EQ(message(ValidateMixCounts({2, 1, 0, 0}, 2)),
            "mixture schedule segment 1 has 0 positions");
  EXPECT_EQ(message(ValidateMixCounts({2, 0, 3, 0}, 2)), "mixture dataset 1 has 0 positions");
  // One segment keeps the plain rule: every dataset has positions.
  EXPECT_EQ(message(ValidateMixCounts({2, 0}, 2)), "mixture dataset 1 has 0 positions");
}

}  // namespace
}  // namespace loaderx
