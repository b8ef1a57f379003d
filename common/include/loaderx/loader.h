// The loader pipeline: sampler -> batch planner -> gather pool -> ordered
// delivery. One engine, two hosts: the embedded Python DataLoader and loaderxd
// both drive a Pipeline; only the BatchAllocator differs (heap vs a ring slot
// in shared memory). A batch at step s is byte-identical in both, whatever the
// thread count or prefetch depth.
//
// Batch memory layout (one contiguous buffer per batch, offsets from its
// start, every section 64-byte aligned, streams in the order given, padding
// between sections zeroed so the whole buffer is a function of the step):
//
//   +---------------------------+  stream 0 values_offset
//   | dense: B * item_bytes      |  (B, *item_shape) C order
//   +---------------------------+  stream 1 values_offset
//   | ragged: concatenated values|  record k at values_offset + offsets[k]
//   +---------------------------+  stream 1 shapes_offset
//   | u64 shapes[B * ndim]       |  record k's dims at shapes[k * ndim]
//   +---------------------------+  stream 1 offsets_offset
//   | u64 offsets[B + 1]         |  byte offsets into values, offsets[0] = 0,
//   +---------------------------+  offsets[B] = values_bytes
//   (total_bytes: end of the last section rounded up to 64)
//
// A ragged stream's records lie back to back in its values section (record
// k + 1 starts where record k ends, no padding between them), so the
// section is one contiguous array of the batch's records: the Python
// RaggedBatch (python/src/bind_source.cc) views it whole, on both hosts. A
// shard group member's slice of it is contiguous too.
//
// Pipeline semantics:
//  * Steps start_step, start_step+1, ... are produced ahead by
//    min(prefetch, num_threads) producer threads, at most `prefetch` batches
//    ready, in production or being freed at any time (stale ones after a Seek
//    included), so memory is bounded by prefetch batches plus what the
//    consumer still holds. Production is out of order; delivery is strictly
//    in step order.
//  * A producer plans and allocates its batch, then gathers it, helped by
//    num_threads - producers pool workers: num_threads is exactly the number
//    of threads that read and decode records, and a producer blocked in
//    Allocate (ring credit) holds no pool worker.
//  * Per step: Sampler::Fill -> PlanBatch -> allocator->Allocate -> FillBatch.
//    An error of a step (bad record, allocation failure) is returned by the
//    NextUntil for that step, which still advances: the pipeline goes on.
//  * SeekUntil(step) discards ready and in-flight work; a generation counter
//    makes sure a stale result is never delivered.
//  * Close() is idempotent, wakes a blocked NextUntil with Cancelled, cancels
//    the allocator, joins the producers (each finishes at most the batch it
//    is making) and then the pool. NextUntil/SeekUntil after Close return
//    Cancelled. The destructor implies Close().
//
// Ownership: the Pipeline shares ownership of the stores and the allocator.
// A delivered BatchView owns its BatchMemory (BatchView::owner), which may
// outlive the Pipeline.
//
// Thread-safety: Pipeline methods may be called from any thread; Close() may
// race with a blocked NextUntil (which then returns Cancelled). The stores must
// be safe for concurrent const calls (store.h guarantees it).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "loaderx/batch_source.h"
#include "loaderx/sampler.h"
#include "loaderx/status.h"
#include "loaderx/store.h"

