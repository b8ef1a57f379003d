#include "codec.h"

#define ZSTD_STATIC_LINKING_ONLY  // ZSTD_c_format / ZSTD_d_format (magicless frames)
#include <zdict.h>
#include <zstd.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "format.h"
#include "loaderx/store.h"
#include "narrow.h"

namespace loaderx::codec {
namespace {

struct CCtxDeleter {
  void operator()(ZSTD_CCtx* c) const { ZSTD_freeCCtx(c); }
};
struct DCtxDeleter {
  void operator()(ZSTD_DCtx* c) const { ZSTD_freeDCtx(c); }
};

// One context per thread: contexts are not thread-safe but are expensive to
// create, and the pool threads live as long as the process.
ZSTD_CCtx* ThreadCCtx() {
  thread_local std::unique_ptr<ZSTD_CCtx, CCtxDeleter> ctx(ZSTD_createCCtx());
  return ctx.get();
}
ZSTD_DCtx* ThreadDCtx() {
  thread_local std::unique_ptr<ZSTD_DCtx, DCtxDeleter> ctx(ZSTD_createDCtx());
  return ctx.get();
}

ZSTD_format_e FormatOf(Frames f) {
  return f == Frames::kCompact ? ZSTD_f_zstd1_magicless : ZSTD_f_zstd1;
}

// Compression context for kCompact frames, with its frame parameters set
// once (they are sticky); level and dictionary are set per call.
ZSTD_CCtx* ThreadCompactCCtx() {
  thread_local std::unique_ptr<ZSTD_CCtx, CCtxDeleter> ctx([] {
    ZSTD_CCtx* c = ZSTD_createCCtx();
    if (c != nullptr) {
      ZSTD_CCtx_setParameter(c, ZSTD_c_format, ZSTD_f_zstd1_magicless);
      ZSTD_CCtx_setParameter(c, ZSTD_c_contentSizeFlag, 1);
      ZSTD_CCtx_setParameter(c, ZSTD_c_checksumFlag, 0);
      ZSTD_CCtx_setParameter(c, ZSTD_c_dictIDFlag, 0);
    }
    return c;
  }());
  return ctx.get();
}

// Decompression context for kCompact frames.
ZSTD_DCtx* ThreadCompactDCtx() {
  thread_local std::unique_ptr<ZSTD_DCtx, DCtxDeleter> ctx([] {
    ZSTD_DCtx* d = ZSTD_createDCtx();
    if (d != nullptr) ZSTD_DCtx_setParameter(d, ZSTD_d_format, ZSTD_f_zstd1_magicless);
    return d;
  }());
  return ctx.get();
}

ZSTD_DCtx* DCtxFor(Frames f) { return f == Frames::kCompact ? ThreadCompactDCtx() : ThreadDCtx(); }

std::string ZstdError(size_t code) { return ZSTD_getErrorName(code); }

constexpr size_t kStreamPiece = 4 << 20;

}  // namespace

Result<std::shared_ptr<const ZstdDictionary>> ZstdDictionary::Create(std::string bytes, int level) {
  if (bytes.empty()) return Status::InvalidArgument("dict_bytes is empty");
  uint32_t id = ZDICT_getDictID(bytes.data(), bytes.size());
  if (id == 0) {
    // Raw content (zstd's ZSTD_dct_auto takes bytes without the ZDICT magic as
    // content): an id of our own, so the store still records which
    // dictionary its records need. Metadata reserves 0 for "no dictionary".
    id = static_cast<uint32_t>(format::Hash64(bytes.data(), bytes.size()));
    if (id == 0) id = 1;
  }
  std::shared_ptr<ZstdDictionary> d(new ZstdDictionary());
  d->bytes_ = std::move(bytes);
  d->id_ = id;
  d->cdict_ = ZSTD_createCDict(d->bytes_.data(), d->bytes_.size(), level);
  d->ddict_ = ZSTD_createDDict(d->bytes_.data(), d->bytes_.size());
  if (d->cdict_ == nullptr || d->ddict_ == nullptr) {
    return Status::InvalidArgument("dict_bytes could not be loaded as a zstd dictionary");
  }
  return std::shared_ptr<const ZstdDictionary>(std::move(d));
}

ZstdDictionary::~ZstdDictionary() {
  ZSTD_freeCDict(cdict_);
  ZSTD_freeDDict(ddict_);
}

size_t CompressBound(size_t n) { return ZSTD_compressBound(n); }

Result<size_t> Compress(const void* src, size_t n, int level, const ZstdDictionary* dict, void* dst,
                        size_t capacity, Frames frames) {
  if (frames == Frames::kCompact) {
    ZSTD_CCtx* cctx = ThreadCompactCCtx();
    if (cctx == nullptr) return Status::ResourceExhausted("ZSTD_createCCtx failed");
    size_t r = ZSTD_CCtx_refCDict(cctx, dict != nullptr ? dict->cdict() : nullptr);
    if (!ZSTD_isError(r) && dict == nullptr) {
      r = ZSTD_CCtx_setParameter(cctx, ZSTD_c_compressionLevel, level);
    }
    if (!ZSTD_isError(r)) r = ZSTD_compress2(cctx, dst, capacity, src, n);
    if (ZSTD_isError(r)) return Status::Internal("zstd compression failed: " + ZstdError(r));
    return r;
  }
  ZSTD_CCtx* cctx = ThreadCCtx();
  if (cctx == nullptr) return Status::ResourceExhausted("ZSTD_createCCtx failed");
  size_t r = dict != nullptr ? ZSTD_compress_usingCDict(cctx, dst, capacity, src, n, dict->cdict())
                             : ZSTD_compressCCtx(cctx, dst, capacity, src, n, level);
  if (ZSTD_isError(r)) return Status::Internal("zstd compression failed: " + ZstdError(r));
  return r;
}

Result<uint64_t> FrameContentSize(const void* src, size_t n, Frames frames) {
  ZSTD_frameHeader h;
  const size_t r = ZSTD_getFrameHeader_advanced(&h, src, n, FormatOf(frames));
  if (ZSTD_isError(r)) return Status::Corruption(std::string("zstd frame header: ") + ZstdError(r));
  if (r != 0) return Status::Corruption("zstd frame header truncated");
  if (h.frameType != ZSTD_frame || h.frameContentSize == ZSTD_CONTENTSIZE_UNKNOWN) {
    return Status::Corruption("zstd frame header has no content size");
  }
  return static_cast<uint64_t>(h.frameContentSize);
}

Status Decompress(const void* src, size_t n, const ZstdDictionary* dict, void* out, size_t out_len,
                  const std::string& what, Frames frames) {
  ZSTD_DCtx* dctx = DCtxFor(frames);
  if (dctx == nullptr) return Status::ResourceExhausted("ZSTD_createDCtx failed");
  size_t r = dict != nullptr ? ZSTD_decompress_usingDDict(dctx, out, out_len, src, n, dict->ddict())
                             : ZSTD_decompressDCtx(dctx, out, out_len, src, n);
  if (ZSTD_isError(r)) return Status::Corruption(what + ": zstd: " + ZstdError(r));
  if (r != out_len) {
    return Status::Corruption(what + ": decoded " + std::to_string(r) + " bytes, expected " +
                              std::to_string(out_len));
  }
  return Status::OK();
}

namespace {
constexpr uint8_t kFhdFcs1 = 0x20;  // single segment, 1-byte content size
constexpr uint8_t kFhdFcs2 = 0x60;  // single segment, 2-byte content size (value - 256)
constexpr uint64_t kFcs2Offset = 256;
constexpr size_t kBlockHeaderBytes = 3;
// Last block, type 2 (compressed), its size in bits 3..23.
uint32_t CompressedBlockHeader(size_t size) {
  return 1u | (2u << 1) | static_cast<uint32_t>(size << 3);
}
}  // namespace

Stripped StripFrame(uint8_t* frame, size_t n, size_t content) {
  uint32_t f = 0;
  if (content < kFcs2Offset) {
    if (n < 2 || frame[0] != kFhdFcs1 || frame[1] != content) return {};
    f = 1;
  } else if (content < kFcs2Offset + 65536) {
    const uint64_t v = content - kFcs2Offset;
    if (n < 3 || frame[0] != kFhdFcs2 || frame[1] != (v & 0xff) || frame[2] != (v >> 8)) return {};
    f = 2;
  } else {
    return {};
  }
  const size_t head = 1 + f + kBlockHeaderBytes;
  if (n <= head) return {};
  const uint32_t want = CompressedBlockHeader(n - head);
  const uint8_t* bh = frame + 1 + f;
  if (bh[0] != (want & 0xff) || bh[1] != ((want >> 8) & 0xff) || bh[2] != (want >> 16)) return {};
  std::memmove(frame, frame + 1, f);
  std::memmove(frame + f, frame + head, n - head);
  return {f, n - 1 - kBlockHeaderBytes};
}

Result<uint64_t> BareContentSize(const uint8_t* src, size_t n, uint32_t fcs_bytes) {
  if (n <= fcs_bytes) {
    return Status::Corruption("bare zstd block of " + std::to_string(n) +
                              " bytes has no content after its " + std::to_string(fcs_bytes) +
                              "-byte content size");
  }
  if (fcs_bytes == 1) return uint64_t{src[0]};
  return kFcs2Offset + (uint64_t{src[0]} | uint64_t{src[1]} << 8);
}

void RebuildFrame(const uint8_t* src, size_t n, uint32_t fcs_bytes, uint8_t* p) {
  p[0] = fcs_bytes == 1 ? kFhdFcs1 : kFhdFcs2;
  std::memcpy(p + 1, src, fcs_bytes);
  const uint32_t bh = CompressedBlockHeader(n - fcs_bytes);
  p[1 + fcs_bytes] = bh & 0xff;
  p[2 + fcs_bytes] = (bh >> 8) & 0xff;
  p[3 + fcs_bytes] = static_cast<uint8_t>(bh >> 16);
  std::memcpy(p + 1 + fcs_bytes + kBlockHeaderBytes, src + fcs_bytes, n - fcs_bytes);
}

Status CompressStream(const void* src, uint64_t n, int level, const ZstdDictionary* dict,
                      const std::function<Status(const void*, size_t)>& sink, Frames frames) {
  ZSTD_CCtx* cctx = ThreadCCtx();
  if (cctx == nullptr) return Status::ResourceExhausted("ZSTD_createCCtx failed");
  ZSTD_CCtx_reset(cctx, ZSTD_reset_session_and_parameters);
  // Leave the context clean for the one-shot calls of this thread.
  struct Reset {
    ZSTD_CCtx* c;
    ~Reset() { ZSTD_CCtx_reset(c, ZSTD_reset_session_and_parameters); }
  } reset{cctx};
  size_t r = dict != nullptr ? ZSTD_CCtx_refCDict(cctx, dict->cdict())
                             : ZSTD_CCtx_setParameter(cctx, ZSTD_c_compressionLevel, level);
  if (!ZSTD_isError(r) && frames == Frames::kCompact) {
    r = ZSTD_CCtx_setParameter(cctx, ZSTD_c_format, ZSTD_f_zstd1_magicless);
    if (!ZSTD_isError(r)) r = ZSTD_CCtx_setParameter(cctx, ZSTD_c_dictIDFlag, 0);
  }
  if (!ZSTD_isError(r)) r = ZSTD_CCtx_setPledgedSrcSize(cctx, n);
  if (ZSTD_isError(r)) return Status::Internal("zstd setup failed: " + ZstdError(r));

  std::vector<uint8_t> piece(kStreamPiece);
  const uint8_t* p = static_cast<const uint8_t*>(src);
  uint64_t left = n;
  for (;;) {
    const size_t chunk = static_cast<size_t>(std::min<uint64_t>(left, kStreamPiece));
    ZSTD_inBuffer in{p, chunk, 0};
    const ZSTD_EndDirective mode = chunk == left ? ZSTD_e_end : ZSTD_e_continue;
    size_t remaining;
    do {
      ZSTD_outBuffer out{piece.data(), piece.size(), 0};
      remaining = ZSTD_compressStream2(cctx, &out, &in, mode);
      if (ZSTD_isError(remaining)) {
        return Status::Internal("zstd compression failed: " + ZstdError(remaining));
      }
      if (out.pos > 0) LX_RETURN_IF_ERROR(sink(piece.data(), out.pos));
    } while (mode == ZSTD_e_end ? remaining != 0 : in.pos < in.size);
    p += chunk;
    left -= chunk;
    if (mode == ZSTD_e_end) return Status::OK();
  }
}

Status DecompressStream(const void* src, uint64_t n, const ZstdDictionary* dict, uint64_t out_len,
                        const std::function<void(const void*, size_t)>& sink,
                        const std::string& what, Frames frames) {
  ZSTD_DCtx* dctx = ThreadDCtx();
  if (dctx == nullptr) return Status::ResourceExhausted("ZSTD_createDCtx failed");
  ZSTD_DCtx_reset(dctx, ZSTD_reset_session_and_parameters);
  struct Reset {
    ZSTD_DCtx* c;
    ~Reset() { ZSTD_DCtx_reset(c, ZSTD_reset_session_and_parameters); }
  } reset{dctx};
  if (frames == Frames::kCompact)
    ZSTD_DCtx_setParameter(dctx, ZSTD_d_format, ZSTD_f_zstd1_magicless);
  if (dict != nullptr) ZSTD_DCtx_refDDict(dctx, dict->ddict());
  std::vector<uint8_t> piece(kStreamPiece);
  ZSTD_inBuffer in{src, static_cast<size_t>(n), 0};
  uint64_t total = 0;
  size_t r = 1;
  while (in.pos < in.size) {
    ZSTD_outBuffer out{piece.data(), piece.size(), 0};
    r = ZSTD_decompressStream(dctx, &out, &in);
    if (ZSTD_isError(r)) return Status::Corruption(what + ": zstd: " + ZstdError(r));
    total += out.pos;
    if (total > out_len) {
      return Status::Corruption(what + ": decodes to more than " + std::to_string(out_len) +
                                " bytes");
    }
    if (out.pos > 0) sink(piece.data(), out.pos);
    if (r == 0 && in.pos < in.size) {
      return Status::Corruption(what + ": trailing bytes after the zstd frame");
    }
    if (out.pos == 0 && in.pos == in.size) break;
  }
  // Flush whatever the decoder still holds.
  while (r != 0) {
    ZSTD_outBuffer out{piece.data(), piece.size(), 0};
    r = ZSTD_decompressStream(dctx, &out, &in);
    if (ZSTD_isError(r)) return Status::Corruption(what + ": zstd: " + ZstdError(r));
    if (out.pos == 0) {
      if (r != 0) return Status::Corruption(what + ": truncated zstd frame");
      break;
    }
    total += out.pos;
    if (total > out_len) {
      return Status::Corruption(what + ": decodes to more than " + std::to_string(out_len) +
                                " bytes");
    }
    sink(piece.data(), out.pos);
  }
  if (total != out_len) {
    return Status::Corruption(what + ": decoded " + std::to_string(total) + " bytes, expected " +
                              std::to_string(out_len));
  }
  return Status::OK();
}

}  // namespace loaderx::codec

