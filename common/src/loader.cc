// The loader pipeline: batch planning, filling and ordered prefetch.
// Contract and batch layout: common/include/loaderx/loader.h.
#include "loaderx/loader.h"

#if defined(_WIN32)
#include <windows.h>
#else
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>
#endif

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "loaderx/thread_pool.h"

namespace loaderx {

namespace {

// Rounds v up to a multiple of kBatchAlignment; false on overflow.
bool AlignUp(uint64_t v, uint64_t* out) {
  uint64_t r;
  if (__builtin_add_overflow(v, kBatchAlignment - 1, &r)) return false;
  *out = r & ~(kBatchAlignment - 1);
  return true;
}

// Appends a section of `bytes` at the aligned end of the layout so far.
bool AddSection(uint64_t* end, uint64_t bytes, uint64_t* section_offset) {
  uint64_t start;
  if (!AlignUp(*end, &start)) return false;
  *section_offset = start;
  return !__builtin_add_overflow(start, bytes, end);
}

Status TooLarge(size_t stream) {
  return Status::ResourceExhausted("stream " + std::to_string(stream) +
                                   ": batch size in bytes overflows 64 bits");
}

std::string StreamName(const std::vector<std::shared_ptr<const Store>>& streams, size_t j) {
  return "stream " + std::to_string(j) + " (" + streams[j]->label() + ")";
}

// Raises the calling thread's nice value by `increment` (capped at 19). A
// new thread starts with its creator's nice value, so this is relative to
// the thread that made the Pipeline. Best effort (see PipelineOptions).
// Linux only: macOS and Windows have no per-thread nice value (setpriority
// there applies to the whole process), so their gather threads keep the
// creator's priority.
void LowerOwnPriority(int increment) {
  if (increment <= 0) return;
#if defined(__linux__)
  const pid_t tid = ::gettid();
  errno = 0;
  const int current = ::getpriority(PRIO_PROCESS, tid);
  if (current == -1 && errno != 0) return;
  (void)::setpriority(PRIO_PROCESS, tid, std::min(current + increment, kMaxGatherNice));
#endif
}

// Batch buffers are large (tens of MiB for image batches) and of the same or
// similar size from step to step. Fresh ones cost a page fault per 4 KiB page
// (or per 2 MiB huge page) plus the kernel zeroing them, which is as slow as
// the gather itself, so the heap allocator keeps freed buffers for reuse and
// asks for transparent huge pages on big ones (as NumPy does for its arrays).
constexpr uint64_t kHugePage = uint64_t{2} << 20;
// Buffers kept while no batch of the allocator is live (every loader closed
// or drained): what a process keeps between loaders.
constexpr size_t kMaxIdleBuffers = 2;

struct HeapBuffer {
  uint8_t* data = nullptr;
  uint64_t capacity = 0;
  uint64_t alignment = 0;
};

void FreeBuffer(const HeapBuffer& b) { ::operator delete(b.data, std::align_val_t(b.alignment)); }

// Freed buffers waiting for reuse; shared by the allocator and every batch it
// handed out, so a batch may outlive both the allocator and the pipeline.
//
// While batches are live it keeps every freed buffer as long as the live and
// the kept ones are no more than the most that were live at once (`peak_`):
// a pipeline's batches are freed in bursts (several steps the consumer let go
// before the producers allocate again), and a cache of fewer buffers than a
// burst freed some that the next steps then allocated anew, each a page
// fault per page. So in steady state no step allocates, and the cache never
// holds more than the pipeline did at its fullest. Once no batch is live, it
// keeps kMaxIdleBuffers and forgets the peak.
class BufferCache {
 public:
  ~BufferCache() {
    for (const HeapBuffer& b : free_) FreeBuffer(b);
  }
  // A cached buffer of at least `bytes` and not much more, if any; the caller
  // allocates one otherwise and, once it has it, calls Live. A miss drops
  // the oldest cached buffer (its size did not fit), so buffers
  // of a size the workload stopped using (ragged batches drift) do not add
  // to what the cache keeps.
  std::optional<HeapBuffer> Take(uint64_t bytes) {
    std::optional<HeapBuffer> evicted;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (size_t i = 0; i < free_.size(); ++i) {
        if (free_[i].capacity >= bytes && free_[i].capacity - bytes <= bytes / 4 + kHugePage) {
          HeapBuffer b = free_[i];
          free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(i));
          Count();
          return b;
        }
      }
      if (!free_.empty()) {
        evicted = free_.front();
        free_.erase(free_.begin());
      }
    }
    if (evicted) FreeBuffer(*evicted);  // outside the lock: munmap can be slow
    return std::nullopt;
  }
  // A buffer the allocator made after Take found none: one more live.
  void Live() {
    std::lock_guard<std::mutex> lock(mu_);
    Count();
  }
  // A batch's buffer, freed: kept within the bounds above, the oldest kept
  // going first.
  void Give(const HeapBuffer& b) {
    std::vector<HeapBuffer> evicted;
    {
      std::lock_guard<std::mutex> lock(mu_);
      --live_;
      free_.push_back(b);
      const size_t keep = live_ == 0 ? kMaxIdleBuffers : peak_ - live_;
      if (live_ == 0) peak_ = 0;
      while (free_.size() > keep) {
        evicted.push_back(free_.front());
        free_.erase(free_.begin());
      }
    }
    for (const HeapBuffer& e : evicted) FreeBuffer(e);  // outside the lock
  }

