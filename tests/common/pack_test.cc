// Tests of sequence packing (common/include/loaderx/pack.h): hand-computed
// rows, segment ids, positions, cu_seqlens and counts for both policies,
// aligned streams of other dtypes, unit independence, and the refusals.
#include "loaderx/pack.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

namespace loaderx {
namespace {

DType D(const char* s) {
  auto d = DType::Parse(s);
  EXPECT_TRUE(d.ok()) << d.status().ToString();
  return *d;
}

template <typename T>
PackStream Stream(const char* name, const char* dtype, const std::vector<std::vector<T>>& docs) {
  PackStream s;
  s.name = name;
  s.dtype = D(dtype);
  for (const auto& d : docs) s.docs.push_back({d.empty() ? nullptr : d.data(), d.size()});
  return s;
}

PackSpec Spec(uint64_t seq_len, uint64_t rows, PackPolicy policy, uint64_t docs = 0) {
  PackSpec spec;
  spec.seq_len = seq_len;
  spec.rows = rows;
  spec.docs = docs;
  spec.policy = policy;
  spec.cu_seqlens = true;
  spec.pad = {-1};
  return spec;
}

template <typename T>
std::vector<T> Values(const PackedBatch& b, size_t stream) {
  std::vector<T> v(b.rows * b.seq_len);
  std::memcpy(v.data(), b.streams[stream].get(), v.size() * sizeof(T));
  return v;
}

// Three documents and an empty one.
std::vector<std::vector<int32_t>> Docs() {
  return {{1, 2, 3}, {10, 11, 12, 13, 14, 15}, {}, {20, 21}};
}

TEST(Pack, ConcatCrossesRowsAndPadsTheTail) {
  const auto docs = Docs();
  auto r = Pack(Spec(4, 3, PackPolicy::kConcat), {Stream("tokens", "<i4", docs)});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->rows, 3u);
  EXPECT_EQ(Values<int32_t>(*r, 0),
            (std::vector<int32_t>{1, 2, 3, 10, 11, 12, 13, 14, 15, 20, 21, -1}));
  EXPECT_EQ(r->segment_ids, (std::vector<int32_t>{1, 1, 1, 2, 1, 1, 1, 1, 1, 2, 2, 0}));
  EXPECT_EQ(r->positions, (std::vector<int32_t>{0, 1, 2, 0, 0, 1, 2, 3, 0, 0, 1, 0}));
  EXPECT_EQ(r->cu_seqlens, (std::vector<int32_t>{0, 3, 4, 8, 9, 11, 12}));
  EXPECT_EQ(r->counts.tokens, 11u);
  EXPECT_EQ(r->counts.tokens_padded, 1u);
  EXPECT_EQ(r->counts.tokens_dropped, 0u);
  EXPECT_EQ(r->counts.docs_split, 1u);
  EXPECT_EQ(r->counts.docs_truncated, 0u);
}

TEST(Pack, ConcatDropsTheTail) {
  const auto docs = Docs();
  auto r = Pack(Spec(4, 2, PackPolicy::kConcat), {Stream("tokens", "<i4", docs)});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(Values<int32_t>(*r, 0), (std::vector<int32_t>{1, 2, 3, 10, 11, 12, 13, 14}));
  EXPECT_EQ(r->segment_ids, (std::vector<int32_t>{1, 1, 1, 2, 1, 1, 1, 1}));
  EXPECT_EQ(r->positions, (std::vector<int32_t>{0, 1, 2, 0, 0, 1, 2, 3}));
  EXPECT_EQ(r->cu_seqlens, (std::vector<int32_t>{0, 3, 4, 8}));
  EXPECT_EQ(r->counts.tokens, 11u);
  EXPECT_EQ(r->counts.tokens_padded, 0u);
  EXPECT_EQ(r->counts.tokens_dropped, 3u);
  EXPECT_EQ(r->counts.docs_split, 1u);
  EXPECT_EQ(r->counts.docs_truncated, 2u);
}

TEST(Pack, BestFitDecreasing) {
  const std::vector<std::vector<int32_t>> docs = {
      {1, 2, 3}, {10, 11, 12, 13, 14, 15}, {30}, {20, 21}};
  auto r = Pack(Spec(4, 3, PackPolicy::kBestFit), {Stream("tokens", "<i4", docs)});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  // Chunks longest first: B[0:4], A, B[4:6], D, C. B[4:6] opens row 2 (row 1
  // has room 1), D goes to row 2 (room 2, the least that holds it), C to row 1.
  EXPECT_EQ(Values<int32_t>(*r, 0),
            (std::vector<int32_t>{10, 11, 12, 13, 1, 2, 3, 30, 14, 15, 20, 21}));
  EXPECT_EQ(r->segment_ids, (std::vector<int32_t>{1, 1, 1, 1, 1, 1, 1, 2, 1, 1, 2, 2}));
  EXPECT_EQ(r->positions, (std::vector<int32_t>{0, 1, 2, 3, 0, 1, 2, 0, 0, 1, 0, 1}));
  EXPECT_EQ(r->cu_seqlens, (std::vector<int32_t>{0, 4, 7, 8, 10, 12}));
  EXPECT_EQ(r->counts.tokens, 12u);
  EXPECT_EQ(r->counts.tokens_padded, 0u);
  EXPECT_EQ(r->counts.tokens_dropped, 0u);
  EXPECT_EQ(r->counts.docs_split, 1u);
  EXPECT_EQ(r->counts.docs_truncated, 0u);
}

TEST(Pack, BestFitDropsChunksThatFitNoRow) {
  const std::vector<std::vector<int32_t>> docs = {
      {1, 2, 3}, {10, 11, 12, 13, 14, 15}, {30}, {20, 21}};
  auto r = Pack(Spec(4, 2, PackPolicy::kBestFit), {Stream("tokens", "<i4", docs)});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(Values<int32_t>(*r, 0), (std::vector<int32_t>{10, 11, 12, 13, 1, 2, 3, 30}));
  EXPECT_EQ(r->segment_ids, (std::vector<int32_t>{1, 1, 1, 1, 1, 1, 1, 2}));
  EXPECT_EQ(r->cu_seqlens, (std::vector<int32_t>{0, 4, 7, 8}));
  EXPECT_EQ(r->counts.tokens, 12u);
  EXPECT_EQ(r->counts.tokens_dropped, 4u);  // B[4:6] and D
  EXPECT_EQ(r->counts.tokens_padded, 0u);
  EXPECT_EQ(r->counts.docs_split, 0u);  // B is placed in one piece only
  EXPECT_EQ(r->counts.docs_truncated, 2u);
}

TEST(Pack, BestFitPadsRowsAndEmptyRowsAreOnePaddingSegment) {
  const std::vector<std::vector<int32_t>> docs = {{1, 2, 3}, {4, 5, 6}};
  auto r = Pack(Spec(4, 3, PackPolicy::kBestFit), {Stream("tokens", "<i4", docs)});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(Values<int32_t>(*r, 0),
            (std::vector<int32_t>{1, 2, 3, -1, 4, 5, 6, -1, -1, -1, -1, -1}));
  EXPECT_EQ(r->segment_ids, (std::vector<int32_t>{1, 1, 1, 0, 1, 1, 1, 0, 0, 0, 0, 0}));
  EXPECT_EQ(r->positions, (std::vector<int32_t>{0, 1, 2, 0, 0, 1, 2, 0, 0, 0, 0, 0}));
  EXPECT_EQ(r->cu_seqlens, (std::vector<int32_t>{0, 3, 4, 7, 8, 12}));
  EXPECT_EQ(r->counts.tokens_padded, 6u);
}

TEST(Pack, AlignedStreamsOfOtherDtypesFollowTheLayout) {
  const std::vector<std::vector<int64_t>> tokens = {{7, 8, 9}, {5, 6}};
  const std::vector<std::vector<uint8_t>> mask = {{0, 1, 1}, {1, 0}};
  PackSpec spec = Spec(4, 2, PackPolicy::kConcat);
  spec.cu_seqlens = false;
  spec.pad = {50256, 0};
  auto r = Pack(spec, {Stream("tokens", "<i8", tokens), Stream("loss_mask", "|u1", mask)});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(Values<int64_t>(*r, 0), (std::vector<int64_t>{7, 8, 9, 5, 6, 50256, 50256, 50256}));
  EXPECT_EQ(Values<uint8_t>(*r, 1), (std::vector<uint8_t>{0, 1, 1, 1, 0, 0, 0, 0}));
  EXPECT_TRUE(r->cu_seqlens.empty());
}

TEST(Pack, BigEndianPadKeepsTheByteOrder) {
  const std::vector<std::vector<uint16_t>> docs = {{0x0102}};
  PackSpec spec = Spec(2, 1, PackPolicy::kConcat);
  spec.pad = {0x0a0b};
  auto r = Pack(spec, {Stream("tokens", ">u2", docs)});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const std::byte* b = r->streams[0].get();
  // The token's bytes as stored, then the pad in big-endian order.
  uint16_t token = 0;
  std::memcpy(&token, b, 2);
  EXPECT_EQ(token, 0x0102);
  EXPECT_EQ(b[2], std::byte{0x0a});
  EXPECT_EQ(b[3], std::byte{0x0b});
}

// Each unit packs alone: packing the halves of a batch and stacking their rows
// gives the whole batch's rows (what makes packed batches world-size invariant).
TEST(Pack, UnitsPackIndependently) {
  const std::vector<std::vector<int32_t>> docs = {{1, 2}, {3, 4, 5, 6}, {7},
                                                  {8, 9}, {},           {10, 11, 12, 13, 14}};
  for (PackPolicy policy : {PackPolicy::kConcat, PackPolicy::kBestFit}) {
    auto whole = Pack(Spec(3, 2, policy, 2), {Stream("tokens", "<i4", docs)});
    ASSERT_TRUE(whole.ok()) << whole.status().ToString();
    EXPECT_EQ(whole->rows, 6u);
    std::vector<int32_t> tokens;
    std::vector<int32_t> segments;
    std::vector<int32_t> positions;
    for (size_t u = 0; u < 3; ++u) {
      const std::vector<std::vector<int32_t>> part(docs.begin() + 2 * u, docs.begin() + 2 * u + 2);
      auto r = Pack(Spec(3, 2, policy), {Stream("tokens", "<i4", part)});
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      auto v = Values<int32_t>(*r, 0);
      tokens.insert(tokens.end(), v.begin(), v.end());
      segments.insert(segments.end(), r->segment_ids.begin(), r->segment_ids.end());
      positions.insert(positions.end(), r->positions.begin(), r->positions.end());
    }
    EXPECT_EQ(Values<int32_t>(*whole, 0), tokens);
    EXPECT_EQ(whole->segment_ids, segments);
    EXPECT_EQ(whole->positions, positions);
  }
  // Concat, hand-computed: unit 0 = 1 2 3 | 4 5 6, unit 1 = 7 8 9 | pad,
  // unit 2 = 10 11 12 | 13 14 pad.
  auto r = Pack(Spec(3, 2, PackPolicy::kConcat, 2), {Stream("tokens", "<i4", docs)});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(Values<int32_t>(*r, 0),
            (std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 8, 9, -1, -1, -1, 10, 11, 12, 13, 14, -1}));
  EXPECT_EQ(r->cu_seqlens, (std::vector<int32_t>{0, 2, 3, 6, 7, 9, 12, 15, 17, 18}));
}