namespace loaderx {

class ThreadPool;

// Every section of a batch, and the batch itself, is aligned to this.
inline constexpr uint64_t kBatchAlignment = 64;
// Bounds of PipelineOptions checked by Pipeline::Create.
inline constexpr uint32_t kMaxPrefetch = 1024;
inline constexpr uint32_t kMaxThreads = 1024;

struct StreamLayout {
  Kind kind = Kind::kDense;
  uint64_t values_offset = 0;
  uint64_t values_bytes = 0;
  uint64_t shapes_offset = 0;   // ragged only
  uint64_t offsets_offset = 0;  // ragged only
};

struct BatchLayout {
  uint64_t batch_size = 0;
  uint64_t total_bytes = 0;
  std::vector<StreamLayout> streams;
};

// Computes the layout of the batch gathering `indices` from every stream.
// Ragged sizes come from the stores' shape tables. IndexError naming the
// stream for an index >= its size; ResourceExhausted if sizes overflow.
Result<BatchLayout> PlanBatch(const std::vector<std::shared_ptr<const Store>>& streams,
                              const std::vector<uint64_t>& indices);
// Writes the shape/offset tables and gathers all values into `base`
// (layout.total_bytes bytes, 64-byte aligned). Uses `pool` (nullptr: caller
// only). REQUIRES: layout == PlanBatch(streams, indices).
Status FillBatch(const std::vector<std::shared_ptr<const Store>>& streams,
                 const std::vector<uint64_t>& indices, const BatchLayout& layout, uint8_t* base,
                 ThreadPool* pool);

// The view of a stream whose sections lie at `base` as `layout` says: the one
// layout-to-view rule of both hosts (Pipeline, client::Loader).
StreamView StreamViewAt(uint8_t* base, const StreamLayout& layout);

// Owner of one batch's bytes. Freed (or returned to its ring) on destruction.
class BatchMemory {
 public:
  virtual ~BatchMemory() = default;
  virtual uint8_t* data() = 0;
  virtual uint64_t size() const = 0;
};

class BatchAllocator {
 public:
  virtual ~BatchAllocator() = default;
  // May block (e.g. waiting for ring credit); must return Cancelled promptly
  // once Cancel() was called.
  virtual Result<std::shared_ptr<BatchMemory>> Allocate(uint64_t step, uint64_t bytes) = 0;
  virtual void Cancel() {}
};

// Heap allocator (64-byte aligned), the embedded default. Keeps up to two
// freed buffers for reuse (fresh large buffers cost a page fault per page and
// kernel zeroing) and asks for transparent huge pages on buffers >= 4 MiB.
// Thread-safe; batches may outlive the allocator.
std::shared_ptr<BatchAllocator> HeapAllocator();

inline constexpr int kMaxGatherNice = 19;  // the span of Linux nice values

struct PipelineOptions {
  uint64_t start_step = 0;
  uint32_t prefetch = 4;     // batches produced ahead of the consumer (>= 1)
  uint32_t num_threads = 0;  // gather threads; 0 = hardware concurrency
  // Nice increment of the gather threads (the producers and their pool
  // helpers; nothing else): each raises its own nice value to that of the
  // thread that created the Pipeline plus this, capped at 19, when it
  // starts (Linux nice values are per thread). Then the threads that hand
  // batches out (the consumer; loaderxd's io and session threads) win a
  // contended core over a gather running ahead. Lowering one's own priority
  // needs no privilege; if setpriority fails anyway the thread keeps its
  // priority (advisory). 0..kMaxGatherNice, else InvalidArgument.
  // loaderxd passes its --gather-nice (daemon/src/serving_group.h Options).
  int gather_nice = 0;
};

// A Pipeline is the embedded BatchSource (batch_source.h), the only way to
// wait for and seek its batches: NextUntil returns writable views of a
// batch's memory, and BatchView::owner is that BatchMemory (loaderxd's groups
// rely on it). SeekUntil never waits for anything but in-flight batch frees,
// so it ignores the deadline and returns true.
class Pipeline : public BatchSource {
 public:
  static Result<std::unique_ptr<Pipeline>> Create(
      std::vector<std::shared_ptr<const Store>> streams, const SamplerSpec& sampler,
      const PipelineOptions& options, std::shared_ptr<BatchAllocator> allocator = nullptr);
  ~Pipeline() override = default;  // implies Close()

  void Close() override = 0;  // idempotent; never blocks longer than one gather task
  const std::vector<StreamInfo>& streams() const override { return stream_info_; }

 private:
  std::vector<StreamInfo> stream_info_;  // set once by Create
};

}  // namespace loaderx