 private:
  void Count() {  // under mu_
    ++live_;
    peak_ = std::max(peak_, live_);
  }

  std::mutex mu_;
  std::vector<HeapBuffer> free_;  // guarded by mu_
  size_t live_ = 0;               // buffers handed out and not yet given back; mu_
  size_t peak_ = 0;               // the most live at once since none was; mu_
};

class HeapMemory final : public BatchMemory {
 public:
  HeapMemory(HeapBuffer buffer, uint64_t size, std::shared_ptr<BufferCache> cache)
      : buffer_(buffer), size_(size), cache_(std::move(cache)) {}
  ~HeapMemory() override { cache_->Give(buffer_); }
  HeapMemory(const HeapMemory&) = delete;
  HeapMemory& operator=(const HeapMemory&) = delete;
  uint8_t* data() override { return buffer_.data; }
  uint64_t size() const override { return size_; }

 private:
  HeapBuffer buffer_;
  uint64_t size_;
  std::shared_ptr<BufferCache> cache_;
};

class HeapAllocatorImpl final : public BatchAllocator {
 public:
  Result<std::shared_ptr<BatchMemory>> Allocate(uint64_t step, uint64_t bytes) override {
    std::optional<HeapBuffer> buffer = cache_->Take(bytes);
    if (!buffer) {
      HeapBuffer b;
      // operator new(0) gives a pointer we may not touch: a batch of empty
      // records still gets one aligned line so data() is usable.
      b.capacity = std::max<uint64_t>(bytes, kBatchAlignment);
      b.alignment = kBatchAlignment;
      if (b.capacity >= 2 * kHugePage) {
        b.alignment = kHugePage;
        b.capacity = (b.capacity + kHugePage - 1) / kHugePage * kHugePage;
      }
      b.data = static_cast<uint8_t*>(
          ::operator new(b.capacity, std::align_val_t(b.alignment), std::nothrow));
      if (b.data == nullptr) {
        return Status::ResourceExhausted("step " + std::to_string(step) + ": cannot allocate " +
                                         std::to_string(bytes) + " bytes for the batch");
      }
      // Advisory only: without THP support the buffer is simply made of 4 KiB pages.
#if defined(MADV_HUGEPAGE)
      if (b.alignment == kHugePage) (void)::madvise(b.data, b.capacity, MADV_HUGEPAGE);
#endif
      cache_->Live();
      buffer = b;
    }
    return std::shared_ptr<BatchMemory>(std::make_shared<HeapMemory>(*buffer, bytes, cache_));
  }

 private:
  std::shared_ptr<BufferCache> cache_ = std::make_shared<BufferCache>();
};

// One produced step: the memory and where its sections lie.
struct Batch {
  uint64_t step = 0;
  BatchLayout layout;
  std::shared_ptr<BatchMemory> memory;
};

