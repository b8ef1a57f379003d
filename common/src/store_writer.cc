// StoreWriter: builds a Zrecord store in a hidden sibling directory and
// publishes it with one atomic rename (docs/format.md, "Writing").
#include <fcntl.h>
#include <sys/stat.h>
#if defined(_WIN32)
#include <process.h>
#else
#include <signal.h>
#include <sys/uio.h>
#include <unistd.h>
#endif

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <random>

#include "codec.h"
#include "format.h"
#include "huge_pages.h"
#include "loaderx/env.h"
#include "loaderx/store.h"
#include "loaderx/thread_pool.h"
#include "narrow.h"
#include "xxh.h"

namespace loaderx {
namespace {

namespace fs = std::filesystem;

// A run is R consecutive records, R chosen so a run holds about kRunBytes of
// input; runs go to the shards round-robin (docs/format.md, placement), so a
// gather of neighbours touches every shard and a run is one contiguous write.
constexpr uint64_t kRunBytes = uint64_t{256} << 10;
// Record caps, so tiny (or zero-byte) records cannot blow up the per-round
// index entries that the byte caps (kRunBytes, WriteOptions::chunk_bytes) do
// not see; kRunMaxRecords also caps
// R, the records per run.
constexpr uint64_t kRunMaxRecords = uint64_t{16} << 10;
constexpr uint64_t kChunkMaxRecords = uint64_t{1} << 20;
// Raw records that are neighbours in memory and together at least this large
// (or one record this large) are written from the caller's buffer (their own
// span); smaller scattered ones are copied together first.
constexpr uint64_t kDirectBytes = uint64_t{64} << 10;

class HashState {
 public:
  HashState() : s_(XXH3_createState()) { XXH3_64bits_reset(s_); }
  ~HashState() { XXH3_freeState(s_); }
  HashState(const HashState&) = delete;
  HashState& operator=(const HashState&) = delete;
  void Update(const void* p, size_t n) { XXH3_64bits_update(s_, p, n); }
  uint64_t Digest() const { return XXH3_64bits_digest(s_); }
  void CopyFrom(const HashState& o) { XXH3_copyState(s_, o.s_); }
  void Reset() { XXH3_64bits_reset(s_); }

 private:
  XXH3_state_t* s_;
};

// A span of bytes to append: (pointer, length).
using Span = std::pair<const uint8_t*, uint64_t>;

// A file written front to back, with a running XXH3 of its content, or (data
// files) XXH3s of its kDataBlockBytes blocks instead: one hash pass either way.
//
// Data files are written in whole huge pages (WriteOptions::huge_page_writes,
// docs/format.md, Writing): every
// write covers whole kHugePageBytes-aligned ranges of the file, except the
// final tail, written when the file is synced. The kernel keeps the page
// cache of such writes in 2 MiB folios (ext4, xfs with large folios), which
// a reader's mapping then maps with 2 MiB pages: one TLB entry where 512 were.
// A write is a pwritev of the staged head (the bytes after the last aligned
// boundary, held in one kHugePageBytes buffer) and the caller's spans up to
// the last boundary they reach; only what lies past that boundary is copied
// into the staging buffer, so large raw inputs go to the kernel uncopied.
class SeqFile {
 public:
  // `block_sums`: a data file (block checksums); `aligned`: written in
  // whole huge pages (data files, WriteOptions::huge_page_writes).
  Status Open(Env* env, const std::string& path, bool block_sums = false, bool aligned = false) {
    env_ = env;
    path_ = path;
    block_sums_ = block_sums;
    aligned_ = aligned;
    // Read-write: Rewind reads back the head of a huge page it must restage.
    LX_ASSIGN_OR_RETURN(fd_,
                        env->Open(path, (aligned_ ? O_RDWR : O_WRONLY) | O_CREAT | O_EXCL, 0644));
    return Status::OK();
  }
  // Closes the file (an aborted writer's, before its removal).
  void Close() { fd_.Reset(); }
  Status Append(const void* p, uint64_t n) {
    const Span s{static_cast<const uint8_t*>(p), n};
    return AppendSpans(&s, 1);
  }
  // Appends the spans in order. They are only read during the call.
  Status AppendSpans(const Span* spans, size_t count) {
    for (size_t k = 0; k < count; ++k) {
      if (block_sums_) {
        HashBlocks(spans[k].first, spans[k].second);
      } else {
        hash_.Update(spans[k].first, spans[k].second);
      }
    }
    if (aligned_) return WriteAligned(spans, count);
    for (size_t k = 0; k < count; ++k) {
      const auto [p, n] = spans[k];
      // PWriteAll takes size_t; uint64 == size_t on the 64-bit hosts we support.
      LX_RETURN_IF_ERROR(PWriteAll(*env_, fd_.get(), p, n, size_, path_));
      size_ += n;
      written_ = size_;
      Writeback();
    }
    return Status::OK();
  }
  // The state Rewind returns to.
  struct Mark {
    uint64_t size = 0, fill = 0;
    size_t sums = 0;
    std::shared_ptr<HashState> hash;
  };
  Mark Here() const {
    Mark m{size_, fill_, sums_.size(), std::make_shared<HashState>()};
    m.hash->CopyFrom(block_sums_ ? block_ : hash_);
    return m;
  }
  // Forgets everything appended after `m`.
  Status Rewind(const Mark& m) {
    if (!aligned_) {
      Status st = env_->Truncate(fd_.get(), m.size);
      if (!st.ok()) return st.WithContext(path_);
      written_ = m.size;
    } else if (m.size >= written_) {
      // Nothing was written since `m`: the staged bytes before it are as they were.
      staged_ = m.size - written_;
    } else {
      // The head of `m`'s huge page went to the file with what followed it:
      // read it back into the staging buffer, drop the file from that
      // boundary on, so the next write starts aligned again.
      const uint64_t boundary = m.size / kHugePageBytes * kHugePageBytes;
      staged_ = m.size - boundary;
      if (staged_ > 0) {
        LX_RETURN_IF_ERROR(
            PReadAll(*env_, fd_.get(), Staging(), staged_, boundary, path_ + ": restaging"));
      }
      Status st = env_->Truncate(fd_.get(), boundary);
      if (!st.ok()) return st.WithContext(path_);
      written_ = boundary;
    }
    size_ = m.size;
    started_ = std::min(started_, written_);
    fill_ = m.fill;
    sums_.resize(m.sums);
    (block_sums_ ? block_ : hash_).CopyFrom(*m.hash);
    return Status::OK();
  }
  // Closes the last, partial data block (block-summed files; before Info()).
  void FinishBlocks() {
    if (block_sums_ && fill_ > 0) {
      sums_.push_back(block_.Digest());
      fill_ = 0;
    }
  }
  // Writes the staged tail, then fdatasync: the content and the size (what a
  // reader needs) are made durable; timestamps are not waited for.
  Status Sync() {
    FinishBlocks();
    if (staged_ > 0) {
      const struct iovec tail { Staging(), staged_ };
      LX_RETURN_IF_ERROR(PWriteVAll(*env_, fd_.get(), &tail, 1, written_, path_));
      written_ += staged_;
      staged_ = 0;
    }
    staging_.reset();
    Status st = env_->DataSync(fd_.get());
    if (!st.ok()) return st.WithContext(path_);
    return Status::OK();
  }
  uint64_t size() const { return size_; }
  // Whole-file XXH3; for block-summed files the XXH3 of the block sums.
  format::FileInfo Info() const {
    if (block_sums_) return {size_, format::Hash64(sums_.data(), sums_.size() * 8)};
    return {size_, hash_.Digest()};
  }
  const std::vector<uint64_t>& block_sums() const { return sums_; }

