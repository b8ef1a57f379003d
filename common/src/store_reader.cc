// Store: opens, validates and reads a published Zrecord store
// (docs/format.md, "Reading").
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <vector>

#include "codec.h"
#include "format.h"
#include "huge_pages.h"
#include "loaderx/env.h"
#include "loaderx/store.h"
#include "loaderx/thread_pool.h"
#include "narrow.h"

namespace loaderx {
namespace {

using format::IndexEntry;

// Gather planning: raw records above kSplitBytes are copied in pieces by
// several threads; small records are grouped until a task has kGroupBytes.
constexpr uint64_t kSplitBytes = uint64_t{1} << 20;
constexpr uint64_t kGroupBytes = uint64_t{256} << 10;
// Grouping counts a decoded byte this many times a copied one, plus
// kFrameCost per compressed record (a frame's set-up: ~2-3 us whatever its
// size, the copy of ~16-32 KiB; 256 ragged token records of ~300 bytes take
// ~0.8 ms of decoding, nearly all of it per frame), and never cuts tasks
// below kMinGroupCost (a task costs a wake-up).
constexpr uint64_t kDecodeCost = 8;
constexpr uint64_t kFrameCost = uint64_t{16} << 10;
constexpr uint64_t kMinGroupCost = uint64_t{32} << 10;
// A batch costing less than this stays on the calling thread: waking pool
// threads cost 20-40 us of wall time on the 2-core VM, more than they save on
// a batch of 256 raw 784-byte records (~40 us of copying), and doubled its
// CPU time. 256 compressed records (kFrameCost each at least) are above it.
constexpr uint64_t kMinParallelCost = uint64_t{1} << 20;
// GatherComputed prefetches the first kPrefetchBytes of the record
// kPrefetchAhead places ahead while it copies the current one, so the cache
// and TLB misses of scattered records overlap (256 random Fashion-MNIST
// records, one core: 36 -> 29 us per batch; 2 KiB token blocks 76 -> 62 us;
// prefetching 4 KiB instead of 1 KiB changed neither).
constexpr size_t kPrefetchAhead = 4;
constexpr uint64_t kPrefetchBytes = 1024;
// How record bytes reach the output (docs/format.md, "How reads work"): raw
// pieces of at least kPreadBytes are read with pread(2) from the page cache
// instead of copied out of the mapping. Every page touched through the
// mapping stays in this process's page tables and is counted in its RSS/PSS
// (after a few epochs: the whole store); pread leaves none behind. It costs
// more CPU per byte (the kernel looks up every 4 KiB page-cache folio), so
// smaller records, where a syscall per record would cost more still, keep the
// mapped path.
constexpr uint64_t kPreadBytes = uint64_t{64} << 10;
// Compressed frames of kPreadFrameBytes..kMaxPreadFrameBytes are read the
// same way, into a per-thread scratch buffer, and decoded from there: the
// extra copy is small next to decoding (a 16 KiB frame decodes in ~100 us).
// Smaller frames (a syscall would be a large part of their cost) and larger
// ones (the scratch buffer stays allocated per thread) decode from the mapping.
constexpr uint64_t kPreadFrameBytes = uint64_t{16} << 10;
constexpr uint64_t kMaxPreadFrameBytes = uint64_t{4} << 20;
// Verify decodes records up to this size in one call, larger ones streaming.
constexpr uint64_t kVerifyOneShot = uint64_t{64} << 20;
// Records per verify task.
constexpr uint64_t kVerifyChunk = 256;

Result<std::string> ReadWhole(Env& env, int fd, uint64_t size, const std::string& what) {
  std::string s(size, '\0');
  LX_RETURN_IF_ERROR(PReadAll(env, fd, s.data(), size, 0, what));
  return s;
}

Result<format::Metadata> ReadMeta(Env& env, int fd, const std::string& what) {
  LX_ASSIGN_OR_RETURN(uint64_t size, FileSize(env, fd, what));
  if (size > format::kMaxMetaBytes) {
    return Status::Corruption(what + ": metadata too large (" + std::to_string(size) + " bytes)");
  }
  LX_ASSIGN_OR_RETURN(std::string bytes, ReadWhole(env, fd, size, what));
  return format::DecodeMetadata(bytes, what);
}

// A bitmap of verified blocks. Bits only go 0 -> 1; a racing second check of
// the same block is harmless (same answer), so relaxed ordering would do; the
// acquire/release pair documents that a set bit means "block checked".
class VerifiedBits {
 public:
  explicit VerifiedBits(uint64_t n)
      : words_((n + 63) / 64), bits_(new std::atomic<uint64_t>[words_]) {
    for (uint64_t w = 0; w < words_; ++w) bits_[w].store(0, std::memory_order_relaxed);
  }
  bool Test(uint64_t b) const {
    return (bits_[b / 64].load(std::memory_order_acquire) >> (b % 64)) & 1;
  }
  void Set(uint64_t b) {
    bits_[b / 64].fetch_or(uint64_t{1} << (b % 64), std::memory_order_release);
  }

 private:
  uint64_t words_;
  std::unique_ptr<std::atomic<uint64_t>[]> bits_;
};

// A blocked table (index or shapes) mapped read-only, with its block checksums.
// Block b covers records b*kBlockRecords.. and bytes [b*stride, +stride) of
// the body (the last block: up to `body`).
struct Table {
  std::string what;  // "<label>/index"
  MappedRegion map;
  uint64_t rows = 0;
  uint64_t row_bytes = 0;  // 0: the kGroups index (rows are not fixed-size)
  uint64_t body = 0, stride = 0;
  std::vector<uint64_t> block_sums;
  std::unique_ptr<VerifiedBits> verified;

  Status CheckBlock(uint64_t b) const {
    if (verified->Test(b)) return Status::OK();
    const uint64_t first = b * format::kBlockRecords;
    const uint64_t last = std::min(rows, first + format::kBlockRecords);
    const uint64_t from = b * stride, to = std::min(body, from + stride);
    const uint64_t h = format::Hash64(map.data() + from, to - from);
    if (h != block_sums[b]) {
      return Status::Corruption(what + ": checksum mismatch in block " + std::to_string(b) +
                                " (records " + std::to_string(first) + ".." +
                                std::to_string(last - 1) + ")");
    }
    verified->Set(b);
    return Status::OK();
  }
  Result<const uint8_t*> Row(uint64_t i) const {
    LX_RETURN_IF_ERROR(CheckBlock(i / format::kBlockRecords));
    return map.data() + i * row_bytes;
  }
};

class StoreImpl final : public Store {
 public:
  static Result<std::shared_ptr<Store>> Make(StoreFiles files, Env* env);

