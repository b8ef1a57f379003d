// On-disk integer narrowing (format 1.2, docs/format.md sections 3 and 5):
// records of every integer dtype round-trip exactly at every stored width,
// the index carries the expected width codes, and hostile width codes are
// Corruption naming the record.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "format.h"
#include "loaderx/store.h"
#include "loaderx/thread_pool.h"
#include "narrow.h"
#include "store_test_util.h"

namespace loaderx {
namespace {

using testing::DenseSchema;
using testing::RaggedSchema;
using testing::ReadFileBytes;
using testing::TempDir;
using testing::WriteFileBytes;

// How docs/format.md says a record is stored: the smallest w of 1, 2, 4 bytes
// (below the itemsize) holding every value, as unsigned values below 2^(8w)
// when none is negative (zero_extend for a signed dtype), else as signed ones
// in [-2^(8w-1), 2^(8w-1)). {0, false} (full width) when none does or no values.
template <typename T>
std::pair<uint32_t, bool> ExpectedPlan(const std::vector<T>& v) {
  if (v.empty()) return {0, false};
  const bool negative = std::any_of(v.begin(), v.end(), [](T x) { return x < T{0}; });
  for (uint32_t w = 1; w < sizeof(T); w *= 2) {
    bool fits = true;
    for (T x : v) {
      const __int128 lo = negative ? -(__int128{1} << (8 * w - 1)) : 0;
      const __int128 hi = negative ? __int128{1} << (8 * w - 1) : __int128{1} << (8 * w);
      fits = fits && static_cast<__int128>(x) >= lo && static_cast<__int128>(x) < hi;
    }
    if (fits) return {w, std::is_signed_v<T> && !negative};
  }
  return {0, false};
}
template <typename T>
uint32_t ExpectedWidth(const std::vector<T>& v) {
  return ExpectedPlan(v).first;
}

// Each record's zero-extension bit, as its index entry (either layout) gives it.
std::vector<bool> IndexZeroExtend(const std::string& store, uint64_t n) {
  auto s = Store::Open(store);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  std::vector<bool> z;
  for (uint64_t k = 0; s.ok() && k < n; ++k) z.push_back((*s)->Locate(k).value().zero_extend);
  return z;
}

// Each record's stored value width (0 = the itemsize), from its index entry.
std::vector<uint32_t> IndexWidths(const std::string& store, uint64_t n) {
  auto s = Store::Open(store);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  std::vector<uint32_t> widths;
  for (uint64_t k = 0; s.ok() && k < n; ++k) widths.push_back((*s)->Locate(k).value().width);
  return widths;
}

// Records (all of 16 values) at every width boundary of T, mixed in one store.
template <typename T>
std::vector<std::vector<T>> BoundaryRecords() {
  using L = std::numeric_limits<T>;
  std::vector<int64_t> sgn = {0,      1,     -1,    127,        128,        -128,
                              -129,   255,   256,   32767,      32768,      -32768,
                              -32769, 65535, 65536, 2147483647, -2147483648};
  std::vector<std::vector<T>> recs;
  std::mt19937_64 rng(5);
  for (int64_t b : sgn) {
    if (b < static_cast<int64_t>(L::min()) ||
        (b > 0 && static_cast<uint64_t>(b) > static_cast<uint64_t>(L::max())))
      continue;
    std::vector<T> r(16);
    for (size_t k = 0; k < r.size(); ++k) r[k] = static_cast<T>(k % 3 == 0 ? b : (k % 7));
    recs.push_back(r);
  }
  // 2^31 (an int64 needing 8 bytes), the extremes of T, one record each.
  if constexpr (sizeof(T) == 8)
    recs.push_back(std::vector<T>(16, static_cast<T>(int64_t{1} << 31)));
  recs.push_back(std::vector<T>(16, L::max()));
  recs.push_back(std::vector<T>(16, L::min()));
  // Incompressible: random values that fit 16 bits (T's own width for int16).
  std::vector<T> noise(600);
  for (T& x : noise)
    x = static_cast<T>(std::is_signed_v<T> ? static_cast<int16_t>(rng())
                                           : static_cast<uint16_t>(rng()));
  recs.push_back(noise);
  return recs;
}

template <typename T>
void RoundTrip(const std::string& dtype, Codec codec, bool dense) {
  SCOPED_TRACE(dtype + (dense ? " dense " : " ragged ") + CodecName(codec));
  TempDir dir;
  const std::string path = dir.Sub("s");
  std::vector<std::vector<T>> recs = BoundaryRecords<T>();
  if (dense) {
    for (auto& r : recs) r.resize(16);  // the noise record too: every record has 16 values
  } else {
    recs.insert(recs.begin() + 3, std::vector<T>{});  // an empty record
  }
  WriteOptions o;
  o.codec = codec;
  o.data_shards = 2;
  if (codec == Codec::kZstdDict) o.dictionary = testing::TestDictionary();
  {
    auto w =
        StoreWriter::Create(path, dense ? DenseSchema(dtype, {16}) : RaggedSchema(dtype, 1), o);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    std::vector<uint64_t> shapes;
    for (const auto& r : recs) shapes.push_back(r.size());
    // Two appends: the second continues the first's runs.
    ASSERT_TRUE(testing::AppendInTwoHalves(**w, recs, dense, shapes, 1).ok());
    ASSERT_TRUE((*w)->Publish().ok());
  }
  std::vector<uint32_t> want_widths;
  std::vector<bool> want_zero;
  for (const auto& r : recs) {
    want_widths.push_back(ExpectedPlan(r).first);
    want_zero.push_back(ExpectedPlan(r).second);
  }
  EXPECT_EQ(IndexWidths(path, recs.size()), want_widths);
  EXPECT_EQ(IndexZeroExtend(path, recs.size()), want_zero);
  if constexpr (std::is_signed_v<T>) {  // both kinds of narrowed records occur
    EXPECT_NE(std::find(want_zero.begin(), want_zero.end(), true), want_zero.end());
    bool sign_extended = false;
    for (size_t k = 0; k < recs.size(); ++k) sign_extended |= want_widths[k] != 0 && !want_zero[k];
    EXPECT_TRUE(sign_extended);
  }
  // Every width occurs below the itemsize (the boundary records cover them).
  for (uint32_t w = 1; w < sizeof(T); w *= 2) {
    EXPECT_NE(std::find(want_widths.begin(), want_widths.end(), w), want_widths.end()) << w;
  }

  auto s = Store::Open(path);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  // Small records: the 1.3 "groups" index (store_groups_test.cc), which
  // holds the same width bits.
  EXPECT_EQ((*s)->format_version(), (std::pair<uint32_t, uint32_t>{1, 3}));
  ASSERT_TRUE((*s)->Verify(nullptr).ok());
  // Gathered in reverse order, with and without the pool; and one by one.
  for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &ThreadPool::Default()}) {
    std::vector<uint64_t> idx;
    std::vector<std::vector<T>> got(recs.size());
    std::vector<void*> outs;
    for (uint64_t k = recs.size(); k-- > 0;) {
      idx.push_back(k);
      got[k].assign(recs[k].size() + 1, T{0x5A});  // one guard value past the end
      outs.push_back(got[k].data());
    }
    ASSERT_TRUE((*s)->Gather(idx, outs, pool).ok());
    for (uint64_t k = 0; k < recs.size(); ++k) {
      EXPECT_EQ(got[k].back(), T{0x5A}) << k;
      got[k].pop_back();
      EXPECT_EQ(got[k], recs[k]) << "record " << k;
      EXPECT_EQ((*s)->RecordBytes(k).value(), recs[k].size() * sizeof(T));
    }
  }
}