 private:
  // Small enough that the final fdatasync finds little not yet on its way
  // (at most this much per file, or one huge page); each hint is one cheap
  // syscall.
  static constexpr uint64_t kWritebackBytes = uint64_t{1} << 20;
  static constexpr uint64_t kHugePageBytes = hugepages::kBytes;
  // One pwritev writes at most this much, so a write the kernel caps
  // (0x7ffff000 bytes) never ends off a boundary, and writeback starts often.
  static constexpr uint64_t kMaxWriteBytes = uint64_t{64} << 20;
  // Buffers in one pwritev (IOV_MAX is 1024): when more spans than this
  // are pending below a boundary, they are copied into the staging buffer.
  static constexpr size_t kMaxIov = 256;
  static_assert(kMaxWriteBytes % kHugePageBytes == 0);

  uint8_t* Staging() {
    if (!staging_) staging_ = std::make_unique_for_overwrite<uint8_t[]>(kHugePageBytes);
    return staging_.get();
  }

  // Invariants: written_ (the file's size) is a multiple of kHugePageBytes;
  // the staging buffer holds the staged_ < kHugePageBytes bytes after it.
  Status WriteAligned(const Span* spans, size_t count) {
    std::vector<struct iovec> iov;  // the bytes from written_ on, not yet written
    uint64_t pending = staged_;
    if (staged_ > 0) iov.push_back({staging_.get(), staged_});
    for (size_t k = 0; k < count; ++k) {
      if (spans[k].second == 0) continue;
      iov.push_back({const_cast<uint8_t*>(spans[k].first), spans[k].second});
      pending += spans[k].second;
      while (pending >= kHugePageBytes) {
        // The longest whole-huge-page prefix (capped): a prefix of the list,
        // its last buffer perhaps cut.
        const uint64_t want = std::min(pending / kHugePageBytes * kHugePageBytes, kMaxWriteBytes);
        size_t used = 0;
        uint64_t got = 0;
        while (used < iov.size() && got + iov[used].iov_len <= want) got += iov[used++].iov_len;
        std::vector<struct iovec> head(iov.begin(), iov.begin() + static_cast<ptrdiff_t>(used));
        const uint64_t cut = want - got;
        if (cut > 0) head.push_back({iov[used].iov_base, cut});
        LX_RETURN_IF_ERROR(PWriteVAll(*env_, fd_.get(), head.data(), static_cast<int>(head.size()),
                                      written_, path_));
        iov.erase(iov.begin(), iov.begin() + static_cast<ptrdiff_t>(used));
        if (cut > 0) {
          iov[0].iov_base = static_cast<uint8_t*>(iov[0].iov_base) + cut;
          iov[0].iov_len -= cut;
        }
        written_ += want;
        pending -= want;
        staged_ = 0;  // the staging buffer, if it was in the list, went first
        Writeback();
      }
      if (iov.size() >= kMaxIov) Restage(&iov);
    }
    Restage(&iov);
    size_ = written_ + staged_;
    return Status::OK();
  }

  // Copies the pending bytes of `iov` that are not in the staging buffer
  // into it, after those that are (they total less than kHugePageBytes).
  void Restage(std::vector<struct iovec>* iov) {
    if (iov->empty()) return;
    uint8_t* const buf = Staging();
    size_t k = 0;
    uint64_t at = 0;
    if ((*iov)[0].iov_base == buf) at = (*iov)[k++].iov_len;
    for (; k < iov->size(); ++k) {
      std::memcpy(buf + at, (*iov)[k].iov_base, (*iov)[k].iov_len);
      at += (*iov)[k].iov_len;
    }
    staged_ = at;
    iov->assign(1, {buf, at});
  }

  // Starts writeback of what is written so far without waiting for it, so the
  // final fsync finds most pages already on their way (docs/format.md, Writing).
  void Writeback() {
    if (written_ - started_ >= kWritebackBytes) {
      env_->StartWriteback(fd_.get(), started_, written_ - started_);
      started_ = written_;
    }
  }

  void HashBlocks(const uint8_t* p, uint64_t n) {
    while (n > 0) {
      if (fill_ == 0) block_.Reset();
      const uint64_t take = std::min(n, format::kDataBlockBytes - fill_);
      block_.Update(p, take);
      fill_ += take;
      p += take;
      n -= take;
      if (fill_ == format::kDataBlockBytes) {
        sums_.push_back(block_.Digest());
        fill_ = 0;
      }
    }
  }

  Env* env_ = nullptr;
  std::string path_;
  UniqueFd fd_;
  // size_: bytes appended; written_: bytes in the file; started_: bytes
  // whose writeback was started.
  uint64_t size_ = 0, written_ = 0, started_ = 0;
  bool block_sums_ = false, aligned_ = false;
  HashState hash_, block_;
  uint64_t fill_ = 0;                   // bytes in the current data block
  std::vector<uint64_t> sums_;          // finished data blocks
  std::unique_ptr<uint8_t[]> staging_;  // aligned files: allocated when first needed
  uint64_t staged_ = 0;                 // bytes in it, file bytes [written_, size_)
};

// Fixed-width rows checksummed per kBlockRecords rows; the table of block
// checksums is appended when finished.
class BlockedTableWriter {
 public:
  explicit BlockedTableWriter(size_t row_bytes) : row_bytes_(row_bytes) {}
  // Rows of another size, rows_per_block of them checksummed together; only
  // before the first row.
  void Reshape(size_t row_bytes, uint64_t rows_per_block) {
    row_bytes_ = row_bytes;
    rows_per_block_ = rows_per_block;
  }
  // A last row shorter than the others (the kGroups layout's last group);
  // nothing may be appended after it but Finish.
  void AppendShortRow(const void* row, size_t bytes) {
    block_.append(static_cast<const char*>(row), bytes);
    ++rows_in_block_;
  }
  Status Open(Env* env, const std::string& path) { return file_.Open(env, path); }
  Status AppendRows(const void* rows, uint64_t n) {
    const uint8_t* p = static_cast<const uint8_t*>(rows);
    while (n > 0) {
      const uint64_t take = std::min(n, rows_per_block_ - rows_in_block_);
      block_.append(reinterpret_cast<const char*>(p), take * row_bytes_);
      rows_in_block_ += take;
      p += take * row_bytes_;
      n -= take;
      if (rows_in_block_ == rows_per_block_) LX_RETURN_IF_ERROR(FlushBlock());
    }
    return Status::OK();
  }
  // Appends the block table, then `trailer` (the index: data block sums).
  Status Finish(uint64_t* table_xxh3, const std::vector<uint64_t>& trailer = {}) {
    if (rows_in_block_ > 0) LX_RETURN_IF_ERROR(FlushBlock());
    const uint64_t table_bytes = block_hashes_.size() * 8;
    *table_xxh3 = format::Hash64(block_hashes_.data(), table_bytes);
    LX_RETURN_IF_ERROR(file_.Append(block_hashes_.data(), table_bytes));
    if (!trailer.empty()) LX_RETURN_IF_ERROR(file_.Append(trailer.data(), trailer.size() * 8));
    return Status::OK();  // the caller syncs it, with the data files
  }
  format::FileInfo Info() const { return file_.Info(); }
  SeqFile& file() { return file_; }

