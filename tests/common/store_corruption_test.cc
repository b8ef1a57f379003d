// Corruption, truncation and misuse: every region of a store, each reported as
// a Status naming the file (open) or the record (read / Verify), never a crash.
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cinttypes>
#include <cstring>
#include <filesystem>
#include <iostream>

#include "format.h"
#include "loaderx/env.h"
#include "loaderx/store.h"
#include "loaderx/thread_pool.h"
#include "store_test_util.h"

namespace loaderx {
namespace {

namespace fs = std::filesystem;
using testing::DenseSchema;
using testing::MakeBytes;
using testing::RaggedSchema;
using testing::ReadFileBytes;
using testing::TempDir;
using testing::WriteFileBytes;

constexpr uint64_t kN = 5000;  // two index blocks

void EditMeta(const std::string& path, const std::function<void(format::Metadata&)>& edit);

// A ragged zstd_dict store of rank 2 over 2 shards has every kind of file
// (rank-1 ragged stores of format 1.1 have no shape table: RaggedRank1Test).
// Its index is the 1.2 "ends" layout, whose entry offsets the tests use;
// GroupsCorruptionTest writes the same store with the 1.3 "groups" index.
class CorruptionTest : public ::testing::Test {
 protected:
  virtual bool GroupIndex() const { return false; }
  void SetUp() override {
    // ~500 KiB of values: two 256 KiB runs, so both shards hold records.
    path_ = dir_.Sub("store");
    std::vector<uint64_t> shapes;
    uint64_t total = 0;
    for (uint64_t i = 0; i < kN; ++i) {
      shapes.push_back(1 + i % 50);
      shapes.push_back(1);
      total += (1 + i % 50) * 4;
    }
    values_ = MakeBytes(total, 11);
    WriteOptions o;
    o.codec = Codec::kZstdDict;
    o.dictionary = testing::TestDictionary();
    o.data_shards = 2;
    o.group_index = GroupIndex();
    auto w = StoreWriter::Create(path_, RaggedSchema("<i4", 2), o);
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE((*w)->AppendRagged(values_.data(), shapes.data(), kN).ok());
    ASSERT_TRUE((*w)->Publish().ok());
    ASSERT_GT(fs::file_size(File("data-001")), 0u);
  }

  std::string File(const std::string& name) const { return path_ + "/" + name; }

  void FlipByte(const std::string& name, uint64_t pos) {
    std::string b = ReadFileBytes(File(name));
    ASSERT_LT(pos, b.size());
    b[pos] ^= 0x5A;
    WriteFileBytes(File(name), b);
  }

  // Expects a Corruption whose message contains `needle`.
  static void ExpectCorruption(const Status& st, const std::string& needle) {
    EXPECT_EQ(st.code(), Status::Code::kCorruption) << st.ToString();
    EXPECT_NE(st.message().find(needle), std::string::npos) << st.ToString();
  }

  // Flips one bit of every 97th byte of `index` below `end`, in turn: each
  // store is refused at open, or fails reading some record, naming the index.
  void ExpectEveryIndexFlipDetected(uint64_t end) {
    const std::string orig = ReadFileBytes(File("index"));
    for (size_t pos = 0; pos < end; pos += 97) {
      std::string b = orig;
      b[pos] ^= 0x10;
      WriteFileBytes(File("index"), b);
      auto s = Store::Open(path_);
      if (!s.ok()) {
        ExpectCorruption(s.status(), "/index");
        continue;
      }
      ExpectCorruption(ReadAll(**s), "/index");
    }
  }

  // Reads every record; returns the first error.
  static Status ReadAll(const Store& s) {
    std::vector<uint8_t> buf;
    for (uint64_t i = 0; i < s.size(); ++i) {
      auto n = s.RecordBytes(i);
      if (!n.ok()) return n.status();
      buf.resize(n.value());
      Status st = s.ReadRecord(i, buf.data(), buf.size());
      if (!st.ok()) return st;
    }
    return Status::OK();
  }