// The seam's view of a produced batch (batch_source.h): owned by its memory.
BatchView ViewOf(Batch b) {
  BatchView v;
  v.step = b.step;
  v.batch_size = b.layout.batch_size;
  v.writable = true;  // the heap buffer (or ring slot) is this batch's alone
  uint8_t* data = b.memory->data();
  for (const StreamLayout& s : b.layout.streams) v.streams.push_back(StreamViewAt(data, s));
  v.owner = std::move(b.memory);
  return v;
}

// Producer threads and the gather pool. Each producer takes the next step
// to make, fills and plans it, allocates its memory (which may block, e.g. on
// ring credit) and gathers it itself, helped by the pool's workers
// (ParallelFor lets the caller work). There are P = min(prefetch,
// num_threads) producers, enough to keep every thread busy with batches of
// one task each (small records), and num_threads - P pool workers, so exactly
// num_threads threads ever read records. Producers that only wait while the
// pool gathers were tried (docs/benchmarks.md): no faster, and the waiting
// producer's wake-up per batch sits on the path to delivering it.
class PipelineImpl final : public Pipeline {
 public:
  PipelineImpl(std::vector<std::shared_ptr<const Store>> streams, Sampler sampler,
               const PipelineOptions& options, std::shared_ptr<BatchAllocator> allocator)
      : streams_(std::move(streams)),
        sampler_(std::move(sampler)),
        prefetch_(options.prefetch),
        allocator_(std::move(allocator)),
        next_step_(options.start_step),
        schedule_step_(options.start_step) {
    const size_t threads = options.num_threads != 0
                               ? options.num_threads
                               : std::max(1u, std::thread::hardware_concurrency());
    const size_t producers = std::min<size_t>(prefetch_, threads);
    const int nice = options.gather_nice;
    if (threads > producers) {
      pool_ = std::make_unique<ThreadPool>(threads - producers, [nice] { LowerOwnPriority(nice); });
    }
    producers_.reserve(producers);
    for (size_t i = 0; i < producers; ++i) {
      producers_.emplace_back([this, nice] {
        LowerOwnPriority(nice);
        ProducerLoop();
      });
    }
  }
  ~PipelineImpl() override { Close(); }

