// _loaderx.Source: see py_source.h.
#include <pybind11/stl.h>

#include <algorithm>
#include <cmath>

#include "py_source.h"

namespace loaderx::py_bind {

namespace {

using Clock = std::chrono::steady_clock;

// The deadline of a wait of `timeout` seconds (None: never).
Clock::time_point DeadlineOf(std::optional<double> timeout) {
  if (!timeout) return Clock::time_point::max();
  if (!(*timeout >= 0)) {  // also NaN
    ThrowStatus(Status::InvalidArgument("timeout must be None or >= 0 seconds, got " +
                                        std::to_string(*timeout)));
  }
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(
                            std::chrono::duration<double>(std::min(*timeout, 1e9)));
}

// A C-contiguous view of `data` with `base` as its base object.
py::object View(const py::dtype& dtype, int nd, const Py_intptr_t* dims, void* data, bool writable,
                const py::capsule& base) {
  auto& api = py::detail::npy_api::get();
  // NumPy derives contiguity and alignment itself; NewFromDescr steals the
  // dtype reference.
  const int flags = writable ? py::detail::npy_api::NPY_ARRAY_WRITEABLE_ : 0;
  PyObject* arr = api.PyArray_NewFromDescr_(api.PyArray_Type_, dtype.inc_ref().ptr(), nd, dims,
                                            nullptr, data, flags, nullptr);
  if (arr == nullptr) throw py::error_already_set();
  py::object owned = py::reinterpret_steal<py::object>(arr);
  // SetBaseObject steals the reference it is given, also on failure.
  if (api.PyArray_SetBaseObject_(arr, base.inc_ref().ptr()) != 0) throw py::error_already_set();
  return owned;
}

// Locks `mu` with the GIL released (a thread holding `mu` may be waiting for
// the GIL).
std::unique_lock<std::mutex> LockWithoutGil(std::mutex& mu) {
  std::unique_lock<std::mutex> lock(mu, std::defer_lock);
  WithoutGil([&] { lock.lock(); });
  return lock;
}

}  // namespace

PySource::~PySource() {
  if (source_) {
    // Closing joins native threads: never with the GIL held.
    WithoutGil([&] { source_->Close(); });
  }
}

void PySource::Init(std::unique_ptr<BatchSource> source) {
  source_ = std::move(source);
  for (const StreamInfo& s : source_->streams()) dtypes_.push_back(py::dtype(s.dtype));
}

py::object PySource::Next(std::optional<double> timeout, std::optional<py::list> stash) {
  const Clock::time_point deadline = DeadlineOf(timeout);
  if (stash && stash->size() != 1) {
    ThrowStatus(Status::InvalidArgument("stash must be a list of one item, got " +
                                        std::to_string(stash->size())));
  }
  std::unique_lock<std::mutex> lock = LockWithoutGil(mu_);
  for (;;) {
    const Clock::time_point slice = std::min(deadline, Clock::now() + kPollSlice);
    Result<std::optional<BatchView>> r = WithoutGil([&] { return source_->NextUntil(slice); });
    if (!r.ok()) ThrowStatus(r.status());
    if (r->has_value()) {
      py::object batch = ToPython(std::move(**r));
      if (stash) (*stash)[0] = batch;
      // A Ctrl-C that came during the wait is raised now, with the batch
      // in the caller's stash.
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();
      return batch;
    }
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    if (Clock::now() >= deadline) return py::none();
  }
}

void PySource::Seek(uint64_t step) {
  std::unique_lock<std::mutex> lock = LockWithoutGil(mu_);
  for (;;) {
    Result<bool> r =
        WithoutGil([&] { return source_->SeekUntil(step, Clock::now() + kPollSlice); });
    if (!r.ok()) ThrowStatus(r.status());
    if (*r) return;
    // Interrupted here, the seek is settled by the next next()/seek().
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
  }
}

void PySource::Close() {
  WithoutGil([&] { source_->Close(); });
}

py::object PySource::ToPython(BatchView batch) {
  // One owner for every array of the batch.
  auto* owner = new std::shared_ptr<const void>(std::move(batch.owner));
  py::capsule base(owner, "loaderx.BatchOwner",
                   [](void* p) { delete static_cast<std::shared_ptr<const void>*>(p); });
  const std::vector<StreamInfo>& streams = source_->streams();
  const size_t num_streams = streams.size();
  py::list values(num_streams);
  std::vector<Py_intptr_t> dims;
  for (size_t j = 0; j < num_streams; ++j) {
    const StreamInfo& s = streams[j];
    const StreamView& v = batch.streams[j];
    if (s.kind == Kind::kDense) {
      dims.assign(1, static_cast<Py_intptr_t>(batch.batch_size));
      for (uint64_t d : s.item_shape) dims.push_back(static_cast<Py_intptr_t>(d));
      values[j] = View(dtypes_[j], static_cast<int>(dims.size()), dims.data(), v.values,
                       batch.writable, base);
      continue;
    }
    const uint64_t b = batch.batch_size;
    py::list records(b);
    dims.resize(s.ndim);
    for (uint64_t k = 0; k < b; ++k) {
      for (uint32_t d = 0; d < s.ndim; ++d) {
        dims[d] = static_cast<Py_intptr_t>(v.shapes[k * s.ndim + d]);
      }
      records[k] = View(dtypes_[j], static_cast<int>(s.ndim), dims.data(),
                        v.values + (v.offsets[k] - v.offsets[0]), batch.writable, base);
    }
    values[j] = std::move(records);
  }
  return py::make_tuple(batch.step, std::move(values));
}

void BindSource(py::module_& m) {
  py::class_<PySource>(m, "Source", R"doc(
A native batch source (internal; use loaderx.dataloader.DataLoader): the
embedded Pipeline or a DaemonLoader served by loaderxd, with one behaviour.

next(timeout, stash) returns (step, values) or None after `timeout` seconds
(None: wait forever; negative: ValueError). `stash` (optional), a list of
one item, receives the batch before anything can raise, so a caller that
loses it to an exception still has it. values holds, per stream, a
(batch_size, *item_shape) ndarray (dense) or a list of ndarrays (ragged),
viewing the batch memory without a copy and sharing one base that owns it.
Ctrl-C raises KeyboardInterrupt within ~20 ms; a batch that arrived
meanwhile is in the stash.
)doc")
      .def("next", &PySource::Next, py::arg("timeout") = py::none(), py::arg("step") = py::none(),
           "(step, values) of the next step (or of `step`, handed out again), or None after "
           "`timeout` seconds.")
      .def("seek", &PySource::Seek, py::arg("step"))
      .def_property_readonly("step", &PySource::step)
      .def("close", &PySource::Close);
}

}  // namespace loaderx::py_bind
