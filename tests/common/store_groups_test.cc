// Format 1.3: the "groups" index and bare zstd blocks (docs/format.md,
// section 3): round trips against the same records in the 1.2 "ends"
// layout, the stored forms, wide ends, and corruption of each new field.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "format.h"
#include "loaderx/store.h"
#include "loaderx/thread_pool.h"
#include "store_test_util.h"

namespace loaderx {
namespace {

using testing::DenseSchema;
using testing::RaggedSchema;
using testing::ReadFileBytes;
using testing::TempDir;
using testing::WriteFileBytes;

// Token-like int32 records: record k has lens[k] values (GPT-2 ids, many
// above 32,767); a few hold a value needing 4 bytes, record 5 is empty,
// record 7 is incompressible noise, record 9 is larger than one zstd block
// (70,000 values, 140 KB narrowed).
std::vector<std::vector<int32_t>> Tokens(uint64_t n, bool dense) {
  std::mt19937_64 rng(11);
  std::vector<std::vector<int32_t>> recs(n);
  for (uint64_t k = 0; k < n; ++k) {
    uint64_t len = dense ? 64 : 1 + rng() % 300;
    if (!dense && k == 5) len = 0;
    if (!dense && k == 9) len = 70000;
    auto& r = recs[k];
    r.resize(len);
    for (uint64_t j = 0; j < len; ++j) {
      // A small vocabulary of phrases: compressible, as text is.
      r[j] = static_cast<int32_t>((j % 7) * 7000 + (k % 5) * 11 + (rng() % 4));
    }
    if (k == 7) {
      for (auto& v : r) v = static_cast<int32_t>(rng() % 65536);
    }
    if (k % 50 == 3 && len > 0) r[0] = -2000000000;  // full width
  }
  return recs;
}

std::string Write(const TempDir& dir, const std::string& name,
                  const std::vector<std::vector<int32_t>>& recs, bool dense, uint32_t ndim,
                  Codec codec, bool group_index, uint32_t shards) {
  std::string path = dir.Sub(name);
  WriteOptions o;
  o.codec = codec;
  o.data_shards = shards;
  o.group_index = group_index;
  if (codec == Codec::kZstdDict) o.dictionary = testing::TestDictionary();
  auto w =
      StoreWriter::Create(path, dense ? DenseSchema("<i4", {64}) : RaggedSchema("<i4", ndim), o);
  EXPECT_TRUE(w.ok()) << w.status().ToString();
  std::vector<uint64_t> shapes;
  for (const auto& r : recs) {
    if (ndim == 2) {  // rank 2: [len / 2, 2] for even lengths, [len, 1] else
      shapes.push_back(r.size() % 2 == 0 ? r.size() / 2 : r.size());
      shapes.push_back(r.size() % 2 == 0 ? 2 : 1);
    } else {
      shapes.push_back(r.size());
    }
  }
  // Two appends: the second goes on with the first's runs and groups.
  EXPECT_TRUE(testing::AppendInTwoHalves(**w, recs, dense, shapes, ndim).ok());
  Status st = (*w)->Publish();
  EXPECT_TRUE(st.ok()) << st.ToString();
  return path;
}

format::Metadata Meta(const std::string& path) {
  auto m = format::DecodeMetadata(ReadFileBytes(path + "/meta"), "meta");
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return *m;
}

std::vector<std::vector<int32_t>> ReadAll(const Store& s) {
  std::vector<std::vector<int32_t>> got(s.size());
  std::vector<uint64_t> idx;
  std::vector<void*> outs;
  for (uint64_t k = 0; k < s.size(); ++k) {
    got[k].resize(s.RecordBytes(k).value() / 4);
    idx.push_back(s.size() - 1 - k);  // reverse order: every record located alone
  }
  for (uint64_t k = 0; k < s.size(); ++k) outs.push_back(got[s.size() - 1 - k].data());
  Status st = s.Gather(idx, outs, &ThreadPool::Default());
  EXPECT_TRUE(st.ok()) << st.ToString();
  return got;
}

struct Case {
  bool dense;
  uint32_t ndim;
  Codec codec;
};

TEST(StoreGroupsTest, RoundTripsAndReadsAsTheEndsLayout) {
  for (const Case& c : {Case{false, 1, Codec::kZstd}, Case{false, 1, Codec::kZstdDict},
                        Case{false, 2, Codec::kZstd}, Case{true, 1, Codec::kZstd},
                        Case{true, 1, Codec::kZstdDict}}) {
    SCOPED_TRACE(std::string(c.dense ? "dense " : "ragged ndim ") + std::to_string(c.ndim) + " " +
                 CodecName(c.codec));
    TempDir dir;
    // 5000 records: runs of a multiple of 64 over all three shards, the
    // last group short (5000 % 64 = 8).
    const uint64_t n = 5000;
    const auto recs = Tokens(n, c.dense);
    const std::string g = Write(dir, "g", recs, c.dense, c.ndim, c.codec, true, 3);
    const std::string e = Write(dir, "e", recs, c.dense, c.ndim, c.codec, false, 3);
    const format::Metadata gm = Meta(g), em = Meta(e);
    EXPECT_EQ(gm.layout, format::Layout::kGroups);
    EXPECT_EQ(gm.minor, 3u);
    EXPECT_EQ(em.layout, format::Layout::kEnds);
    EXPECT_EQ(em.minor, 2u);
    EXPECT_EQ(gm.run_records % format::kGroupRecords, 0u);
    EXPECT_EQ(gm.wide_ends, 0u);
    // The index: a row per group, then the block table and the data sums.
    uint64_t data_blocks = 0;
    for (uint32_t s = 0; s < 3; ++s) {
      data_blocks +=
          format::NumDataBlocks(gm.files.at(format::DataFileName(s)).size, format::kDataBlockBytes);
    }
    EXPECT_EQ(gm.files.at("index").size,
              format::NumGroups(n) * 8 + n * 4 + format::NumBlocks(n) * 8 + data_blocks * 8);
    auto gs = Store::Open(g);
    auto es = Store::Open(e);
    ASSERT_TRUE(gs.ok()) << gs.status().ToString();
    ASSERT_TRUE(es.ok()) << es.status().ToString();
    const auto got = ReadAll(**gs);
    EXPECT_EQ(got, ReadAll(**es));
    for (uint64_t k = 0; k < recs.size(); ++k) ASSERT_EQ(got[k], recs[k]) << k;
    // One by one too, and with the same shapes.
    for (uint64_t k : {0, 5, 7, 9, 63, 64, 4999}) {
      std::vector<int32_t> one(recs[k].size());
      ASSERT_TRUE((*gs)->ReadRecord(k, one.data(), one.size() * 4).ok()) << k;
      EXPECT_EQ(one, recs[k]) << k;
    }
    EXPECT_TRUE((*gs)->Verify(nullptr).ok());
    // Every stored form: bare blocks with a 1-byte content size (under 256
    // bytes of narrowed values) and a 2-byte one, and in the ragged stores a
    // whole frame (record 9: several blocks) and raw (record 7, noise).
    uint64_t bare1 = 0, bare2 = 0;
    for (uint64_t k = 0; k < recs.size(); ++k) {
      const RecordRef r = (*gs)->Locate(k).value();
      bare1 += r.bare == 1 ? 1 : 0;
      bare2 += r.bare == 2 ? 1 : 0;
      const RecordRef o = (*es)->Locate(k).value();
      EXPECT_EQ(r.width, o.width) << k;
      if (r.bare != 0) {
        // A bare block is its frame less the descriptor and block header
        // (which may make a record compressed that was raw in 1.2).
        EXPECT_TRUE(r.compressed) << k;
        if (o.compressed) {
          EXPECT_EQ(r.stored_len + 4, o.stored_len) << k;
        }
      } else {
        EXPECT_EQ(r.compressed, o.compressed) << k;
        EXPECT_EQ(r.stored_len, o.stored_len) << k;
      }
    }
    EXPECT_GT(bare1, 0u);
    if (!c.dense) {
      EXPECT_GT(bare2, 0u);
      const RecordRef r9 = (*gs)->Locate(9).value();
      EXPECT_TRUE(r9.compressed);
      EXPECT_EQ(r9.bare, 0u);
      EXPECT_EQ(r9.width, 2u);
      EXPECT_FALSE((*gs)->Locate(7).value().compressed);
      EXPECT_EQ((*gs)->Locate(5).value().stored_len, 0u);
      EXPECT_EQ((*gs)->Locate(53).value().width, 0u);  // holds -2e9
    }
    // The new layout saves 4 bytes per bare record and 3.875 per index entry.
    EXPECT_LT(gs.value()->stored_bytes(), es.value()->stored_bytes());
  }
}

TEST(StoreGroupsTest, OnlyNarrowingStoresOfSmallRecordsUseIt) {
  TempDir dir;
  const auto recs = Tokens(200, true);
  // narrow=False: format 1.1, the "ends" index, as before.
  {
    WriteOptions o;
    o.codec = Codec::kZstd;
    o.narrow_integers = false;
    const std::string p = dir.Sub("plain");
    auto w = StoreWriter::Create(p, DenseSchema("<i4", {64}), o);
    ASSERT_TRUE(w.ok());
    std::vector<int32_t> flat;
    for (const auto& r : recs) flat.insert(flat.end(), r.begin(), r.end());
    ASSERT_TRUE((*w)->AppendDense(flat.data(), recs.size()).ok());
    ASSERT_TRUE((*w)->Publish().ok());
    EXPECT_EQ(Meta(p).layout, format::Layout::kEnds);
    EXPECT_EQ(Meta(p).minor, 1u);
  }
  // Records of 64 KiB: runs of 4 records, below a group: format 1.2.
  {
    WriteOptions o;
    o.codec = Codec::kZstd;
    const std::string p = dir.Sub("large");
    auto w = StoreWriter::Create(p, DenseSchema("<i4", {16384}), o);
    ASSERT_TRUE(w.ok());
    std::vector<int32_t> flat(size_t{16384} * 10);
    for (size_t j = 0; j < flat.size(); ++j) flat[j] = static_cast<int32_t>(j % 300);
    ASSERT_TRUE((*w)->AppendDense(flat.data(), 10).ok());
    ASSERT_TRUE((*w)->Publish().ok());
    EXPECT_EQ(Meta(p).layout, format::Layout::kEnds);
    EXPECT_EQ(Meta(p).minor, 2u);
    auto s = Store::Open(p);
    ASSERT_TRUE(s.ok());
    std::vector<int32_t> got(16384);
    ASSERT_TRUE((*s)->ReadRecord(9, got.data(), got.size() * 4).ok());
    EXPECT_EQ(got, std::vector<int32_t>(flat.end() - 16384, flat.end()));
  }
}

// A record ending 64 MiB or more past its group's base takes a wide end.
TEST(StoreGroupsTest, RecordsFarFromTheirGroupBaseTakeWideEnds) {
  TempDir dir;
  const std::string path = dir.Sub("w");
  WriteOptions o;
  o.codec = Codec::kZstd;
  auto w = StoreWriter::Create(path, RaggedSchema("<u2", 1), o);
  ASSERT_TRUE(w.ok());
  // 100 short records (runs of 16,384), then one of 65 MiB of noise (stored
  // raw: it cannot be narrowed or compressed), then 10 short ones.
  std::vector<std::vector<uint16_t>> recs(111);
  std::mt19937_64 rng(3);
  for (uint64_t k = 0; k < recs.size(); ++k) {
    recs[k].assign(k == 100 ? (uint64_t{65} << 20) / 2 : 40, static_cast<uint16_t>(k % 200));
    if (k == 100) {
      for (auto& v : recs[k]) v = static_cast<uint16_t>(rng());
    }
    std::vector<uint64_t> shape = {recs[k].size()};
    ASSERT_TRUE((*w)->AppendRagged(recs[k].data(), shape.data(), 1).ok());
  }
  ASSERT_TRUE((*w)->Publish().ok());
  const format::Metadata m = Meta(path);
  EXPECT_EQ(m.layout, format::Layout::kGroups);
  // Records 100..127 of group 1 end past 2^26 - 1 bytes after its base
  // (record 64's start): 11 wide ends.
  EXPECT_EQ(m.wide_ends, 11u);
  auto s = Store::Open(path);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  for (uint64_t k : {0, 99, 100, 101, 110}) {
    std::vector<uint16_t> got(recs[k].size());
    ASSERT_TRUE((*s)->ReadRecord(k, got.data(), got.size() * 2).ok()) << k;
    EXPECT_EQ(got, recs[k]) << k;
  }
  EXPECT_EQ((*s)->Locate(100).value().stored_len, uint64_t{65} << 20);
  EXPECT_TRUE((*s)->Verify(nullptr).ok());
}

// --- corruption of each field, every checksum rebuilt (a hostile store) ---

constexpr uint64_t kN = 300;

std::string SmallStore(const TempDir& dir) {
  return Write(dir, "s", Tokens(kN, true), true, 1, Codec::kZstd, true, 2);
}

// Applies `edit` to the index body, then rebuilds the block checksums, the
// table hash and the file entry in `meta` (`wide` replaces the wide ends).
void EditIndex(const std::string& path, const std::function<void(uint8_t* body)>& edit,
               const std::vector<uint64_t>* wide = nullptr) {
  std::string idx = ReadFileBytes(path + "/index");
  format::Metadata m = Meta(path);
  const uint64_t body = format::GroupsBodyBytes(m.count);
  const uint64_t blocks = format::NumBlocks(m.count);
  const uint64_t stride = format::kBlockRecords / format::kGroupRecords * format::kGroupRowBytes;
  edit(reinterpret_cast<uint8_t*>(idx.data()));
  for (uint64_t b = 0; b < blocks; ++b) {
    const uint64_t from = b * stride, to = std::min(body, from + stride);
    const uint64_t h = format::Hash64(idx.data() + from, to - from);
    std::memcpy(idx.data() + body + b * 8, &h, 8);
  }
  m.index_table_xxh3 = format::Hash64(idx.data() + body, blocks * 8);
  if (wide != nullptr) {
    const uint64_t at = body + blocks * 8;
    idx.erase(at, m.wide_ends * 8);
    idx.insert(at, reinterpret_cast<const char*>(wide->data()), wide->size() * 8);
    m.wide_ends = wide->size();
    m.wide_xxh3 = format::Hash64(wide->data(), wide->size() * 8);
  }
  m.files["index"] = {idx.size(), format::Hash64(idx.data(), idx.size())};
  WriteFileBytes(path + "/index", idx);
  WriteFileBytes(path + "/meta", format::EncodeMetadata(m));
}

uint32_t Word(const uint8_t* body, uint64_t k) {
  uint32_t w;
  std::memcpy(&w, body + format::GroupWordOffset(k), 4);
  return w;
}
void SetWord(uint8_t* body, uint64_t k, uint32_t w) {
  std::memcpy(body + format::GroupWordOffset(k), &w, 4);
}

// Locate, Gather and Verify all refuse record k, naming it (Verify names
// the first bad record: `verify_k`, if not k).
void ExpectRefused(const std::string& path, uint64_t k, const std::string& needle,
                   uint64_t verify_k = UINT64_MAX, const std::string& verify_needle = "") {
  auto s = Store::Open(path);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  const std::string want = path + "/index: record " + std::to_string(k) + ": " + needle;
  auto r = (*s)->Locate(k);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Status::Code::kCorruption);
  EXPECT_NE(r.status().message().find(want), std::string::npos) << r.status().ToString();
  std::vector<uint8_t> out(256);
  std::vector<uint64_t> idx = {k};
  std::vector<void*> outs = {out.data()};
  Status g = (*s)->Gather(idx, outs, nullptr);
  EXPECT_EQ(g.code(), Status::Code::kCorruption);
  EXPECT_NE(g.message().find(want), std::string::npos) << g.ToString();
  Status v = (*s)->Verify(nullptr);
  EXPECT_EQ(v.code(), Status::Code::kCorruption);
  const std::string vwant =
      verify_k == UINT64_MAX
          ? want
          : path + "/index: record " + std::to_string(verify_k) + ": " + verify_needle;
  EXPECT_NE(v.message().find(vwant), std::string::npos) << v.ToString();
}

TEST(StoreGroupsTest, CorruptWordEndIsRefusedByRecord) {
  TempDir dir;
  const std::string p = SmallStore(dir);
  // Record 70's end past its data file: records 70 and 71 (which starts there).
  EditIndex(p,
            [](uint8_t* b) { SetWord(b, 70, (Word(b, 70) & ~format::kWordRelMask) | 0x3ffffff); });
  ExpectRefused(p, 70, "extent [");
  ExpectRefused(p, 71, "ends at ", 70, "extent [");
}

TEST(StoreGroupsTest, CorruptWordEndBeforeItsStartIsRefused) {
  TempDir dir;
  const std::string p = SmallStore(dir);
  EditIndex(p, [](uint8_t* b) { SetWord(b, 66, Word(b, 66) & ~format::kWordRelMask); });
  ExpectRefused(p, 66, "ends at ");
}

TEST(StoreGroupsTest, CorruptGroupBaseIsRefused) {
  TempDir dir;
  const std::string p = SmallStore(dir);
  // Past the data file: every record of group 2 (records 128..191).
  EditIndex(p, [](uint8_t* b) {
    const uint64_t far = uint64_t{1} << 40;
    std::memcpy(b + 2 * format::kGroupRowBytes, &far, 8);
  });
  ExpectRefused(p, 128, "group base 1099511627776 outside data-000");
}

TEST(StoreGroupsTest, ShiftedGroupBaseFailsVerify) {
  TempDir dir;
  const std::string p = SmallStore(dir);
  // Group 1 (records 64..127; the store is one run in data-000) one byte
  // on: its records still lie in the file, so only verify sees it.
  uint64_t base;
  std::memcpy(&base, ReadFileBytes(p + "/index").data() + format::kGroupRowBytes, 8);
  EditIndex(p, [&](uint8_t* b) {
    const uint64_t moved = base + 1;
    std::memcpy(b + format::kGroupRowBytes, &moved, 8);
  });
  auto s = Store::Open(p);
  ASSERT_TRUE(s.ok());
  Status v = (*s)->Verify(nullptr);
  EXPECT_EQ(v.code(), Status::Code::kCorruption);
  EXPECT_NE(v.message().find(p + "/index: record 64: group base " + std::to_string(base + 1) +
                             " != " + std::to_string(base) +
                             ", where the record before it in data-000 ends"),
            std::string::npos)
      << v.ToString();
}

TEST(StoreGroupsTest, CorruptWidthBitsAreRefused) {
  TempDir dir;
  const std::string p = SmallStore(dir);
  // Width code 3 (4 bytes) on an <i4 store: not below the itemsize.
  EditIndex(p, [](uint8_t* b) { SetWord(b, 10, Word(b, 10) | (3u << format::kWordWidthShift)); });
  ExpectRefused(p, 10, "stored width 4 bytes is not below the itemsize 4");
}

TEST(StoreGroupsTest, CorruptFormIsRefusedOrDecodesToAnError) {
  TempDir dir;
  const std::string p = SmallStore(dir);
  // A bare block marked raw: its stored length is not the record's length.
  EditIndex(p, [](uint8_t* b) { SetWord(b, 12, Word(b, 12) & ~(3u << format::kWordFormShift)); });
  ExpectRefused(p, 12, "stored length ");
}

TEST(StoreGroupsTest, BareBlockLongerThanAnyIsRefused) {
  TempDir dir;
  const std::string p = dir.Sub("b");
  WriteOptions o;
  o.codec = Codec::kZstd;
  auto w = StoreWriter::Create(p, RaggedSchema("<u2", 1), o);
  ASSERT_TRUE(w.ok());
  // Record 3: 40,000 random values, stored raw (80,000 bytes).
  std::mt19937_64 rng(1);
  for (uint64_t k = 0; k < 10; ++k) {
    std::vector<uint16_t> r(k == 3 ? 40000 : 50, static_cast<uint16_t>(k));
    if (k == 3) {
      for (auto& v : r) v = static_cast<uint16_t>(rng());
    }
    std::vector<uint64_t> shape = {r.size()};
    ASSERT_TRUE((*w)->AppendRagged(r.data(), shape.data(), 1).ok());
  }
  ASSERT_TRUE((*w)->Publish().ok());
  ASSERT_EQ(Meta(p).layout, format::Layout::kGroups);
  EditIndex(p, [](uint8_t* b) {
    SetWord(b, 3, Word(b, 3) | (format::kFormBare1 << format::kWordFormShift));
  });
  ExpectRefused(p, 3, "bare zstd block of 80000 bytes (at most 65791)");
}

TEST(StoreGroupsTest, WideOrdinalOutOfRangeIsRefused) {
  TempDir dir;
  const std::string p = SmallStore(dir);
  EditIndex(p, [](uint8_t* b) {
    SetWord(b, 20, (Word(b, 20) & ~format::kWordRelMask) | format::kWordWideBit | 5);
  });
  ExpectRefused(p, 20, "wide end 5 out of range (0 wide ends)");
}

TEST(StoreGroupsTest, WideEndsAreReadAndChecked) {
  TempDir dir;
  const std::string p = SmallStore(dir);
  // Record 20's end moved to a wide end holding the same offset: reads the same.
  uint64_t end = 0;
  {
    auto s = Store::Open(p);
    ASSERT_TRUE(s.ok());
    const RecordRef r = (*s)->Locate(20).value();
    end = r.offset + r.stored_len;
  }
  std::vector<uint64_t> wide = {7, end};
  EditIndex(
      p,
      [](uint8_t* b) {
        SetWord(b, 20, (Word(b, 20) & ~format::kWordRelMask) | format::kWordWideBit | 1);
      },
      &wide);
  auto s = Store::Open(p);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  const auto recs = Tokens(kN, true);
  for (uint64_t k : {19, 20, 21}) {
    std::vector<int32_t> got(64);
    ASSERT_TRUE((*s)->ReadRecord(k, got.data(), 256).ok()) << k;
    EXPECT_EQ(got, recs[k]) << k;
  }
  // A wide end table that does not match its hash: refused at open.
  std::string idx = ReadFileBytes(p + "/index");
  const uint64_t at = format::GroupsBodyBytes(kN) + format::NumBlocks(kN) * 8;
  idx[at] ^= 1;
  format::Metadata m = Meta(p);
  m.files["index"] = {idx.size(), format::Hash64(idx.data(), idx.size())};
  WriteFileBytes(p + "/index", idx);
  WriteFileBytes(p + "/meta", format::EncodeMetadata(m));
  auto bad = Store::Open(p);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), Status::Code::kCorruption);
  EXPECT_NE(bad.status().message().find(p + "/index: wide end table mismatch"), std::string::npos)
      << bad.status().ToString();
}