 private:
  Status FlushBlock() {
    block_hashes_.push_back(format::Hash64(block_.data(), block_.size()));
    LX_RETURN_IF_ERROR(file_.Append(block_.data(), block_.size()));
    block_.clear();
    rows_in_block_ = 0;
    return Status::OK();
  }
  size_t row_bytes_;
  uint64_t rows_per_block_ = format::kBlockRecords;
  SeqFile file_;
  std::string block_;
  uint64_t rows_in_block_ = 0;
  std::vector<uint64_t> block_hashes_;
};

// Bytes of one piece's output. Reserve keeps the allocation when it is large
// enough: a writer reuses its pieces' buffers from round to round, since
// fresh ones cost page faults on every write into them (the allocator hands
// freed buffers of this size back to the kernel).
struct Buffer {
  std::unique_ptr<uint8_t[]> data;
  uint64_t size = 0;
  uint64_t capacity = 0;

  // At least n bytes at data, size 0.
  uint8_t* Reserve(uint64_t n) {
    if (capacity < n) {
      data = std::make_unique_for_overwrite<uint8_t[]>(n);
      capacity = n;
    }
    size = 0;
    return data.get();
  }
};

// One task run by a pool worker beside the caller, or by the caller itself
// when it needs the result and no worker has taken the task yet: a writer
// called from a pool worker, every other worker busy, cannot deadlock on it.
// At most one task at a time; the destructor waits for it. Thread-safety:
// Start and Wait from one thread (the owner); the task runs on one thread.
class BackgroundTask {
 public:
  BackgroundTask() = default;
  BackgroundTask(const BackgroundTask&) = delete;
  BackgroundTask& operator=(const BackgroundTask&) = delete;
  ~BackgroundTask() { (void)Wait(); }

  // REQUIRES: no task pending (Wait returned since the last Start).
  void Start(ThreadPool* pool, std::function<Status()> fn) {
    state_ = std::make_shared<State>();
    state_->fn = std::move(fn);
    pool->Submit([s = state_] {
      {
        std::lock_guard<std::mutex> lock(s->mu);
        if (s->claimed) return;  // the owner ran it: fn may reference gone objects
        s->claimed = true;
      }
      Status st = s->fn();
      {
        std::lock_guard<std::mutex> lock(s->mu);
        s->st = std::move(st);
        s->done = true;
      }
      s->cv.notify_all();
    });
  }

  // The pending task's Status, once it has run (here, if no worker took
  // it); OK when none is pending.
  Status Wait() {
    if (!state_) return Status::OK();
    const std::shared_ptr<State> s = std::move(state_);
    std::unique_lock<std::mutex> lock(s->mu);
    if (!s->claimed) {
      s->claimed = true;
      lock.unlock();
      return s->fn();
    }
    s->cv.wait(lock, [&] { return s->done; });
    return s->st;
  }

 private:
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    bool claimed = false, done = false;  // guarded by mu
    Status st;                           // guarded by mu
    std::function<Status()> fn;          // run by whoever claimed it
  };
  std::shared_ptr<State> state_;
};

class StoreWriterImpl final : public StoreWriter {
 public:
  StoreWriterImpl(std::string path, std::string parent, std::string tmp, UniqueFd tmp_lock,
                  Schema schema, WriteOptions opt)
      : path_(std::move(path)),
        parent_(std::move(parent)),
        tmp_(std::move(tmp)),
        tmp_lock_(std::move(tmp_lock)),
        schema_(std::move(schema)),
        opt_(std::move(opt)),
        env_(opt_.env != nullptr ? opt_.env : Env::Default()),
        pool_(opt_.pool != nullptr ? opt_.pool : &ThreadPool::Default()),
        layout_(schema_.kind == Kind::kDense && opt_.codec == Codec::kRaw
                    ? format::Layout::kComputed
                    : format::Layout::kEnds),
        shape_table_(schema_.kind == Kind::kRagged && schema_.ndim > 1),
        narrow_(opt_.narrow_integers && opt_.codec != Codec::kRaw &&
                format::NarrowableDType(schema_.dtype)),
        index_(format::kEndEntryBytes),
        shapes_(schema_.kind == Kind::kRagged ? schema_.ndim * 8 : 8) {}

  ~StoreWriterImpl() override {
    if (!published_) Abort();
  }

  Status Init() {
    if (opt_.codec == Codec::kZstdDict) {
      LX_ASSIGN_OR_RETURN(dict_, codec::ZstdDictionary::Create(opt_.dictionary, opt_.level));
      SeqFile f;
      LX_RETURN_IF_ERROR(f.Open(env_, File(format::kDictFile)));
      LX_RETURN_IF_ERROR(f.Append(dict_->bytes().data(), dict_->bytes().size()));
      LX_RETURN_IF_ERROR(f.Sync());
      dict_info_ = f.Info();
    }
    LX_RETURN_IF_ERROR(index_.Open(env_, File(format::kIndexFile)));
    if (shape_table_) LX_RETURN_IF_ERROR(shapes_.Open(env_, File(format::kShapesFile)));
    for (uint32_t s = 0; s < opt_.data_shards; ++s) {
      shards_.push_back(std::make_unique<SeqFile>());
      LX_RETURN_IF_ERROR(shards_.back()->Open(env_, File(format::DataFileName(s)),
                                              /*block_sums=*/true,
                                              /*aligned=*/opt_.huge_page_writes));
    }
    return Status::OK();
  }

  Status AppendDense(const void* data, uint64_t n) override {
    LX_RETURN_IF_ERROR(CheckWritable());
    if (schema_.kind != Kind::kDense) {
      return Status::SchemaError(path_ + ": AppendDense on a ragged store");
    }
    const uint64_t item = schema_.DenseItemBytes();
    uint64_t total;
    if (format::MulOverflow(item, n, &total))
      return Status::InvalidArgument("record count overflows");
    return Guard(
        WriteRecords({static_cast<const uint8_t*>(data), n, nullptr, item, nullptr, nullptr}));
  }