// narrow::NarrowRecord against a plain reference, for every guess of the
// width (none, right, too narrow, too wide): the width, the zero-extension
// and the narrowed bytes never depend on the guess. Records cross the
// 1,024-value blocks of the bounds pass, with their widest value first, in
// the middle or last.
template <typename T>
void ExpectNarrowRecordIgnoresTheGuess() {
  constexpr uint32_t kItem = sizeof(T);
  std::mt19937_64 rng(kItem * 2 + std::is_signed_v<T>);
  std::vector<int64_t> tops{0, 1, 127, 128, 255, 256, 32767, 32768, 65535, 65536};
  if (kItem > 4) tops.insert(tops.end(), {int64_t{1} << 31, int64_t{1} << 32, int64_t{1} << 40});
  for (int64_t top : tops) {
    for (bool negative : {false, true}) {
      if (negative && !std::is_signed_v<T>) continue;
      if (static_cast<uint64_t>(top) > static_cast<uint64_t>(std::numeric_limits<T>::max()))
        continue;
      for (uint64_t n : {uint64_t{1}, uint64_t{7}, uint64_t{3000}}) {
        for (uint64_t at : {uint64_t{0}, n / 2, n - 1}) {
          std::vector<T> vals(n);
          for (uint64_t k = 0; k < n; ++k) vals[k] = static_cast<T>(rng() % (top / 2 + 1));
          vals[at] = static_cast<T>(negative ? -top - 1 : top);  // the widest value
          // The reference: the smallest width holding every value.
          uint32_t want = kItem;
          for (uint32_t w = 4; w >= 1; w /= 2) {
            if (w >= kItem) continue;
            const int64_t lo = negative ? -(int64_t{1} << (8 * w - 1)) : 0;
            const int64_t hi = negative ? (int64_t{1} << (8 * w - 1)) : (int64_t{1} << (8 * w));
            bool fits = true;
            for (T v : vals)
              fits = fits && static_cast<int64_t>(v) >= lo && static_cast<int64_t>(v) < hi;
            if (fits) want = w;
          }
          std::vector<uint8_t> want_bytes;
          for (T v : vals) {
            const uint8_t* p = reinterpret_cast<const uint8_t*>(&v);  // little-endian host
            want_bytes.insert(want_bytes.end(), p, p + want);
          }
          for (uint32_t guess : {0u, 1u, 2u, 4u, 8u}) {
            SCOPED_TRACE("top " + std::to_string(top) + (negative ? " negative" : "") + " n " +
                         std::to_string(n) + " at " + std::to_string(at) + " guess " +
                         std::to_string(guess));
            std::vector<uint8_t> out(5, 0xee);  // stale bytes from a previous record
            const narrow::Plan plan =
                narrow::NarrowRecord(reinterpret_cast<const uint8_t*>(vals.data()), n, kItem,
                                     std::is_signed_v<T>, &out, guess);
            ASSERT_EQ(plan.width, want);
            EXPECT_EQ(plan.zero_extend, std::is_signed_v<T> && !negative && want < kItem);
            if (want < kItem) {
              EXPECT_EQ(out, want_bytes);
            }
          }
        }
      }
    }
  }
}