  const Schema& schema() const override { return meta_.schema; }
  Codec codec() const override { return meta_.codec; }
  uint32_t data_shards() const override { return meta_.data_shards; }
  uint64_t size() const override { return meta_.count; }
  uint64_t nbytes() const override { return meta_.nbytes; }
  uint64_t stored_bytes() const override { return stored_bytes_; }
  const std::string& label() const override { return files_.label; }
  const std::string& user_metadata() const override { return meta_.user_metadata; }
  std::pair<uint32_t, uint32_t> format_version() const override {
    return {meta_.major, meta_.minor};
  }

  Status RecordShape(uint64_t i, uint64_t* dims) const override {
    LX_RETURN_IF_ERROR(CheckIndex(i));
    if (meta_.schema.kind == Kind::kDense) {
      std::copy(meta_.schema.item_shape.begin(), meta_.schema.item_shape.end(), dims);
      return Status::OK();
    }
    if (!has_shapes_) {
      LX_ASSIGN_OR_RETURN(RecordRef r, Locate(i));
      dims[0] = r.raw_len / meta_.schema.dtype.itemsize;
      return Status::OK();
    }
    LX_ASSIGN_OR_RETURN(const uint8_t* row, shapes_.Row(i));
    std::memcpy(dims, row, size_t{meta_.schema.ndim} * 8);
    return Status::OK();
  }

  Result<uint64_t> RecordBytes(uint64_t i) const override {
    LX_RETURN_IF_ERROR(CheckIndex(i));
    if (meta_.schema.kind == Kind::kDense) return item_bytes_;
    if (!has_shapes_) {
      LX_ASSIGN_OR_RETURN(RecordRef r, Locate(i));
      return r.raw_len;
    }
    LX_ASSIGN_OR_RETURN(const uint8_t* row, shapes_.Row(i));
    uint64_t b = meta_.schema.dtype.itemsize;
    for (uint32_t d = 0; d < meta_.schema.ndim; ++d) {
      uint64_t dim;
      std::memcpy(&dim, row + size_t{d} * 8, 8);
      if (format::MulOverflow(b, dim, &b)) {
        return Status::Corruption(shapes_.what + ": record " + std::to_string(i) +
                                  ": shape overflows");
      }
    }
    return b;
  }

  Result<RecordRef> Locate(uint64_t i) const override {
    switch (meta_.layout) {
      case format::Layout::kEntries:
        return LocateEntry(i);
      case format::Layout::kComputed:
        return LocateComputed(i);
      case format::Layout::kEnds:
        return LocateEnd(i);
      case format::Layout::kGroups:
        return LocateGroup(i);
    }
    return Status::Internal("unknown layout");
  }

  Status ReadRecord(uint64_t i, void* out, uint64_t out_len) const override {
    LX_ASSIGN_OR_RETURN(RecordRef r, Locate(i));
    if (out_len != r.raw_len) {
      return Status::InvalidArgument("record " + std::to_string(i) + " has " +
                                     std::to_string(r.raw_len) + " bytes, output has " +
                                     std::to_string(out_len));
    }
    return Decode(i, r, out);
  }

  Status Gather(std::span<const uint64_t> indices, std::span<void* const> outs,
                ThreadPool* pool) const override {
    if (indices.size() != outs.size()) {
      return Status::InvalidArgument("Gather: indices and outputs differ in length");
    }
    if (meta_.layout == format::Layout::kComputed && item_bytes_ < kPreadBytes &&
        (pool == nullptr || item_bytes_ == 0 || indices.size() < kMinParallelCost / item_bytes_)) {
      return GatherComputed(indices, outs);
    }
    struct Task {
      size_t k;           // first output of the task
      size_t end;         // one past the last output (groups)
      uint64_t from, to;  // byte range (pieces of one split raw record)
    };
    std::vector<RecordRef> refs(indices.size());
    // Tasks are sized by cost, decoding counted kDecodeCost times a copy, and
    // cut so every pool thread gets about two: a batch of 256 small
    // compressed records (200 KiB decoded) is spread over the cores instead
    // of being one task, while a batch below kMinParallelCost (small raw
    // records) is one task on the calling thread.
    uint64_t total_cost = 0;
    for (size_t k = 0; k < indices.size(); ++k) {
      LX_ASSIGN_OR_RETURN(refs[k], Locate(indices[k]));
      total_cost += Cost(refs[k]);
    }
    if (total_cost < kMinParallelCost) pool = nullptr;
    const uint64_t group_cost = pool == nullptr
                                    ? UINT64_MAX
                                    : std::clamp<uint64_t>(total_cost / (2 * (pool->size() + 1)),
                                                           kMinGroupCost, kGroupBytes);
    std::vector<Task> tasks;
    uint64_t group = 0;
    for (size_t k = 0; k < indices.size(); ++k) {
      const RecordRef& r = refs[k];
      if (!r.compressed && r.width == 0 && r.raw_len > kSplitBytes && pool != nullptr) {
        for (uint64_t off = 0; off < r.raw_len; off += kSplitBytes) {
          tasks.push_back({k, k + 1, off, std::min(r.raw_len, off + kSplitBytes)});
        }
        group = UINT64_MAX;  // close the current group
        continue;
      }
      if (tasks.empty() || group >= group_cost) {
        tasks.push_back({k, k + 1, 0, UINT64_MAX});
        group = 0;
      } else {
        tasks.back().end = k + 1;
      }
      group += Cost(r);
    }
    std::vector<Status> sts(tasks.size());
    auto run = [&](size_t t) {
      const Task& task = tasks[t];
      if (task.to != UINT64_MAX) {  // a piece of a raw record
        const RecordRef& r = refs[task.k];
        sts[t] = CopyRaw(indices[task.k], r, task.from, task.to,
                         static_cast<uint8_t*>(outs[task.k]) + task.from);
        return;
      }
      for (size_t k = task.k; k < task.end; ++k) {
        Status st = Decode(indices[k], refs[k], outs[k]);
        if (!st.ok()) {
          sts[t] = std::move(st);
          return;
        }
      }
    };
    if (pool != nullptr) {
      pool->ParallelFor(tasks.size(), run);
    } else {
      for (size_t t = 0; t < tasks.size(); ++t) run(t);
    }
    for (auto& st : sts) LX_RETURN_IF_ERROR(st);
    return Status::OK();
  }

