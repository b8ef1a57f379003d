// Sequence packing: the documents of one batch as dense (rows, seq_len) token rows.
//
// Purpose. Language-model pretraining feeds fixed-shape rows of seq_len
// tokens; a corpus holds documents of any length. Pack() lays the documents
// of one batch (per packed stream: B 1-D integer arrays, aligned across
// streams: document i has the same length in every stream, e.g. tokens and
// loss_mask) into rows, and describes the layout per token:
//
//  * streams: one (rows, seq_len) array per packed stream, of that stream's
//    dtype (bytes copied as stored, byte order included), padding = the
//    stream's pad value;
//  * segment_ids (int32): 1, 2, ... for the pieces of documents of a row in
//    row order, 0 for padding;
//  * positions (int32): the offset of the token within its piece (its segment
//    of the row), 0 for padding. A document placed whole in one row has
//    positions 0..len-1; each later piece of a split document starts at 0
//    again, since the attention of a segment sees that segment alone (and
//    positions stay < seq_len, inside a rotary table of seq_len);
//  * cu_seqlens (int32, optional): the boundaries of the segments over the
//    flattened rows * seq_len tokens, the layout variable-length attention
//    kernels take: 0, end of segment 1, ..., rows * seq_len. The padding at
//    the end of a row is one segment of its own (rows never share a
//    segment), so the last value is always rows * seq_len; its length varies
//    with the batch (segments + padded rows + 1).
//
// Pack units (determinism). The batch is cut into units of `docs` consecutive
// documents (0: the whole batch is one unit); each unit is packed alone into
// `rows` rows, and the units' rows follow each other. A unit's rows are a
// pure function of its documents, so when the batch of a rank is a
// contiguous slice of the global batch (the sampler's sharding, sampler.h)
// and holds whole units, the concatenated ranks' packed rows equal those of
// world size 1 for any world size (docs/guide.md, "Sequence packing").
//
// Policies (per unit; empty documents take no place and no segment):
//  * kConcat: the documents in order, end to end, cut every seq_len tokens:
//    a document may cross rows (each row piece is its own segment). Only the
//    unit's tail is affected: tokens past rows * seq_len are dropped, and a
//    unit with fewer tokens pads the end of its last row and its empty rows.
//  * kBestFit: a document longer than seq_len is split into chunks of
//    seq_len tokens and a shorter last chunk; chunks are placed best-fit
//    decreasing (longest first, ties in document order; each into the row
//    with the least room that holds it, the lowest such row on ties, else a
//    new row) into at most `rows` rows. A chunk that fits no row once `rows`
//    rows are open is dropped. Rows are padded at their end. Within a row,
//    pieces keep their order of placement.
//
// Counts (PackCounts, per call): tokens in = packed + dropped, and
// rows * seq_len = packed + padded. docs_split counts the documents placed in
// more than one piece, docs_truncated those with a token dropped.
//
// Errors (Status, nothing partial is returned): InvalidArgument for a bad
// spec (seq_len 0, rows 0, rows * seq_len > kMaxPackTokens, no pad value), a
// batch that is not a whole number of units or packs to more than
// kMaxPackTokens tokens, a stream count other than the pad count, documents
// of different lengths across streams (the document and streams are named),
// a pad value the dtype cannot hold; SchemaError for a stream whose dtype is
// not an integer or bool dtype.
//
// Thread-safety: pure functions of their arguments; the documents are read
// only, any number of threads may pack at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "loaderx/status.h"
#include "loaderx/store.h"

namespace loaderx {

enum class PackPolicy : uint8_t { kConcat = 0, kBestFit = 1 };

// "concat" / "best_fit"; InvalidArgument naming the accepted names otherwise.
Result<PackPolicy> ParsePackPolicy(std::string_view name);
const char* PackPolicyName(PackPolicy policy);

// Largest rows * seq_len of one call: every offset and cu_seqlens value is an int32.
inline constexpr uint64_t kMaxPackTokens = 0x7fffffff;

struct PackSpec {
  uint64_t seq_len = 0;  // tokens per row, > 0
  uint64_t rows = 0;     // rows per unit, > 0
  uint64_t docs = 0;     // documents per unit; 0 = the whole batch is one unit
  PackPolicy policy = PackPolicy::kConcat;
  bool cu_seqlens = false;
  // One padding value per packed stream (their number), e.g. {pad_id, 0}.
  std::vector<int64_t> pad;

  // Checks every field; InvalidArgument naming the bad one.
  Status Validate() const;
  // Units of a batch of `batch_size` documents; InvalidArgument when it is
  // not a whole number of units or packs to more than kMaxPackTokens tokens.
  // REQUIRES: Validate().ok().
  Result<uint64_t> Units(uint64_t batch_size) const;
  // SchemaError unless `dtype` is an integer or bool dtype; InvalidArgument
  // when pad[stream] does not fit it. REQUIRES: stream < pad.size().
  Status CheckDType(size_t stream, const DType& dtype, std::string_view name) const;
};

// One document of one stream: `size` elements of the stream's dtype.
struct PackDoc {
  const void* data = nullptr;  // may be null when size == 0
  uint64_t size = 0;
};

struct PackStream {
  std::string name;  // for messages
  DType dtype;
  std::vector<PackDoc> docs;  // B documents, aligned across streams
};

struct PackCounts {
  uint64_t tokens = 0;          // tokens of the documents (per stream)
  uint64_t tokens_padded = 0;   // padding tokens in the rows
  uint64_t tokens_dropped = 0;  // document tokens left out
  uint64_t docs_split = 0;      // documents placed in more than one piece
  uint64_t docs_truncated = 0;  // documents with at least one token dropped
};

struct PackedBatch {
  uint64_t rows = 0;  // units * spec.rows
  uint64_t seq_len = 0;
  // Per stream, rows * seq_len elements of its dtype (row-major).
  std::vector<std::unique_ptr<std::byte[]>> streams;
  std::vector<int32_t> segment_ids;  // rows * seq_len
  std::vector<int32_t> positions;    // rows * seq_len
  std::vector<int32_t> cu_seqlens;   // empty unless spec.cu_seqlens
  PackCounts counts;
};

// Packs `streams` (at least one; streams[0] decides the layout, the others
// must match its document lengths). REQUIRES: spec.Validate().ok().
Result<PackedBatch> Pack(const PackSpec& spec, const std::vector<PackStream>& streams);

}  // namespace loaderx
