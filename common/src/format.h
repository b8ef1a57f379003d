// Zrecord v1 on-disk format: file names, constants, index entry and metadata
// encoding. The byte layout is documented in docs/format.md; this header is
// the single place in the code that knows it.
//
// Private to common/. Thread-safety: free functions are pure; none keeps state.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "loaderx/status.h"
#include "loaderx/store.h"

namespace loaderx::format {

static_assert(std::endian::native == std::endian::little,
              "Zrecord stores are little-endian; big-endian hosts are unsupported");

inline constexpr std::string_view kMagic = "zrecord";
inline constexpr uint32_t kFormatMajor = 1;
// The newest minor this code reads; a store of a newer minor is refused at open.
// 1.1: compact layouts, data block sums; 1.2: narrowed integer records;
// 1.3: the "groups" index layout and bare zstd blocks.
inline constexpr uint32_t kFormatMinor = 3;
// The minor of stores that cannot hold narrowed records (every store but the
// compressed ones of narrowable integer dtypes), so older builds read them.
inline constexpr uint32_t kPlainMinor = 1;
inline constexpr uint32_t kNarrowMinor = 2;
inline constexpr uint32_t kGroupsMinor = 3;

inline constexpr char kMetaFile[] = "meta";
inline constexpr char kIndexFile[] = "index";
inline constexpr char kShapesFile[] = "shapes";
inline constexpr char kDictFile[] = "dict";
// "data-000" .. "data-254".
std::string DataFileName(uint32_t shard);

// Index and shape tables are checksummed in blocks of this many records; a
// block is verified the first time any of its records is used.
inline constexpr uint64_t kBlockRecords = 4096;
inline constexpr uint64_t NumBlocks(uint64_t n) { return (n + kBlockRecords - 1) / kBlockRecords; }

inline constexpr size_t kEntryBytes = 24;
inline constexpr uint8_t kFlagCompressed = 0x01;
inline constexpr uint8_t kKnownFlags = kFlagCompressed;
inline constexpr uint32_t kMaxShards = 255;
inline constexpr uint32_t kMaxNdim = 64;  // NumPy 2's own limit (NPY_MAXDIMS)
// A dense batch adds one axis to item_shape, so a dense item has one fewer.
inline constexpr uint32_t kMaxDenseItemNdim = kMaxNdim - 1;
inline constexpr uint64_t kMaxMetaBytes = 1 << 20;

// How records are located (docs/format.md, section 3).
enum class Layout : uint8_t {
  kEntries = 0,   // 1.0: a 24-byte entry per record (offset, length, checksum, shard, flags)
  kComputed = 1,  // 1.1 dense raw: no index; offsets follow from the record number
  kEnds = 2,      // 1.1 otherwise: an 8-byte entry per record (end offset | compressed bit)
  kGroups = 3,    // 1.3: a u64 base per group of kGroupRecords records, a u32 word per record
};
const char* LayoutName(Layout l);

// 1.1 placement: record k belongs to run k / R (R = run_records); run r lies
// in data-<r mod S>, runs of one shard back to back in run order, the records
// of a run back to back in record order.
inline uint32_t RunShard(uint64_t k, uint64_t run_records, uint32_t shards) {
  return static_cast<uint32_t>((k / run_records) % shards);
}
// The record stored just before record k in k's shard, or false if k is the
// first record of its shard.
inline bool PrevInShard(uint64_t k, uint64_t run_records, uint32_t shards, uint64_t* prev) {
  if (k % run_records != 0) {
    *prev = k - 1;
    return true;
  }
  if (k / run_records < shards) return false;
  *prev = k - run_records * (shards - 1) - 1;
  return true;
}
// kComputed: the byte offset of record k in its shard (item = record bytes).
inline uint64_t ComputedOffset(uint64_t k, uint64_t run_records, uint32_t shards, uint64_t item) {
  const uint64_t run = k / run_records;
  return ((run / shards) * run_records + k % run_records) * item;
}
// kComputed: the size of data-<s> for a store of n records.
inline uint64_t ComputedShardBytes(uint64_t n, uint64_t run_records, uint32_t shards, uint32_t s,
                                   uint64_t item) {
  const uint64_t full_runs = n / run_records, tail = n % run_records;
  uint64_t records = (full_runs / shards + (full_runs % shards > s ? 1 : 0)) * run_records;
  if (tail != 0 && full_runs % shards == s) records += tail;
  return records * item;
}

// kEnds entry: bit 63 = the record is one zstd frame; 1.2: bits 61..62 = the
// width code of its stored values (0 = the dtype's itemsize, 1/2/3 = 1/2/4
// bytes), bit 60 = a signed dtype's narrowed values are unsigned (widened by
// zero-extension, not sign-extension), bits 0..59 = the offset one past its
// last byte in its shard file (1.1: bits 0..62, with 60..62 always 0 since no
// shard file reaches 2^60).
inline constexpr size_t kEndEntryBytes = 8;
inline constexpr uint64_t kEndCompressedBit = uint64_t{1} << 63;
inline constexpr int kEndWidthShift = 61;
inline constexpr uint64_t kEndWidthMask = uint64_t{3} << kEndWidthShift;
inline constexpr uint64_t kEndZeroExtendBit = uint64_t{1} << 60;
inline constexpr uint64_t kEndOffsetMask = kEndZeroExtendBit - 1;
// A shard file must stay below this many bytes (the end offset's 60 bits).
inline constexpr uint64_t kMaxShardBytes = kEndZeroExtendBit;
inline constexpr uint32_t WidthOfCode(uint64_t code) { return code == 0 ? 0 : 1u << (code - 1); }
inline constexpr uint64_t CodeOfWidth(uint32_t w) { return w == 1 ? 1 : w == 2 ? 2 : 3; }
// Dtypes whose records a compressed 1.2 store may narrow: little-endian
// integers of 2, 4 or 8 bytes (docs/format.md, section 3).
inline bool NarrowableDType(const DType& d) {
  return (d.kind == 'i' || d.kind == 'u') &&
         (d.itemsize == 2 || d.itemsize == 4 || d.itemsize == 8) && !d.str.empty() &&
         d.str[0] == '<';
}
// kGroups (docs/format.md, section 3): records are in groups of
// kGroupRecords (group g: records g*G .. g*G+G-1; run_records is a multiple
// of G, so a group lies in one shard, back to back). The index body is one
// row per group: the u64 offset of its first record in its shard file, then
// a u32 word per record:
//   bits 0..25   the end of the record relative to the group's base, or with
//                bit 31 set, the ordinal of its absolute end in the wide ends
//   bits 26..27  how it is stored: kFormRaw, kFormFrame (a magicless zstd
//                frame), kFormBare1 / kFormBare2 (a bare compressed block
//                after its 1- or 2-byte frame content size field)
//   bits 28..29  width code (as kEnds bits 61..62); bit 30 zero-extension
inline constexpr uint64_t kGroupRecords = 64;
inline constexpr uint64_t kGroupRowBytes = 8 + 4 * kGroupRecords;
inline constexpr uint32_t kWordRelBits = 26;
inline constexpr uint32_t kWordRelMask = (uint32_t{1} << kWordRelBits) - 1;
inline constexpr int kWordFormShift = 26;
inline constexpr int kWordWidthShift = 28;
inline constexpr uint32_t kWordZeroExtendBit = uint32_t{1} << 30;
inline constexpr uint32_t kWordWideBit = uint32_t{1} << 31;
inline constexpr uint32_t kFormRaw = 0, kFormFrame = 1, kFormBare1 = 2, kFormBare2 = 3;
inline constexpr uint64_t NumGroups(uint64_t n) { return (n + kGroupRecords - 1) / kGroupRecords; }
// Bytes of the kGroups index body for n records (a short last row).
inline constexpr uint64_t GroupsBodyBytes(uint64_t n) { return NumGroups(n) * 8 + n * 4; }
// Byte offset of record i's word in the body.
inline constexpr uint64_t GroupWordOffset(uint64_t i) {
  return (i / kGroupRecords) * kGroupRowBytes + 8 + (i % kGroupRecords) * 4;
}

// 1.1 data files are checksummed in blocks of this many bytes; the sums sit
// at the end of `index`, after its own block table.
inline constexpr uint64_t kDataBlockBytes = uint64_t{64} << 10;
inline uint64_t NumDataBlocks(uint64_t file_bytes, uint64_t block) {
  return (file_bytes + block - 1) / block;
}
// User metadata (JSON text) is capped so `meta` stays under kMaxMetaBytes.
inline constexpr uint64_t kMaxUserMetadataBytes = uint64_t{512} << 10;

// One 1.0 index entry: 24 bytes, little-endian.
//   0  u64 offset      byte offset of the stored record in data-<shard>
//   8  u64 stored_len  bytes stored (== decoded length when not compressed)
//  16  u32 checksum    low 32 bits of XXH3-64 of the stored bytes
//  20  u8  shard       0..data_shards-1
//  21  u8  flags       bit 0: zstd frame; other bits must be 0
//  22  u16 reserved    0
struct IndexEntry {
  uint64_t offset = 0;
  uint64_t stored_len = 0;
  uint32_t checksum = 0;
  uint8_t shard = 0;
  uint8_t flags = 0;
  uint16_t reserved = 0;
};

inline void EncodeEntry(const IndexEntry& e, uint8_t* out) {
  std::memcpy(out + 0, &e.offset, 8);
  std::memcpy(out + 8, &e.stored_len, 8);
  std::memcpy(out + 16, &e.checksum, 4);
  out[20] = e.shard;
  out[21] = e.flags;
  std::memcpy(out + 22, &e.reserved, 2);
}

inline IndexEntry DecodeEntry(const uint8_t* in) {
  IndexEntry e;
  std::memcpy(&e.offset, in + 0, 8);
  std::memcpy(&e.stored_len, in + 8, 8);
  std::memcpy(&e.checksum, in + 16, 4);
  e.shard = in[20];
  e.flags = in[21];
  std::memcpy(&e.reserved, in + 22, 2);
  return e;
}

// XXH3-64 of a byte range (seed 0).
uint64_t Hash64(const void* data, size_t len);
inline uint32_t RecordChecksum(const void* data, size_t len) {
  return static_cast<uint32_t>(Hash64(data, len));
}

struct FileInfo {
  uint64_t size = 0;
  uint64_t xxh3 = 0;  // XXH3-64 of the whole file
  bool operator==(const FileInfo&) const = default;
};

// The decoded metadata file. The file is a msgpack map followed by the 8-byte
// little-endian XXH3-64 of the map's bytes.
struct Metadata {
  uint32_t major = kFormatMajor;
  uint32_t minor = kPlainMinor;
  Schema schema;
  Codec codec = Codec::kRaw;
  int level = 0;
  uint64_t count = 0;
  uint32_t data_shards = 1;
  uint32_t dict_id = 0;                   // 0 unless codec == zstd_dict
  uint64_t nbytes = 0;                    // logical bytes of all records
  uint64_t index_table_xxh3 = 0;          // XXH3-64 of the index's block-checksum table
  uint64_t shapes_table_xxh3 = 0;         // same for the shape table (ragged)
  std::map<std::string, FileInfo> files;  // every file but meta
  std::string writer;
  // 1.1 keys (absent in 1.0 stores: layout kEntries, the rest 0 / empty).
  Layout layout = Layout::kEntries;
  uint64_t run_records = 0;      // R, >= 1 in 1.1
  uint64_t data_block = 0;       // bytes per data checksum block
  uint64_t sums_table_xxh3 = 0;  // XXH3 of the data block sums (end of `index`)
  std::string user_metadata;     // JSON text given at create, or empty
  // 1.3, kGroups: the absolute ends that do not fit a word (after the block
  // table in `index`), and their XXH3.
  uint64_t wide_ends = 0;
  uint64_t wide_xxh3 = 0;
};

std::string EncodeMetadata(const Metadata& m);
// `label` names the file in errors. Checks the trailer checksum, magic,
// version and value ranges; does not look at any other file.
Result<Metadata> DecodeMetadata(std::string_view bytes, const std::string& label);

// Expected size of a blocked table file: n rows of `row_bytes` + 8 bytes per block.
// Ragged 1.1 stores of rank 1 have no shape table: a record's length follows
// from its entry (raw) or its frame header (compressed).
inline bool HasShapeTable(const Metadata& m) {
  return m.schema.kind == Kind::kRagged && (m.layout == Layout::kEntries || m.schema.ndim > 1);
}

inline uint64_t TableFileSize(uint64_t n, uint64_t row_bytes) {
  return n * row_bytes + NumBlocks(n) * 8;
}

// a * b, or false on uint64 overflow.
inline bool MulOverflow(uint64_t a, uint64_t b, uint64_t* out) {
  return __builtin_mul_overflow(a, b, out);
}

}  // namespace loaderx::format