  Result<std::optional<BatchView>> NextUntil(Clock::time_point deadline) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (!ready_cv_.wait_until(lock, deadline,
                              [&] { return closed_ || ready_.contains(next_step_); })) {
      return std::optional<BatchView>();
    }
    LX_ASSIGN_OR_RETURN(Batch b, TakeLocked(lock));
    return std::optional<BatchView>(ViewOf(std::move(b)));
  }

  // Never waits for anything but in-flight batch frees: the deadline is not needed.
  Result<bool> SeekUntil(uint64_t step, Clock::time_point /*deadline*/) override {
    std::map<uint64_t, Result<Batch>> dropped;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closed_) return Status::Cancelled("loader closed");
      ++generation_;
      dropped.swap(ready_);
      // Still counted against prefetch until freed below, so memory never
      // exceeds prefetch batches, not even for a moment.
      discarding_ += dropped.size();
      next_step_ = schedule_step_ = step;
    }
    const uint64_t n = dropped.size();
    dropped.clear();
    {
      std::lock_guard<std::mutex> lock(mu_);
      discarding_ -= n;
    }
    work_cv_.notify_all();
    return true;
  }

  uint64_t step() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return next_step_;
  }

  void Close() override {
    // close_mu_ serialises concurrent Close calls: each returns only after
    // every thread was joined.
    std::lock_guard<std::mutex> close_lock(close_mu_);
    std::map<uint64_t, Result<Batch>> dropped;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closed_ && producers_.empty()) return;  // already closed
      closed_ = true;
      ++generation_;
      dropped.swap(ready_);
    }
    ready_cv_.notify_all();
    work_cv_.notify_all();
    allocator_->Cancel();  // unblocks a producer waiting for ring credit
    // Each producer finishes the batch it is making (helped by the pool,
    // which is still alive) and then sees closed_. producers_ is only
    // touched here and in the constructor, under close_mu_ here.
    for (std::thread& t : producers_) t.join();
    producers_.clear();
    // No producer is left, so no task is queued or running: joining the pool
    // is immediate.
    pool_.reset();
  }

 private:
  // Hands out the batch of next_step_. REQUIRES: closed_ or it is ready.
  Result<Batch> TakeLocked(std::unique_lock<std::mutex>& lock) {
    if (closed_) return Status::Cancelled("loader closed");
    auto node = ready_.extract(next_step_);
    ++next_step_;
    lock.unlock();
    work_cv_.notify_one();  // one more step may be started
    return std::move(node.mapped());
  }

  // Whether a producer may start a step: fewer than prefetch_ batches are
  // ready, being made or being freed (stale ones included, so a seek cannot
  // double the memory) and the window [next_step_, next_step_ + prefetch_)
  // is not fully scheduled.
  bool CanStartLocked() const {
    return in_flight_ + ready_.size() + discarding_ < prefetch_ &&
           schedule_step_ - next_step_ < prefetch_;
  }

  void ProducerLoop() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      work_cv_.wait(lock, [&] { return closed_ || CanStartLocked(); });
      if (closed_) return;
      const uint64_t step = schedule_step_++;
      const uint64_t generation = generation_;
      ++in_flight_;
      lock.unlock();
      Result<Batch> result = MakeBatch(step);
      lock.lock();
      if (!closed_ && generation == generation_) {
        ready_.emplace(step, std::move(result));
        --in_flight_;
        lock.unlock();
        ready_cv_.notify_all();
        lock.lock();
      } else {
        // Stale (a seek or Close came in between): free it while it still
        // counts against prefetch.
        lock.unlock();
        { Result<Batch> drop = std::move(result); }
        lock.lock();
        --in_flight_;
      }
    }
  }

  Result<Batch> MakeBatch(uint64_t step) {
    Batch batch;
    batch.step = step;
    std::vector<uint64_t> indices(sampler_.spec().batch_size);
    sampler_.Fill(step, indices.data());
    const std::string context = "step " + std::to_string(step);
    auto layout = PlanBatch(streams_, indices);
    if (!layout.ok()) return layout.status().WithContext(context);
    batch.layout = std::move(layout).value();
    auto memory = allocator_->Allocate(step, batch.layout.total_bytes);
    if (!memory.ok()) return memory.status();
    batch.memory = std::move(memory).value();
    if (batch.memory == nullptr || batch.memory->size() < batch.layout.total_bytes) {
      return Status::Internal(context + ": allocator returned too little memory");
    }
    Status st = FillBatch(streams_, indices, batch.layout, batch.memory->data(), pool_.get());
    if (!st.ok()) return st.WithContext(context);
    return batch;
  }

  const std::vector<std::shared_ptr<const Store>> streams_;
  const Sampler sampler_;  // only Fill (const, thread-safe) is used
  const uint64_t prefetch_;
  const std::shared_ptr<BatchAllocator> allocator_;

  // The producers' gather helpers (null when every gather thread is a
  // producer). Reset, and thereby joined, by Close after the producers.
  std::unique_ptr<ThreadPool> pool_;
  std::vector<std::thread> producers_;  // started by the constructor, joined by Close

  std::mutex close_mu_;
  mutable std::mutex mu_;
  std::condition_variable ready_cv_;  // ready_ gained a batch, or closed_
  std::condition_variable work_cv_;   // CanStartLocked() may have become true, or closed_
  // All below guarded by mu_.
  uint64_t next_step_;      // the step NextUntil delivers
  uint64_t schedule_step_;  // the next step a producer starts
  // Bumped by SeekUntil and Close: a producer whose generation differs is stale
  // and its result is dropped, so it can never be delivered.
  uint64_t generation_ = 0;
  std::map<uint64_t, Result<Batch>> ready_;  // current generation only
  uint64_t in_flight_ = 0;                   // steps being made (or their stale result freed)
  uint64_t discarding_ = 0;                  // batches a seek dropped and is freeing
  bool closed_ = false;
};

}  // namespace