  Status AppendRagged(const void* data, const uint64_t* shapes, uint64_t count) override {
    LX_RETURN_IF_ERROR(CheckWritable());
    LX_ASSIGN_OR_RETURN(std::vector<uint64_t> lens, RaggedLens("AppendRagged", shapes, count));
    return Guard(
        WriteRecords({static_cast<const uint8_t*>(data), count, lens.data(), 0, shapes, nullptr}));
  }

  Status AppendRaggedRecords(const void* const* records, const uint64_t* shapes,
                             uint64_t count) override {
    LX_RETURN_IF_ERROR(CheckWritable());
    LX_ASSIGN_OR_RETURN(std::vector<uint64_t> lens,
                        RaggedLens("AppendRaggedRecords", shapes, count));
    return Guard(WriteRecords({nullptr, count, lens.data(), 0, shapes,
                               reinterpret_cast<const uint8_t* const*>(records)}));
  }

  Status Publish() override {
    LX_RETURN_IF_ERROR(CheckWritable());
    ReleaseRounds();
    Status st = DoPublish();
    if (!st.ok()) {
      Abort();  // no-op once the rename happened
      return st;
    }
    published_ = true;
    return Status::OK();
  }

  void Abort() override {
    if (published_ || aborted_) return;
    aborted_ = true;
    ReleaseRounds();
    shards_.clear();
#if defined(_WIN32)
    // Windows removes no file or directory while a handle names it (a
    // deleted file stays listed until closed): close them all first.
    index_.file().Close();
    shapes_.file().Close();
    tmp_lock_.Reset();
#endif
    (void)RemoveTree(*env_, tmp_);  // best effort: nothing to report to
  }

  uint64_t size() const override { return count_; }
  const Schema& schema() const override { return schema_; }

 private:
  std::string File(const std::string& name) const { return tmp_ + "/" + name; }

  Status CheckWritable() const {
    if (published_) return Status::State(path_ + ": store already published (closed)");
    if (aborted_) return Status::State(path_ + ": store was discarded");
    if (failed_) {
      return Status::State(path_ +
                           ": a previous append failed part-way; the store cannot be "
                           "published");
    }
    return Status::OK();
  }

  Status Guard(Status st) {
    if (!st.ok()) failed_ = true;
    return st;
  }

  // The byte length of each ragged record, from its shape.
  Result<std::vector<uint64_t>> RaggedLens(const char* what, const uint64_t* shapes,
                                           uint64_t count) const {
    if (schema_.kind != Kind::kRagged) {
      return Status::SchemaError(path_ + ": " + what + " on a dense store");
    }
    std::vector<uint64_t> lens(count);
    for (uint64_t k = 0; k < count; ++k) {
      uint64_t b = schema_.dtype.itemsize;
      for (uint32_t d = 0; d < schema_.ndim; ++d) {
        if (format::MulOverflow(b, shapes[k * schema_.ndim + d], &b)) {
          return Status::InvalidArgument("record " + std::to_string(k) + ": shape overflows");
        }
      }
      lens[k] = b;
    }
    return lens;
  }

  uint64_t Len(const uint64_t* lens, uint64_t uniform, uint64_t k) const {
    return lens != nullptr ? lens[k] : uniform;
  }

  // R, fixed by the first records: runs of about kRunBytes of input.
  void ChooseRunRecords(const uint64_t* lens, uint64_t uniform, uint64_t count) {
    uint64_t mean = uniform;
    if (lens != nullptr) {
      const uint64_t m = std::min<uint64_t>(count, 4096);
      uint64_t sum = 0;
      for (uint64_t k = 0; k < m; ++k) sum += std::min(lens[k], kRunBytes);
      mean = sum / m;
    }
    run_records_ = std::clamp<uint64_t>(kRunBytes / std::max<uint64_t>(mean, 1), 1, kRunMaxRecords);
    // Format 1.3: a store that narrows, of records small enough for runs of
    // at least one group, gets the "groups" index (runs a multiple of groups).
    if (narrow_ && opt_.group_index && run_records_ >= format::kGroupRecords) {
      run_records_ -= run_records_ % format::kGroupRecords;
      layout_ = format::Layout::kGroups;
      index_.Reshape(format::kGroupRowBytes, format::kBlockRecords / format::kGroupRecords);
      shard_end_.assign(opt_.data_shards, 0);
    }
  }

  // Appends the index entries of records count_ .. count_ + n - 1, in record
  // order: `ends` are their end offsets in their shard files (kEnds: with
  // the compressed and width bits), `marks` (kGroups) their word's bits
  // 26..30.
  Status AppendEntries(const uint64_t* ends, const uint32_t* marks, uint64_t n) {
    if (layout_ == format::Layout::kEnds) return index_.AppendRows(ends, n);
    for (uint64_t j = 0; j < n; ++j) {
      const uint64_t k = count_ + j;
      const uint32_t s = ShardOf(k);
      const uint64_t pos = k % format::kGroupRecords;
      if (pos == 0) std::memcpy(group_row_, &shard_end_[s], 8);  // the group's base
      uint64_t base;
      std::memcpy(&base, group_row_, 8);
      const uint64_t rel = ends[j] - base;
      uint32_t word = marks[j];
      if (rel <= format::kWordRelMask) {
        word |= static_cast<uint32_t>(rel);
      } else {
        if (wide_.size() > format::kWordRelMask) {
          return Status::ResourceExhausted(path_ + "/" + format::kIndexFile + ": more than 2^26 " +
                                           "records end too far from their group's start");
        }
        word |= format::kWordWideBit | static_cast<uint32_t>(wide_.size());
        wide_.push_back(ends[j]);
      }
      std::memcpy(group_row_ + 8 + pos * 4, &word, 4);
      shard_end_[s] = ends[j];
      if (pos + 1 == format::kGroupRecords) LX_RETURN_IF_ERROR(index_.AppendRows(group_row_, 1));
    }
    return Status::OK();
  }

  // Frees the rounds' output buffers: nothing is appended after a publish or an abort.
  void ReleaseRounds() {
    for (Round& r : rounds_) r = Round{};
  }

  uint32_t ShardOf(uint64_t k) const { return format::RunShard(k, run_records_, opt_.data_shards); }