TEST(NarrowTest, NarrowRecordGivesTheSameResultWhateverTheGuessedWidth) {
  ExpectNarrowRecordIgnoresTheGuess<int16_t>();
  ExpectNarrowRecordIgnoresTheGuess<uint16_t>();
  ExpectNarrowRecordIgnoresTheGuess<int32_t>();
  ExpectNarrowRecordIgnoresTheGuess<uint32_t>();
  ExpectNarrowRecordIgnoresTheGuess<int64_t>();
  ExpectNarrowRecordIgnoresTheGuess<uint64_t>();
}

TEST(NarrowTest, EveryIntegerDTypeRoundTripsAtEveryWidth) {
  for (Codec c : {Codec::kZstd, Codec::kZstdDict}) {
    for (bool dense : {true, false}) {
      RoundTrip<int16_t>("<i2", c, dense);
      RoundTrip<uint16_t>("<u2", c, dense);
      RoundTrip<int32_t>("<i4", c, dense);
      RoundTrip<uint32_t>("<u4", c, dense);
      RoundTrip<int64_t>("<i8", c, dense);
      RoundTrip<uint64_t>("<u8", c, dense);
    }
  }
}

// Writes `n` int32 records of `values` values each; record k holds k * mult + j.
std::string WriteInts(const TempDir& dir, const std::string& name, const std::string& dtype,
                      Codec codec, uint64_t n, uint64_t values, int64_t mult, bool narrow,
                      uint64_t stream_threshold = uint64_t{32} << 20) {
  std::string path = dir.Sub(name);
  WriteOptions o;
  o.codec = codec;
  o.narrow_integers = narrow;
  o.group_index = false;  // format 1.2: EditEntry rewrites "ends" entries
  o.stream_threshold = stream_threshold;
  auto w = StoreWriter::Create(path, RaggedSchema(dtype, 1), o);
  EXPECT_TRUE(w.ok()) << w.status().ToString();
  const uint32_t item = DType::Parse(dtype).value().itemsize;
  std::vector<uint8_t> flat(n * values * item);
  std::vector<uint64_t> shapes(n, values);
  for (uint64_t k = 0; k < n; ++k) {
    for (uint64_t j = 0; j < values; ++j) {
      const int64_t v = static_cast<int64_t>(k) * mult + static_cast<int64_t>(j % 97);
      std::memcpy(flat.data() + (k * values + j) * item, &v, item);  // little-endian low bytes
    }
  }
  EXPECT_TRUE((*w)->AppendRagged(flat.data(), shapes.data(), n).ok());
  EXPECT_TRUE((*w)->Publish().ok());
  return path;
}