StreamView StreamViewAt(uint8_t* base, const StreamLayout& layout) {
  StreamView v;
  v.values = base + layout.values_offset;
  if (layout.kind == Kind::kRagged) {
    v.offsets = reinterpret_cast<const uint64_t*>(base + layout.offsets_offset);
    v.shapes = reinterpret_cast<const uint64_t*>(base + layout.shapes_offset);
  }
  return v;
}

Result<BatchLayout> PlanBatch(const std::vector<std::shared_ptr<const Store>>& streams,
                              const std::vector<uint64_t>& indices) {
  if (streams.empty()) return Status::InvalidArgument("a batch needs at least one stream");
  if (indices.empty()) return Status::InvalidArgument("a batch needs at least one index");
  BatchLayout layout;
  layout.batch_size = indices.size();
  layout.streams.resize(streams.size());
  uint64_t end = 0;
  for (size_t j = 0; j < streams.size(); ++j) {
    const Store& store = *streams[j];
    const uint64_t n = store.size();
    for (uint64_t i : indices) {
      if (i >= n) {
        return Status::IndexError(StreamName(streams, j) + ": record index " + std::to_string(i) +
                                  " out of range [0, " + std::to_string(n) + ")");
      }
    }
    StreamLayout& s = layout.streams[j];
    const Schema& schema = store.schema();
    s.kind = schema.kind;
    if (schema.kind == Kind::kDense) {
      if (__builtin_mul_overflow(schema.DenseItemBytes(), indices.size(), &s.values_bytes)) {
        return TooLarge(j);
      }
    } else {
      uint64_t sum = 0;
      for (uint64_t i : indices) {
        LX_ASSIGN_OR_RETURN(uint64_t bytes, store.RecordBytes(i));
        if (__builtin_add_overflow(sum, bytes, &sum)) return TooLarge(j);
      }
      s.values_bytes = sum;
    }
    if (!AddSection(&end, s.values_bytes, &s.values_offset)) return TooLarge(j);
    if (schema.kind == Kind::kRagged) {
      uint64_t shape_bytes, offset_bytes;
      if (__builtin_mul_overflow(uint64_t{schema.ndim} * 8, indices.size(), &shape_bytes) ||
          __builtin_mul_overflow(uint64_t{8}, indices.size() + 1, &offset_bytes) ||
          !AddSection(&end, shape_bytes, &s.shapes_offset) ||
          !AddSection(&end, offset_bytes, &s.offsets_offset)) {
        return TooLarge(j);
      }
    }
  }
  if (!AlignUp(end, &layout.total_bytes)) return TooLarge(streams.size() - 1);
  return layout;
}

Status FillBatch(const std::vector<std::shared_ptr<const Store>>& streams,
                 const std::vector<uint64_t>& indices, const BatchLayout& layout, uint8_t* base,
                 ThreadPool* pool) {
  if (layout.streams.size() != streams.size() || layout.batch_size != indices.size()) {
    return Status::InvalidArgument("batch layout does not match the streams and indices");
  }
  if (reinterpret_cast<uintptr_t>(base) % kBatchAlignment != 0) {
    return Status::InvalidArgument("batch memory is not 64-byte aligned");
  }
  const size_t b = indices.size();
  // Zero the alignment padding so the whole buffer, not only its sections,
  // is a function of the step (a ring slot must not carry stale bytes).
  uint64_t cursor = 0;
  auto pad_to = [&](uint64_t offset) {
    if (offset > cursor) std::memset(base + cursor, 0, offset - cursor);
  };
  std::vector<void*> outs(b);
  for (size_t j = 0; j < streams.size(); ++j) {
    const Store& store = *streams[j];
    const StreamLayout& s = layout.streams[j];
    uint8_t* values = base + s.values_offset;
    pad_to(s.values_offset);
    cursor = s.values_offset + s.values_bytes;
    if (s.kind == Kind::kDense) {
      const uint64_t item = store.schema().DenseItemBytes();
      for (size_t k = 0; k < b; ++k) outs[k] = values + k * item;
    } else {
      const uint32_t ndim = store.schema().ndim;
      auto* shapes = reinterpret_cast<uint64_t*>(base + s.shapes_offset);
      auto* offsets = reinterpret_cast<uint64_t*>(base + s.offsets_offset);
      pad_to(s.shapes_offset);
      pad_to(s.offsets_offset);
      uint64_t acc = 0;
      for (size_t k = 0; k < b; ++k) {
        LX_RETURN_IF_ERROR(store.RecordShape(indices[k], shapes + k * ndim));
        LX_ASSIGN_OR_RETURN(uint64_t bytes, store.RecordBytes(indices[k]));
        offsets[k] = acc;
        outs[k] = values + acc;
        acc += bytes;
      }
      offsets[b] = acc;
      if (acc != s.values_bytes) {
        return Status::InvalidArgument(StreamName(streams, j) +
                                       ": batch layout was planned for other indices");
      }
      cursor = s.offsets_offset + 8 * (b + 1);
    }
    Status st = store.Gather(indices, outs, pool);
    if (!st.ok()) return st.WithContext(StreamName(streams, j));
  }
  pad_to(layout.total_bytes);
  return Status::OK();
}