  TempDir dir_;
  std::string path_;
  std::vector<uint8_t> values_;
};

class GroupsCorruptionTest : public CorruptionTest {
 protected:
  bool GroupIndex() const override { return true; }
  // The groups index body: its block table starts here.
  static uint64_t Body() { return format::GroupsBodyBytes(kN); }
};

TEST_F(GroupsCorruptionTest, IntactStoreVerifiesAndIsGroups) {
  auto m = format::DecodeMetadata(ReadFileBytes(File("meta")), "meta");
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->layout, format::Layout::kGroups);
  EXPECT_EQ(fs::file_size(File("index")),
            Body() + format::NumBlocks(kN) * 8 + m->wide_ends * 8 +
                (m->files.at("index").size - Body() - format::NumBlocks(kN) * 8));
  auto s = Store::Open(path_);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_TRUE((*s)->Verify(nullptr).ok());
  EXPECT_TRUE(ReadAll(**s).ok());
}

TEST_F(GroupsCorruptionTest, FlippedWordIsCaughtOnFirstUseOfItsBlock) {
  FlipByte("index", format::GroupWordOffset(4096 + 7) + 1);  // block 1, record 4103
  auto s = Store::Open(path_);
  ASSERT_TRUE(s.ok()) << "open is O(1): it does not read index blocks";
  std::vector<uint8_t> buf(4);
  EXPECT_TRUE((*s)->ReadRecord(0, buf.data(), 4).ok()) << "block 0 is intact";
  auto r = (*s)->Locate(4500);
  ASSERT_FALSE(r.ok());
  ExpectCorruption(r.status(), "/index: checksum mismatch in block 1 (records 4096..4999)");
  ExpectCorruption((*s)->Verify(nullptr), "block 1");
}

TEST_F(GroupsCorruptionTest, AnyFlippedIndexByteIsDetected) {
  // Rows (bases and words) and their block table.
  ExpectEveryIndexFlipDetected(Body() + format::NumBlocks(kN) * 8);
}

TEST_F(GroupsCorruptionTest, FlippedBlockChecksumTableFailsOpen) {
  FlipByte("index", Body() + 3);
  auto s = Store::Open(path_);
  ASSERT_FALSE(s.ok());
  ExpectCorruption(s.status(), "/index: block checksum table mismatch");
}

TEST_F(GroupsCorruptionTest, BadContentSizeOfABareBlockIsCorruptionNamingTheRecord) {
  auto s0 = Store::Open(path_);
  ASSERT_TRUE(s0.ok());
  uint64_t i = 1000;
  while ((*s0)->Locate(i).value().bare != 1) ++i;
  const RecordRef r = (*s0)->Locate(i).value();
  s0->reset();
  {  // the 1-byte content size field, one more: not what the record decodes to
    std::string b = ReadFileBytes(File(format::DataFileName(r.shard)));
    b[r.offset] = static_cast<char>(b[r.offset] + 1);
    WriteFileBytes(File(format::DataFileName(r.shard)), b);
  }
  auto s = Store::Open(path_);
  ASSERT_TRUE(s.ok());
  const std::string want = path_ + ": record " + std::to_string(i) + ": frame: zstd: ";
  std::vector<uint8_t> buf(r.raw_len);
  ExpectCorruption((*s)->ReadRecord(i, buf.data(), buf.size()), want);
  ExpectCorruption((*s)->Verify(nullptr),
                   "/data-00" + std::to_string(r.shard) + ": checksum mismatch in bytes ");
}

TEST_F(CorruptionTest, IntactStoreVerifies) {
  auto s = Store::Open(path_);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  uint64_t last_done = 0, last_total = 0;
  EXPECT_TRUE((*s)->Verify([&](uint64_t d, uint64_t t) {
                    last_done = d;
                    last_total = t;
                  })
                  .ok());
  EXPECT_EQ(last_done, kN);
  EXPECT_EQ(last_total, kN);
  EXPECT_TRUE(ReadAll(**s).ok());
}

TEST_F(CorruptionTest, AnyFlippedMetadataByteFailsOpen) {
  const std::string orig = ReadFileBytes(File("meta"));
  for (size_t pos = 0; pos < orig.size(); ++pos) {
    std::string b = orig;
    b[pos] ^= 0x01;
    WriteFileBytes(File("meta"), b);
    auto s = Store::Open(path_);
    ASSERT_FALSE(s.ok()) << "byte " << pos;
    ExpectCorruption(s.status(), "/meta");
  }
}

TEST_F(CorruptionTest, TruncatedOrExtendedFileFailsOpenNamingIt) {
  for (const char* name : {"meta", "index", "shapes", "dict", "data-000", "data-001"}) {
    SCOPED_TRACE(name);
    const std::string orig = ReadFileBytes(File(name));
    for (uint64_t keep : {uint64_t{0}, orig.size() / 2, orig.size() - 1}) {
      WriteFileBytes(File(name), orig.substr(0, keep));
      auto s = Store::Open(path_);
      ASSERT_FALSE(s.ok());
      ExpectCorruption(s.status(), std::string("/") + name);
    }
    WriteFileBytes(File(name), orig + "x");
    auto s = Store::Open(path_);
    ASSERT_FALSE(s.ok());
    ExpectCorruption(s.status(), std::string("/") + name);
    WriteFileBytes(File(name), orig);
  }
  EXPECT_TRUE(Store::Open(path_).ok());
}

TEST_F(CorruptionTest, MissingFileFailsOpenNamingIt) {
  for (const char* name : {"index", "shapes", "dict", "data-001"}) {
    const std::string orig = ReadFileBytes(File(name));
    fs::remove(File(name));
    auto s = Store::Open(path_);
    ASSERT_FALSE(s.ok());
    ExpectCorruption(s.status(), std::string("/") + name + ": missing");
    WriteFileBytes(File(name), orig);
  }
}

TEST_F(CorruptionTest, FlippedIndexEntryIsCaughtOnFirstUseOfItsBlock) {
  FlipByte("index", (4096 + 7) * format::kEndEntryBytes + 3);  // block 1, record 4103
  auto s = Store::Open(path_);
  ASSERT_TRUE(s.ok()) << "open is O(1): it does not read index blocks";
  std::vector<uint8_t> buf(4);
  EXPECT_TRUE((*s)->ReadRecord(0, buf.data(), 4).ok()) << "block 0 is intact";
  auto r = (*s)->Locate(4500);
  ASSERT_FALSE(r.ok());
  ExpectCorruption(r.status(), "/index: checksum mismatch in block 1");
  Status v = (*s)->Verify(nullptr);
  ExpectCorruption(v, "block 1");
}

TEST_F(CorruptionTest, AnyFlippedIndexByteIsDetected) {
  // Entries and their block table (the data block sums after them are
  // Verify's: FlippedDataBlockSumIsCaughtByVerify).
  ExpectEveryIndexFlipDetected(kN * format::kEndEntryBytes + format::NumBlocks(kN) * 8);
}

TEST_F(CorruptionTest, FlippedBlockChecksumTableFailsOpen) {
  FlipByte("index", kN * format::kEndEntryBytes + 3);
  auto s = Store::Open(path_);
  ASSERT_FALSE(s.ok());
  ExpectCorruption(s.status(), "/index: block checksum table mismatch");
}

// The data block sums follow the index's own block table; only Verify reads them.
TEST_F(CorruptionTest, FlippedDataBlockSumIsCaughtByVerify) {
  const uint64_t size = fs::file_size(File("index"));
  FlipByte("index", size - 3);
  auto s = Store::Open(path_);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_TRUE(ReadAll(**s).ok());
  ExpectCorruption((*s)->Verify(nullptr), "/index: data block checksum table mismatch");
}

TEST_F(CorruptionTest, FlippedShapeIsCaughtOnUse) {
  FlipByte("shapes", 10 * 16);  // record 10
  auto s = Store::Open(path_);
  ASSERT_TRUE(s.ok());
  uint64_t dims[2];
  ExpectCorruption((*s)->RecordShape(10, dims), "/shapes: checksum mismatch in block 0");
  ExpectCorruption((*s)->RecordBytes(4095).status(), "/shapes");
  EXPECT_TRUE((*s)->RecordBytes(4096).ok());
}

TEST_F(CorruptionTest, FlippedDictionaryFailsOpen) {
  FlipByte("dict", 100);
  auto s = Store::Open(path_);
  ASSERT_FALSE(s.ok());
  ExpectCorruption(s.status(), "/dict: checksum mismatch");
}

TEST_F(CorruptionTest, FlippedRecordByteIsNamedByVerify) {
  auto s0 = Store::Open(path_);
  ASSERT_TRUE(s0.ok());
  const RecordRef r = (*s0)->Locate(1234).value();
  s0->reset();
  const uint64_t pos = r.offset + r.stored_len / 2;
  FlipByte("data-00" + std::to_string(r.shard), pos);
  auto s = Store::Open(path_);
  ASSERT_TRUE(s.ok());
  // Format 1.1 checksums data in 64 KiB blocks: Verify names the block and
  // the records in it.
  const uint64_t from = pos / format::kDataBlockBytes * format::kDataBlockBytes;
  const Status st = (*s)->Verify(nullptr);
  ExpectCorruption(st, "/data-00" + std::to_string(r.shard) + ": checksum mismatch in bytes " +
                           std::to_string(from) + "..");
  const size_t at = st.message().find("(records ");
  ASSERT_NE(at, std::string::npos) << st.ToString();
  uint64_t lo = 0, hi = 0;
  ASSERT_EQ(std::sscanf(st.message().c_str() + at, "(records %" SCNu64 "..%" SCNu64 ")", &lo, &hi),
            2);
  EXPECT_LE(lo, 1234u);
  EXPECT_GE(hi, 1234u);
}

TEST_F(CorruptionTest, BadFrameOfACompressedRecordIsCorruptionNamingTheRecordOnRead) {
  auto s0 = Store::Open(path_);
  ASSERT_TRUE(s0.ok());
  uint64_t i = 1000;
  while (!(*s0)->Locate(i).value().compressed) ++i;
  const RecordRef r = (*s0)->Locate(i).value();
  s0->reset();
  // A reserved bit of the frame header (1.1 frames have no magic number and
  // no checksum: a flipped payload byte is Verify's to find).
  {
    std::string b = ReadFileBytes(File(format::DataFileName(r.shard)));
    b[r.offset] = static_cast<char>(b[r.offset] | 0x08);
    WriteFileBytes(File(format::DataFileName(r.shard)), b);
  }
  auto s = Store::Open(path_);
  ASSERT_TRUE(s.ok());
  const std::string want = path_ + ": record " + std::to_string(i) + ": frame: zstd: ";
  std::vector<uint8_t> buf(r.raw_len);
  ExpectCorruption((*s)->ReadRecord(i, buf.data(), buf.size()), want);
  std::vector<uint64_t> idx = {i - 1, i};
  std::vector<uint8_t> a((*s)->RecordBytes(i - 1).value());
  std::vector<void*> outs = {a.data(), buf.data()};
  ExpectCorruption((*s)->Gather(idx, outs, &ThreadPool::Default()), want);
}

TEST_F(CorruptionTest, VerifyNamesTheLowestBadRecordAcrossParallelChunks) {
  auto s0 = Store::Open(path_);
  ASSERT_TRUE(s0.ok());
  const RecordRef late = (*s0)->Locate(4321).value();
  const RecordRef early = (*s0)->Locate(300).value();
  s0->reset();
  FlipByte(format::DataFileName(late.shard), late.offset);
  FlipByte(format::DataFileName(early.shard), early.offset + early.stored_len - 1);
  auto s = Store::Open(path_);
  ASSERT_TRUE(s.ok());
  // Named: the bad block holding the lowest record (record 300's).
  const uint64_t from =
      (early.offset + early.stored_len - 1) / format::kDataBlockBytes * format::kDataBlockBytes;
  for (int run = 0; run < 3; ++run) {
    const Status st = (*s)->Verify(nullptr);
    ExpectCorruption(st, format::DataFileName(early.shard) + ": checksum mismatch in bytes " +
                             std::to_string(from) + "..");
    uint64_t lo = 0, hi = 0;
    const size_t at = st.message().find("(records ");
    ASSERT_NE(at, std::string::npos);
    ASSERT_EQ(
        std::sscanf(st.message().c_str() + at, "(records %" SCNu64 "..%" SCNu64 ")", &lo, &hi), 2);
    EXPECT_LE(lo, 300u);
    EXPECT_GE(hi, 300u);
    EXPECT_LT(hi, 4321u);
  }
}

TEST_F(CorruptionTest, NotAStore) {
  TempDir other;
  auto s = Store::Open(other.path());
  ASSERT_FALSE(s.ok());
  ExpectCorruption(s.status(), "not a Zrecord store");
  WriteFileBytes(other.Sub("file"), "hello");
  s = Store::Open(other.Sub("file"));
  ASSERT_FALSE(s.ok());
  ExpectCorruption(s.status(), "not a directory");
  s = Store::Open(other.Sub("missing"));
  EXPECT_EQ(s.status().code(), Status::Code::kNotFound);
}

// Rewrites the metadata with `edit` applied, re-checksummed: a consistent but
// hostile store.
void EditMeta(const std::string& path, const std::function<void(format::Metadata&)>& edit) {
  auto m = format::DecodeMetadata(ReadFileBytes(path + "/meta"), "meta");
  ASSERT_TRUE(m.ok());
  edit(*m);
  WriteFileBytes(path + "/meta", format::EncodeMetadata(*m));
}

TEST_F(CorruptionTest, NewerMajorVersionIsRejected) {
  EditMeta(path_, [](format::Metadata& m) { m.major = 2; });
  auto s = Store::Open(path_);
  ASSERT_FALSE(s.ok());
  ExpectCorruption(s.status(), "unsupported format version 2.");
}

TEST_F(CorruptionTest, WrongDictionaryIdIsRejected) {
  EditMeta(path_, [](format::Metadata& m) { m.dict_id ^= 1; });
  auto s = Store::Open(path_);
  ASSERT_FALSE(s.ok());
  ExpectCorruption(s.status(), "dictionary id");
}

TEST_F(CorruptionTest, ConsistentlyChecksummedOutOfBoundsEntryIsRejected) {
  // An index entry pointing past its data file, with every checksum rebuilt:
  // only the bounds check stands between it and a read outside the mapping.
  std::string idx = ReadFileBytes(File("index"));
  const uint64_t far = uint64_t{1} << 40;
  std::memcpy(idx.data(), &far, 8);  // record 0 ends 1 TiB into its shard
  const uint64_t blocks = format::NumBlocks(kN);
  const uint64_t body = kN * format::kEndEntryBytes;
  const uint64_t h0 = format::Hash64(idx.data(), format::kBlockRecords * format::kEndEntryBytes);
  std::memcpy(idx.data() + body, &h0, 8);
  WriteFileBytes(File("index"), idx);
  EditMeta(path_, [&](format::Metadata& m) {
    m.index_table_xxh3 = format::Hash64(idx.data() + body, blocks * 8);
  });
  auto s = Store::Open(path_);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  auto r = (*s)->Locate(0);
  ASSERT_FALSE(r.ok());
  ExpectCorruption(r.status(), "record 0: extent");
  std::vector<uint8_t> buf(4);
  ExpectCorruption((*s)->ReadRecord(0, buf.data(), 4), "outside data-");
  ExpectCorruption((*s)->Verify(nullptr), "outside");
}

TEST_F(CorruptionTest, OutOfRangeIndexIsIndexError) {
  auto s = Store::Open(path_);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ((*s)->Locate(kN).status().code(), Status::Code::kIndexError);
  EXPECT_EQ((*s)->RecordBytes(UINT64_MAX).status().code(), Status::Code::kIndexError);
  std::vector<uint64_t> idx = {1, kN + 5};
  std::vector<uint8_t> a(8), b(8);
  std::vector<void*> outs = {a.data(), b.data()};
  Status st = (*s)->Gather(idx, outs, &ThreadPool::Default());
  EXPECT_EQ(st.code(), Status::Code::kIndexError);
  EXPECT_NE(st.message().find(std::to_string(kN + 5)), std::string::npos);
}

TEST_F(CorruptionTest, WrongOutputSizeIsRejected) {
  auto s = Store::Open(path_);
  ASSERT_TRUE(s.ok());
  std::vector<uint8_t> buf(100);
  EXPECT_EQ((*s)->ReadRecord(0, buf.data(), 100).code(), Status::Code::kInvalidArgument);
}

// Raw records of 64 KiB and more, and compressed frames of 16 KiB..4 MiB, are
// read with pread, not through the mapping (docs/format.md, "How reads
// work"), so a data file truncated under an open store is reported for them
// instead of faulting (SIGBUS) on a mapped page.
TEST(StoreReadTest, LargeRecordOfADataFileTruncatedAfterOpenIsCorruption) {
#if defined(_WIN32)
  GTEST_SKIP() << "Windows cannot truncate a file while a store maps it";
#endif
  for (Codec codec : {Codec::kRaw, Codec::kZstd}) {
    SCOPED_TRACE(CodecName(codec));
    TempDir dir;
    const std::string path = dir.Sub("s");
    constexpr uint64_t kItem = uint64_t{3} << 19;       // 1.5 MiB: split across the pool if raw
    std::vector<uint8_t> values = MakeBytes(kItem, 5);  // each record half compressible
    const std::vector<uint8_t> second = MakeBytes(kItem, 6);
    values.insert(values.end(), second.begin(), second.end());
    WriteOptions o;
    o.codec = codec;
    o.data_shards = 1;
    auto w = StoreWriter::Create(path, DenseSchema("|u1", {kItem}), o);
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE((*w)->AppendDense(values.data(), 2).ok());
    ASSERT_TRUE((*w)->Publish().ok());
    auto s = Store::Open(path);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    const RecordRef r1 = (*s)->Locate(1).value();
    ASSERT_EQ(r1.compressed, codec != Codec::kRaw);
    ASSERT_GE(r1.stored_len, uint64_t{16} << 10);
    std::vector<uint8_t> out(kItem);
    ASSERT_TRUE((*s)->ReadRecord(1, out.data(), kItem).ok());
    EXPECT_EQ(0, std::memcmp(out.data(), values.data() + kItem, kItem));

    fs::resize_file(path + "/data-000", r1.offset + r1.stored_len / 2);  // record 1 loses its tail
    Status st = (*s)->ReadRecord(1, out.data(), kItem);
    EXPECT_EQ(st.code(), Status::Code::kCorruption) << st.ToString();
    EXPECT_NE(st.message().find("record 1: " + path + "/data-000: truncated"), std::string::npos)
        << st.ToString();
    std::vector<uint64_t> idx = {0, 1};
    std::vector<uint8_t> a(kItem), b(kItem);
    std::vector<void*> outs = {a.data(), b.data()};
    for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &ThreadPool::Default()}) {
      st = (*s)->Gather(idx, outs, pool);
      EXPECT_EQ(st.code(), Status::Code::kCorruption) << st.ToString();
      EXPECT_NE(st.message().find("data-000: truncated"), std::string::npos) << st.ToString();
    }
    // Record 0 lies wholly before the cut and still reads exactly.
    ASSERT_TRUE((*s)->ReadRecord(0, out.data(), kItem).ok());
    EXPECT_EQ(0, std::memcmp(out.data(), values.data(), kItem));
  }
}

