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
inline constexpr uint32_t kFormatMinor = 0;
inline constexpr char kWriterVersion[] = "loaderx 0.1.0";

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
inline constexpr uint32_t kMaxNdim = 32;      // NumPy's own limit
inline constexpr uint64_t kMaxMetaBytes = 1 << 20;

// One index entry: 24 bytes, little-endian.
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
  uint32_t minor = kFormatMinor;
  Schema schema;
  Codec codec = Codec::kRaw;
  int level = 0;
  uint64_t count = 0;
  uint32_t data_shards = 1;
  uint32_t dict_id = 0;             // 0 unless codec == zstd_dict
  uint64_t nbytes = 0;              // logical bytes of all records
  uint64_t index_table_xxh3 = 0;    // XXH3-64 of the index's block-checksum table
  uint64_t shapes_table_xxh3 = 0;   // same for the shape table (ragged)
  std::map<std::string, FileInfo> files;  // every file but meta
  std::string writer;
};

std::string EncodeMetadata(const Metadata& m);
// `label` names the file in errors. Checks the trailer checksum, magic,
// version and value ranges; does not look at any other file.
Result<Metadata> DecodeMetadata(std::string_view bytes, const std::string& label);

// Expected size of a blocked table file: n rows of `row_bytes` + 8 bytes per block.
inline uint64_t TableFileSize(uint64_t n, uint64_t row_bytes) {
  return n * row_bytes + NumBlocks(n) * 8;
}

// a * b, or false on uint64 overflow.
inline bool MulOverflow(uint64_t a, uint64_t b, uint64_t* out) {
  return __builtin_mul_overflow(a, b, out);
}

}  // namespace loaderx::format