  Status Verify(const std::function<void(uint64_t, uint64_t)>& progress) const override {
    const uint64_t n = meta_.count;
    // Tables first: a record cannot be located through a bad block.
    LX_RETURN_IF_ERROR(VerifyTable(index_, format::kIndexFile));
    if (has_shapes_) LX_RETURN_IF_ERROR(VerifyTable(shapes_, format::kShapesFile));
    if (meta_.layout != format::Layout::kEntries) LX_RETURN_IF_ERROR(VerifyDataBlocks());
    // Records are checked on the default pool in rounds of chunks; within a
    // round the lowest failing chunk wins, so the first bad record is named
    // whatever the thread count. Progress is reported between rounds, from
    // the calling thread only.
    ThreadPool& pool = ThreadPool::Default();
    const uint64_t chunks = (n + kVerifyChunk - 1) / kVerifyChunk;
    const uint64_t per_round = std::max<uint64_t>(1, 8 * pool.size());
    if (progress) progress(0, n);
    for (uint64_t c0 = 0; c0 < chunks; c0 += per_round) {
      const uint64_t m = std::min(per_round, chunks - c0);
      std::vector<Status> sts(m);
      pool.ParallelFor(m, [&](size_t c) {
        const uint64_t first = (c0 + c) * kVerifyChunk;
        sts[c] = VerifyRecords(first, std::min(n, first + kVerifyChunk));
      });
      for (auto& st : sts) LX_RETURN_IF_ERROR(st);
      if (progress) progress(std::min(n, (c0 + m) * kVerifyChunk), n);
    }
    if (meta_.layout != format::Layout::kEntries) return Status::OK();  // blocks cover everything
    // Whole-file checksums catch bytes no record covers; shards in parallel.
    std::vector<Status> sts(meta_.data_shards);
    pool.ParallelFor(meta_.data_shards, [&](size_t s) {
      const std::string name = format::DataFileName(static_cast<uint32_t>(s));
      const MappedRegion& m = data_maps_[s];
      if (format::Hash64(m.data(), m.size()) != meta_.files.at(name).xxh3) {
        sts[s] = Status::Corruption(files_.label + "/" + name + ": file checksum mismatch");
      }
    });
    for (auto& st : sts) LX_RETURN_IF_ERROR(st);
    return Status::OK();
  }

 private:
  Status VerifyRecords(uint64_t first, uint64_t end) const {
    std::vector<uint8_t> scratch, frame;
    for (uint64_t i = first; i < end; ++i) {
      LX_ASSIGN_OR_RETURN(RecordRef r, Locate(i));
      const uint8_t* src = data_maps_[r.shard].data() + r.offset;
      auto what = [&] {
        return files_.label + ": record " + std::to_string(i) + " (" +
               format::DataFileName(r.shard) + ")";
      };
      if (meta_.layout == format::Layout::kEntries &&
          format::RecordChecksum(src, r.stored_len) != r.checksum) {
        return Status::Corruption(what() + ": checksum mismatch");
      }
      if (meta_.layout == format::Layout::kGroups && i % format::kGroupRecords == 0) {
        // A group's base is where the record before it in its shard ends.
        uint64_t prev, want = 0;
        if (format::PrevInShard(i, meta_.run_records, meta_.data_shards, &prev)) {
          LX_ASSIGN_OR_RETURN(RecordRef p, Locate(prev));
          want = p.offset + p.stored_len;
        }
        if (r.offset != want) {
          return BadEntry(
              i, "group base " + std::to_string(r.offset) + " != " + std::to_string(want) +
                     ", where the record before it in " + format::DataFileName(r.shard) + " ends");
        }
      }
      if (!r.compressed) continue;
      // A narrowed record decodes to its values at their stored width.
      const uint64_t decoded = DecodedLen(r);
      if (r.bare != 0) {
        frame.resize(r.stored_len + codec::kBareFrameExtra);
        codec::RebuildFrame(src, r.stored_len, r.bare, frame.data());
        scratch.resize(decoded);
        LX_RETURN_IF_ERROR(codec::Decompress(frame.data(), frame.size(), dict_.get(),
                                             scratch.data(), decoded, what(), frames_));
      } else if (decoded <= kVerifyOneShot) {
        scratch.resize(decoded);
        LX_RETURN_IF_ERROR(codec::Decompress(src, r.stored_len, dict_.get(), scratch.data(),
                                             decoded, what(), frames_));
      } else {
        LX_RETURN_IF_ERROR(codec::DecompressStream(
            src, r.stored_len, dict_.get(), decoded, [](const void*, size_t) {}, what(), frames_));
      }
    }
    return Status::OK();
  }

  // Dense raw records of format 1.1 (offsets computed from the index) in a
  // batch that stays on the calling thread: every index is checked first (a
  // bad one writes nothing), then one loop of offset arithmetic and copies out
  // of the mapping, with no per-record RecordRef, Result or task. Open checked
  // every shard's size against the count, so every computed extent is inside
  // its file.
  Status GatherComputed(std::span<const uint64_t> indices, std::span<void* const> outs) const {
    // One branch-free pass finds the largest index; only a batch with an
    // index out of range looks for the first bad one (its error is the same).
    uint64_t max_index = 0;
    for (uint64_t i : indices) max_index = std::max(max_index, i);
    if (!indices.empty() && max_index >= meta_.count) {
      for (uint64_t i : indices) LX_RETURN_IF_ERROR(CheckIndex(i));
    }
    const uint64_t runs = meta_.run_records, item = item_bytes_;
    const uint32_t shards = meta_.data_shards;
    if (item == 0) return Status::OK();
    auto src_of = [&](uint64_t i) {
      return data_maps_[format::RunShard(i, runs, shards)].data() +
             format::ComputedOffset(i, runs, shards, item);
    };
    const size_t n = indices.size();
    const uint64_t ahead_bytes = std::min<uint64_t>(item, kPrefetchBytes);
    auto prefetch = [&](const uint8_t* p) {
      for (uint64_t b = 0; b < ahead_bytes; b += 64) __builtin_prefetch(p + b);
    };
    // Each source address is computed once (two 64-bit divisions) and kept
    // in a ring from its prefetch until its copy.
    const uint8_t* ring[kPrefetchAhead];
    for (size_t k = 0; k < std::min(n, kPrefetchAhead); ++k) {
      ring[k] = src_of(indices[k]);
      prefetch(ring[k]);
    }
    for (size_t k = 0; k < n; ++k) {
      const uint8_t* src = ring[k % kPrefetchAhead];
      if (k + kPrefetchAhead < n) {
        const uint8_t* next = src_of(indices[k + kPrefetchAhead]);
        prefetch(next);
        ring[k % kPrefetchAhead] = next;
      }
      std::memcpy(outs[k], src, item);
    }
    return Status::OK();
  }

  Status BadEntry(uint64_t i, const std::string& why) const {
    return Status::Corruption(index_.what + ": record " + std::to_string(i) + ": " + why);
  }

