// zstd record codec: one-shot and streaming (de)compression with per-thread
// contexts, and the shared dictionary of a zstd_dict store.
//
// Private to common/. Thread-safety: every function may be called from any
// thread; each thread lazily creates and keeps its own ZSTD_CCtx / ZSTD_DCtx
// (thread_local). A ZstdDictionary is immutable after Create and shared by all
// threads (zstd documents CDict/DDict as read-only after creation).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "loaderx/status.h"

struct ZSTD_CDict_s;
struct ZSTD_DDict_s;

namespace loaderx::codec {

class ZstdDictionary {
 public:
  // Digests `bytes` (non-empty) for compression at `level` and for
  // decompression. Like zstd itself, it takes either a ZDICT-format
  // dictionary (magic and header, as train_dict makes; its id is the header's)
  // or any other bytes as a raw-content dictionary (its id is derived from the
  // content, never 0). Bytes with the ZDICT magic but a bad header are refused.
  static Result<std::shared_ptr<const ZstdDictionary>> Create(std::string bytes, int level);
  ~ZstdDictionary();
  ZstdDictionary(const ZstdDictionary&) = delete;
  ZstdDictionary& operator=(const ZstdDictionary&) = delete;

  uint32_t id() const { return id_; }
  const std::string& bytes() const { return bytes_; }
  const ZSTD_CDict_s* cdict() const { return cdict_; }
  const ZSTD_DDict_s* ddict() const { return ddict_; }

 private:
  ZstdDictionary() = default;
  std::string bytes_;
  uint32_t id_ = 0;
  ZSTD_CDict_s* cdict_ = nullptr;
  ZSTD_DDict_s* ddict_ = nullptr;
};

// Frame flavour. kStandard (format 1.0): zstd's default frame (magic number,
// dictionary id, content size). kCompact (format 1.1): no magic number
// (ZSTD_f_zstd1_magicless), no dictionary id, no checksum, content size kept;
// 4-8 bytes fewer per record, which counts for 100-byte records.
enum class Frames : uint8_t { kStandard = 0, kCompact = 1 };

// Worst-case compressed size of n input bytes.
size_t CompressBound(size_t n);

// No frame is shorter than this (RFC 8878, section 3.1.1): a frame header of
// at least 2 bytes (the descriptor, then the window descriptor or, for a
// single-segment frame, a content size of at least 1 byte; no dictionary id in
// kCompact), then at least one block: a 3-byte block header and at least 1
// byte of content (an RLE block; a compressed block has a literals and a
// sequences section header of at least 1 byte each). kStandard adds the 4-byte
// magic number. A record of at most this many bytes can never be stored
// compressed (a frame must be shorter than the record), so the writer does not
// call the compressor for it: the store is the same, without the call.
constexpr size_t MinFrameBytes(Frames frames) { return frames == Frames::kCompact ? 6 : 10; }

// Compresses [src, src+n) as one frame into dst (capacity >= CompressBound(n)).
// `dict` may be null. Returns the frame size.
Result<size_t> Compress(const void* src, size_t n, int level, const ZstdDictionary* dict, void* dst,
                        size_t capacity, Frames frames = Frames::kCompact);

// The decoded size a frame's header announces; Corruption if the header is
// bad or has no content size.
Result<uint64_t> FrameContentSize(const void* src, size_t n, Frames frames);

// Decodes one record into exactly out_len bytes; any other outcome (bad frame,
// wrong dictionary, longer or shorter output) is Corruption("<what>: ...").
Status Decompress(const void* src, size_t n, const ZstdDictionary* dict, void* out, size_t out_len,
                  const std::string& what, Frames frames);

// Bare blocks (format 1.3). A kCompact frame of one compressed block, as
// zstd writes it for a record of fewer than 65,792 bytes, is
//   [descriptor 0x20 | 0x60][content size: 1 | 2 bytes][block header: 3 bytes][block]
// The descriptor and the block header follow from the record's stored
// length and the size of the content size field, so a store may keep only
// the content size field and the block ("bare"). StripFrame turns a frame
// of `n` bytes in place into that form and returns the content size field's
// size (1 or 2) and the new length, or 0 if the frame is not of that shape
// (several blocks, a raw or RLE block, another header): it stays whole.
struct Stripped {
  uint32_t fcs_bytes = 0;
  size_t len = 0;
};
Stripped StripFrame(uint8_t* frame, size_t n, size_t content);
// The content size a bare record's first `fcs_bytes` bytes hold; Corruption
// if the record is too short for them and one block byte.
Result<uint64_t> BareContentSize(const uint8_t* src, size_t n, uint32_t fcs_bytes);
// A bare record is shorter than its content (else it is stored raw), so at
// most this long; its frame is kBareFrameExtra bytes longer.
constexpr size_t kMaxBareBytes = 256 + 65535;
constexpr size_t kBareFrameExtra = 4;
// The frame a bare record of n <= kMaxBareBytes bytes was stripped from,
// rebuilt into frame[0, n + kBareFrameExtra): exactly the bytes zstd wrote.
void RebuildFrame(const uint8_t* src, size_t n, uint32_t fcs_bytes, uint8_t* frame);

// Streaming compression of a large record: the frame is handed to `sink` in
// pieces of at most a few MiB, so memory stays bounded whatever n is.
Status CompressStream(const void* src, uint64_t n, int level, const ZstdDictionary* dict,
                      const std::function<Status(const void*, size_t)>& sink,
                      Frames frames = Frames::kCompact);

// Streaming decode (verify path): decoded pieces go to `sink`; the total must
// equal out_len.
Status DecompressStream(const void* src, uint64_t n, const ZstdDictionary* dict, uint64_t out_len,
                        const std::function<void(const void*, size_t)>& sink,
                        const std::string& what, Frames frames);

}  // namespace loaderx::codec