namespace loaderx {

Result<std::string> TrainDictionary(const std::vector<std::string_view>& samples, size_t capacity,
                                    const DType* narrow_as) {
  if (capacity < 256) {
    return Status::InvalidArgument("dictionary size " + std::to_string(capacity) +
                                   " is too small (minimum 256 bytes)");
  }
  std::string joined;
  std::vector<size_t> sizes;
  sizes.reserve(samples.size());
  const bool narrow = narrow_as != nullptr && format::NarrowableDType(*narrow_as);
  const uint32_t item = narrow ? narrow_as->itemsize : 1;
  std::vector<uint8_t> narrowed;
  for (auto s : samples) {
    if (s.empty()) continue;  // ZDICT rejects empty samples
    if (narrow && s.size() % item == 0) {
      const auto* p = reinterpret_cast<const uint8_t*>(s.data());
      const uint64_t n = s.size() / item;
      if (narrow::NarrowRecord(p, n, item, narrow_as->kind == 'i', &narrowed).width < item) {
        s = {reinterpret_cast<const char*>(narrowed.data()), narrowed.size()};
      }
    }
    joined.append(s);
    sizes.push_back(s.size());
  }
  std::string dict(capacity, '\0');
  size_t r = ZDICT_trainFromBuffer(dict.data(), capacity, joined.data(), sizes.data(),
                                   static_cast<unsigned>(sizes.size()));
  if (ZDICT_isError(r)) {
    return Status::InvalidArgument(
        "cannot train a dictionary from " + std::to_string(sizes.size()) + " samples (" +
        std::to_string(joined.size()) + " bytes): " + ZDICT_getErrorName(r) +
        "; give more (or larger) records, or a smaller size");
  }
  dict.resize(r);
  return dict;
}

}  // namespace loaderx