  // Format 1.0: a 24-byte entry per record.
  Result<RecordRef> LocateEntry(uint64_t i) const {
    LX_ASSIGN_OR_RETURN(uint64_t raw_len, RecordBytes(i));
    LX_ASSIGN_OR_RETURN(const uint8_t* row, index_.Row(i));
    const IndexEntry e = format::DecodeEntry(row);
    if (e.shard >= meta_.data_shards) {
      return BadEntry(i, "shard " + std::to_string(e.shard) + " out of range");
    }
    if ((e.flags & ~format::kKnownFlags) != 0 || e.reserved != 0)
      return BadEntry(i, "unknown flags");
    RecordRef r;
    r.shard = e.shard;
    r.offset = e.offset;
    r.stored_len = e.stored_len;
    r.raw_len = raw_len;
    r.compressed = (e.flags & format::kFlagCompressed) != 0;
    r.checksum = e.checksum;
    LX_RETURN_IF_ERROR(CheckRef(i, r));
    return r;
  }

  // Format 1.1 dense raw: the offset follows from i.
  Result<RecordRef> LocateComputed(uint64_t i) const {
    LX_RETURN_IF_ERROR(CheckIndex(i));
    RecordRef r;
    r.shard = format::RunShard(i, meta_.run_records, meta_.data_shards);
    r.offset = format::ComputedOffset(i, meta_.run_records, meta_.data_shards, item_bytes_);
    r.stored_len = r.raw_len = item_bytes_;
    return r;  // Open checked every shard's size against the count
  }

  // Format 1.1 otherwise: the record ends where its entry says and starts
  // where the record before it in its shard ends.
  // The stored width of entry `e` of record i (bits 60..62 set): a width
  // code exists only in 1.2 stores of narrowable dtypes (a 1.1 store's
  // entries have bits 60..62 clear), and only narrower than the dtype; the
  // zero-extension bit only with one, on a signed dtype (docs/format.md,
  // section 3).
  Status ReadWidth(uint64_t i, uint64_t e, RecordRef* r) const {
    return ReadWidthBits(i, (e & format::kEndWidthMask) >> format::kEndWidthShift,
                         (e & format::kEndZeroExtendBit) != 0, r);
  }
  Status ReadWidthBits(uint64_t i, uint64_t code, bool zero_extend, RecordRef* r) const {
    if (!width_refusal_.empty()) {
      return BadEntry(i, (code != 0 ? "width code " + std::to_string(code)
                                    : std::string("zero-extension bit")) +
                             " in " + width_refusal_);
    }
    r->width = format::WidthOfCode(code);
    r->zero_extend = zero_extend;
    if (r->width >= meta_.schema.dtype.itemsize) {
      return BadEntry(i, "stored width " + std::to_string(r->width) +
                             " bytes is not below the itemsize " +
                             std::to_string(meta_.schema.dtype.itemsize));
    }
    if (r->zero_extend && (r->width == 0 || meta_.schema.dtype.kind != 'i')) {
      return BadEntry(i, r->width == 0 ? "zero-extension bit without a width code"
                                       : "zero-extension bit on an unsigned dtype");
    }
    return Status::OK();
  }

  Result<RecordRef> LocateEnd(uint64_t i) const {
    LX_RETURN_IF_ERROR(CheckIndex(i));
    LX_ASSIGN_OR_RETURN(const uint8_t* row, index_.Row(i));
    uint64_t e, start = 0, prev;
    std::memcpy(&e, row, 8);
    if (format::PrevInShard(i, meta_.run_records, meta_.data_shards, &prev)) {
      LX_ASSIGN_OR_RETURN(const uint8_t* prow, index_.Row(prev));
      std::memcpy(&start, prow, 8);
      start &= format::kEndOffsetMask;
    }
    const uint64_t end = e & format::kEndOffsetMask;
    RecordRef r;
    r.shard = format::RunShard(i, meta_.run_records, meta_.data_shards);
    r.compressed = (e & format::kEndCompressedBit) != 0;
    if ((e & (format::kEndWidthMask | format::kEndZeroExtendBit)) != 0) {
      LX_RETURN_IF_ERROR(ReadWidth(i, e, &r));
    }
    if (end < start) {
      return BadEntry(
          i, "ends at " + std::to_string(end) + ", before its start " + std::to_string(start));
    }
    r.offset = start;
    r.stored_len = end - start;
    const uint64_t file_size = data_sizes_[r.shard];
    if (end > file_size) {
      return BadEntry(i, "extent [" + std::to_string(start) + ", +" + std::to_string(r.stored_len) +
                             ") outside " + format::DataFileName(r.shard) + " (" +
                             std::to_string(file_size) + " bytes)");
    }
    LX_RETURN_IF_ERROR(SetRawLen(i, &r));
    LX_RETURN_IF_ERROR(CheckRef(i, r));
    return r;
  }

  // Format 1.3: the record's word in its group's row; it starts where the
  // record before it in the group ends, or at the group's base.
  Result<RecordRef> LocateGroup(uint64_t i) const {
    LX_RETURN_IF_ERROR(CheckIndex(i));
    LX_RETURN_IF_ERROR(index_.CheckBlock(i / format::kBlockRecords));
    const uint8_t* row = index_.map.data() + (i / format::kGroupRecords) * format::kGroupRowBytes;
    const uint64_t pos = i % format::kGroupRecords;
    uint64_t base;
    uint32_t word;
    std::memcpy(&base, row, 8);
    std::memcpy(&word, row + 8 + pos * 4, 4);
    RecordRef r;
    r.shard = format::RunShard(i, meta_.run_records, meta_.data_shards);
    const uint64_t file_size = data_sizes_[r.shard];
    if (base > file_size) {
      return BadEntry(i, "group base " + std::to_string(base) + " outside " +
                             format::DataFileName(r.shard) + " (" + std::to_string(file_size) +
                             " bytes)");
    }
    uint64_t start = base, end;
    if (pos != 0) {
      uint32_t pword;
      std::memcpy(&pword, row + 4 + pos * 4, 4);
      LX_ASSIGN_OR_RETURN(start, WordEnd(i - 1, base, pword));
    }
    LX_ASSIGN_OR_RETURN(end, WordEnd(i, base, word));
    if (end < start) {
      return BadEntry(
          i, "ends at " + std::to_string(end) + ", before its start " + std::to_string(start));
    }
    r.offset = start;
    r.stored_len = end - start;
    const uint32_t form = (word >> format::kWordFormShift) & 3;
    r.compressed = form != format::kFormRaw;
    r.bare = form == format::kFormBare1 ? 1 : form == format::kFormBare2 ? 2 : 0;
    const uint64_t code = (word >> format::kWordWidthShift) & 3;
    const bool zext = (word & format::kWordZeroExtendBit) != 0;
    if (code != 0 || zext) LX_RETURN_IF_ERROR(ReadWidthBits(i, code, zext, &r));
    if (end > file_size) {
      return BadEntry(i, "extent [" + std::to_string(start) + ", +" + std::to_string(r.stored_len) +
                             ") outside " + format::DataFileName(r.shard) + " (" +
                             std::to_string(file_size) + " bytes)");
    }
    if (r.bare != 0 && r.stored_len > codec::kMaxBareBytes) {
      return BadEntry(i, "bare zstd block of " + std::to_string(r.stored_len) + " bytes (at most " +
                             std::to_string(codec::kMaxBareBytes) + ")");
    }
    LX_RETURN_IF_ERROR(SetRawLen(i, &r));
    LX_RETURN_IF_ERROR(CheckRef(i, r));
    return r;
  }