// Frames below, inside and above the pread range decode alike, from any
// thread (each thread has its own scratch buffer).
TEST(StoreReadTest, CompressedFramesOfEverySizeDecodeExactlyThroughThePool) {
  TempDir dir;
  const std::string path = dir.Sub("s");
  // Record k has 2^(8+k) bytes, half of them incompressible: frames from
  // ~150 bytes to ~5 MiB (above the 4 MiB pread cap).
  std::vector<uint64_t> shapes;
  std::vector<uint8_t> values;
  for (uint64_t k = 0; k < 16; ++k) {
    const auto rec = MakeBytes(uint64_t{1} << (8 + k), k);
    values.insert(values.end(), rec.begin(), rec.end());
    shapes.push_back(rec.size());
  }
  WriteOptions o;
  o.codec = Codec::kZstd;
  o.data_shards = 2;
  auto w = StoreWriter::Create(path, RaggedSchema("|u1", 1), o);
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE((*w)->AppendRagged(values.data(), shapes.data(), shapes.size()).ok());
  ASSERT_TRUE((*w)->Publish().ok());
  auto s = Store::Open(path);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ASSERT_GT((*s)->Locate(15).value().stored_len, uint64_t{4} << 20);
  ASSERT_LT((*s)->Locate(2).value().stored_len, uint64_t{16} << 10);
  // Every record twice, largest first, so thread scratch buffers shrink never
  // and grow often.
  std::vector<uint64_t> idx;
  for (uint64_t k = 16; k-- > 0;) idx.push_back(k);
  for (uint64_t k = 0; k < 16; ++k) idx.push_back(k);
  std::vector<std::vector<uint8_t>> outs_buf;
  std::vector<void*> outs;
  for (uint64_t k : idx) outs_buf.emplace_back(shapes[k], 0);
  for (auto& b : outs_buf) outs.push_back(b.data());
  ASSERT_TRUE((*s)->Gather(idx, outs, &ThreadPool::Default()).ok());
  uint64_t offset = 0;
  std::vector<uint64_t> starts;
  for (uint64_t len : shapes) {
    starts.push_back(offset);
    offset += len;
  }
  for (size_t j = 0; j < idx.size(); ++j) {
    EXPECT_EQ(0, std::memcmp(outs_buf[j].data(), values.data() + starts[idx[j]], shapes[idx[j]]))
        << "record " << idx[j];
  }
}