TEST(NarrowTest, NarrowOffWritesFormat11WithoutWidthCodes) {
  TempDir dir;
  const std::string path = WriteInts(dir, "off", "<i4", Codec::kZstd, 50, 40, 0, false);
  auto s = Store::Open(path);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ((*s)->format_version(), (std::pair<uint32_t, uint32_t>{1, 1}));
  EXPECT_EQ(IndexWidths(path, 50), std::vector<uint32_t>(50, 0));
  const std::string on = WriteInts(dir, "on", "<i4", Codec::kZstd, 50, 40, 0, true);
  EXPECT_EQ(IndexWidths(on, 50), std::vector<uint32_t>(50, 1));
  EXPECT_LT(ReadFileBytes(on + "/data-000").size(), ReadFileBytes(path + "/data-000").size());
}

TEST(NarrowTest, RawFloatByteAndBigEndianStoresStayFormat11) {
  TempDir dir;
  struct Case {
    const char* dtype;
    Codec codec;
  };
  int k = 0;
  for (const Case& c :
       {Case{"<i4", Codec::kRaw}, Case{"<f4", Codec::kZstd}, Case{"|u1", Codec::kZstd},
        Case{"|i1", Codec::kZstd}, Case{">i4", Codec::kZstd}, Case{"<M8[s]", Codec::kZstd}}) {
    const std::string path =
        WriteInts(dir, "s" + std::to_string(k++), c.dtype, c.codec, 20, 64, 1, true);
    auto s = Store::Open(path);
    ASSERT_TRUE(s.ok()) << c.dtype;
    EXPECT_EQ((*s)->format_version(), (std::pair<uint32_t, uint32_t>{1, 1})) << c.dtype;
    EXPECT_EQ(IndexWidths(path, 20), std::vector<uint32_t>(20, 0)) << c.dtype;
  }
}

