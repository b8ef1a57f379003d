// BatchSource: the one interface between a host and whatever produces its
// batches. Two implementations: the embedded Pipeline (loader.h, batches
// gathered in this process) and client::Loader (client.h, batches served by
// loaderxd through a shared-memory ring). The Python binding, its poll loop,
// its GIL rule and its array builder are written once against this
// interface (python/src/bind_source.cc), so every behaviour the user sees
// (timeouts, writeability, errors, close, Ctrl-C) has one rule on both.
//
// Contract, for both implementations:
//  * NextUntil(deadline) returns the batch of step() and advances, or
//    std::nullopt once `deadline` passes first (nothing is consumed: the next
//    call returns the same step). A step whose production failed returns its
//    Status and still advances. Cancelled once Close() ran (also in a thread
//    blocked here when another thread closes, within kSourcePollBound).
//    Daemon: a dead or unresponsive daemon is Status::Daemon.
//  * SeekUntil(step, deadline): the next batch is `step`. false means the
//    seek is still in progress when `deadline` passed: call SeekUntil again
//    with the same step (or NextUntil, which settles it first); nothing is
//    lost or sent twice either way.
//    A refused seek (IndexError: a group member asking for a step its group
//    dropped) changes nothing.
//  * step(): the step of the batch the next successful NextUntil returns.
//  * Close(): idempotent, thread-safe, never blocks longer than one gather
//    task; batches already returned stay valid and unchanged.
//
// Thread-safety: NextUntil/SeekUntil are called by one thread at a time;
// step() and Close() from any thread. A BatchView may be destroyed on any
// thread.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "loaderx/status.h"
#include "loaderx/store.h"

namespace loaderx {

// How long a blocked NextUntil/SeekUntil may take to notice Close() from
// another thread (both implementations wait in slices at most this long).
inline constexpr std::chrono::milliseconds kSourcePollBound{100};

// What one stream's values look like (the same for every batch).
struct StreamInfo {
  std::string label;  // the store path (daemon) or store name
  Kind kind = Kind::kDense;
  std::string dtype;  // NumPy dtype.str
  uint32_t itemsize = 0;
  std::vector<uint64_t> item_shape;  // dense
  uint32_t ndim = 0;                 // ragged rank (dense: item_shape.size())
  uint64_t size = 0;                 // records in the store
};

// One stream of a delivered batch. Dense: `values` is the (B, *item_shape)
// C-order array. Ragged: record k is `values + offsets[k] - offsets[0]`
// (offsets[0] is 0 for a whole batch, not for a shard group member's slice)
// with dims shapes[k * ndim .. (k + 1) * ndim); records are contiguous, so
// the stream's values are the offsets[B] - offsets[0] bytes at `values`.
struct StreamView {
  uint8_t* values = nullptr;
  const uint64_t* offsets = nullptr;  // B + 1 entries; ragged only
  const uint64_t* shapes = nullptr;   // B * ndim entries; ragged only
};

// The stream views of one batch, read like a std::vector<StreamView>
// (size, [], iteration, push_back). Up to kInline of them are held in place,
// so delivering a batch of that many streams allocates nothing (loaderxd's
// hand-off is kept free of malloc: docs/benchmarks.md, "The take allocates
// nothing"); a batch of more streams keeps them all on the heap.
class StreamViews {
 public:
  static constexpr size_t kInline = 4;

  StreamViews() = default;
  StreamViews(const StreamViews&) = default;
  StreamViews& operator=(const StreamViews&) = default;
  // A moved-from list is empty.
  StreamViews(StreamViews&& o) noexcept
      : inline_(o.inline_), more_(std::move(o.more_)), n_(std::exchange(o.n_, 0)) {}
  StreamViews& operator=(StreamViews&& o) noexcept {
    inline_ = o.inline_;
    more_ = std::move(o.more_);
    n_ = std::exchange(o.n_, 0);
    return *this;
  }

  size_t size() const { return n_; }
  bool empty() const { return n_ == 0; }
  StreamView* data() { return n_ <= kInline ? inline_.data() : more_.data(); }
  const StreamView* data() const { return n_ <= kInline ? inline_.data() : more_.data(); }
  StreamView& operator[](size_t j) { return data()[j]; }
  const StreamView& operator[](size_t j) const { return data()[j]; }
  StreamView* begin() { return data(); }
  StreamView* end() { return data() + n_; }
  const StreamView* begin() const { return data(); }
  const StreamView* end() const { return data() + n_; }
  void push_back(const StreamView& v) {
    if (n_ < kInline) {
      inline_[n_++] = v;
      return;
    }
    if (n_ == kInline) more_.assign(inline_.begin(), inline_.end());
    more_.push_back(v);
    ++n_;
  }

 private:
  std::array<StreamView, kInline> inline_{};  // [0, n_) while n_ <= kInline
  std::vector<StreamView> more_;              // all n_ once n_ > kInline
  size_t n_ = 0;
};

// One delivered batch: views into memory kept alive by `owner`. Every view
// stays valid, and its bytes unchanged by anyone else, for as long as any
// copy of `owner` lives. `writable`: the values may be written through (the
// memory is private to this process); false only for a daemon batch viewed
// in the shared ring itself (client::LoaderSpec::shared_view).
struct BatchView {
  uint64_t step = 0;
  uint64_t batch_size = 0;
  bool writable = true;
  StreamViews streams;
  std::shared_ptr<const void> owner;
};

class BatchSource {
 public:
  using Clock = std::chrono::steady_clock;
  virtual ~BatchSource() = default;

  virtual Result<std::optional<BatchView>> NextUntil(Clock::time_point deadline) = 0;
  virtual Result<bool> SeekUntil(uint64_t step, Clock::time_point deadline) = 0;
  virtual uint64_t step() const = 0;
  virtual void Close() = 0;
  // One entry per stream, in the order given at creation.
  virtual const std::vector<StreamInfo>& streams() const = 0;
};

}  // namespace loaderx