// Format 1.1 rank-1 ragged stores keep no shape table: a raw record's length
// is its extent, a compressed one's the content size in its frame header. A
// bad header is Corruption naming the record and its data file wherever the
// length is needed.
TEST(RaggedRank1Test, BadFrameHeaderIsCorruptionNamingTheRecord) {
  TempDir dir;
  const std::string path = dir.Sub("s");
  std::vector<uint64_t> shapes;
  std::vector<uint8_t> values;
  for (uint64_t k = 0; k < 40; ++k) {
    const auto rec = MakeBytes(4 * (100 + k), k);
    values.insert(values.end(), rec.begin(), rec.end());
    shapes.push_back(100 + k);
  }
  WriteOptions o;
  o.codec = Codec::kZstd;
  o.data_shards = 2;
  o.group_index = false;  // whole frames (bare blocks: GroupsCorruptionTest)
  auto w = StoreWriter::Create(path, RaggedSchema("<i4", 1), o);
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE((*w)->AppendRagged(values.data(), shapes.data(), shapes.size()).ok());
  ASSERT_TRUE((*w)->Publish().ok());
  EXPECT_FALSE(fs::exists(path + "/shapes"));
  auto s0 = Store::Open(path);
  ASSERT_TRUE(s0.ok()) << s0.status().ToString();
  uint64_t dim = 0;
  ASSERT_TRUE((*s0)->RecordShape(7, &dim).ok());
  EXPECT_EQ(dim, 107u);
  const RecordRef r = (*s0)->Locate(7).value();
  ASSERT_TRUE(r.compressed);
  EXPECT_EQ(r.raw_len, 4 * 107u);
  s0->reset();
  std::string b = ReadFileBytes(path + "/" + format::DataFileName(r.shard));
  b[r.offset] = static_cast<char>(b[r.offset] | 0x08);  // a reserved bit of the frame header
  WriteFileBytes(path + "/" + format::DataFileName(r.shard), b);
  auto s = Store::Open(path);
  ASSERT_TRUE(s.ok());
  const std::string want =
      path + ": record 7 (" + format::DataFileName(r.shard) + "): zstd frame header";
  std::vector<uint8_t> a(4 * 107);
  std::vector<uint64_t> idx = {6, 7};
  std::vector<uint8_t> c(4 * 106);
  std::vector<void*> outs = {c.data(), a.data()};
  for (const Status& st :
       {(*s)->RecordShape(7, &dim), (*s)->RecordBytes(7).status(),
        (*s)->ReadRecord(7, a.data(), a.size()), (*s)->Gather(idx, outs, &ThreadPool::Default())}) {
    EXPECT_EQ(st.code(), Status::Code::kCorruption) << st.ToString();
    EXPECT_NE(st.message().find(want), std::string::npos) << st.ToString();
  }
  // Verify finds the changed bytes first, by their block checksum.
  const Status v = (*s)->Verify(nullptr);
  EXPECT_NE(v.message().find(format::DataFileName(r.shard) + ": checksum mismatch in bytes 0.."),
            std::string::npos)
      << v.ToString();
  std::vector<uint8_t> out(4 * 106);
  EXPECT_TRUE((*s)->ReadRecord(6, out.data(), out.size()).ok()) << "its neighbour is intact";
  EXPECT_EQ(0, std::memcmp(out.data(), values.data() + 4 * (100 * 6 + 15), out.size()));
}

