// Format building blocks: dtype strings, index entries, metadata encoding.
#include <gtest/gtest.h>
#include <xxhash.h>

#include <random>
#include <vector>

#include "codec.h"
#include "format.h"
#include "loaderx/store.h"

namespace loaderx {
namespace {

TEST(DTypeTest, ParsesAndCanonicalisesNumpyStrings) {
  struct Case {
    const char* in;
    const char* str;
    char kind;
    uint32_t itemsize;
  };
  for (const Case& c :
       {Case{"<f4", "<f4", 'f', 4}, Case{"=i8", "<i8", 'i', 8}, Case{"|b1", "|b1", 'b', 1},
        Case{"u1", "|u1", 'u', 1}, Case{"<c16", "<c16", 'c', 16},
        Case{"<M8[ns]", "<M8[ns]", 'M', 8}, Case{"<m8[10s]", "<m8[10s]", 'm', 8},
        Case{"<M8", "<M8", 'M', 8}, Case{"<f2", "<f2", 'f', 2}, Case{">f4", ">f4", 'f', 4},
        Case{">i2", ">i2", 'i', 2}, Case{">u1", "|u1", 'u', 1}, Case{">M8[s]", ">M8[s]", 'M', 8},
        Case{"|S3", "|S3", 'S', 3}, Case{"<S3", "|S3", 'S', 3}, Case{"<U3", "<U3", 'U', 12},
        Case{">U1", ">U1", 'U', 4}, Case{"|V8", "|V8", 'V', 8},
        Case{"|S100000", "|S100000", 'S', 100000}}) {
    auto d = DType::Parse(c.in);
    ASSERT_TRUE(d.ok()) << c.in << ": " << d.status().ToString();
    EXPECT_EQ(d->str, c.str);
    EXPECT_EQ(d->kind, c.kind);
    EXPECT_EQ(d->itemsize, c.itemsize);
  }
}

TEST(DTypeTest, RejectsUnsupportedDTypes) {
  for (const char* bad : {"|O8", "|V0", "|S0", "<U0", "<U1000000000", "<f3", "<i16", "<M8[xx]",
                          "<M4", "", "<", "<f", "<f4x", "|b2", "<c4", "|S3x"}) {
    auto d = DType::Parse(bad);
    EXPECT_FALSE(d.ok()) << bad;
    EXPECT_EQ(d.status().code(), Status::Code::kSchemaError) << bad;
  }
  EXPECT_NE(DType::Parse("|O8").status().message().find("object"), std::string::npos);
}

TEST(CodecTest, NamesRoundTrip) {
  for (Codec c : {Codec::kRaw, Codec::kZstd, Codec::kZstdDict}) {
    EXPECT_EQ(ParseCodec(CodecName(c)).value(), c);
  }
  EXPECT_EQ(ParseCodec("zstdd").status().code(), Status::Code::kInvalidArgument);
}

// The writer skips the compressor for records of at most MinFrameBytes: that
// only leaves the store unchanged if no frame is ever that short, whatever the
// content, level or dictionary (the bound comes from the frame format; zstd's
// own shortest frames are longer, it never starts a frame with an RLE block).
TEST(CodecTest, NoFrameIsShorterThanMinFrameBytes) {
  auto dict = codec::ZstdDictionary::Create(std::string(4096, 'a') + "0123456789abcdef", 3);
  ASSERT_TRUE(dict.ok());
  std::mt19937_64 rng(3);
  for (codec::Frames frames : {codec::Frames::kCompact, codec::Frames::kStandard}) {
    const size_t min = codec::MinFrameBytes(frames);
    for (int level : {-5, 1, 3, 19}) {
      for (const codec::ZstdDictionary* d :
           {static_cast<const codec::ZstdDictionary*>(nullptr), dict->get()}) {
        for (size_t n = 1; n <= 64; ++n) {
          std::vector<std::vector<uint8_t>> contents = {
              std::vector<uint8_t>(n, 0), std::vector<uint8_t>(n, 'a'), std::vector<uint8_t>(n)};
          for (auto& b : contents[2]) b = static_cast<uint8_t>(rng());
          for (const auto& src : contents) {
            std::vector<uint8_t> dst(codec::CompressBound(n));
            auto c = codec::Compress(src.data(), n, level, d, dst.data(), dst.size(), frames);
            ASSERT_TRUE(c.ok()) << c.status().ToString();
            EXPECT_GE(*c, min) << "n " << n << " level " << level;
          }
        }
      }
    }
  }
}

// format::Hash64 may run libxxhash's SIMD-dispatched XXH3 (common/src/xxh.h);
// this test calls the library's plain XXH3_64bits: the two must agree on every
// length around the algorithm's internal boundaries (16, 128, 240 bytes,
// stripes of 64, blocks of 1,024) and on a large buffer, or every checksum of
// every store written so far would stop matching.
TEST(FormatHashTest, Hash64IsPlainXxh3OnEveryLength) {
  std::vector<uint8_t> buf((1 << 20) + 17);
  std::mt19937_64 rng(11);
  for (auto& b : buf) b = static_cast<uint8_t>(rng());
  for (size_t n = 0; n <= 4200; ++n) {
    ASSERT_EQ(format::Hash64(buf.data() + 3, n), XXH3_64bits(buf.data() + 3, n)) << n;
  }
  EXPECT_EQ(format::Hash64(buf.data(), buf.size()), XXH3_64bits(buf.data(), buf.size()));
  EXPECT_EQ(format::Hash64(nullptr, 0), 0x2D06800538D394C2ull);  // XXH3's empty-input value
}

TEST(IndexEntryTest, EncodesLittleEndianWith64BitLengths) {
  format::IndexEntry e;
  e.offset = 0x0102030405060708ull;
  e.stored_len = (uint64_t{5} << 30) + 1;  // > 4 GiB
  e.checksum = 0xA1B2C3D4;
  e.shard = 254;
  e.flags = format::kFlagCompressed;
  uint8_t buf[format::kEntryBytes];
  format::EncodeEntry(e, buf);
  EXPECT_EQ(buf[0], 0x08);
  EXPECT_EQ(buf[7], 0x01);
  EXPECT_EQ(buf[20], 254);
  EXPECT_EQ(buf[21], 1);
  format::IndexEntry d = format::DecodeEntry(buf);
  EXPECT_EQ(d.offset, e.offset);
  EXPECT_EQ(d.stored_len, e.stored_len);
  EXPECT_EQ(d.checksum, e.checksum);
  EXPECT_EQ(d.shard, e.shard);
  EXPECT_EQ(d.flags, e.flags);
}

TEST(MetadataTest, RoundTripsEveryField) {
  format::Metadata m;
  m.schema.kind = Kind::kDense;
  m.schema.dtype = DType::Parse("<u2").value();
  m.schema.item_shape = {3, 0, 2};
  m.schema.ndim = 3;
  m.codec = Codec::kZstd;
  m.level = 3;
  m.count = 1ull << 40;
  m.data_shards = 255;
  m.nbytes = 0;
  m.index_table_xxh3 = 77;
  m.files["index"] = {10, 20};
  m.files["data-000"] = {30, 40};
  m.writer = "test";
  const std::string b = format::EncodeMetadata(m);
  auto d = format::DecodeMetadata(b, "x/meta");
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->schema.dtype, m.schema.dtype);
  EXPECT_EQ(d->schema.item_shape, m.schema.item_shape);
  EXPECT_EQ(d->count, m.count);
  EXPECT_EQ(d->data_shards, 255u);
  EXPECT_EQ(d->files, m.files);
  EXPECT_EQ(d->writer, "test");
  EXPECT_EQ(d->index_table_xxh3, 77u);
}

TEST(MetadataTest, RejectsTruncationAndBadChecksum) {
  format::Metadata m;
  m.schema.dtype = DType::Parse("|u1").value();
  const std::string b = format::EncodeMetadata(m);
  EXPECT_EQ(format::DecodeMetadata(b.substr(0, b.size() - 1), "m").status().code(),
            Status::Code::kCorruption);
  EXPECT_EQ(format::DecodeMetadata("", "m").status().code(), Status::Code::kCorruption);
  std::string c = b;
  c[3] ^= 1;
  auto r = format::DecodeMetadata(c, "dir/meta");
  EXPECT_NE(r.status().message().find("dir/meta: metadata checksum mismatch"), std::string::npos);
}

}  // namespace
}  // namespace loaderx