// Random words and bases, every checksum rebuilt: each read and verify ends
// in a Status (the values may differ: the index is not the data's checksum).
TEST(StoreGroupsTest, HostileWordsAndBasesEndInAStatus) {
  TempDir dir;
  const auto recs = Tokens(200, false);
  const std::string src = Write(dir, "src", recs, false, 1, Codec::kZstd, true, 2);
  const std::string body = ReadFileBytes(src + "/index");
  std::mt19937_64 rng(9);
  for (int round = 0; round < 150; ++round) {
    const std::string p = dir.Sub("h" + std::to_string(round));
    std::filesystem::copy(src, p);
    EditIndex(p, [&](uint8_t* b) {
      for (int e = 0; e < 1 + round % 3; ++e) {
        const uint64_t k = rng() % 200;
        if (rng() % 4 == 0) {
          const uint64_t base = rng() % 3 == 0 ? rng() : rng() % 40000;
          std::memcpy(b + (k / format::kGroupRecords) * format::kGroupRowBytes, &base, 8);
        } else {
          SetWord(b, k, Word(b, k) ^ (uint32_t{1} << (rng() % 32)));
        }
      }
    });
    auto s = Store::Open(p);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    for (uint64_t k = 0; k < recs.size(); ++k) {
      auto bytes = (*s)->RecordBytes(k);
      if (!bytes.ok()) {
        EXPECT_EQ(bytes.status().code(), Status::Code::kCorruption);
        continue;
      }
      if (*bytes > (uint64_t{1} << 20)) continue;
      std::vector<uint8_t> out(*bytes);
      Status st = (*s)->ReadRecord(k, out.data(), out.size());
      if (!st.ok()) {
        EXPECT_EQ(st.code(), Status::Code::kCorruption) << st.ToString();
      }
    }
    Status v = (*s)->Verify(nullptr);
    if (!v.ok()) {
      EXPECT_EQ(v.code(), Status::Code::kCorruption) << v.ToString();
    }
  }
  EXPECT_EQ(ReadFileBytes(src + "/index"), body);
}