// A rank-1 raw ragged record whose extent is not a whole number of items,
// with every checksum rebuilt: Corruption on use, not a short read.
TEST(RaggedRank1Test, ExtentNotAMultipleOfTheItemsizeIsCorruption) {
  TempDir dir;
  const std::string path = dir.Sub("s");
  std::vector<uint64_t> shapes = {3, 5};
  std::vector<uint8_t> values(8 * 4, 1);
  WriteOptions o;
  o.data_shards = 1;
  auto w = StoreWriter::Create(path, RaggedSchema("<i4", 1), o);
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE((*w)->AppendRagged(values.data(), shapes.data(), 2).ok());
  ASSERT_TRUE((*w)->Publish().ok());
  std::string idx = ReadFileBytes(path + "/index");
  const uint64_t end0 = 13;  // 3.25 items
  std::memcpy(idx.data(), &end0, 8);
  const uint64_t h0 = format::Hash64(idx.data(), 2 * 8);
  std::memcpy(idx.data() + 16, &h0, 8);
  WriteFileBytes(path + "/index", idx);
  EditMeta(path, [&](format::Metadata& m) { m.index_table_xxh3 = format::Hash64(&h0, 8); });
  auto s = Store::Open(path);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  const Status st = (*s)->RecordBytes(0).status();
  EXPECT_EQ(st.code(), Status::Code::kCorruption) << st.ToString();
  EXPECT_NE(st.message().find("record 0: length 13 is not a multiple of the itemsize"),
            std::string::npos)
      << st.ToString();
  EXPECT_EQ((*s)->RecordBytes(1).status().code(), Status::Code::kCorruption)
      << "record 1 (19 bytes) is not whole either";
}