  // The spans a raw piece of records [first, end) at `ptrs` is written as:
  // records that are neighbours in memory (views of one array) form a group,
  // and a group of at least kDirectBytes (a large record alone, or a run of
  // small neighbours) goes as one span straight from the caller's buffer; the
  // small scattered rest is copied into `buf` (reserved once per piece:
  // spans keep pointing into it), on the pool thread, so a shard still writes
  // few, large pieces. Zero-length records are skipped (their pointer means
  // nothing).
  static void RawSpans(const uint8_t* const* ptrs, const uint64_t* lens, uint64_t first,
                       uint64_t end, uint64_t piece_bytes, Buffer* buf, std::vector<Span>* spans) {
    bool last_copied = false, reserved = false;
    uint64_t k = first;
    while (k < end) {
      if (lens[k] == 0) {
        ++k;
        continue;
      }
      const uint8_t* src = ptrs[k];
      uint64_t len = lens[k];
      for (++k; k < end && (lens[k] == 0 || ptrs[k] == src + len); ++k) len += lens[k];
      if (len >= kDirectBytes) {
        spans->emplace_back(src, len);
        last_copied = false;
        continue;
      }
      if (!reserved) {
        buf->Reserve(piece_bytes);
        reserved = true;
      }
      std::memcpy(buf->data.get() + buf->size, src, len);
      if (last_copied) {
        spans->back().second += len;
      } else {
        spans->emplace_back(buf->data.get() + buf->size, len);
      }
      buf->size += len;
      last_copied = true;
    }
  }

  // The records of one append: `data` (records back to back) or, when `ptrs`
  // is set, record k at ptrs[k] (`data` unused); record k is Len(k) bytes
  // (lens[k], or `uniform` when lens is null); `shapes`: ndim per record.
  struct Input {
    const uint8_t* data;
    uint64_t count;
    const uint64_t* lens;
    uint64_t uniform;
    const uint64_t* shapes;
    const uint8_t* const* ptrs;
    uint64_t Len(uint64_t k) const { return lens != nullptr ? lens[k] : uniform; }
  };

  // Consecutive records [first, end) of one run within one chunk; `in_off`:
  // the first one's offset in Input::data; `bytes`: their input size.
  struct Piece {
    uint64_t first, end, in_off, bytes;
    uint32_t shard;
  };
  // A piece ready to append.
  struct PieceOut {
    Buffer buf;
    // What the shard appends, in order: (pointer, bytes) spans.
    std::vector<Span> spans;
    std::vector<uint64_t> ends;   // kEnds entries, relative to the piece's start
    std::vector<uint32_t> marks;  // kGroups: each record's word bits 26..30
    Status st;
  };
  // One chunk: its pieces and, once compressed, their output: outs[i] for
  // pieces[i]; outs beyond the pieces keep their buffers for later rounds.
  struct Round {
    std::vector<Piece> pieces;
    std::vector<PieceOut> outs;
  };

  // Records are cut into chunks of at most WriteOptions::chunk_bytes of input
  // and chunks into pieces (CutChunk). A chunk's pieces are compressed in
  // parallel (CompressRound), then each shard appends its pieces in order,
  // shards in parallel (WriteRound). The two stages overlap: chunk k is
  // written by one pool task while chunk k+1 is compressed, so the writer
  // holds the output of at most two chunks (docs/format.md, Writing). Every
  // write completes before the next one starts and before this returns, so
  // the bytes and their order are those of compressing and writing each chunk
  // in turn. A run cut by a chunk (or an append) boundary goes on in the next
  // one: its shard file has received nothing else meanwhile. On an error,
  // the first in record order is returned, after every task has finished.
  // The two rounds are the writer's (rounds_), so their output buffers serve
  // every chunk of every append until the publish or abort frees them.
  Status WriteRecords(const Input& in) {
    if (in.count == 0) return Status::OK();
    if (run_records_ == 0) ChooseRunRecords(in.lens, in.uniform, in.count);
    const uint64_t base = count_;  // global index = base + local index
    size_t cur = 0;
    BackgroundTask writing;  // the write of rounds_[cur ^ 1], if any
    uint64_t j = 0, in_off = 0;
    while (j < in.count) {
      if (in.Len(j) > opt_.stream_threshold) {
        LX_RETURN_IF_ERROR(writing.Wait());
        const uint64_t len = in.Len(j);
        LX_RETURN_IF_ERROR(
            WriteLarge(in.ptrs != nullptr ? in.ptrs[j] : in.data + in_off, len,
                       in.shapes != nullptr ? in.shapes + j * schema_.ndim : nullptr));
        in_off += len;
        ++j;
        continue;
      }
      Round& r = rounds_[cur];
      CutChunk(in, base, &j, &in_off, &r.pieces);
      const Status compressed = CompressRound(in, &r);
      LX_RETURN_IF_ERROR(writing.Wait());  // the previous chunk's write, which overlapped
      LX_RETURN_IF_ERROR(compressed);
      writing.Start(pool_, [this, &in, &r] { return WriteRound(in, &r); });
      cur ^= 1;
    }
    return writing.Wait();
  }

  // Cuts the next chunk, from record *j (at *in_off in Input::data) on, into
  // *pieces: at most chunk_bytes (or one record) and kChunkMaxRecords records
  // of input, stopping before a record above stream_threshold; a piece is at
  // most kRunBytes (or one record) of one run. Where pieces end changes
  // nothing on disk (each record is its own frame).
  void CutChunk(const Input& in, uint64_t base, uint64_t* j, uint64_t* in_off,
                std::vector<Piece>* pieces) const {
    pieces->clear();
    uint64_t chunk = 0;
    const uint64_t chunk_first = *j;
    while (*j < in.count && chunk < opt_.chunk_bytes && *j - chunk_first < kChunkMaxRecords &&
           in.Len(*j) <= opt_.stream_threshold) {
      const uint64_t run_end = ((base + *j) / run_records_ + 1) * run_records_ - base;
      const uint64_t cap = std::min(kRunBytes, opt_.chunk_bytes - chunk);
      Piece p{*j, *j, *in_off, 0, ShardOf(base + *j)};
      while (*j < in.count && *j < run_end && in.Len(*j) <= opt_.stream_threshold &&
             (*j == p.first || p.bytes + in.Len(*j) <= cap)) {
        p.bytes += in.Len(*j);
        ++*j;
      }
      p.end = *j;
      *in_off += p.bytes;
      chunk += p.bytes;
      pieces->push_back(p);
    }
  }

  // Compresses (or, raw, lays out) every piece of `r` in parallel; order is
  // kept by position. The first error of a piece, in order.
  Status CompressRound(const Input& in, Round* r) const {
    const size_t n = r->pieces.size();
    if (r->outs.size() < n) r->outs.resize(n);
    for (size_t pi = 0; pi < n; ++pi) {  // a used PieceOut, empty but for its buffer
      PieceOut& o = r->outs[pi];
      o.spans.clear();
      o.ends.clear();
      o.marks.clear();
      o.buf.size = 0;
      o.st = Status::OK();
    }
    pool_->ParallelFor(n, [&](size_t pi) {
      const Piece& p = r->pieces[pi];
      PieceOut& o = r->outs[pi];
      if (opt_.codec == Codec::kRaw) {
        RawPiece(in, p, &o);
      } else {
        o.st = CompressPiece(in, p, &o);
      }
    });
    for (size_t pi = 0; pi < n; ++pi) LX_RETURN_IF_ERROR(r->outs[pi].st);
    return Status::OK();
  }