  // The absolute end offset word `w` of record i (in a group of base `base`) gives.
  Result<uint64_t> WordEnd(uint64_t i, uint64_t base, uint32_t w) const {
    if ((w & format::kWordWideBit) == 0) return base + (w & format::kWordRelMask);
    const uint64_t ord = w & format::kWordRelMask;
    if (ord >= wide_.size()) {
      return BadEntry(i, "wide end " + std::to_string(ord) + " out of range (" +
                             std::to_string(wide_.size()) + " wide ends)");
    }
    return wide_[ord];
  }

  // r->raw_len of located record i: dense, from its shape, or (rank 1
  // without a shape table) from its stored bytes or frame header.
  Status SetRawLen(uint64_t i, RecordRef* rp) const {
    RecordRef& r = *rp;
    // Bytes per stored value: what the stored bytes decode to is a multiple of it.
    const uint64_t unit = r.width != 0 ? r.width : meta_.schema.dtype.itemsize;
    if (meta_.schema.kind == Kind::kDense) {
      r.raw_len = item_bytes_;
    } else if (has_shapes_) {
      LX_ASSIGN_OR_RETURN(r.raw_len, RecordBytes(i));
    } else {
      // Rank 1 without a shape table: the length follows from the stored
      // bytes (raw) or the frame header, over the stored value width.
      uint64_t n = r.stored_len;
      if (r.compressed) {
        const uint8_t* src = data_maps_[r.shard].data() + r.offset;
        auto c = r.bare != 0 ? codec::BareContentSize(src, r.stored_len, r.bare)
                             : codec::FrameContentSize(src, r.stored_len, codec::Frames::kCompact);
        if (!c.ok()) {
          return Status::Corruption(files_.label + ": record " + std::to_string(i) + " (" +
                                    format::DataFileName(r.shard) + "): " + c.status().message());
        }
        n = *c;
      }
      if (n % unit != 0) {
        return BadEntry(i, std::string(r.compressed ? "frame content size " : "length ") +
                               std::to_string(n) + " is not a multiple of " +
                               (r.width != 0 ? "the stored width " + std::to_string(r.width)
                                             : std::string("the itemsize")));
      }
      if (format::MulOverflow(n / unit, meta_.schema.dtype.itemsize, &r.raw_len)) {
        return BadEntry(i, "frame content size " + std::to_string(n) + " overflows");
      }
    }
    return Status::OK();
  }

  // Bounds and consistency of a located record, before any data is touched.
  Status CheckRef(uint64_t i, const RecordRef& r) const {
    const uint64_t file_size = data_sizes_[r.shard];
    if (r.offset > file_size || r.stored_len > file_size - r.offset) {
      return BadEntry(i, "extent [" + std::to_string(r.offset) + ", +" +
                             std::to_string(r.stored_len) + ") outside " +
                             format::DataFileName(r.shard) + " (" + std::to_string(file_size) +
                             " bytes)");
    }
    const uint64_t decoded = DecodedLen(r);
    if (!r.compressed && r.stored_len != decoded) {
      return BadEntry(i,
                      "stored length " + std::to_string(r.stored_len) + " != record length " +
                          std::to_string(decoded) +
                          (r.width != 0 ? " (" + std::to_string(r.width) + "-byte values)" : ""));
    }
    if (r.compressed &&
        (r.stored_len == 0 || r.stored_len >= decoded || meta_.codec == Codec::kRaw)) {
      return BadEntry(i, "inconsistent compressed entry");
    }
    return Status::OK();
  }

  // What the stored bytes of a located record decode to: raw_len, or for a
  // narrowed record its values at their stored width.
  uint64_t DecodedLen(const RecordRef& r) const {
    return r.width == 0 ? r.raw_len : r.raw_len / meta_.schema.dtype.itemsize * r.width;
  }

  static uint64_t Cost(const RecordRef& r) {
    return r.compressed ? kFrameCost + r.raw_len * kDecodeCost : r.raw_len;
  }

  Status CheckIndex(uint64_t i) const {
    if (i >= meta_.count) {
      return Status::IndexError("record index " + std::to_string(i) + " out of range for " +
                                files_.label + " (" + std::to_string(meta_.count) + " records)");
    }
    return Status::OK();
  }

  // Format 1.1: every data block against its sum (kept after the index's
  // block table). A mismatch names the lowest record overlapping a bad block.
  Status VerifyDataBlocks() const {
    const uint64_t blk = meta_.data_block;
    std::vector<uint64_t> sums(sums_count_);
    LX_RETURN_IF_ERROR(PReadAll(*env_, files_.index.get(), sums.data(), sums_count_ * 8,
                                sums_offset_, index_.what));
    if (format::Hash64(sums.data(), sums.size() * 8) != meta_.sums_table_xxh3) {
      return Status::Corruption(index_.what + ": data block checksum table mismatch");
    }
    struct Bad {
      uint32_t shard;
      uint64_t from, to;
    };
    std::vector<Bad> bad;
    std::mutex mu;
    uint64_t first_sum = 0;
    for (uint32_t s = 0; s < meta_.data_shards; ++s) {
      const uint64_t size = data_sizes_[s];
      const uint64_t nb = format::NumDataBlocks(size, blk);
      const MappedRegion& m = data_maps_[s];
      ThreadPool::Default().ParallelFor(nb, [&](size_t b) {
        const uint64_t from = b * blk, to = std::min(size, from + blk);
        if (format::Hash64(m.data() + from, to - from) != sums[first_sum + b]) {
          std::lock_guard<std::mutex> lock(mu);
          bad.push_back({s, from, to});
        }
      });
      first_sum += nb;
    }
    if (bad.empty()) return Status::OK();
    // Rare path: name the bad block holding the lowest record, and the
    // records it holds (one of them, or bytes between them, changed).
    const Bad* worst = nullptr;
    uint64_t lo = UINT64_MAX, hi = 0;
    for (uint64_t i = 0; i < meta_.count; ++i) {
      auto r = Locate(i);
      if (!r.ok()) continue;
      for (const Bad& b : bad) {
        if (b.shard != r->shard || r->stored_len == 0 || r->offset >= b.to ||
            r->offset + r->stored_len <= b.from) {
          continue;
        }
        if (worst == nullptr) {
          worst = &b;
          lo = i;
        }
        if (&b == worst) hi = i;
      }
    }
    if (worst == nullptr) worst = &bad[0];
    std::string msg = files_.label + "/" + format::DataFileName(worst->shard) +
                      ": checksum mismatch in bytes " + std::to_string(worst->from) + ".." +
                      std::to_string(worst->to - 1);
    if (lo != UINT64_MAX) {
      msg += " (records " + std::to_string(lo) + ".." + std::to_string(hi) + ")";
    }
    return Status::Corruption(msg);
  }