TEST(StoreGroupsTest, FlippedIndexByteIsABlockChecksumMismatch) {
  TempDir dir;
  const std::string p = SmallStore(dir);
  std::string idx = ReadFileBytes(p + "/index");
  idx[format::GroupWordOffset(100)] ^= 4;
  WriteFileBytes(p + "/index", idx);
  auto s = Store::Open(p);
  ASSERT_TRUE(s.ok());
  auto r = (*s)->Locate(100);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(p + "/index: checksum mismatch in block 0 (records 0..299)"),
            std::string::npos)
      << r.status().ToString();
}

TEST(StoreGroupsTest, MetadataOfTheLayoutIsChecked) {
  TempDir dir;
  const std::string p = SmallStore(dir);
  format::Metadata m = Meta(p);
  struct Bad {
    std::function<void(format::Metadata*)> edit;
    std::string why;
  };
  for (const Bad& b : std::vector<Bad>{
           {[](format::Metadata* x) { x->minor = 2; }, "layout 'groups' in a format 1.2 store"},
           {[](format::Metadata* x) { x->run_records = 100; },
            "run_records 100 is not a multiple of 64 (layout 'groups')"},
           {[](format::Metadata* x) { x->wide_ends = kN + 1; },
            "wide_ends 301 above the record count"},
       }) {
    format::Metadata e = m;
    b.edit(&e);
    auto d = format::DecodeMetadata(format::EncodeMetadata(e), "meta");
    ASSERT_FALSE(d.ok()) << b.why;
    EXPECT_EQ(d.status().code(), Status::Code::kCorruption);
    EXPECT_NE(d.status().message().find(b.why), std::string::npos) << d.status().ToString();
  }
}

}  // namespace
}  // namespace loaderx