  // A raw piece: its end entries and spans, straight from the caller's
  // buffer (or RawSpans for one pointer per record).
  void RawPiece(const Input& in, const Piece& p, PieceOut* o) const {
    if (layout_ == format::Layout::kEnds) {
      o->ends.resize(p.end - p.first);
      uint64_t pos = 0;
      for (uint64_t k = p.first; k < p.end; ++k) {
        pos += in.Len(k);
        o->ends[k - p.first] = pos;
      }
    }
    if (in.ptrs == nullptr) {
      o->spans.emplace_back(in.data + p.in_off, p.bytes);  // straight from the caller's buffer
    } else {
      RawSpans(in.ptrs, in.lens, p.first, p.end, p.bytes, &o->buf, &o->spans);
    }
  }

  // A compressed piece: each record narrowed (format 1.2: the values in the
  // fewest bytes that hold them all) and compressed as its own frame, or
  // stored raw when that is not smaller, back to back in o->buf. Narrowing
  // runs here, on the piece's pool thread, record by record: a record whose
  // width is its predecessor's is read once (its width found and its values
  // narrowed in one pass), and its narrowed copy is compressed while in cache.
  Status CompressPiece(const Input& in, const Piece& p, PieceOut* o) const {
    const bool groups = layout_ == format::Layout::kGroups;
    o->ends.resize(p.end - p.first);
    if (groups) o->marks.resize(p.end - p.first);
    uint64_t cap = 0;
    for (uint64_t k = p.first; k < p.end; ++k) cap += codec::CompressBound(in.Len(k));
    uint8_t* out = o->buf.Reserve(cap);
    uint64_t pos = 0, src_pos = 0;
    std::vector<uint8_t> narrowed;  // the narrowed values of one record
    uint32_t guess = 0;             // the previous record's width (NarrowRecord)
    const uint32_t itemsize = schema_.dtype.itemsize;
    const bool is_signed = schema_.dtype.kind == 'i';
    for (uint64_t k = p.first; k < p.end; ++k) {
      const uint64_t len = in.Len(k);
      const uint8_t* src = in.ptrs != nullptr ? in.ptrs[k] : in.data + p.in_off + src_pos;
      src_pos += len;
      uint64_t width_bits = 0, n = len;
      uint32_t mark = 0;
      if (narrow_ && len > 0) {
        const uint64_t count = len / itemsize;
        const narrow::Plan plan =
            narrow::NarrowRecord(src, count, itemsize, is_signed, &narrowed, guess);
        guess = plan.width;
        if (plan.width < itemsize) {
          src = narrowed.data();
          n = count * plan.width;
          width_bits = format::CodeOfWidth(plan.width) << format::kEndWidthShift |
                       (plan.zero_extend ? format::kEndZeroExtendBit : 0);
          mark = static_cast<uint32_t>(format::CodeOfWidth(plan.width) << format::kWordWidthShift) |
                 (plan.zero_extend ? format::kWordZeroExtendBit : 0);
        }
      }
      uint64_t stored = n, flag = 0;
      if (n > codec::MinFrameBytes(codec::Frames::kCompact)) {
        LX_ASSIGN_OR_RETURN(const uint64_t c, codec::Compress(src, n, opt_.level, dict_.get(),
                                                              out + pos, codec::CompressBound(n)));
        uint64_t form_len = c;
        uint32_t form = format::kFormFrame;
        if (groups) {  // format 1.3: a one-block frame loses its descriptor and block header
          const codec::Stripped b = codec::StripFrame(out + pos, c, n);
          if (b.fcs_bytes != 0) {
            form_len = b.len;
            form = b.fcs_bytes == 1 ? format::kFormBare1 : format::kFormBare2;
          }
        }
        if (form_len < n) {
          stored = form_len;
          flag = format::kEndCompressedBit;
          mark |= form << format::kWordFormShift;
        }
      }
      // Incompressible: store it raw so zstd never loses to raw on size.
      if (flag == 0 && n > 0) std::memcpy(out + pos, src, n);
      pos += stored;
      if (groups) {
        o->ends[k - p.first] = pos;
        o->marks[k - p.first] = mark;
      } else {
        o->ends[k - p.first] = pos | flag | width_bits;
      }
    }
    o->buf.size = pos;
    o->spans.emplace_back(out, pos);
    return Status::OK();
  }

  // Appends a compressed round: each shard its pieces in order (one call per
  // shard, so its pieces go out in whole huge pages: SeqFile), shards in
  // parallel; then the index and shape rows in record order.
  Status WriteRound(const Input& in, Round* r) {
    std::vector<std::vector<size_t>> by_shard(opt_.data_shards);
    for (size_t pi = 0; pi < r->pieces.size(); ++pi) by_shard[r->pieces[pi].shard].push_back(pi);
    std::vector<uint32_t> active;
    for (uint32_t s = 0; s < opt_.data_shards; ++s) {
      if (!by_shard[s].empty()) active.push_back(s);
    }
    std::vector<Status> sts(active.size());
    pool_->ParallelFor(active.size(), [&](size_t ai) {
      SeqFile& f = *shards_[active[ai]];
      std::vector<Span> spans;
      uint64_t at = f.size();
      for (size_t pi : by_shard[active[ai]]) {
        PieceOut& o = r->outs[pi];
        for (uint64_t& e : o.ends) e += at;  // below the width and compressed bits
        for (const Span& sp : o.spans) {
          spans.push_back(sp);
          at += sp.second;
        }
      }
      if (at >= format::kMaxShardBytes) {
        sts[ai] = ShardTooLarge(active[ai]);
        return;
      }
      sts[ai] = f.AppendSpans(spans.data(), spans.size());
    });
    for (auto& st : sts) LX_RETURN_IF_ERROR(st);
    for (size_t pi = 0; pi < r->pieces.size(); ++pi) {
      const Piece& p = r->pieces[pi];
      if (layout_ != format::Layout::kComputed) {
        const PieceOut& o = r->outs[pi];
        LX_RETURN_IF_ERROR(AppendEntries(o.ends.data(), o.marks.data(), o.ends.size()));
      }
      if (shape_table_) {
        LX_RETURN_IF_ERROR(shapes_.AppendRows(in.shapes + p.first * schema_.ndim, p.end - p.first));
      }
      nbytes_ += p.bytes;
      count_ += p.end - p.first;
    }
    return Status::OK();
  }