// Format 1.1 dense raw stores have no per-record index: every data file must
// have exactly the size the record count implies.
TEST(ComputedLayoutTest, DataFileOfTheWrongSizeFailsOpenNamingIt) {
  TempDir dir;
  const std::string path = dir.Sub("s");
  WriteOptions o;
  o.data_shards = 3;
  auto w = StoreWriter::Create(path, DenseSchema("<u2", {3}), o);
  ASSERT_TRUE(w.ok());
  std::vector<uint16_t> v(3 * 100000);
  for (size_t k = 0; k < v.size(); ++k) v[k] = static_cast<uint16_t>(k);
  ASSERT_TRUE((*w)->AppendDense(v.data(), 100000).ok());
  ASSERT_TRUE((*w)->Publish().ok());
  // 600 KB of records: the index holds only the data block sums.
  EXPECT_LT(fs::file_size(path + "/index"), 100u);
  const std::string orig = ReadFileBytes(path + "/data-002");
  const uint64_t size = orig.size();
  // Shrunk by a whole record and the metadata made to agree: only the layout check is left.
  WriteFileBytes(path + "/data-002", orig.substr(0, size - 6));
  EditMeta(path, [&](format::Metadata& m) { m.files["data-002"].size = size - 6; });
  auto s = Store::Open(path);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(
      s.status().message().find("/data-002: size " + std::to_string(size - 6) +
                                " bytes, expected " + std::to_string(size) + " for 100000 records"),
      std::string::npos)
      << s.status().ToString();
}