TEST(Pack, Policies) {
  EXPECT_EQ(ParsePackPolicy("concat").value(), PackPolicy::kConcat);
  EXPECT_EQ(ParsePackPolicy("best_fit").value(), PackPolicy::kBestFit);
  auto bad = ParsePackPolicy("first_fit");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(bad.status().message(),
            "packing policy must be 'concat' or 'best_fit', got 'first_fit'");
  EXPECT_STREQ(PackPolicyName(PackPolicy::kBestFit), "best_fit");
}

TEST(Pack, RefusesBadSpecs) {
  PackSpec spec = Spec(0, 1, PackPolicy::kConcat);
  EXPECT_EQ(spec.Validate().message(), "packing seq_len must be >= 1, got 0");
  spec = Spec(4, 0, PackPolicy::kConcat);
  EXPECT_EQ(spec.Validate().message(), "packing rows must be >= 1, got 0");
  spec = Spec(uint64_t{1} << 16, uint64_t{1} << 15, PackPolicy::kConcat);
  EXPECT_EQ(spec.Validate().code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(spec.Validate().message(),
            "packing rows * seq_len (32768 * 65536) must be <= 2147483647");
  spec = Spec(4, 1, PackPolicy::kConcat);
  spec.pad.clear();
  EXPECT_EQ(spec.Validate().message(), "packing needs at least one packed stream");
  spec = Spec(4, 1, PackPolicy::kConcat, 3);
  EXPECT_EQ(spec.Units(8).status().message(),
            "packing docs (3) must divide the batch size (8): each rank packs whole units of "
            "docs documents");
  EXPECT_EQ(spec.Units(9).value(), 3u);
  EXPECT_EQ(spec.Units(0).status().code(), Status::Code::kInvalidArgument);
  spec = Spec(uint64_t{1} << 20, 1024, PackPolicy::kConcat, 1);
  EXPECT_TRUE(spec.Validate().ok());
  EXPECT_EQ(spec.Units(4).status().code(), Status::Code::kInvalidArgument);
}

TEST(Pack, RefusesBadInput) {
  const PackSpec spec = Spec(4, 1, PackPolicy::kConcat);
  // Non-integer dtype.
  const std::vector<std::vector<float>> floats = {{1.0F}};
  auto r = Pack(spec, {Stream("tokens", "<f4", floats)});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Status::Code::kSchemaError);
  EXPECT_EQ(r.status().message(),
            "packed stream 'tokens' has dtype <f4: packing needs integer (or bool) tokens");
  // Misaligned streams.
  PackSpec two = spec;
  two.pad = {0, 0};
  const std::vector<std::vector<int32_t>> a = {{1, 2}, {3}};
  const std::vector<std::vector<int32_t>> b = {{1, 2}, {3, 4}};
  r = Pack(two, {Stream("tokens", "<i4", a), Stream("mask", "<i4", b)});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(r.status().message(),
            "packing: document 1 has 2 elements in stream 'mask' but 1 in 'tokens': packed "
            "streams must be aligned");
  const std::vector<std::vector<int32_t>> one = {{1, 2}};
  r = Pack(two, {Stream("tokens", "<i4", a), Stream("mask", "<i4", one)});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "packed stream 'mask' has 1 documents but 'tokens' has 2");
  // Stream count vs pad count.
  r = Pack(two, {Stream("tokens", "<i4", a)});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "packing: 1 streams given for 2 pad values");
  // Pad values the dtype cannot hold.
  PackSpec big = spec;
  big.pad = {256};
  const std::vector<std::vector<uint8_t>> bytes = {{1}};
  r = Pack(big, {Stream("tokens", "|u1", bytes)});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(r.status().message(),
            "packing pad value 256 of packed stream 'tokens' does not fit its dtype |u1");
  big.pad = {-1};
  EXPECT_FALSE(big.CheckDType(0, D("<u8"), "t").ok());
  EXPECT_TRUE(big.CheckDType(0, D("<i1"), "t").ok());
  big.pad = {-129};
  EXPECT_FALSE(big.CheckDType(0, D("<i1"), "t").ok());
  big.pad = {2};
  EXPECT_FALSE(big.CheckDType(0, D("|b1"), "t").ok());
  big.pad = {1};
  EXPECT_TRUE(big.CheckDType(0, D("|b1"), "t").ok());
  big.pad = {-(int64_t{1} << 62)};
  EXPECT_TRUE(big.CheckDType(0, D("<i8"), "t").ok());
  // A document without data.
  PackStream s = Stream("tokens", "<i4", a);
  s.docs[0].data = nullptr;
  r = Pack(spec, {s});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "packing: document 0 of stream 'tokens' has no data");
}

}  // namespace
}  // namespace loaderx