  // One record above stream_threshold, streamed onto the end of its run.
  Status WriteLarge(const uint8_t* in, uint64_t len, const uint64_t* shape) {
    SeqFile& f = *shards_[ShardOf(count_)];
    uint64_t flag = 0;
    bool stored_raw = true;
    if (opt_.codec != Codec::kRaw) {
      const SeqFile::Mark before = f.Here();
      uint64_t stored = 0;
      Status st = codec::CompressStream(in, len, opt_.level, dict_.get(),
                                        [&](const void* p, size_t n) -> Status {
                                          stored += n;
                                          if (stored >= len) return Status::OK();  // raw wins
                                          return f.Append(p, n);
                                        });
      LX_RETURN_IF_ERROR(st);
      if (stored < len) {
        stored_raw = false;
        flag = format::kEndCompressedBit;
      } else {
        LX_RETURN_IF_ERROR(f.Rewind(before));
      }
    }
    if (stored_raw) LX_RETURN_IF_ERROR(f.Append(in, len));
    if (f.size() >= format::kMaxShardBytes) return ShardTooLarge(ShardOf(count_));
    if (layout_ != format::Layout::kComputed) {
      const uint64_t e = layout_ == format::Layout::kGroups ? f.size() : f.size() | flag;
      const uint32_t mark = flag != 0 ? format::kFormFrame << format::kWordFormShift : 0;
      LX_RETURN_IF_ERROR(AppendEntries(&e, &mark, 1));
    }
    if (shape_table_) LX_RETURN_IF_ERROR(shapes_.AppendRows(shape, 1));
    nbytes_ += len;
    ++count_;
    return Status::OK();
  }

  // Entries hold end offsets below 2^60 (docs/format.md, section 3).
  Status ShardTooLarge(uint32_t shard) const {
    return Status::ResourceExhausted(path_ + "/" + format::DataFileName(shard) +
                                     ": a data file cannot reach 2^60 bytes (use more "
                                     "data_shards)");
  }

  Status DoPublish() {
    format::Metadata m;
    m.minor = layout_ == format::Layout::kGroups ? format::kGroupsMinor
              : narrow_                          ? format::kNarrowMinor
                                                 : format::kPlainMinor;
    m.schema = schema_;
    m.codec = opt_.codec;
    m.level = opt_.codec == Codec::kRaw ? 0 : opt_.level;
    m.count = count_;
    m.data_shards = opt_.data_shards;
    m.dict_id = dict_ ? dict_->id() : 0;
    m.nbytes = nbytes_;
    m.writer = LOADERX_WRITER;  // "<distribution> <version>" (common/CMakeLists.txt)
    m.layout = layout_;
    m.run_records = std::max<uint64_t>(run_records_, 1);
    m.data_block = format::kDataBlockBytes;
    m.user_metadata = opt_.user_metadata;
    // Finish every data file's last block, write the index (its tail is the
    // data block sums) and the shape table, then make all of them durable in
    // one parallel round: one fsync latency instead of three in a row.
    for (auto& f : shards_) f->FinishBlocks();
    std::vector<uint64_t> sums;
    for (uint32_t s = 0; s < shards_.size(); ++s) {
      m.files[format::DataFileName(s)] = shards_[s]->Info();
      const auto& b = shards_[s]->block_sums();
      sums.insert(sums.end(), b.begin(), b.end());
    }
    m.sums_table_xxh3 = format::Hash64(sums.data(), sums.size() * 8);
    if (layout_ == format::Layout::kGroups) {
      // The last group, if short; then the wide ends go before the data sums.
      const uint64_t tail = count_ % format::kGroupRecords;
      if (tail != 0) index_.AppendShortRow(group_row_, 8 + tail * 4);
      m.wide_ends = wide_.size();
      m.wide_xxh3 = format::Hash64(wide_.data(), wide_.size() * 8);
      sums.insert(sums.begin(), wide_.begin(), wide_.end());
    }
    LX_RETURN_IF_ERROR(index_.Finish(&m.index_table_xxh3, sums));
    m.files[format::kIndexFile] = index_.Info();
    if (shape_table_) {
      LX_RETURN_IF_ERROR(shapes_.Finish(&m.shapes_table_xxh3));
      m.files[format::kShapesFile] = shapes_.Info();
    }
    if (dict_) m.files[format::kDictFile] = dict_info_;
    const std::string meta = format::EncodeMetadata(m);
    SeqFile mf;
    LX_RETURN_IF_ERROR(mf.Open(env_, File(format::kMetaFile)));
    LX_RETURN_IF_ERROR(mf.Append(meta.data(), meta.size()));
    // Every file and the directory's entries are made durable in one
    // parallel round, before the rename: one sync latency instead of three
    // in a row (docs/format.md, Writing). Their order inside the round does
    // not matter: nothing reads a temporary directory (a dead writer's is
    // swept, never opened), so all that counts is that the whole of it is
    // durable when the rename publishes it.
    std::vector<SeqFile*> files;
    for (auto& f : shards_) files.push_back(f.get());
    files.push_back(&index_.file());
    if (shape_table_) files.push_back(&shapes_.file());
    files.push_back(&mf);
    std::vector<Status> sts(files.size() + 1);
    pool_->ParallelFor(sts.size(), [&](size_t k) {
      sts[k] = k < files.size() ? files[k]->Sync() : SyncDir(*env_, tmp_);
    });
    for (auto& st : sts) LX_RETURN_IF_ERROR(st);
    Status renamed = env_->RenameNoReplace(tmp_, path_);
    if (renamed.code() == Status::Code::kAlreadyExists) {
      return Status::AlreadyExists(path_ +
                                   ": already exists (created while this store was "
                                   "being written)");
    }
    LX_RETURN_IF_ERROR(renamed);
    // Visible now: from here on the store must not be removed, whatever happens.
    published_ = true;
    shards_.clear();
    return SyncDir(*env_, parent_);
  }