// -- writer misuse -----------------------------------------------------------------

TEST(StoreWriterTest, ExistingPathIsAlreadyExists) {
  TempDir dir;
  fs::create_directory(dir.Sub("s"));
  auto w = StoreWriter::Create(dir.Sub("s"), DenseSchema("|u1", {}), WriteOptions{});
  EXPECT_EQ(w.status().code(), Status::Code::kAlreadyExists);
}

TEST(StoreWriterTest, BadOptionsAreInvalidArgument) {
  TempDir dir;
  WriteOptions o;
  for (uint32_t shards : {0u, 256u}) {
    o.data_shards = shards;
    EXPECT_EQ(StoreWriter::Create(dir.Sub("s"), DenseSchema("|u1", {}), o).status().code(),
              Status::Code::kInvalidArgument);
  }
  o = WriteOptions{};
  o.codec = Codec::kZstdDict;
  EXPECT_EQ(StoreWriter::Create(dir.Sub("s"), DenseSchema("|u1", {}), o).status().code(),
            Status::Code::kInvalidArgument);
  // The ZDICT magic with a garbage header: neither a dictionary nor raw content.
  o.dictionary = std::string("\x37\xa4\x30\xec", 4) + "definitely not a zstd dictionary";
  auto w = StoreWriter::Create(dir.Sub("s"), DenseSchema("|u1", {}), o);
  EXPECT_EQ(w.status().code(), Status::Code::kInvalidArgument);
  EXPECT_NE(w.status().message().find("could not be loaded"), std::string::npos);
  EXPECT_TRUE(fs::is_empty(dir.path())) << "no temporary directory left behind";
  EXPECT_EQ(
      StoreWriter::Create(dir.Sub("r"), RaggedSchema("<i4", 0), WriteOptions{}).status().code(),
      Status::Code::kInvalidArgument);
}

