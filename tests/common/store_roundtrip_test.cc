// Round trips through StoreWriter and Store: every dtype, codec, rank and
// shard-count edge, dense and ragged, N = 0 and N = 1.
#if !defined(_WIN32)
#include <sys/mman.h>
#endif

#include <cstring>
#include <filesystem>
#include <random>
#include <thread>

#include "loaderx/store.h"
#include "loaderx/thread_pool.h"
#include "store_test_util.h"

namespace loaderx {
namespace {

using testing::DenseSchema;
using testing::MakeBytes;
using testing::RaggedSchema;
using testing::TempDir;

WriteOptions Options(Codec codec, uint32_t shards) {
  WriteOptions o;
  o.codec = codec;
  o.data_shards = shards;
  if (codec == Codec::kZstdDict) o.dictionary = testing::TestDictionary();
  return o;
}

// Writes n dense records of `schema` and checks every byte comes back.
void DenseRoundTrip(const std::string& path, const Schema& schema, const WriteOptions& opt,
                    uint64_t n) {
  const uint64_t item = schema.DenseItemBytes();
  std::vector<uint8_t> data = MakeBytes(item * n, 42);
  {
    auto w = StoreWriter::Create(path, schema, opt);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    // Two appends: the sequence continues across calls.
    const uint64_t half = n / 2;
    ASSERT_TRUE((*w)->AppendDense(data.data(), half).ok());
    ASSERT_TRUE((*w)->AppendDense(data.data() + half * item, n - half).ok());
    EXPECT_EQ((*w)->size(), n);
    ASSERT_TRUE((*w)->Publish().ok());
  }
  auto s = Store::Open(path);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  const Store& st = **s;
  EXPECT_EQ(st.size(), n);
  EXPECT_EQ(st.schema().dtype, schema.dtype);
  EXPECT_EQ(st.schema().item_shape, schema.item_shape);
  EXPECT_EQ(st.codec(), opt.codec);
  EXPECT_EQ(st.data_shards(), opt.data_shards);
  EXPECT_EQ(st.nbytes(), item * n);
  std::vector<uint8_t> out(item);
  for (uint64_t i = 0; i < n; ++i) {
    ASSERT_TRUE(st.ReadRecord(i, out.data(), item).ok()) << i;
    ASSERT_EQ(0, std::memcmp(out.data(), data.data() + i * item, item)) << "record " << i;
  }
  // Gather in a scrambled order with duplicates through the pool.
  std::vector<uint64_t> idx;
  for (uint64_t i = 0; i < n; ++i) idx.push_back((i * 7919) % n);
  if (n > 0) idx.push_back(0);
  std::vector<uint8_t> batch(item * idx.size());
  std::vector<void*> outs;
  for (size_t k = 0; k < idx.size(); ++k) outs.push_back(batch.data() + k * item);
  ASSERT_TRUE(st.Gather(idx, outs, &ThreadPool::Default()).ok());
  for (size_t k = 0; k < idx.size(); ++k) {
    ASSERT_EQ(0, std::memcmp(batch.data() + k * item, data.data() + idx[k] * item, item)) << k;
  }
  EXPECT_TRUE(st.Verify(nullptr).ok());
}

struct DTypeCodec {
  const char* dtype;
  Codec codec;
};

class DenseDTypeCodecTest : public ::testing::TestWithParam<DTypeCodec> {};

TEST_P(DenseDTypeCodecTest, RoundTripsEveryByte) {
  TempDir dir;
  DenseRoundTrip(dir.Sub("s"), DenseSchema(GetParam().dtype, {3, 5}), Options(GetParam().codec, 4),
                 300);
}

std::vector<DTypeCodec> AllDTypeCodecs() {
  const char* dtypes[] = {"|b1",     "|i1",    "<i2",     "<i4",    "<i8", "|u1", "<u2",
                          "<u4",     "<u8",    "<f2",     "<f4",    "<f8", "<c8", "<c16",
                          "<M8[ns]", "<M8[D]", "<m8[us]", "<m8[s]", "<M8"};
  std::vector<DTypeCodec> v;
  for (const char* d : dtypes) {
    for (Codec c : {Codec::kRaw, Codec::kZstd, Codec::kZstdDict}) v.push_back({d, c});
  }
  return v;
}

INSTANTIATE_TEST_SUITE_P(AllDTypes, DenseDTypeCodecTest, ::testing::ValuesIn(AllDTypeCodecs()),
                         [](const auto& info) {
                           std::string n = info.param.dtype;
                           for (char& ch : n) {
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           }
                           return n + "_" + CodecName(info.param.codec);
                         });

class DenseRankTest : public ::testing::TestWithParam<int> {};

TEST_P(DenseRankTest, RoundTripsRank) {
  const std::vector<std::vector<uint64_t>> shapes = {{}, {7}, {2, 3}, {2, 3, 4}, {2, 1, 3, 2}};
  for (Codec c : {Codec::kRaw, Codec::kZstd}) {
    TempDir dir;
    DenseRoundTrip(dir.Sub("s"), DenseSchema("<f4", shapes[GetParam()]), Options(c, 3), 100);
  }
}
INSTANTIATE_TEST_SUITE_P(Ranks0To4, DenseRankTest, ::testing::Range(0, 5));

class ShardCountTest : public ::testing::TestWithParam<uint32_t> {};

TEST_P(ShardCountTest, RoundTripsWithShards) {
  for (Codec c : {Codec::kRaw, Codec::kZstd}) {
    TempDir dir;
    // 256 KiB runs: 600 records of 8 KiB span 19 runs, so shards alternate.
    DenseRoundTrip(dir.Sub("s"), DenseSchema("|u1", {8192}), Options(c, GetParam()), 600);
  }
}
INSTANTIATE_TEST_SUITE_P(Edges, ShardCountTest, ::testing::Values(1u, 2u, 255u));

TEST(StoreRoundTrip, MoreShardsThanRecords) {
  TempDir dir;
  DenseRoundTrip(dir.Sub("s"), DenseSchema("<i4", {4}), Options(Codec::kZstd, 16), 3);
}

TEST(StoreRoundTrip, EmptyStore) {
  for (Codec c : {Codec::kRaw, Codec::kZstd, Codec::kZstdDict}) {
    TempDir dir;
    DenseRoundTrip(dir.Sub("s"), DenseSchema("<f8", {2}), Options(c, 4), 0);
  }
}

TEST(StoreRoundTrip, SingleRecordStore) {
  for (Codec c : {Codec::kRaw, Codec::kZstd, Codec::kZstdDict}) {
    TempDir dir;
    DenseRoundTrip(dir.Sub("s"), DenseSchema("<u2", {10, 10}), Options(c, 4), 1);
  }
}

TEST(StoreRoundTrip, FlexibleAndBigEndianDTypesKeepTheirString) {
  for (const char* dt : {"|S7", "<U3", "|V5", ">i4", ">f8", ">M8[ms]"}) {
    TempDir dir;
    DenseRoundTrip(dir.Sub("s"), DenseSchema(dt, {3}), Options(Codec::kZstd, 2), 9);
  }
}

TEST(StoreRoundTrip, RawContentDictionary) {
  // Bytes without the ZDICT magic are a raw-content dictionary, as in zstd.
  for (std::string dict : {std::string("hello"), std::string(4096, 'a') + "bcdefgh"}) {
    TempDir dir;
    WriteOptions o = Options(Codec::kZstdDict, 2);
    o.dictionary = dict;
    DenseRoundTrip(dir.Sub("s"), DenseSchema("|u1", {64}), o, 20);
  }
}

TEST(StoreRoundTrip, SixtyThreeDenseAndSixtyFourRaggedDims) {
  TempDir dir;
  DenseRoundTrip(dir.Sub("s"), DenseSchema("|u1", std::vector<uint64_t>(63, 1)),
                 Options(Codec::kRaw, 1), 2);
  EXPECT_EQ(StoreWriter::Create(dir.Sub("t"), DenseSchema("|u1", std::vector<uint64_t>(64, 1)),
                                WriteOptions{})
                .status()
                .code(),
            Status::Code::kInvalidArgument);
  EXPECT_TRUE(StoreWriter::Create(dir.Sub("r"), RaggedSchema("|u1", 64), WriteOptions{}).ok());
  EXPECT_EQ(
      StoreWriter::Create(dir.Sub("q"), RaggedSchema("|u1", 65), WriteOptions{}).status().code(),
      Status::Code::kInvalidArgument);
}

TEST(StoreRoundTrip, RecordsSpreadOverAllShards) {
  TempDir dir;
  DenseRoundTrip(dir.Sub("s"), DenseSchema("|u1", {1 << 16}), Options(Codec::kRaw, 4), 16);
  auto s = Store::Open(dir.Sub("s"));
  ASSERT_TRUE(s.ok());
  // 64 KiB records, 256 KiB runs: 4 records per run, runs round-robin.
  for (uint64_t i = 0; i < 16; ++i) EXPECT_EQ((*s)->Locate(i)->shard, (i / 4) % 4) << i;
}

TEST(StoreRoundTrip, IncompressibleRecordsAreStoredRaw) {
  TempDir dir;
  std::vector<uint8_t> noise(4096 * 10);
  std::mt19937_64 rng(1);
  for (auto& b : noise) b = static_cast<uint8_t>(rng());
  std::vector<uint8_t> zeros(4096 * 10, 0);
  auto w = StoreWriter::Create(dir.Sub("s"), DenseSchema("|u1", {4096}), Options(Codec::kZstd, 2));
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE((*w)->AppendDense(noise.data(), 10).ok());
  ASSERT_TRUE((*w)->AppendDense(zeros.data(), 10).ok());
  ASSERT_TRUE((*w)->Publish().ok());
  auto s = Store::Open(dir.Sub("s"));
  ASSERT_TRUE(s.ok());
  for (uint64_t i = 0; i < 10; ++i) {
    EXPECT_FALSE((*s)->Locate(i)->compressed) << i;
    EXPECT_EQ((*s)->Locate(i)->stored_len, 4096u);
    EXPECT_TRUE((*s)->Locate(10 + i)->compressed);
    EXPECT_LT((*s)->Locate(10 + i)->stored_len, 100u);
  }
  // zstd never loses to raw: stored data is at most the logical bytes.
  EXPECT_LE((*s)->stored_bytes() - 4096, (*s)->nbytes());
}

// Records of at most codec::MinFrameBytes (6) are stored raw without calling
// the compressor, as no frame can be shorter; 7 and 8 zero bytes are stored raw
// because zstd's frame is not shorter either; 64 zero bytes are a frame.
TEST(StoreRoundTrip, RecordsNoFrameCanBeatAreStoredRawAndLongerOnesCompressed) {
  for (Codec c : {Codec::kZstd, Codec::kZstdDict}) {
    TempDir dir;
    std::vector<uint64_t> shapes;
    for (uint64_t len = 0; len <= 8; ++len) shapes.push_back(len);
    shapes.push_back(64);
    std::vector<uint8_t> zeros(36 + 64, 0);
    {
      auto w = StoreWriter::Create(dir.Sub("r"), RaggedSchema("|u1", 1), Options(c, 2));
      ASSERT_TRUE(w.ok());
      ASSERT_TRUE((*w)->AppendRagged(zeros.data(), shapes.data(), shapes.size()).ok());
      ASSERT_TRUE((*w)->Publish().ok());
    }
    auto s = Store::Open(dir.Sub("r"));
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    for (uint64_t i = 0; i < shapes.size(); ++i) {
      const uint64_t len = shapes[i];
      auto loc = (*s)->Locate(i);
      ASSERT_TRUE(loc.ok());
      EXPECT_EQ(loc->compressed, len == 64) << len;
      if (len <= 8) {
        EXPECT_EQ(loc->stored_len, len);
      }
      if (len == 64) {
        EXPECT_LT(loc->stored_len, 16u);
      }
      std::vector<uint8_t> out(len, 0xff);
      ASSERT_TRUE((*s)->ReadRecord(i, out.data(), len).ok()) << len;
      EXPECT_EQ(out, std::vector<uint8_t>(len, 0)) << len;
    }
    EXPECT_TRUE((*s)->Verify(nullptr).ok());
  }

  // Scalar uint8 labels: every record raw, the data files hold the labels.
  TempDir dir;
  std::vector<uint8_t> labels(1000);
  for (size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<uint8_t>(i % 10);
  {
    auto w = StoreWriter::Create(dir.Sub("l"), DenseSchema("|u1", {}), Options(Codec::kZstd, 2));
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE((*w)->AppendDense(labels.data(), labels.size()).ok());
    ASSERT_TRUE((*w)->Publish().ok());
  }
  auto s = Store::Open(dir.Sub("l"));
  ASSERT_TRUE(s.ok());
  uint64_t data_bytes = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.Sub("l"))) {
    if (e.path().filename().string().starts_with("data-")) data_bytes += e.file_size();
  }
  EXPECT_EQ(data_bytes, labels.size());
  for (uint64_t i = 0; i < labels.size(); ++i) {
    EXPECT_FALSE((*s)->Locate(i)->compressed) << i;
    EXPECT_EQ((*s)->Locate(i)->stored_len, 1u) << i;
    uint8_t v = 0xff;
    ASSERT_TRUE((*s)->ReadRecord(i, &v, 1).ok());
    EXPECT_EQ(v, labels[i]) << i;
  }
}

// Ragged: shapes of every rank with zero-length axes included.
void RaggedRoundTrip(uint32_t ndim, Codec codec, uint32_t shards, uint64_t n) {
  TempDir dir;
  const std::string path = dir.Sub("r");
  std::vector<uint64_t> shapes;
  std::vector<uint64_t> offsets{0};
  std::mt19937_64 rng(ndim * 100 + n);
  for (uint64_t i = 0; i < n; ++i) {
    uint64_t elems = 1;
    for (uint32_t d = 0; d < ndim; ++d) {
      uint64_t dim = (i % 5 == 3 && d == 0) ? 0 : 1 + rng() % (ndim > 2 ? 4 : 40);
      shapes.push_back(dim);
      elems *= dim;
    }
    offsets.push_back(offsets.back() + elems * 4);
  }
  std::vector<uint8_t> values = MakeBytes(offsets.back(), 9);
  {
    auto w = StoreWriter::Create(path, RaggedSchema("<i4", ndim), Options(codec, shards));
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    ASSERT_TRUE((*w)->AppendRagged(values.data(), shapes.data(), n).ok());
    ASSERT_TRUE((*w)->Publish().ok());
  }
  auto s = Store::Open(path);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ((*s)->schema().kind, Kind::kRagged);
  EXPECT_EQ((*s)->schema().ndim, ndim);
  EXPECT_EQ((*s)->size(), n);
  EXPECT_EQ((*s)->nbytes(), offsets.back());
  for (uint64_t i = 0; i < n; ++i) {
    std::vector<uint64_t> dims(ndim);
    ASSERT_TRUE((*s)->RecordShape(i, dims.data()).ok());
    EXPECT_EQ(dims,
              std::vector<uint64_t>(shapes.begin() + i * ndim, shapes.begin() + (i + 1) * ndim));
    const uint64_t len = offsets[i + 1] - offsets[i];
    ASSERT_EQ((*s)->RecordBytes(i).value(), len);
    std::vector<uint8_t> out(len);
    ASSERT_TRUE((*s)->ReadRecord(i, out.data(), len).ok());
    ASSERT_EQ(0, len ? std::memcmp(out.data(), values.data() + offsets[i], len) : 0) << i;
  }
  EXPECT_TRUE((*s)->Verify(nullptr).ok());
}

TEST(StoreRoundTrip, RaggedEveryRankAndCodec) {
  for (uint32_t ndim = 1; ndim <= 4; ++ndim) {
    for (Codec c : {Codec::kRaw, Codec::kZstd, Codec::kZstdDict}) {
      SCOPED_TRACE(std::to_string(ndim) + CodecName(c));
      RaggedRoundTrip(ndim, c, 3, 200);
    }
  }
}

TEST(StoreRoundTrip, RaggedEmptyAndSingle) {
  RaggedRoundTrip(1, Codec::kZstd, 4, 0);
  RaggedRoundTrip(2, Codec::kZstd, 4, 1);
}

TEST(StoreRoundTrip, RaggedZeroLengthRecords) {
  TempDir dir;
  std::vector<uint64_t> shapes = {0, 3, 0};
  std::vector<int32_t> values = {1, 2, 3};
  auto w = StoreWriter::Create(dir.Sub("r"), RaggedSchema("<i4", 1), Options(Codec::kZstd, 2));
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE((*w)->AppendRagged(values.data(), shapes.data(), 3).ok());
  ASSERT_TRUE((*w)->Publish().ok());
  auto s = Store::Open(dir.Sub("r"));
  ASSERT_TRUE(s.ok());
  EXPECT_EQ((*s)->RecordBytes(0).value(), 0u);
  EXPECT_EQ((*s)->RecordBytes(2).value(), 0u);
  int32_t out[3];
  ASSERT_TRUE((*s)->ReadRecord(1, out, 12).ok());
  EXPECT_EQ(out[0], 1);
  EXPECT_EQ(out[2], 3);
  EXPECT_TRUE((*s)->ReadRecord(0, nullptr, 0).ok());
}

std::vector<uint8_t> FileBytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

// AppendRaggedRecords reads each record from its own buffer: records that are
// neighbours in memory, scattered small ones (copied together), scattered
// large ones (written from their buffers), zero-length ones, and records
// above stream_threshold. The store must be the one AppendRagged writes from
// the same records packed into one buffer, file for file and byte for byte.
TEST(StoreRoundTrip, RaggedRecordsFromScatteredBuffersWriteTheStoreOfOnePackedBuffer) {
  std::mt19937_64 rng(5);
  const uint64_t n = 700;
  std::vector<uint64_t> lens(n);
  for (uint64_t i = 0; i < n; ++i) {
    if (i % 97 == 5) {
      lens[i] = (64 << 10) + 4 * (rng() % 60000);  // large: 64..298 KiB
    } else if (i % 13 == 7) {
      lens[i] = 0;
    } else {
      lens[i] = 4 * (1 + rng() % 300);
    }
  }
  uint64_t total = 0;
  for (uint64_t l : lens) total += l;
  std::vector<uint8_t> packed = MakeBytes(total, 3);
  // Records 0..299 sit back to back in one arena (neighbours in memory; runs
  // of them reach kDirectBytes and are written from the arena), except that a
  // zero-length record there points elsewhere (its pointer means nothing and
  // must not split the group); every other record has a buffer of its own.
  std::vector<std::vector<uint8_t>> own(n);
  std::vector<uint8_t> arena;
  std::vector<const void*> ptrs(n);
  std::vector<uint64_t> offsets{0};
  for (uint64_t i = 0; i < n; ++i) offsets.push_back(offsets.back() + lens[i]);
  arena.assign(packed.begin(), packed.begin() + static_cast<ptrdiff_t>(offsets[300]));
  for (uint64_t i = 0; i < n; ++i) {
    if (i < 300) {
      ptrs[i] = lens[i] == 0 ? static_cast<const void*>(&rng) : arena.data() + offsets[i];
    } else {
      own[i].assign(packed.begin() + static_cast<ptrdiff_t>(offsets[i]),
                    packed.begin() + static_cast<ptrdiff_t>(offsets[i + 1]));
      ptrs[i] = own[i].data();
    }
  }
  std::vector<uint64_t> shapes(lens.size());
  for (uint64_t i = 0; i < n; ++i) shapes[i] = lens[i] / 4;
  for (Codec c : {Codec::kRaw, Codec::kZstd, Codec::kZstdDict}) {
    for (uint64_t threshold : {uint64_t{32} << 20, uint64_t{100} << 10}) {
      SCOPED_TRACE(std::string(CodecName(c)) + " threshold " + std::to_string(threshold));
      TempDir dir;
      WriteOptions o = Options(c, 3);
      o.stream_threshold = threshold;
      {
        auto w = StoreWriter::Create(dir.Sub("packed"), RaggedSchema("<i4", 1), o);
        ASSERT_TRUE(w.ok());
        // The same two calls as below (the first call's records fix the run length).
        ASSERT_TRUE((*w)->AppendRagged(packed.data(), shapes.data(), 150).ok());
        ASSERT_TRUE(
            (*w)->AppendRagged(packed.data() + offsets[150], shapes.data() + 150, n - 150).ok());
        ASSERT_TRUE((*w)->Publish().ok());
      }
      {
        auto w = StoreWriter::Create(dir.Sub("scattered"), RaggedSchema("<i4", 1), o);
        ASSERT_TRUE(w.ok());
        // Two calls, the first ending inside the arena: runs go on across calls.
        ASSERT_TRUE((*w)->AppendRaggedRecords(ptrs.data(), shapes.data(), 150).ok());
        ASSERT_TRUE(
            (*w)->AppendRaggedRecords(ptrs.data() + 150, shapes.data() + 150, n - 150).ok());
        EXPECT_EQ((*w)->size(), n);
        ASSERT_TRUE((*w)->Publish().ok());
      }
      size_t files = 0;
      for (const auto& e : std::filesystem::directory_iterator(dir.Sub("packed"))) {
        const std::string name = e.path().filename().string();
        EXPECT_EQ(FileBytes(e.path().string()), FileBytes(dir.Sub("scattered") + "/" + name))
            << name;
        ++files;
      }
      EXPECT_GE(files, 5u);  // meta, index, three data files
      auto s = Store::Open(dir.Sub("scattered"));
      ASSERT_TRUE(s.ok()) << s.status().ToString();
      ASSERT_EQ((*s)->size(), n);
      for (uint64_t i = 0; i < n; ++i) {
        ASSERT_EQ((*s)->RecordBytes(i).value(), lens[i]) << i;
        std::vector<uint8_t> out(lens[i]);
        ASSERT_TRUE((*s)->ReadRecord(i, out.data(), lens[i]).ok()) << i;
        ASSERT_EQ(0, lens[i] ? std::memcmp(out.data(), packed.data() + offsets[i], lens[i]) : 0)
            << "record " << i;
      }
      EXPECT_TRUE((*s)->Verify(nullptr).ok());
    }
  }
}

// Token-like int32 records for the chunking test: small values (narrowed to 1
// or 2 bytes), some negative or wide ones (4 bytes), zero-length records, and
// records above the stream threshold below; record i's values start at i, so
// a reordered or dropped record changes the bytes.
std::vector<std::vector<int32_t>> ChunkTestRecords(uint64_t n) {
  std::mt19937_64 rng(11);
  std::vector<std::vector<int32_t>> recs(n);
  for (uint64_t i = 0; i < n; ++i) {
    const uint64_t len = i % 17 == 3 ? 0 : i % 211 == 100 ? 12000 : 1 + rng() % 700;
    const int32_t span = i % 5 == 0 ? 200 : i % 7 == 0 ? 1 << 20 : 50000;
    for (uint64_t k = 0; k < len; ++k) {
      int32_t v = static_cast<int32_t>(i) + static_cast<int32_t>(rng() % span);
      if (i % 11 == 4 && k % 3 == 0) v = -v;
      recs[i].push_back(v);
    }
  }
  return recs;
}

// Chunks overlap (one is written while the next is compressed) and a piece
// ends at a chunk boundary, but the bytes on disk are those of writing all the
// input as one chunk: every file equal, for both append calls, every codec,
// with records streamed between chunks and with or without huge-page writes;
// and the same for four appends of uneven sizes, whose chunks reuse the
// output buffers of the previous append's chunks, larger or smaller (the
// first append fixes the run length, so they are compared with themselves).
TEST(StoreRoundTrip, ManySmallChunksWriteTheStoreOfOneChunk) {
  const std::vector<std::vector<int32_t>> recs = ChunkTestRecords(1500);
  const uint64_t n = recs.size();
  std::vector<int32_t> packed;
  std::vector<const void*> ptrs;
  std::vector<uint64_t> shapes;
  for (const auto& r : recs) {
    packed.insert(packed.end(), r.begin(), r.end());
    ptrs.push_back(r.data());
    shapes.push_back(r.size());
  }
  const uint64_t total = packed.size() * 4;
  for (Codec c : {Codec::kRaw, Codec::kZstd, Codec::kZstdDict}) {
    for (bool scattered : {false, true}) {
      for (bool huge : {false, true}) {
        SCOPED_TRACE(std::string(CodecName(c)) + (scattered ? " scattered" : " packed") +
                     (huge ? " huge pages" : ""));
        TempDir dir;
        for (const std::string name : {"one", "many", "appends-one", "appends-many"}) {
          WriteOptions o = Options(c, 3);
          o.huge_page_writes = huge;
          o.stream_threshold = 40000;  // the 48,000-byte records are streamed
          // "one": more than the whole input; "many": hundreds of chunks.
          o.chunk_bytes = name.ends_with("one") ? total + 1 : 3000;
          auto w = StoreWriter::Create(dir.Sub(name), RaggedSchema("<i4", 1), o);
          ASSERT_TRUE(w.ok()) << w.status().ToString();
          const std::vector<uint64_t> cuts = name.starts_with("appends")
                                                 ? std::vector<uint64_t>{0, 700, 701, 1300, n}
                                                 : std::vector<uint64_t>{0, n};
          uint64_t at = 0;  // the first value of record cuts[k] in `packed`
          for (size_t k = 0; k + 1 < cuts.size(); ++k) {
            const uint64_t a = cuts[k], m = cuts[k + 1] - a;
            const Status st = scattered
                                  ? (*w)->AppendRaggedRecords(ptrs.data() + a, shapes.data() + a, m)
                                  : (*w)->AppendRagged(packed.data() + at, shapes.data() + a, m);
            ASSERT_TRUE(st.ok()) << st.ToString();
            for (uint64_t i = a; i < a + m; ++i) at += shapes[i];
          }
          ASSERT_TRUE((*w)->Publish().ok());
        }
        size_t files = 0;
        for (const auto& e : std::filesystem::directory_iterator(dir.Sub("one"))) {
          const std::string name = e.path().filename().string();
          const std::vector<uint8_t> one = FileBytes(e.path().string());
          EXPECT_EQ(one, FileBytes(dir.Sub("many") + "/" + name)) << name;
          EXPECT_GT(one.size(), 0u) << name;
          EXPECT_EQ(FileBytes(dir.Sub("appends-one") + "/" + name),
                    FileBytes(dir.Sub("appends-many") + "/" + name))
              << name;
          ++files;
        }
        EXPECT_EQ(files, c == Codec::kZstdDict ? 6u : 5u);  // meta, index, 3 data, dict
        auto s = Store::Open(dir.Sub("many"));
        ASSERT_TRUE(s.ok()) << s.status().ToString();
        ASSERT_EQ((*s)->size(), n);
        EXPECT_EQ((*s)->nbytes(), total);
        for (uint64_t i = 0; i < n; ++i) {
          std::vector<int32_t> out(recs[i].size());
          ASSERT_TRUE((*s)->ReadRecord(i, out.data(), out.size() * 4).ok()) << i;
          ASSERT_EQ(out, recs[i]) << "record " << i;
        }
      }
    }
  }
}

TEST(StoreRoundTrip, ZeroChunkBytesIsInvalid) {
  TempDir dir;
  WriteOptions o = Options(Codec::kZstd, 1);
  o.chunk_bytes = 0;
  auto w = StoreWriter::Create(dir.Sub("s"), RaggedSchema("<i4", 1), o);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(w.status().message(), "chunk_bytes must be > 0");
  EXPECT_FALSE(std::filesystem::exists(dir.Sub("s")));
}

TEST(StoreRoundTrip, RaggedRecordsOnADenseStoreIsASchemaError) {
  TempDir dir;
  auto w = StoreWriter::Create(dir.Sub("d"), DenseSchema("<i4", {2}), WriteOptions{});
  ASSERT_TRUE(w.ok());
  const int32_t v[2] = {1, 2};
  const void* p = v;
  const uint64_t shape = 2;
  Status st = (*w)->AppendRaggedRecords(&p, &shape, 1);
  EXPECT_EQ(st.code(), Status::Code::kSchemaError) << st.ToString();
  EXPECT_NE(st.ToString().find("AppendRaggedRecords on a dense store"), std::string::npos);
}

// Dense raw records gathered on the calling thread take the computed-offset
// loop (store_reader.cc, GatherComputed): 8 KiB records in 256 KiB runs over 3
// shards, so records of every shard and of later rounds of runs are read; a
// batch with an out-of-range index is an IndexError that writes nothing.
TEST(StoreRoundTrip, DenseRawGatherOnTheCallerReadsEveryShardExactly) {
  const uint64_t n = 400, item = 8192;
  std::vector<uint8_t> data = MakeBytes(n * item, 21);
  TempDir dir;
  {
    auto w = StoreWriter::Create(dir.Sub("s"), DenseSchema("|u1", {item}), Options(Codec::kRaw, 3));
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE((*w)->AppendDense(data.data(), n).ok());
    ASSERT_TRUE((*w)->Publish().ok());
  }
  auto s = Store::Open(dir.Sub("s"));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ASSERT_EQ((*s)->Locate(32)->shard, 1u);   // 32 records per run
  ASSERT_EQ((*s)->Locate(399)->shard, 0u);  // run 12: the fifth round
  std::vector<uint64_t> idx;
  for (uint64_t k = 0; k < 100; ++k) idx.push_back((k * 7919 + 3) % n);
  idx.push_back(idx[4]);
  idx.push_back(n - 1);
  std::vector<uint8_t> out(idx.size() * item, 0xEE);
  std::vector<void*> outs;
  for (size_t k = 0; k < idx.size(); ++k) outs.push_back(out.data() + k * item);
  ASSERT_TRUE((*s)->Gather(idx, outs, nullptr).ok());
  for (size_t k = 0; k < idx.size(); ++k) {
    ASSERT_EQ(0, std::memcmp(out.data() + k * item, data.data() + idx[k] * item, item))
        << "position " << k << ", record " << idx[k];
  }
  std::fill(out.begin(), out.end(), 0xEE);
  idx.back() = n;
  Status st = (*s)->Gather(idx, outs, &ThreadPool::Default());
  EXPECT_EQ(st.code(), Status::Code::kIndexError) << st.ToString();
  EXPECT_NE(st.message().find("record index 400 out of range"), std::string::npos) << st.ToString();
  EXPECT_EQ(std::count(out.begin(), out.end(), 0xEE), static_cast<ptrdiff_t>(out.size()));
}

// GatherComputed keeps each source address in a ring of its prefetch
// distance (4) from prefetch to copy: batches of 0..9 records (shorter than,
// equal to and longer than the ring) are exact; with several bad indices the
// first one is named and nothing is written.
TEST(StoreRoundTrip, DenseRawGatherOfEveryBatchSizeAroundThePrefetchRing) {
  const uint64_t n = 50, item = 784;
  std::vector<uint8_t> data = MakeBytes(n * item, 22);
  TempDir dir;
  {
    auto w =
        StoreWriter::Create(dir.Sub("s"), DenseSchema("|u1", {28, 28}), Options(Codec::kRaw, 4));
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE((*w)->AppendDense(data.data(), n).ok());
    ASSERT_TRUE((*w)->Publish().ok());
  }
  auto s = Store::Open(dir.Sub("s"));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  for (size_t b = 0; b <= 9; ++b) {
    std::vector<uint64_t> idx;
    for (size_t k = 0; k < b; ++k) idx.push_back((k * 17 + b) % n);
    std::vector<uint8_t> out(b * item + 1, 0xEE);
    std::vector<void*> outs;
    for (size_t k = 0; k < b; ++k) outs.push_back(out.data() + k * item);
    ASSERT_TRUE((*s)->Gather(idx, outs, nullptr).ok()) << "batch of " << b;
    for (size_t k = 0; k < b; ++k) {
      ASSERT_EQ(0, std::memcmp(out.data() + k * item, data.data() + idx[k] * item, item))
          << "batch of " << b << ", position " << k;
    }
    EXPECT_EQ(out.back(), 0xEE) << "batch of " << b << " wrote past its output";
  }
  std::vector<uint64_t> idx{3, 7, n + 5, 1, n, 2};
  std::vector<uint8_t> out(idx.size() * item, 0xEE);
  std::vector<void*> outs;
  for (size_t k = 0; k < idx.size(); ++k) outs.push_back(out.data() + k * item);
  Status st = (*s)->Gather(idx, outs, nullptr);
  EXPECT_EQ(st.code(), Status::Code::kIndexError) << st.ToString();
  EXPECT_NE(st.message().find("record index 55 out of range"), std::string::npos) << st.ToString();
  EXPECT_EQ(std::count(out.begin(), out.end(), 0xEE), static_cast<ptrdiff_t>(out.size()));
}

TEST(StoreRoundTrip, StreamedRecordsAboveThreshold) {
  // The bounded-memory path of huge records, exercised with a small threshold.
  for (Codec c : {Codec::kRaw, Codec::kZstd, Codec::kZstdDict}) {
    TempDir dir;
    WriteOptions o = Options(c, 3);
    o.stream_threshold = 1000;
    DenseRoundTrip(dir.Sub("s"), DenseSchema("|u1", {9000}), o, 20);
  }
}

TEST(StoreRoundTrip, StreamedIncompressibleRecordFallsBackToRaw) {
  TempDir dir;
  WriteOptions o = Options(Codec::kZstd, 1);
  o.stream_threshold = 100;
  std::vector<uint8_t> noise(1 << 20);
  std::mt19937_64 rng(3);
  for (auto& b : noise) b = static_cast<uint8_t>(rng());
  auto w = StoreWriter::Create(dir.Sub("s"), DenseSchema("|u1", {1 << 19}), o);
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE((*w)->AppendDense(noise.data(), 2).ok());
  ASSERT_TRUE((*w)->Publish().ok());
  auto s = Store::Open(dir.Sub("s"));
  ASSERT_TRUE(s.ok());
  EXPECT_FALSE((*s)->Locate(1)->compressed);
  EXPECT_EQ((*s)->Locate(1)->offset, 1u << 19);
  std::vector<uint8_t> out(1 << 19);
  ASSERT_TRUE((*s)->ReadRecord(1, out.data(), out.size()).ok());
  EXPECT_EQ(0, std::memcmp(out.data(), noise.data() + (1 << 19), out.size()));
  EXPECT_TRUE((*s)->Verify(nullptr).ok());
}

// Linux and macOS: the 4 GiB input comes from an anonymous mapping that
// costs no RAM, which Windows (and wine) cannot give without committing it.
#if !defined(_WIN32)
TEST(StoreRoundTrip, RecordLargerThan4GiB) {
  // 4 GiB + 3 bytes of zeros from an untouched anonymous mapping (reading it
  // costs no RAM), followed by a small record; zstd stores the big one in a
  // few hundred KiB. Reading it back needs one 4 GiB output mapping.
  const uint64_t len = (uint64_t{4} << 30) + 3;
  const int kFlags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
  auto* in = static_cast<uint8_t*>(::mmap(nullptr, len + 5, PROT_READ | PROT_WRITE, kFlags, -1, 0));
  ASSERT_NE(in, MAP_FAILED);
  std::memcpy(in + len, "hello", 5);
  TempDir dir;
  {
    auto w = StoreWriter::Create(dir.Sub("big"), RaggedSchema("|u1", 1), Options(Codec::kZstd, 2));
    ASSERT_TRUE(w.ok());
    uint64_t shape[2] = {len, 5};
    ASSERT_TRUE((*w)->AppendRagged(in, shape, 2).ok());
    ASSERT_TRUE((*w)->Publish().ok());
  }
  ::munmap(in, len + 5);
  auto s = Store::Open(dir.Sub("big"));
  ASSERT_TRUE(s.ok());
  EXPECT_EQ((*s)->RecordBytes(0).value(), len);
  EXPECT_EQ((*s)->nbytes(), len + 5);
  EXPECT_TRUE((*s)->Locate(0)->compressed);
  EXPECT_LT((*s)->Locate(0)->stored_len, uint64_t{1} << 20);
  char small[5];
  ASSERT_TRUE((*s)->ReadRecord(1, small, 5).ok());
  EXPECT_EQ(std::string(small, 5), "hello");
  auto* out =
      static_cast<uint8_t*>(::mmap(nullptr, len + 1, PROT_READ | PROT_WRITE, kFlags, -1, 0));
  ASSERT_NE(out, MAP_FAILED);
  out[0] = out[len / 2] = out[len - 1] = out[len] = 0xAB;
  ASSERT_TRUE((*s)->ReadRecord(0, out, len).ok());
  EXPECT_EQ(out[0], 0);
  EXPECT_EQ(out[len / 2], 0);
  EXPECT_EQ(out[len - 1], 0);
  EXPECT_EQ(out[len], 0xAB);  // nothing written past the record
  ::munmap(out, len + 1);
  EXPECT_TRUE((*s)->Verify(nullptr).ok());  // streams: no 4 GiB buffer
}
#endif

TEST(StoreRoundTrip, ConcurrentGathersFromManyThreads) {
  TempDir dir;
  const uint64_t n = 2000, item = 256;
  std::vector<uint8_t> data = MakeBytes(n * item, 5);
  {
    auto w =
        StoreWriter::Create(dir.Sub("s"), DenseSchema("|u1", {item}), Options(Codec::kZstd, 4));
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE((*w)->AppendDense(data.data(), n).ok());
    ASSERT_TRUE((*w)->Publish().ok());
  }
  auto s = Store::Open(dir.Sub("s"));
  ASSERT_TRUE(s.ok());
  ThreadPool pool(2);
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      // 1,024 records: enough decoding that a gather through the pool is
      // spread over its threads (a smaller batch stays on the caller).
      constexpr size_t kBatch = 1024;
      std::vector<uint64_t> idx(kBatch);
      std::vector<uint8_t> out(kBatch * item);
      std::vector<void*> outs(kBatch);
      for (int round = 0; round < 20; ++round) {
        for (size_t k = 0; k < kBatch; ++k) {
          idx[k] = (t * 1000 + round * 64 + k * 31) % n;
          outs[k] = out.data() + k * item;
        }
        if (!(*s)->Gather(idx, outs, t % 2 ? &pool : nullptr).ok()) mismatches++;
        for (size_t k = 0; k < kBatch; ++k) {
          if (std::memcmp(outs[k], data.data() + idx[k] * item, item) != 0) mismatches++;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
}

TEST(StoreRoundTrip, LargeRawRecordsAreSplitAcrossThePool) {
  TempDir dir;
  DenseRoundTrip(dir.Sub("s"), DenseSchema("|u1", {3 << 20}), Options(Codec::kRaw, 2), 5);
}

// Gathers of small compressed records below and above the size at which a
// batch is spread over the pool (docs/format.md, "Reading"): one record, a
// few, 64 (one task on the caller), 256 and more (tasks on every thread),
// in a scrambled order with duplicates, raw and zstd, with and without a pool.
TEST(StoreRoundTrip, SmallRecordBatchesOfEverySizeGatherExactlyWithAndWithoutAPool) {
  const uint64_t n = 3000, item = 784;
  std::vector<uint8_t> data(n * item);
  std::mt19937_64 rng(11);
  for (uint64_t i = 0; i < data.size(); ++i) {
    data[i] = static_cast<uint8_t>((i / 97) * 31 + (rng() % 8 == 0 ? rng() : 0));
  }
  for (Codec codec : {Codec::kRaw, Codec::kZstd}) {
    SCOPED_TRACE(CodecName(codec));
    TempDir dir;
    {
      auto w = StoreWriter::Create(dir.Sub("s"), DenseSchema("|u1", {28, 28}), Options(codec, 4));
      ASSERT_TRUE(w.ok());
      ASSERT_TRUE((*w)->AppendDense(data.data(), n).ok());
      ASSERT_TRUE((*w)->Publish().ok());
    }
    auto s = Store::Open(dir.Sub("s"));
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    if (codec == Codec::kZstd) {
      ASSERT_TRUE((*s)->Locate(5)->compressed);
    }
    ThreadPool three(3);
    for (size_t batch : {size_t{1}, size_t{7}, size_t{64}, size_t{256}, size_t{2500}}) {
      std::vector<uint64_t> idx(batch);
      for (size_t k = 0; k < batch; ++k) idx[k] = (k * 7919 + batch) % n;
      idx[batch / 2] = idx[0];  // a duplicate
      for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &three, &ThreadPool::Default()}) {
        std::vector<uint8_t> out(batch * item, 0xEE);
        std::vector<void*> outs(batch);
        for (size_t k = 0; k < batch; ++k) outs[k] = out.data() + k * item;
        ASSERT_TRUE((*s)->Gather(idx, outs, pool).ok()) << batch;
        for (size_t k = 0; k < batch; ++k) {
          ASSERT_EQ(0, std::memcmp(out.data() + k * item, data.data() + idx[k] * item, item))
              << "batch " << batch << ", position " << k << ", record " << idx[k];
        }
      }
    }
  }
}

}  // namespace
}  // namespace loaderx

namespace loaderx {
namespace {

TEST(StoreRoundTrip, ManyZeroByteRecordsAreSpreadInBoundedRuns) {
  // 100k zero-byte records: runs are capped by record count, so shards still
  // alternate (a byte-only cap would put them all in one run).
  TempDir dir;
  WriteOptions o;
  o.data_shards = 3;
  auto w = StoreWriter::Create(dir.Sub("s"), testing::DenseSchema("<f4", {0}), o);
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE((*w)->AppendDense(nullptr, 100000).ok());
  ASSERT_TRUE((*w)->Publish().ok());
  auto s = Store::Open(dir.Sub("s"));
  ASSERT_TRUE(s.ok());
  EXPECT_EQ((*s)->size(), 100000u);
  EXPECT_EQ((*s)->nbytes(), 0u);
  EXPECT_EQ((*s)->Locate(0)->shard, 0u);
  EXPECT_EQ((*s)->Locate(16384)->shard, 1u);
  EXPECT_EQ((*s)->Locate(99999)->shard, (99999u / 16384) % 3);
  EXPECT_TRUE((*s)->ReadRecord(99999, nullptr, 0).ok());
  EXPECT_TRUE((*s)->Verify(nullptr).ok());
}

}  // namespace
}  // namespace loaderx