  Status VerifyTable(const Table& t, const char* name) const {
    for (uint64_t b = 0; b < t.block_sums.size(); ++b) LX_RETURN_IF_ERROR(t.CheckBlock(b));
    if (meta_.layout != format::Layout::kEntries)
      return Status::OK();  // file checked by its blocks
    if (format::Hash64(t.map.data(), t.map.size()) != meta_.files.at(name).xxh3) {
      return Status::Corruption(t.what + ": file checksum mismatch");
    }
    return Status::OK();
  }

  // Copies bytes [from, to) of raw record i into out.
  Status CopyRaw(uint64_t i, const RecordRef& r, uint64_t from, uint64_t to, void* out) const {
    const uint64_t n = to - from;
    if (n >= kPreadBytes) {
      Status st = PReadAll(*env_, files_.data[r.shard].get(), out, n, r.offset + from,
                           data_names_[r.shard]);
      if (!st.ok()) return st.WithContext("record " + std::to_string(i));
      return st;
    }
    if (n > 0) std::memcpy(out, data_maps_[r.shard].data() + r.offset + from, n);
    return Status::OK();
  }

  Status Decode(uint64_t i, const RecordRef& r, void* out) const {
    if (r.width != 0) return DecodeNarrowed(i, r, out);
    if (!r.compressed) return CopyRaw(i, r, 0, r.raw_len, out);
    return DecodeFrame(i, r, out, r.raw_len);
  }

  // A narrowed record (format 1.2): its w-byte values are copied or decoded
  // into a per-thread scratch buffer, then widened into the output.
  Status DecodeNarrowed(uint64_t i, const RecordRef& r, void* out) const {
    const uint64_t decoded = DecodedLen(r);
    thread_local std::vector<uint8_t> scratch;
    std::vector<uint8_t> large;  // above kMaxPreadFrameBytes: freed after the record
    uint8_t* values = nullptr;
    if (decoded > kMaxPreadFrameBytes) {
      large.resize(decoded);
      values = large.data();
    } else {
      if (scratch.size() < decoded) scratch.resize(decoded);
      values = scratch.data();
    }
    if (r.compressed) {
      LX_RETURN_IF_ERROR(DecodeFrame(i, r, values, decoded));
    } else {
      LX_RETURN_IF_ERROR(CopyRaw(i, r, 0, decoded, values));
    }
    narrow::Widen(values, decoded / r.width, meta_.schema.dtype.itemsize,
                  meta_.schema.dtype.kind == 'i', r.width, r.zero_extend,
                  static_cast<uint8_t*>(out));
    return Status::OK();
  }

  // Decodes record i's frame into out, which takes exactly `len` bytes.
  Status DecodeFrame(uint64_t i, const RecordRef& r, void* out, uint64_t len) const {
    const uint8_t* src = data_maps_[r.shard].data() + r.offset;
    if (r.stored_len >= kPreadFrameBytes && r.stored_len <= kMaxPreadFrameBytes) {
      thread_local std::vector<uint8_t> scratch;
      if (scratch.size() < r.stored_len) scratch.resize(r.stored_len);
      Status st = PReadAll(*env_, files_.data[r.shard].get(), scratch.data(), r.stored_len,
                           r.offset, data_names_[r.shard]);
      if (!st.ok()) return st.WithContext("record " + std::to_string(i));
      src = scratch.data();
    }
    // The message names the record only on failure: building it for every
    // record would cost an allocation per small record.
    static const std::string kFrame = "frame";
    size_t n = r.stored_len;
    if (r.bare != 0) {  // format 1.3: rebuild the frame around the bare block
      thread_local std::vector<uint8_t> frame(codec::kMaxBareBytes + codec::kBareFrameExtra);
      codec::RebuildFrame(src, n, r.bare, frame.data());
      src = frame.data();
      n += codec::kBareFrameExtra;
    }
    Status st = codec::Decompress(src, n, dict_.get(), out, len, kFrame, frames_);
    if (st.ok()) return st;
    return st.WithContext(files_.label + ": record " + std::to_string(i));
  }

  Status LoadTable(Table* t, const char* name, int fd, uint64_t rows, uint64_t row_bytes,
                   uint64_t table_xxh3, uint64_t trailer_bytes);
  Status LoadWideEnds();
  Status CheckFileSizes();
  Status LoadTables();
  Status LoadDictionary();
  Status MapDataFiles();
  // "<label>/<name>": a file of the store, as messages name it.
  std::string NameOf(const std::string& name) const { return files_.label + "/" + name; }