TEST(StoreWriterTest, DestroyedOrAbortedWriterLeavesNothing) {
  TempDir dir;
  {
    auto w = StoreWriter::Create(dir.Sub("s"), DenseSchema("|u1", {4}), WriteOptions{});
    ASSERT_TRUE(w.ok());
    uint8_t d[8] = {};
    ASSERT_TRUE((*w)->AppendDense(d, 2).ok());
    EXPECT_FALSE(fs::is_empty(dir.path())) << "the hidden temporary directory exists";
  }
  EXPECT_TRUE(fs::is_empty(dir.path()));
  auto w = StoreWriter::Create(dir.Sub("s"), DenseSchema("|u1", {4}), WriteOptions{});
  ASSERT_TRUE(w.ok());
  (*w)->Abort();
  (*w)->Abort();
  EXPECT_TRUE(fs::is_empty(dir.path()));
  EXPECT_EQ((*w)->Publish().code(), Status::Code::kState);
}

TEST(StoreWriterTest, NothingIsAcceptedAfterPublish) {
  TempDir dir;
  auto w = StoreWriter::Create(dir.Sub("s"), DenseSchema("|u1", {4}), WriteOptions{});
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE((*w)->Publish().ok());
  uint8_t d[4] = {};
  EXPECT_EQ((*w)->AppendDense(d, 1).code(), Status::Code::kState);
  EXPECT_EQ((*w)->Publish().code(), Status::Code::kState);
  w->reset();  // destroying a published writer keeps the store
  EXPECT_TRUE(Store::Open(dir.Sub("s")).ok());
}

TEST(StoreWriterTest, WrongKindAppendIsSchemaError) {
  TempDir dir;
  auto w = StoreWriter::Create(dir.Sub("s"), DenseSchema("|u1", {4}), WriteOptions{});
  ASSERT_TRUE(w.ok());
  uint64_t shape = 1;
  uint8_t d = 0;
  EXPECT_EQ((*w)->AppendRagged(&d, &shape, 1).code(), Status::Code::kSchemaError);
}

}  // namespace
}  // namespace loaderx

namespace loaderx {
namespace {

// A 10^8-record dense store whose index is a sparse 2.4 GB file of zero
// entries (every full block then has the same checksum): Open must succeed
// without reading the index, and only the block of a used record is checked.
TEST(StoreOpenTest, HundredMillionRecordStoreOpensWithoutReadingTheIndex) {
  TempDir dir;
  const std::string path = dir.Sub("huge");
  fs::create_directory(path);
  const uint64_t n = 100'000'000;
  const uint64_t blocks = format::NumBlocks(n);
  const uint64_t body = n * format::kEntryBytes;
  std::vector<uint8_t> zeros(format::kBlockRecords * format::kEntryBytes, 0);
  const uint64_t full = format::Hash64(zeros.data(), zeros.size());
  const uint64_t tail_rows = n % format::kBlockRecords;
  std::vector<uint64_t> table(blocks, full);
  if (tail_rows) table.back() = format::Hash64(zeros.data(), tail_rows * format::kEntryBytes);
  {
    auto fd = OpenFile(path + "/index", O_WRONLY | O_CREAT);
    ASSERT_TRUE(fd.ok());
    ASSERT_EQ(::ftruncate(fd->get(), static_cast<off_t>(body)), 0);
    ASSERT_TRUE(
        PWriteAll(*Env::Default(), fd->get(), table.data(), blocks * 8, body, "index").ok());
    auto d = OpenFile(path + "/data-000", O_WRONLY | O_CREAT);
    ASSERT_TRUE(d.ok());
  }
  format::Metadata m;
  m.schema = DenseSchema("|u1", {});
  m.count = n;
  m.nbytes = n;
  m.data_shards = 1;
  m.index_table_xxh3 = format::Hash64(table.data(), blocks * 8);
  m.files["index"] = {body + blocks * 8, 0};
  m.files["data-000"] = {0, 0};
  WriteFileBytes(path + "/meta", format::EncodeMetadata(m));

  const auto t0 = std::chrono::steady_clock::now();
  auto s = Store::Open(path);
  const auto us =
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0)
          .count();
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  RecordProperty("open_us", static_cast<int>(us));
  std::cout << "[ info ] opened a 1e8-record store in " << us << " us\n";
  EXPECT_EQ((*s)->size(), n);
  // Zero entries claim 0 stored bytes for 1-byte raw records: caught on use.
  auto r = (*s)->Locate(n / 2);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("stored length 0 != record length 1"), std::string::npos)
      << r.status().ToString();
}

}  // namespace
}  // namespace loaderx