std::shared_ptr<BatchAllocator> HeapAllocator() { return std::make_shared<HeapAllocatorImpl>(); }

Result<std::unique_ptr<Pipeline>> Pipeline::Create(
    std::vector<std::shared_ptr<const Store>> streams, const SamplerSpec& sampler,
    const PipelineOptions& options, std::shared_ptr<BatchAllocator> allocator) {
  if (streams.empty()) return Status::InvalidArgument("streams: at least one stream is required");
  for (size_t j = 0; j < streams.size(); ++j) {
    if (streams[j] == nullptr) {
      return Status::InvalidArgument("streams: stream " + std::to_string(j) + " is null");
    }
  }
  for (size_t j = 1; j < streams.size(); ++j) {
    if (streams[j]->size() != streams[0]->size()) {
      return Status::InvalidArgument("streams have different lengths: " + StreamName(streams, 0) +
                                     " has " + std::to_string(streams[0]->size()) + " records, " +
                                     StreamName(streams, j) + " has " +
                                     std::to_string(streams[j]->size()));
    }
  }
  if (sampler.n != streams[0]->size()) {
    return Status::InvalidArgument("sampler n = " + std::to_string(sampler.n) +
                                   " does not match the stream length " +
                                   std::to_string(streams[0]->size()));
  }
  if (options.prefetch < 1 || options.prefetch > kMaxPrefetch) {
    return Status::InvalidArgument("prefetch must be in 1.." + std::to_string(kMaxPrefetch) +
                                   ", got " + std::to_string(options.prefetch));
  }
  if (options.num_threads > kMaxThreads) {
    return Status::InvalidArgument("num_threads must be in 0.." + std::to_string(kMaxThreads) +
                                   ", got " + std::to_string(options.num_threads));
  }
  if (options.gather_nice < 0 || options.gather_nice > kMaxGatherNice) {
    return Status::InvalidArgument("gather_nice must be in 0.." + std::to_string(kMaxGatherNice) +
                                   ", got " + std::to_string(options.gather_nice));
  }
  LX_ASSIGN_OR_RETURN(Sampler s, Sampler::Make(sampler, options.start_step));
  if (allocator == nullptr) allocator = HeapAllocator();
  std::vector<StreamInfo> info;
  for (size_t j = 0; j < streams.size(); ++j) {
    const Schema& schema = streams[j]->schema();
    StreamInfo i;
    i.label = StreamName(streams, j);
    i.kind = schema.kind;
    i.dtype = schema.dtype.str;
    i.itemsize = schema.dtype.itemsize;
    i.item_shape = schema.item_shape;
    i.ndim = schema.ndim;
    i.size = streams[j]->size();
    info.push_back(std::move(i));
  }
  std::unique_ptr<Pipeline> p(
      new PipelineImpl(std::move(streams), std::move(s), options, std::move(allocator)));
  p->stream_info_ = std::move(info);
  return p;
}

}  // namespace loaderx
