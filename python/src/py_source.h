// PySource: the one Python face of a loaderx::BatchSource (batch_source.h),
// shared by _loaderx.Pipeline (embedded) and _loaderx.DaemonLoader (loaderxd).
//
// One poll loop: next() and seek() wait in slices of kPollSlice with the GIL
// released (WithoutGil, the extension's exit-safe GIL rule) and call
// PyErr_CheckSignals between slices, so Ctrl-C raises KeyboardInterrupt
// within kPollSlice plus one slice of the source's own poll, and a thread
// blocked here at interpreter exit is ended without std::terminate.
//
// One array builder: a dense stream becomes one (B, *item_shape) ndarray, a
// ragged stream a list of B ndarrays (RaggedForm::kList, the default) or one
// RaggedBatch (kPacked: one flat values array, since a stream's records are
// contiguous in every batch, plus cu_seqlens, offsets and shapes), all
// viewing the batch memory without a copy, all with one base (a capsule
// owning BatchView::owner), writable exactly when BatchView::writable
// (embedded: always; daemon: unless the loader asked for the shared
// read-only view).
//
// One argument rule: timeout None waits forever, a number >= 0 bounds the
// wait, anything negative or NaN is InvalidArgumentError (ValueError).
//
// One delivery rule: an interrupt consumes no step. next() may be given a
// one-element list, the caller's stash: a batch taken from the source is
// stored in stash[0] before anything can raise, and a Ctrl-C that arrived
// while next() waited is raised only after that. The caller (the
// DataLoader) empties the stash once it has counted the batch, and takes
// the batch from there when an exception came first.
//
// Thread-safety: next() and seek() from several threads are serialised by a
// mutex taken with the GIL released; step and close() from any thread.
#pragma once

#include <pybind11/numpy.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "bindings.h"
#include "loaderx/batch_source.h"

namespace loaderx::py_bind {

// How a ragged stream is delivered (the loader's `ragged=` keyword).
enum class RaggedForm { kList, kPacked };

// `ragged` ("list" | "packed") as a RaggedForm: the one check of the
// keyword. ArgumentTypeError for a non-str, InvalidArgumentError naming any
// other value.
RaggedForm ParseRaggedForm(const py::object& ragged);

// Longest wait without looking at signals. Ctrl-C must land within 100 ms.
inline constexpr std::chrono::milliseconds kPollSlice{20};
static_assert(kPollSlice < std::chrono::milliseconds{100});

class PySource {
 public:
  virtual ~PySource();
  PySource(const PySource&) = delete;
  PySource& operator=(const PySource&) = delete;

  // (step, [value per stream]) or None when `timeout` seconds pass first;
  // the batch is also stored in stash[0] (a list) first, when given.
  py::object Next(std::optional<double> timeout, std::optional<py::list> stash);
  void Seek(uint64_t step);
  uint64_t step() const { return source_->step(); }
  void Close();

 protected:
  PySource() = default;
  // Takes the source; caches the streams' dtypes. GIL held.
  void Init(std::unique_ptr<BatchSource> source, RaggedForm ragged);
  BatchSource& source() { return *source_; }

 private:
  py::object ToPython(BatchView batch);

  std::unique_ptr<BatchSource> source_;
  std::vector<py::dtype> dtypes_;
  RaggedForm ragged_ = RaggedForm::kList;
  // Serialises Next/Seek (the seam takes one caller at a time). Taken with
  // the GIL released, never the other way round.
  std::mutex mu_;
};

}  // namespace loaderx::py_bind