  const std::string path_, parent_, tmp_;
  // An exclusive flock on the temporary directory, held for the writer's
  // life: the kernel drops it when the process dies, however it dies, which
  // is what lets the next Create in this parent sweep the directory.
  UniqueFd tmp_lock_;
  const Schema schema_;
  const WriteOptions opt_;
  Env* const env_;
  ThreadPool* const pool_;
  // kComputed, kEnds, or kGroups (chosen with run_records_, at the first append).
  format::Layout layout_;
  const bool shape_table_;
  // Records are narrowed (format 1.2): compressed stores of narrowable
  // integer dtypes, unless WriteOptions::narrow_integers is off.
  const bool narrow_;
  std::shared_ptr<const codec::ZstdDictionary> dict_;
  format::FileInfo dict_info_;
  std::vector<std::unique_ptr<SeqFile>> shards_;
  BlockedTableWriter index_, shapes_;
  uint64_t count_ = 0, nbytes_ = 0;
  uint64_t run_records_ = 0;  // R, fixed by the first append (0 before)
  // kGroups: the group row being filled, each shard's end so far, the wide ends.
  uint8_t group_row_[format::kGroupRowBytes] = {};
  std::vector<uint64_t> shard_end_;
  std::vector<uint64_t> wide_;
  // The chunks being compressed and written (WriteRecords); kept between
  // appends for their output buffers, freed by ReleaseRounds.
  Round rounds_[2];
  bool failed_ = false, published_ = false, aborted_ = false;
};

Status ValidateSchema(Schema* s) {
  LX_ASSIGN_OR_RETURN(s->dtype, DType::Parse(s->dtype.str));
  if (s->kind == Kind::kDense) {
    if (s->item_shape.size() > format::kMaxDenseItemNdim) {
      return Status::InvalidArgument(
          "item_shape has more than 63 dimensions (a batch adds one; "
          "NumPy allows 64)");
    }
    s->ndim = static_cast<uint32_t>(s->item_shape.size());
    uint64_t b = s->dtype.itemsize;
    for (uint64_t d : s->item_shape) {
      if (format::MulOverflow(b, d, &b)) return Status::InvalidArgument("item_shape overflows");
    }
  } else {
    if (s->ndim < 1 || s->ndim > format::kMaxNdim) {
      return Status::InvalidArgument("ragged ndim must be in 1..64, got " +
                                     std::to_string(s->ndim) +
                                     " (scalar records: use Dense with item_shape=())");
    }
    if (!s->item_shape.empty()) return Status::InvalidArgument("ragged stores have no item_shape");
  }
  return Status::OK();
}

Status ValidateOptions(const WriteOptions& o) {
  if (o.data_shards < 1 || o.data_shards > format::kMaxShards) {
    return Status::InvalidArgument("data_shards must be in 1..255, got " +
                                   std::to_string(o.data_shards));
  }
  if (o.codec == Codec::kZstdDict && o.dictionary.empty()) {
    return Status::InvalidArgument(
        "codec 'zstd_dict' needs dict_bytes (train one with "
        "loaderx.utils.train_dict)");
  }
  if (o.codec != Codec::kZstdDict && !o.dictionary.empty()) {
    return Status::InvalidArgument(std::string("dict_bytes is only used with codec 'zstd_dict', "
                                               "not '") +
                                   CodecName(o.codec) + "'");
  }
  if (o.codec != Codec::kRaw && (o.level < -100 || o.level > 22)) {
    return Status::InvalidArgument("zstd level must be in -100..22, got " +
                                   std::to_string(o.level));
  }
  if (o.stream_threshold == 0) return Status::InvalidArgument("stream_threshold must be > 0");
  if (o.chunk_bytes == 0) return Status::InvalidArgument("chunk_bytes must be > 0");
  if (o.user_metadata.size() > format::kMaxUserMetadataBytes) {
    return Status::InvalidArgument("metadata is " + std::to_string(o.user_metadata.size()) +
                                   " bytes of JSON; at most " +
                                   std::to_string(format::kMaxUserMetadataBytes) + " are kept");
  }
  return Status::OK();
}

constexpr char kTmpMarker[] = ".zrecord-tmp-";
// A temporary directory whose writer is gone for this long is swept even if
// its name's pid is alive again (pid reuse); a live writer holds its lock
// and is never swept, whatever its age.
constexpr int64_t kSweepAfterSeconds = 3600;

// Removes the temporary directories of dead writers in `parent`: hidden
// ".<name>.zrecord-tmp-<pid>-<random>" directories whose lock (see
// StoreWriterImpl::tmp_lock_) nobody holds and whose writer pid is gone (or
// that are older than kSweepAfterSeconds). A writer between its mkdir and
// its flock holds no lock yet, but its pid is alive, so it is left alone.
// Best effort: a directory that cannot be inspected or removed is skipped.
// Not on Windows, where a directory cannot be locked: a crashed writer's
// temporary directory stays there (docs/platforms.md, "Windows").
#if defined(_WIN32)
void SweepDeadWriters(Env& env, const std::string& parent) {}
#else
void SweepDeadWriters(Env& env, const std::string& parent) {
  auto names = env.ListDir(parent);
  if (!names.ok()) return;
  std::vector<std::string> dead;
  for (const std::string& n : *names) {
    const size_t at = n.find(kTmpMarker);
    if (n.empty() || n[0] != '.' || at == std::string::npos) continue;
    const std::string dir = std::string(parent).append("/").append(n);
    auto fd = env.Open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW, 0);
    if (!fd.ok()) continue;
    auto locked = env.TryLock(fd->get());
    if (!locked.ok() || !*locked) continue;  // its writer lives
    struct stat st;
    if (!env.Stat(fd->get(), &st).ok() || st.st_uid != ::geteuid()) continue;  // not ours to judge
    const long pid = std::strtol(n.c_str() + at + sizeof(kTmpMarker) - 1, nullptr, 10);
    const bool pid_alive = pid > 0 && (::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM);
    const bool old = ::time(nullptr) - st.st_mtime > kSweepAfterSeconds;
    if (pid == ::getpid() || (pid_alive && !old)) continue;
    dead.push_back(dir);
  }
  for (const std::string& dir : dead) (void)RemoveTree(env, dir);
}
#endif

std::string RandomSuffix() {
  std::random_device rd;
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%d-%08x%08x", static_cast<int>(::getpid()), rd(), rd());
  return buf;
}

}  // namespace

Result<std::unique_ptr<StoreWriter>> StoreWriter::Create(const std::string& path,
                                                         const Schema& schema,
                                                         const WriteOptions& options) {
  Schema s = schema;
  LX_RETURN_IF_ERROR(ValidateSchema(&s));
  LX_RETURN_IF_ERROR(ValidateOptions(options));
  if (path.empty()) return Status::InvalidArgument("store path is empty");
  fs::path p(path);
  if (!p.has_filename()) p = p.parent_path();  // "dir/" names "dir"
  const std::string name = p.filename().string();
  if (name.empty() || name == "." || name == "..") {
    return Status::InvalidArgument("'" + path + "' does not name a new directory");
  }
  fs::path parent = p.parent_path();
  if (parent.empty()) parent = ".";
  Env& env = options.env != nullptr ? *options.env : *Env::Default();
  struct stat st;
  Status exists = env.StatPath(p.string(), /*follow=*/false, &st);
  if (exists.ok()) return Status::AlreadyExists(path + ": already exists");
  if (exists.code() != Status::Code::kNotFound) return exists;
  Status made = CreateDirs(env, parent.string());
  if (!made.ok()) return made.WithContext("cannot create the parent directory");

  SweepDeadWriters(env, parent.string());
  const std::string tmp = (parent / ("." + name + kTmpMarker + RandomSuffix())).string();
  LX_RETURN_IF_ERROR(env.Mkdir(tmp, 0755));
  // The lock: see StoreWriterImpl::tmp_lock_.
  auto lock = env.Open(tmp, O_RDONLY | O_DIRECTORY, 0);
  Status locked = lock.status();
  if (lock.ok()) {
    Result<bool> got = env.TryLock(lock->get());
    if (!got.ok()) locked = got.status().WithContext(tmp);
    if (got.ok() && !*got) locked = Status::IOError(tmp + ": flock: held by another process");
  }
  if (!locked.ok()) {
    (void)env.Rmdir(tmp);
    return locked;
  }
  auto w = std::make_unique<StoreWriterImpl>(p.string(), parent.string(), tmp, std::move(*lock),
                                             std::move(s), options);
  Status init = w->Init();
  if (!init.ok()) return init;  // the destructor removes tmp
  return std::unique_ptr<StoreWriter>(std::move(w));
}

}  // namespace loaderx