TEST(NarrowTest, LargeNarrowedRecordsTakeEveryReadPath) {
  // Narrowed records decoded through the pread scratch (16 KiB .. 4 MiB
  // frames), above it (> 4 MiB of narrowed values), stored raw (incompressible,
  // read with pread), and one above the streaming threshold (not narrowed).
  TempDir dir;
  const std::string path = dir.Sub("big");
  WriteOptions o;
  o.codec = Codec::kZstd;
  o.stream_threshold = 12 << 20;
  auto w = StoreWriter::Create(path, RaggedSchema("<i8", 1), o);
  ASSERT_TRUE(w.ok());
  std::mt19937_64 rng(9);
  std::vector<std::vector<int64_t>> recs;
  recs.emplace_back(1'100'000);  // 8.8 MB, 20-bit random values: 4.4 MB narrowed, compressed
  for (int64_t& v : recs.back()) v = static_cast<int64_t>(rng() % (1 << 20));
  recs.emplace_back(200'000);  // 2-byte random values: 400 KB narrowed, stored raw
  for (int64_t& v : recs.back()) v = static_cast<int16_t>(rng());
  recs.emplace_back(2'000'000);  // 16 MB, above the threshold: full width
  for (int64_t& v : recs.back()) v = static_cast<int64_t>(rng() % 256) - 128;
  recs.emplace_back(300'000);  // compressible 1-byte values
  for (size_t j = 0; j < recs.back().size(); ++j)
    recs.back()[j] = static_cast<int64_t>(j % 50) - 25;
  for (const auto& r : recs) {
    const uint64_t shape = r.size();
    ASSERT_TRUE((*w)->AppendRagged(r.data(), &shape, 1).ok());
  }
  ASSERT_TRUE((*w)->Publish().ok());
  EXPECT_EQ(IndexWidths(path, 4), (std::vector<uint32_t>{4, 2, 0, 1}));
  auto s = Store::Open(path);
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE((*s)->Verify(nullptr).ok());
  EXPECT_TRUE((*s)->Locate(0).value().compressed);
  EXPECT_FALSE((*s)->Locate(1).value().compressed);  // incompressible: raw, narrowed
  EXPECT_EQ((*s)->Locate(1).value().width, 2u);
  EXPECT_EQ((*s)->Locate(1).value().stored_len, 400'000u);
  std::vector<std::vector<int64_t>> got(recs.size());
  std::vector<void*> outs;
  std::vector<uint64_t> idx;
  for (size_t k = 0; k < recs.size(); ++k) {
    got[k].resize(recs[k].size());
    outs.push_back(got[k].data());
    idx.push_back(k);
  }
  ASSERT_TRUE((*s)->Gather(idx, outs, &ThreadPool::Default()).ok());
  for (size_t k = 0; k < recs.size(); ++k) EXPECT_EQ(got[k], recs[k]) << k;
}

// Rewrites entry `k` of a kEnds index with `edit` applied, every checksum
// rebuilt: a consistent but hostile store.
void EditEntry(const std::string& path, uint64_t n, uint64_t k,
               const std::function<uint64_t(uint64_t)>& edit) {
  std::string idx = ReadFileBytes(path + "/index");
  uint64_t e;
  std::memcpy(&e, idx.data() + k * 8, 8);
  e = edit(e);
  std::memcpy(idx.data() + k * 8, &e, 8);
  const uint64_t blocks = format::NumBlocks(n);
  const uint64_t b = k / format::kBlockRecords;
  const uint64_t rows = std::min(n, (b + 1) * format::kBlockRecords) - b * format::kBlockRecords;
  const uint64_t h = format::Hash64(idx.data() + b * format::kBlockRecords * 8, rows * 8);
  std::memcpy(idx.data() + n * 8 + b * 8, &h, 8);
  WriteFileBytes(path + "/index", idx);
  auto m = format::DecodeMetadata(ReadFileBytes(path + "/meta"), "meta");
  ASSERT_TRUE(m.ok());
  m->index_table_xxh3 = format::Hash64(idx.data() + n * 8, blocks * 8);
  m->files["index"] = {idx.size(), format::Hash64(idx.data(), idx.size())};
  WriteFileBytes(path + "/meta", format::EncodeMetadata(*m));
}

void ExpectRecordCorruption(const Store& s, uint64_t k, const std::string& needle) {
  const std::string rec = "record " + std::to_string(k) + ": ";
  auto r = s.Locate(k);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Status::Code::kCorruption);
  EXPECT_NE(r.status().message().find(rec + needle), std::string::npos) << r.status().ToString();
  std::vector<uint8_t> out(4096);
  std::vector<uint64_t> idx = {k};
  std::vector<void*> outs = {out.data()};
  Status g = s.Gather(idx, outs, nullptr);
  EXPECT_EQ(g.code(), Status::Code::kCorruption);
  EXPECT_NE(g.message().find(rec + needle), std::string::npos) << g.ToString();
  Status v = s.Verify(nullptr);
  EXPECT_EQ(v.code(), Status::Code::kCorruption);
  EXPECT_NE(v.message().find(rec + needle), std::string::npos) << v.ToString();
}

constexpr uint64_t kWidth1 = uint64_t{1} << 61, kWidth2 = uint64_t{2} << 61;

TEST(NarrowTest, WidthCodeInAFormat11StoreIsCorruption) {
  TempDir dir;
  const std::string path = WriteInts(dir, "s", "<i4", Codec::kZstd, 30, 40, 3, false);
  EditEntry(path, 30, 7, [](uint64_t e) { return e | kWidth1; });
  auto s = Store::Open(path);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ExpectRecordCorruption(**s, 7, "width code 1 in a format 1.1 store");
}

TEST(NarrowTest, WidthNotBelowTheItemsizeIsCorruption) {
  TempDir dir;
  const std::string path = WriteInts(dir, "s", "<i2", Codec::kZstd, 30, 40, 300, true);
  EXPECT_EQ(IndexWidths(path, 30)[0], 1u);  // record 0 holds 0..96
  EditEntry(path, 30, 0, [](uint64_t e) { return (e & ~(uint64_t{3} << 61)) | kWidth2; });
  auto s = Store::Open(path);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ExpectRecordCorruption(**s, 0, "stored width 2 bytes is not below the itemsize 2");
}

TEST(NarrowTest, WidthCodeOnAFloatOrRawStoreIsCorruption) {
  // As written (format 1.1), then claiming format 1.2: neither may narrow.
  TempDir dir;
  struct Case {
    const char* dtype;
    Codec codec;
    const char* why;
  };
  int n = 0;
  for (const Case& c : {Case{"<f4", Codec::kZstd, "in a store of dtype '<f4'"},
                        Case{"<i4", Codec::kRaw, "in a raw store"}}) {
    for (bool claim_12 : {false, true}) {
      SCOPED_TRACE(std::string(c.dtype) + (claim_12 ? " 1.2" : " 1.1"));
      const std::string path =
          WriteInts(dir, "s" + std::to_string(n++), c.dtype, c.codec, 30, 40, 0, true);
      EditEntry(path, 30, 4, [](uint64_t e) { return e | kWidth1; });
      if (claim_12) {
        auto m = format::DecodeMetadata(ReadFileBytes(path + "/meta"), "meta");
        ASSERT_TRUE(m.ok());
        m->minor = 2;
        WriteFileBytes(path + "/meta", format::EncodeMetadata(*m));
      }
      auto s = Store::Open(path);
      ASSERT_TRUE(s.ok()) << s.status().ToString();
      ExpectRecordCorruption(
          **s, 4, std::string("width code 1 ") + (claim_12 ? c.why : "in a format 1.1 store"));
    }
  }
}

TEST(NarrowTest, MisplacedZeroExtensionBitIsCorruption) {
  constexpr uint64_t kZero = uint64_t{1} << 60;
  TempDir dir;
  // Without a width code (record 0 of a full-width store).
  const std::string a = WriteInts(dir, "a", "<i4", Codec::kZstd, 30, 40, 1 << 20, true);
  ASSERT_EQ(IndexWidths(a, 30)[29], 0u);
  EditEntry(a, 30, 29, [](uint64_t e) { return e | kZero; });
  auto s = Store::Open(a);
  ASSERT_TRUE(s.ok());
  ExpectRecordCorruption(**s, 29, "zero-extension bit without a width code");
  // On an unsigned dtype (its values are always zero-extended).
  const std::string b = WriteInts(dir, "b", "<u4", Codec::kZstd, 30, 40, 0, true);
  ASSERT_EQ(IndexWidths(b, 30)[3], 1u);
  EditEntry(b, 30, 3, [](uint64_t e) { return e | kZero; });
  auto s2 = Store::Open(b);
  ASSERT_TRUE(s2.ok());
  ExpectRecordCorruption(**s2, 3, "zero-extension bit on an unsigned dtype");
  // In a format 1.1 store.
  const std::string c = WriteInts(dir, "c", "<i4", Codec::kZstd, 30, 40, 0, false);
  EditEntry(c, 30, 5, [](uint64_t e) { return e | kZero; });
  auto s3 = Store::Open(c);
  ASSERT_TRUE(s3.ok());
  ExpectRecordCorruption(**s3, 5, "zero-extension bit in a format 1.1 store");
}

TEST(NarrowTest, SignedTokensBelow65536TakeTwoBytesZeroExtended) {
  // int32 tokens as a GPT-2 tokenizer makes them (0..50256): records 33..39
  // hold values above 32767, which a sign-extended 2-byte value cannot.
  TempDir dir;
  const std::string path = WriteInts(dir, "t", "<i4", Codec::kZstd, 40, 48, 1000, true);
  // Record k holds k * 1000 + 0..47: 1 byte for k = 0, 2 bytes from 1 on,
  // always zero-extended.
  std::vector<uint32_t> want(40, 2);
  want[0] = 1;
  EXPECT_EQ(IndexWidths(path, 40), want);
  EXPECT_EQ(IndexZeroExtend(path, 40), std::vector<bool>(40, true));
  auto s = Store::Open(path);
  ASSERT_TRUE(s.ok());
  std::vector<int32_t> got(48);
  ASSERT_TRUE((*s)->ReadRecord(39, got.data(), got.size() * sizeof(int32_t)).ok());
  for (int j = 0; j < 48; ++j) EXPECT_EQ(got[j], 39000 + j % 97);
}

TEST(NarrowTest, DecodedLengthOtherThanCountTimesWidthIsCorruption) {
  // A dense store: record 5's frame holds 64 one-byte values; its width code
  // rewritten to 2 bytes asks for 128 bytes from that frame.
  TempDir dir;
  const std::string path = dir.Sub("d");
  WriteOptions o;
  o.codec = Codec::kZstd;
  o.group_index = false;  // EditEntry rewrites "ends" entries
  auto w = StoreWriter::Create(path, DenseSchema("<u4", {64}), o);
  ASSERT_TRUE(w.ok());
  std::vector<uint32_t> v(size_t{64} * 10);
  for (size_t j = 0; j < v.size(); ++j) v[j] = static_cast<uint32_t>(j / 64 + 100);
  ASSERT_TRUE((*w)->AppendDense(v.data(), 10).ok());
  ASSERT_TRUE((*w)->Publish().ok());
  ASSERT_EQ(IndexWidths(path, 10), std::vector<uint32_t>(10, 1));
  EditEntry(path, 10, 5, [](uint64_t e) { return (e & ~(uint64_t{3} << 61)) | kWidth2; });
  auto s = Store::Open(path);
  ASSERT_TRUE(s.ok());
  ASSERT_TRUE((*s)->Locate(5).value().compressed);
  std::vector<uint32_t> out(64);
  Status st = (*s)->ReadRecord(5, out.data(), 256);
  EXPECT_EQ(st.code(), Status::Code::kCorruption) << st.ToString();
  EXPECT_NE(st.message().find("record 5"), std::string::npos) << st.ToString();
  Status v2 = (*s)->Verify(nullptr);
  EXPECT_EQ(v2.code(), Status::Code::kCorruption) << v2.ToString();
  EXPECT_NE(v2.message().find("record 5"), std::string::npos) << v2.ToString();
}

TEST(NarrowTest, UnknownMinorIsRefusedAtOpen) {
  TempDir dir;
  const std::string path = WriteInts(dir, "s", "<i4", Codec::kZstd, 30, 40, 3, true);
  auto m = format::DecodeMetadata(ReadFileBytes(path + "/meta"), "meta");
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->minor, 2u);
  m->minor = 4;
  WriteFileBytes(path + "/meta", format::EncodeMetadata(*m));
  auto s = Store::Open(path);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), Status::Code::kCorruption);
  EXPECT_NE(
      s.status().message().find("unsupported format version 1.4 (this reader supports 1.0 to 1.3)"),
      std::string::npos)
      << s.status().ToString();
}

}  // namespace
}  // namespace loaderx