  Env* env_ = nullptr;  // not owned (Store::Open: outlives the store)
  StoreFiles files_;
  format::Metadata meta_;
  Table index_, shapes_;
  std::vector<MappedRegion> data_maps_;
  std::vector<uint64_t> data_sizes_;
  std::vector<std::string> data_names_;  // "<label>/data-<s>", for messages
  std::shared_ptr<const codec::ZstdDictionary> dict_;
  uint64_t item_bytes_ = 0;
  uint64_t stored_bytes_ = 0;
  codec::Frames frames_ = codec::Frames::kStandard;
  bool has_shapes_ = false;
  uint64_t sums_offset_ = 0, sums_count_ = 0;  // 1.1: data block sums in `index`
  std::vector<uint64_t> wide_;                 // 1.3 kGroups: the wide ends
  // Why an entry may not carry a width code ("a format 1.1 store", ...), or
  // empty in a 1.2 compressed store of a narrowable dtype.
  std::string width_refusal_;
};

Status StoreImpl::LoadTable(Table* t, const char* name, int fd, uint64_t rows, uint64_t row_bytes,
                            uint64_t table_xxh3, uint64_t trailer_bytes) {
  t->what = files_.label + "/" + name;
  t->rows = rows;
  t->row_bytes = row_bytes;
  const uint64_t blocks = format::NumBlocks(rows);
  uint64_t body;
  bool overflow = false;
  if (row_bytes == 0) {  // kGroups: a row per group, a block per 64 groups
    overflow = rows > (uint64_t{1} << 60);
    body = overflow ? 0 : format::GroupsBodyBytes(rows);
    t->stride = format::kBlockRecords / format::kGroupRecords * format::kGroupRowBytes;
  } else {
    overflow = format::MulOverflow(rows, row_bytes, &body) ||
               format::MulOverflow(row_bytes, format::kBlockRecords, &t->stride);
  }
  t->body = body;
  if (overflow || body + blocks * 8 < body ||
      body + blocks * 8 + trailer_bytes < body + blocks * 8) {
    return Status::Corruption(t->what + ": record count overflows");
  }
  LX_ASSIGN_OR_RETURN(uint64_t size, FileSize(*env_, fd, t->what));
  if (size != body + blocks * 8 + trailer_bytes) {
    return Status::Corruption(t->what + ": size " + std::to_string(size) + " bytes, expected " +
                              std::to_string(body + blocks * 8 + trailer_bytes) +
                              " (truncated or extended)");
  }
  t->block_sums.resize(blocks);
  LX_RETURN_IF_ERROR(PReadAll(*env_, fd, t->block_sums.data(), blocks * 8, body, t->what));
  if (format::Hash64(t->block_sums.data(), blocks * 8) != table_xxh3) {
    return Status::Corruption(t->what + ": block checksum table mismatch");
  }
  t->verified = std::make_unique<VerifiedBits>(blocks);
  auto map = env_->Map(fd, size);
  if (!map.ok()) return map.status().WithContext(t->what);
  t->map = std::move(*map);
  return Status::OK();
}

// Opening a store is Make's steps in order: the metadata, every listed file's
// size (CheckFileSizes), the index and shape tables (LoadTables), the
// dictionary (LoadDictionary), the data mappings (MapDataFiles).
Result<std::shared_ptr<Store>> StoreImpl::Make(StoreFiles files, Env* env) {
  auto s = std::shared_ptr<StoreImpl>(new StoreImpl());
  s->env_ = env;
  s->files_ = std::move(files);
  const std::string& label = s->files_.label;
  if (!s->files_.meta.valid() || !s->files_.index.valid()) {
    return Status::InvalidArgument(label + ": incomplete file set");
  }
  const std::string meta_name = s->NameOf(format::kMetaFile);
  LX_ASSIGN_OR_RETURN(s->meta_, ReadMeta(*env, s->files_.meta.get(), meta_name));
  const format::Metadata& m = s->meta_;
  LX_ASSIGN_OR_RETURN(s->stored_bytes_, FileSize(*env, s->files_.meta.get(), meta_name));
  s->has_shapes_ = format::HasShapeTable(m);
  if (m.minor < format::kNarrowMinor) {
    s->width_refusal_ = "a format 1." + std::to_string(m.minor) + " store";
  } else if (m.codec == Codec::kRaw) {
    s->width_refusal_ = "a raw store";
  } else if (!format::NarrowableDType(m.schema.dtype)) {
    s->width_refusal_ = "a store of dtype '" + m.schema.dtype.str + "'";
  }
  s->frames_ =
      m.layout == format::Layout::kEntries ? codec::Frames::kStandard : codec::Frames::kCompact;
  LX_RETURN_IF_ERROR(s->CheckFileSizes());
  LX_RETURN_IF_ERROR(s->LoadTables());
  if (m.codec == Codec::kZstdDict) LX_RETURN_IF_ERROR(s->LoadDictionary());
  LX_RETURN_IF_ERROR(s->MapDataFiles());
  return std::shared_ptr<Store>(std::move(s));
}

// Every file the metadata lists must be present with exactly its size; adds
// their sizes to stored_bytes_.
Status StoreImpl::CheckFileSizes() {
  const format::Metadata& m = meta_;
  auto check_size = [&](int fd, const std::string& name) -> Status {
    auto it = m.files.find(name);
    if (it == m.files.end()) {
      return Status::Corruption(NameOf(format::kMetaFile) + ": no entry for file '" + name + "'");
    }
    if (fd < 0) return Status::Corruption(NameOf(name) + ": missing");
    LX_ASSIGN_OR_RETURN(uint64_t size, FileSize(*env_, fd, NameOf(name)));
    if (size != it->second.size) {
      return Status::Corruption(NameOf(name) + ": size " + std::to_string(size) +
                                " bytes, expected " + std::to_string(it->second.size) +
                                " (truncated or extended)");
    }
    stored_bytes_ += size;
    return Status::OK();
  };
  if (files_.data.size() != m.data_shards) {
    return Status::Corruption(files_.label + ": " + std::to_string(files_.data.size()) +
                              " data files, metadata says " + std::to_string(m.data_shards));
  }
  LX_RETURN_IF_ERROR(check_size(files_.index.get(), format::kIndexFile));
  if (has_shapes_) LX_RETURN_IF_ERROR(check_size(files_.shapes.get(), format::kShapesFile));
  if (m.codec == Codec::kZstdDict) {
    LX_RETURN_IF_ERROR(check_size(files_.dict.get(), format::kDictFile));
  }
  for (uint32_t i = 0; i < m.data_shards; ++i) {
    LX_RETURN_IF_ERROR(check_size(files_.data[i].get(), format::DataFileName(i)));
  }
  return Status::OK();
}

// The dense record size (checked against nbytes), the computed data file
// sizes, where the data block sums start, then the index and shape tables.
Status StoreImpl::LoadTables() {
  const format::Metadata& m = meta_;
  if (m.schema.kind == Kind::kDense) {
    item_bytes_ = m.schema.DenseItemBytes();
    uint64_t total;
    if (format::MulOverflow(item_bytes_, m.count, &total) || total != m.nbytes) {
      return Status::Corruption(NameOf(format::kMetaFile) + ": nbytes inconsistent with count");
    }
  }
  uint64_t index_rows = m.count, entry_bytes = format::kEntryBytes;
  if (m.layout != format::Layout::kEntries) {
    entry_bytes = m.layout == format::Layout::kGroups ? 0 : format::kEndEntryBytes;
    if (m.layout == format::Layout::kComputed) index_rows = 0;
    for (uint32_t i = 0; i < m.data_shards; ++i) {
      const uint64_t size = m.files.at(format::DataFileName(i)).size;
      if (m.layout == format::Layout::kComputed) {
        const uint64_t want =
            format::ComputedShardBytes(m.count, m.run_records, m.data_shards, i, item_bytes_);
        if (size != want) {
          return Status::Corruption(NameOf(format::DataFileName(i)) + ": size " +
                                    std::to_string(size) + " bytes, expected " +
                                    std::to_string(want) + " for " + std::to_string(m.count) +
                                    " records");
        }
      }
      sums_count_ += format::NumDataBlocks(size, m.data_block);
    }
    sums_offset_ =
        (entry_bytes == 0 ? format::GroupsBodyBytes(index_rows) : index_rows * entry_bytes) +
        format::NumBlocks(index_rows) * 8 + m.wide_ends * 8;
  }
  LX_RETURN_IF_ERROR(LoadTable(&index_, format::kIndexFile, files_.index.get(), index_rows,
                               entry_bytes, m.index_table_xxh3, (m.wide_ends + sums_count_) * 8));
  if (m.layout == format::Layout::kGroups) LX_RETURN_IF_ERROR(LoadWideEnds());
  if (has_shapes_) {
    LX_RETURN_IF_ERROR(LoadTable(&shapes_, format::kShapesFile, files_.shapes.get(), m.count,
                                 uint64_t{m.schema.ndim} * 8, m.shapes_table_xxh3, 0));
  }
  return Status::OK();
}

// Format 1.3 kGroups: the wide ends (between the index's block table and the
// data block sums), read and checked against wide_xxh3 at open.
Status StoreImpl::LoadWideEnds() {
  const uint64_t n = meta_.wide_ends;
  wide_.resize(n);
  LX_RETURN_IF_ERROR(
      PReadAll(*env_, files_.index.get(), wide_.data(), n * 8, sums_offset_ - n * 8, index_.what));
  if (format::Hash64(wide_.data(), n * 8) != meta_.wide_xxh3) {
    return Status::Corruption(index_.what + ": wide end table mismatch");
  }
  return Status::OK();
}

// The zstd_dict store's dictionary, checked against its checksum and id.
Status StoreImpl::LoadDictionary() {
  const format::Metadata& m = meta_;
  const std::string what = NameOf(format::kDictFile);
  const format::FileInfo& info = m.files.at(format::kDictFile);
  LX_ASSIGN_OR_RETURN(std::string bytes, ReadWhole(*env_, files_.dict.get(), info.size, what));
  if (format::Hash64(bytes.data(), bytes.size()) != info.xxh3) {
    return Status::Corruption(what + ": checksum mismatch");
  }
  auto d = codec::ZstdDictionary::Create(std::move(bytes), m.level);
  if (!d.ok()) return Status::Corruption(what + ": " + d.status().message());
  if ((*d)->id() != m.dict_id) {
    return Status::Corruption(what + ": dictionary id " + std::to_string((*d)->id()) +
                              " != metadata dict_id " + std::to_string(m.dict_id));
  }
  dict_ = std::move(*d);
  return Status::OK();
}

// Maps every data file, with huge pages for those of a store that fits in
// RAM (huge_pages.h: the rule and why it is enough).
Status StoreImpl::MapDataFiles() {
  const format::Metadata& m = meta_;
  uint64_t data_bytes = 0;
  for (uint32_t i = 0; i < m.data_shards; ++i)
    data_bytes += m.files.at(format::DataFileName(i)).size;
  uint64_t mem_available = 0;
  if (data_bytes >= hugepages::kBytes) {
    auto avail = hugepages::MemAvailableBytes();
    if (avail.ok()) mem_available = *avail;  // unknown: advise nothing
  }
  for (uint32_t i = 0; i < m.data_shards; ++i) {
    const uint64_t size = m.files.at(format::DataFileName(i)).size;
    data_sizes_.push_back(size);
    data_names_.push_back(NameOf(format::DataFileName(i)));
    auto r = env_->Map(files_.data[i].get(), size);
    if (!r.ok()) return r.status().WithContext(data_names_.back());
    // A hint: a kernel without THP refuses it (EINVAL) and reads as before.
    if (hugepages::ShouldAdvise(size, data_bytes, mem_available)) (void)r->AdviseHugePages();
    data_maps_.push_back(std::move(*r));
  }
  return Status::OK();
}

Result<UniqueFd> OpenPart(Env& env, const std::string& dir, const std::string& name) {
  auto fd = env.Open(dir + "/" + name, O_RDONLY, 0);
  if (!fd.ok() && fd.status().code() == Status::Code::kNotFound) {
    return Status::Corruption(dir + "/" + name + ": missing");
  }
  return fd;
}

}  // namespace

Result<StoreFiles> Store::OpenFileSet(const std::string& path, Env* env_or_null) {
  Env& env = env_or_null != nullptr ? *env_or_null : *Env::Default();
  struct stat st;
  Status found = env.StatPath(path, /*follow=*/true, &st);
  if (found.code() == Status::Code::kNotFound) return Status::NotFound(path + ": no such store");
  LX_RETURN_IF_ERROR(found);
  if (!S_ISDIR(st.st_mode)) {
    return Status::Corruption(path + ": not a Zrecord store (not a directory)");
  }
  StoreFiles f;
  f.label = path;
  auto meta = OpenPart(env, path, format::kMetaFile);
  if (!meta.ok()) {
    if (meta.status().code() == Status::Code::kCorruption) {
      return Status::Corruption(path + ": not a Zrecord store (no metadata file)");
    }
    return meta.status();
  }
  f.meta = std::move(*meta);
  LX_ASSIGN_OR_RETURN(format::Metadata m,
                      ReadMeta(env, f.meta.get(), path + "/" + format::kMetaFile));
  LX_ASSIGN_OR_RETURN(f.index, OpenPart(env, path, format::kIndexFile));
  if (format::HasShapeTable(m)) {
    LX_ASSIGN_OR_RETURN(f.shapes, OpenPart(env, path, format::kShapesFile));
  }
  if (m.codec == Codec::kZstdDict) {
    LX_ASSIGN_OR_RETURN(f.dict, OpenPart(env, path, format::kDictFile));
  }
  for (uint32_t i = 0; i < m.data_shards; ++i) {
    LX_ASSIGN_OR_RETURN(UniqueFd fd, OpenPart(env, path, format::DataFileName(i)));
    f.data.push_back(std::move(fd));
  }
  return f;
}

Result<std::shared_ptr<Store>> Store::FromFiles(StoreFiles files, Env* env) {
  return StoreImpl::Make(std::move(files), env != nullptr ? env : Env::Default());
}

Result<std::shared_ptr<Store>> Store::Open(const std::string& path, Env* env) {
  LX_ASSIGN_OR_RETURN(StoreFiles f, OpenFileSet(path, env));
  return FromFiles(std::move(f), env);
}

}  // namespace loaderx
