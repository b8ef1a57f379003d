// Sequence packing (pack.h): plan the pieces of each unit, then copy them.
#include "loaderx/pack.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <set>
#include <string>
#include <utility>

namespace loaderx {
namespace {

// One run of a document in a row: tokens [offset, offset + length) of
// document `doc` at columns [col, col + length) of row `row`.
struct Piece {
  uint64_t doc = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
  uint64_t row = 0;
  uint64_t col = 0;
};

// Per document of a unit: pieces placed, tokens dropped.
struct DocTally {
  uint64_t pieces = 0;
  uint64_t dropped = 0;
};

void Tally(const std::vector<DocTally>& docs, PackCounts& counts) {
  for (const DocTally& d : docs) {
    if (d.pieces > 1) ++counts.docs_split;
    if (d.dropped > 0) ++counts.docs_truncated;
    counts.tokens_dropped += d.dropped;
  }
}

// Documents [first, first + n) into rows [row0, row0 + rows), end to end.
void PlanConcat(const PackSpec& spec, const std::vector<PackDoc>& docs, uint64_t first, uint64_t n,
                uint64_t row0, std::vector<Piece>& pieces, PackCounts& counts) {
  const uint64_t cap = spec.rows * spec.seq_len;
  uint64_t pos = 0;
  std::vector<DocTally> tally(n);
  for (uint64_t i = 0; i < n; ++i) {
    uint64_t left = docs[first + i].size;
    uint64_t offset = 0;
    while (left > 0 && pos < cap) {
      const uint64_t col = pos % spec.seq_len;
      const uint64_t take = std::min(left, spec.seq_len - col);
      pieces.push_back({first + i, offset, take, row0 + pos / spec.seq_len, col});
      ++tally[i].pieces;
      pos += take;
      offset += take;
      left -= take;
    }
    tally[i].dropped = left;
  }
  Tally(tally, counts);
}

// Best-fit decreasing of the documents' seq_len chunks into at most spec.rows rows.
void PlanBestFit(const PackSpec& spec, const std::vector<PackDoc>& docs, uint64_t first, uint64_t n,
                 uint64_t row0, std::vector<Piece>& pieces, PackCounts& counts) {
  const uint64_t len = spec.seq_len;
  std::vector<Piece> chunks;  // row/col unset
  for (uint64_t i = 0; i < n; ++i) {
    const uint64_t size = docs[first + i].size;
    for (uint64_t offset = 0; offset < size; offset += len) {
      chunks.push_back({first + i, offset, std::min(len, size - offset), 0, 0});
    }
  }
  // Longest first; ties keep document (and chunk) order.
  std::stable_sort(chunks.begin(), chunks.end(),
                   [](const Piece& a, const Piece& b) { return a.length > b.length; });
  std::vector<uint64_t> used;                    // per open row, tokens placed
  std::set<std::pair<uint64_t, uint64_t>> room;  // (free tokens, row) of rows with room
  std::vector<DocTally> tally(n);
  const size_t start = pieces.size();
  for (Piece c : chunks) {
    DocTally& t = tally[c.doc - first];
    uint64_t row = 0;
    auto it = room.lower_bound({c.length, 0});
    if (it != room.end()) {
      row = it->second;
      room.erase(it);
    } else if (used.size() < spec.rows) {
      row = used.size();
      used.push_back(0);
    } else {
      t.dropped += c.length;
      continue;
    }
    c.row = row0 + row;
    c.col = used[row];
    used[row] += c.length;
    if (used[row] < len) room.emplace(len - used[row], row);
    pieces.push_back(c);
    ++t.pieces;
  }
  // Row-major order (placement order within a row is column order).
  std::sort(pieces.begin() + static_cast<std::ptrdiff_t>(start), pieces.end(),
            [](const Piece& a, const Piece& b) {
              return a.row != b.row ? a.row < b.row : a.col < b.col;
            });
  Tally(tally, counts);
}

// The pad value's bytes in the dtype's size and byte order.
void PadBytes(int64_t pad, const DType& dtype, std::byte* out) {
  const auto bits = static_cast<uint64_t>(pad);  // two's complement: the low bytes are the value
  const bool big = dtype.str[0] == '>';
  for (uint32_t b = 0; b < dtype.itemsize; ++b) {
    const auto byte = static_cast<std::byte>((bits >> (8 * b)) & 0xff);
    out[big ? dtype.itemsize - 1 - b : b] = byte;
  }
}

}  // namespace

Result<PackPolicy> ParsePackPolicy(std::string_view name) {
  if (name == "concat") return PackPolicy::kConcat;
  if (name == "best_fit") return PackPolicy::kBestFit;
  return Status::InvalidArgument("packing policy must be 'concat' or 'best_fit', got '" +
                                 std::string(name) + "'");
}

const char* PackPolicyName(PackPolicy policy) {
  switch (policy) {
    case PackPolicy::kConcat:
      return "concat";
    case PackPolicy::kBestFit:
      return "best_fit";
  }
  return "unknown";
}

Status PackSpec::Validate() const {
  if (seq_len == 0) return Status::InvalidArgument("packing seq_len must be >= 1, got 0");
  if (rows == 0) return Status::InvalidArgument("packing rows must be >= 1, got 0");
  if (seq_len > kMaxPackTokens || rows > kMaxPackTokens / seq_len) {
    return Status::InvalidArgument("packing rows * seq_len (" + std::to_string(rows) + " * " +
                                   std::to_string(seq_len) +
                                   ") must be <= " + std::to_string(kMaxPackTokens));
  }
  if (policy != PackPolicy::kConcat && policy != PackPolicy::kBestFit) {
    return Status::InvalidArgument("packing policy must be 'concat' or 'best_fit'");
  }
  if (pad.empty()) return Status::InvalidArgument("packing needs at least one packed stream");
  return Status::OK();
}

Result<uint64_t> PackSpec::Units(uint64_t batch_size) const {
  if (batch_size == 0) return Status::InvalidArgument("packing: the batch has no documents");
  const uint64_t per_unit = docs == 0 ? batch_size : docs;
  if (batch_size % per_unit != 0) {
    return Status::InvalidArgument("packing docs (" + std::to_string(docs) +
                                   ") must divide the batch size (" + std::to_string(batch_size) +
                                   "): each rank packs whole units of docs documents");
  }
  const uint64_t units = batch_size / per_unit;
  if (units > kMaxPackTokens / (rows * seq_len)) {
    return Status::InvalidArgument("packing: " + std::to_string(units) + " units of " +
                                   std::to_string(rows) + " rows of " + std::to_string(seq_len) +
                                   " tokens exceed " + std::to_string(kMaxPackTokens) +
                                   " tokens per batch");
  }
  return units;
}

Status PackSpec::CheckDType(size_t stream, const DType& dtype, std::string_view name) const {
  const std::string who = "packed stream '" + std::string(name) + "'";
  if (dtype.kind != 'i' && dtype.kind != 'u' && dtype.kind != 'b') {
    return Status::SchemaError(who + " has dtype " + dtype.str +
                               ": packing needs integer (or bool) tokens");
  }
  const int64_t v = pad[stream];
  bool fits = false;
  if (dtype.kind == 'b') {
    fits = v == 0 || v == 1;
  } else if (dtype.kind == 'u') {
    fits = v >= 0 && (dtype.itemsize >= 8 || static_cast<uint64_t>(v) >> (8 * dtype.itemsize) == 0);
  } else {
    const int bits = static_cast<int>(8 * dtype.itemsize);
    fits = bits >= 64 || (v >= -(int64_t{1} << (bits - 1)) && v < (int64_t{1} << (bits - 1)));
  }
  if (!fits) {
    return Status::InvalidArgument("packing pad value " + std::to_string(v) + " of " + who +
                                   " does not fit its dtype " + dtype.str);
  }
  return Status::OK();
}

namespace {

// Checks the streams against the spec and each other; returns the units of the batch.
Result<uint64_t> CheckStreams(const PackSpec& spec, const std::vector<PackStream>& streams) {
  LX_RETURN_IF_ERROR(spec.Validate());
  if (streams.size() != spec.pad.size()) {
    return Status::InvalidArgument("packing: " + std::to_string(streams.size()) +
                                   " streams given for " + std::to_string(spec.pad.size()) +
                                   " pad values");
  }
  const std::vector<PackDoc>& lead = streams[0].docs;
  const uint64_t batch = lead.size();
  LX_ASSIGN_OR_RETURN(const uint64_t units, spec.Units(batch));
  for (size_t s = 0; s < streams.size(); ++s) {
    const PackStream& st = streams[s];
    LX_RETURN_IF_ERROR(spec.CheckDType(s, st.dtype, st.name));
    if (st.docs.size() != batch) {
      return Status::InvalidArgument("packed stream '" + st.name + "' has " +
                                     std::to_string(st.docs.size()) + " documents but '" +
                                     streams[0].name + "' has " + std::to_string(batch));
    }
    for (uint64_t i = 0; i < batch; ++i) {
      if (st.docs[i].size != lead[i].size) {
        return Status::InvalidArgument("packing: document " + std::to_string(i) + " has " +
                                       std::to_string(st.docs[i].size) + " elements in stream '" +
                                       st.name + "' but " + std::to_string(lead[i].size) + " in '" +
                                       streams[0].name + "': packed streams must be aligned");
      }
      if (st.docs[i].data == nullptr && st.docs[i].size > 0) {
        return Status::InvalidArgument("packing: document " + std::to_string(i) + " of stream '" +
                                       st.name + "' has no data");
      }
    }
  }
  return units;
}

// segment_ids (1, 2, ... per row, 0 = padding) and positions of the pieces.
void FillSegments(const std::vector<Piece>& pieces, uint64_t seq_len, PackedBatch& out) {
  const uint64_t total = out.rows * seq_len;
  out.segment_ids.assign(total, 0);
  out.positions.assign(total, 0);
  uint64_t row = out.rows;  // none yet
  int32_t segment = 0;
  for (const Piece& p : pieces) {
    if (p.row != row) {
      row = p.row;
      segment = 0;
    }
    ++segment;
    const uint64_t at = p.row * seq_len + p.col;
    std::fill_n(out.segment_ids.begin() + static_cast<std::ptrdiff_t>(at), p.length, segment);
    for (uint64_t k = 0; k < p.length; ++k) out.positions[at + k] = static_cast<int32_t>(k);
  }
}

// cu_seqlens: the end of every piece, and of every row's padding (its own segment).
void FillCuSeqlens(const std::vector<Piece>& pieces, const std::vector<uint64_t>& used,
                   uint64_t seq_len, PackedBatch& out) {
  out.cu_seqlens.reserve(pieces.size() + out.rows + 1);
  out.cu_seqlens.push_back(0);
  size_t next = 0;
  for (uint64_t r = 0; r < out.rows; ++r) {
    for (; next < pieces.size() && pieces[next].row == r; ++next) {
      const Piece& p = pieces[next];
      out.cu_seqlens.push_back(static_cast<int32_t>(r * seq_len + p.col + p.length));
    }
    if (used[r] < seq_len) out.cu_seqlens.push_back(static_cast<int32_t>((r + 1) * seq_len));
  }
}

// Each stream's (rows, seq_len) array: the pieces' elements, then its pad value.
void CopyStreams(const PackSpec& spec, const std::vector<PackStream>& streams,
                 const std::vector<Piece>& pieces, const std::vector<uint64_t>& used,
                 PackedBatch& out) {
  const uint64_t total = out.rows * spec.seq_len;
  out.streams.reserve(streams.size());
  for (size_t s = 0; s < streams.size(); ++s) {
    const PackStream& st = streams[s];
    const size_t isz = st.dtype.itemsize;
    auto buf = std::make_unique_for_overwrite<std::byte[]>(total * isz);
    for (const Piece& p : pieces) {
      const auto* src = static_cast<const std::byte*>(st.docs[p.doc].data);
      std::memcpy(buf.get() + (p.row * spec.seq_len + p.col) * isz, src + p.offset * isz,
                  p.length * isz);
    }
    std::array<std::byte, 8> pad{};  // integer and bool dtypes have at most 8 bytes
    PadBytes(spec.pad[s], st.dtype, pad.data());
    for (uint64_t r = 0; r < out.rows; ++r) {
      std::byte* at = buf.get() + (r * spec.seq_len + used[r]) * isz;
      for (uint64_t k = used[r]; k < spec.seq_len; ++k, at += isz) std::memcpy(at, pad.data(), isz);
    }
    out.streams.push_back(std::move(buf));
  }
}

}  // namespace

Result<PackedBatch> Pack(const PackSpec& spec, const std::vector<PackStream>& streams) {
  LX_ASSIGN_OR_RETURN(const uint64_t units, CheckStreams(spec, streams));
  const std::vector<PackDoc>& lead = streams[0].docs;
  PackedBatch out;
  out.rows = units * spec.rows;
  out.seq_len = spec.seq_len;
  const uint64_t per_unit = lead.size() / units;
  std::vector<Piece> pieces;
  for (uint64_t u = 0; u < units; ++u) {
    if (spec.policy == PackPolicy::kConcat) {
      PlanConcat(spec, lead, u * per_unit, per_unit, u * spec.rows, pieces, out.counts);
    } else {
      PlanBestFit(spec, lead, u * per_unit, per_unit, u * spec.rows, pieces, out.counts);
    }
  }
  for (const PackDoc& d : lead) out.counts.tokens += d.size;
  // Tokens placed per row (pieces fill each row from column 0 without gaps).
  std::vector<uint64_t> used(out.rows, 0);
  for (const Piece& p : pieces) used[p.row] += p.length;
  uint64_t packed = 0;
  for (uint64_t u : used) packed += u;
  out.counts.tokens_padded = out.rows * spec.seq_len - packed;

  FillSegments(pieces, spec.seq_len, out);
  if (spec.cu_seqlens) FillCuSeqlens(pieces, used, spec.seq_len, out);
  CopyStreams(spec, streams, pieces, used, out);
  return out;
}

}  // namespace loaderx
