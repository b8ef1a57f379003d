// _loaderx.Source: see py_source.h.
#include <pybind11/stl.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

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

// The view of one ragged record: `ndim` dims read from a u64 shape table at
// `shape`; `dims` is scratch space.
py::object RecordView(const py::dtype& dtype, uint32_t ndim, const uint64_t* shape, uint8_t* data,
                      bool writable, const py::capsule& base, std::vector<Py_intptr_t>& dims) {
  dims.resize(ndim);
  for (uint32_t d = 0; d < ndim; ++d) dims[d] = static_cast<Py_intptr_t>(shape[d]);
  return View(dtype, static_cast<int>(ndim), dims.data(), data, writable, base);
}

// A fresh read-only C-contiguous array of `shape` holding `from` (its own memory).
template <typename T>
py::array_t<T> ReadOnlyArray(std::vector<py::ssize_t> shape, const std::vector<T>& from) {
  py::array_t<T> a(std::move(shape));
  std::copy(from.begin(), from.end(), a.mutable_data());
  py::detail::array_proxy(a.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
  return a;
}

// Locks `mu` with the GIL released (a thread holding `mu` may be waiting for
// the GIL).
std::unique_lock<std::mutex> LockWithoutGil(std::mutex& mu) {
  std::unique_lock<std::mutex> lock(mu, std::defer_lock);
  WithoutGil([&] { lock.lock(); });
  return lock;
}

// The error of a packed stream whose rows overflow int32 cu_seqlens (built
// here, not inside the loop that finds it).
[[noreturn]] void ThrowTooManyRows(uint64_t step, const std::string& label) {
  ThrowStatus(Status::ResourceExhausted("ragged='packed': the batch of step " +
                                        std::to_string(step) + " has more than 2**31-1 rows in " +
                                        label +
                                        ", more than int32 cu_seqlens can count; use "
                                        "ragged='list'"));
}

// loaderx.RaggedBatch: one ragged stream of one batch, packed. Its records
// are contiguous in the batch memory (loader.h, "Batch memory layout"), so
// `values` is one flat view of them all, without a copy. cu_seqlens,
// offsets and shapes are small read-only arrays of their own; record views
// are built from private copies of the tables, so nothing a caller writes
// can make a view reach outside the batch. Immutable once built, so safe to
// share between threads.
class RaggedBatch {
 public:
  // REQUIRES: the GIL; `v` a ragged stream of `b` records of rank `ndim`
  // whose offsets and shapes agree (both hosts guarantee it).
  RaggedBatch(const py::dtype& dtype, uint32_t ndim, uint64_t b, const StreamView& v, bool writable,
              py::capsule base, const std::string& label, uint64_t step)
      : dtype_(dtype),
        ndim_(ndim),
        writable_(writable),
        base_(std::move(base)),
        data_(v.values),
        shapes_(v.shapes, v.shapes + b * ndim),
        bytes_(b + 1) {
    const auto itemsize = static_cast<uint64_t>(dtype.itemsize());
    std::vector<int32_t> cu(b + 1);
    std::vector<int64_t> offsets(b + 1);
    constexpr auto kMaxRows = static_cast<uint64_t>(std::numeric_limits<int32_t>::max());
    for (uint64_t k = 0; k <= b; ++k) {
      bytes_[k] = v.offsets[k] - v.offsets[0];
      offsets[k] = static_cast<int64_t>(bytes_[k] / itemsize);
      cu[k] = static_cast<int32_t>(rows_);  // rows_ <= kMaxRows
      if (k == b) break;
      const uint64_t len = shapes_[k * ndim];
      max_seqlen_ = std::max(max_seqlen_, len);
      if (len > kMaxRows - rows_) ThrowTooManyRows(step, label);
      rows_ += len;
    }
    const Py_intptr_t n = static_cast<Py_intptr_t>(bytes_[b] / itemsize);
    values_ = View(dtype, 1, &n, data_, writable, base_);
    const auto bs = static_cast<py::ssize_t>(b);
    cu_seqlens_ = ReadOnlyArray<int32_t>({bs + 1}, cu);
    offsets_ = ReadOnlyArray<int64_t>({bs + 1}, offsets);
    std::vector<int64_t> shapes(shapes_.begin(), shapes_.end());
    shapes_array_ = ReadOnlyArray<int64_t>({bs, static_cast<py::ssize_t>(ndim)}, shapes);
  }

  size_t size() const { return bytes_.size() - 1; }
  const py::object& values() const { return values_; }
  const py::object& cu_seqlens() const { return cu_seqlens_; }
  const py::object& offsets() const { return offsets_; }
  const py::object& shapes() const { return shapes_array_; }
  uint64_t max_seqlen() const { return max_seqlen_; }

  // Record i (negative counts from the end), as the list form gives it.
  py::object Record(int64_t i) const {
    const auto b = static_cast<int64_t>(size());
    const int64_t k = i < 0 ? i + b : i;
    if (k < 0 || k >= b) {
      ThrowStatus(Status::IndexError("record " + std::to_string(i) +
                                     " out of range for a batch of " + std::to_string(b)));
    }
    std::vector<Py_intptr_t> dims;
    return At(static_cast<uint64_t>(k), dims);
  }

  py::list ToList() const {
    py::list records(size());
    std::vector<Py_intptr_t> dims;
    for (uint64_t k = 0; k < size(); ++k) records[k] = At(k, dims);
    return records;
  }

  std::string Repr() const {
    return "RaggedBatch(" + std::to_string(size()) +
           " records, dtype=" + py::str(dtype_).cast<std::string>() +
           ", ndim=" + std::to_string(ndim_) + ", rows=" + std::to_string(rows_) + ")";
  }

 private:
  py::object At(uint64_t k, std::vector<Py_intptr_t>& dims) const {
    return RecordView(dtype_, ndim_, shapes_.data() + k * ndim_, data_ + bytes_[k], writable_,
                      base_, dims);
  }

  py::dtype dtype_;
  uint32_t ndim_;
  bool writable_;
  py::capsule base_;
  uint8_t* data_;
  std::vector<uint64_t> shapes_;  // b * ndim, the batch's shape table
  std::vector<uint64_t> bytes_;   // b + 1 byte offsets from record 0
  uint64_t max_seqlen_ = 0;
  uint64_t rows_ = 0;  // the sum of the records' first dims
  py::object values_, cu_seqlens_, offsets_, shapes_array_;
};

}  // namespace

PySource::~PySource() {
  if (source_) {
    // Closing joins native threads: never with the GIL held.
    WithoutGil([&] { source_->Close(); });
  }
}

RaggedForm ParseRaggedForm(const py::object& ragged) {
  if (!py::isinstance<py::str>(ragged)) {
    py::object cls = py::module_::import("loaderx.errors").attr("ArgumentTypeError");
    PyErr_Format(cls.ptr(), "ragged must be 'list' or 'packed', got %s",
                 Py_TYPE(ragged.ptr())->tp_name);
    throw py::error_already_set();
  }
  const auto form = ragged.cast<std::string>();
  if (form == "list") return RaggedForm::kList;
  if (form == "packed") return RaggedForm::kPacked;
  ThrowStatus(Status::InvalidArgument("ragged must be 'list' or 'packed', got " +
                                      py::repr(ragged).cast<std::string>()));
}

void PySource::Init(std::unique_ptr<BatchSource> source, RaggedForm ragged) {
  ragged_ = ragged;
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
    if (ragged_ == RaggedForm::kPacked) {
      values[j] = py::cast(
          RaggedBatch(dtypes_[j], s.ndim, b, v, batch.writable, base, s.label, batch.step));
      continue;
    }
    py::list records(b);
    for (uint64_t k = 0; k < b; ++k) {
      records[k] = RecordView(dtypes_[j], s.ndim, v.shapes + k * s.ndim,
                              v.values + (v.offsets[k] - v.offsets[0]), batch.writable, base, dims);
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
(batch_size, *item_shape) ndarray (dense) or, for a ragged stream, a list
of ndarrays (ragged='list') or a RaggedBatch (ragged='packed'), viewing the
batch memory without a copy and sharing one base that owns it.
Ctrl-C raises KeyboardInterrupt within ~20 ms; a batch that arrived
meanwhile is in the stash.
)doc")
      .def("next", &PySource::Next, py::arg("timeout") = py::none(), py::arg("step") = py::none(),
           "(step, values) of the next step (or of `step`, handed out again), or None after "
           "`timeout` seconds.")
      .def("seek", &PySource::Seek, py::arg("step"))
      .def_property_readonly("step", &PySource::step)
      .def("close", &PySource::Close);

  py::class_<RaggedBatch>(m, "RaggedBatch", R"doc(
One ragged stream of one batch, packed (DataLoader(..., ragged="packed")).

values: 1-D ndarray of every element of the batch's records, record after
record in batch order (each record C order), viewing the batch memory
without a copy; writable exactly when the list form's arrays are.
offsets: int64 (B + 1,), element offsets into values: record k is
values[offsets[k]:offsets[k + 1]].reshape(shapes[k]).
cu_seqlens: int32 (B + 1,), cumulative first-dimension lengths (rows;
tokens for 1-D records): cu_seqlens[k + 1] - cu_seqlens[k] == shapes[k, 0].
shapes: int64 (B, ndim), each record's shape. max_seqlen: the largest
shapes[k, 0]. cu_seqlens, offsets and shapes are read-only arrays of their
own. len(), batch[k] (negative k counts from the end), iteration and
tolist() give the records as the list form does: views of the same memory.
)doc")
      .def_property_readonly("values", &RaggedBatch::values,
                             "Every element of the batch's records, flat, without a copy.")
      .def_property_readonly("cu_seqlens", &RaggedBatch::cu_seqlens,
                             "int32 (B + 1,): cumulative first-dimension lengths.")
      .def_property_readonly("offsets", &RaggedBatch::offsets,
                             "int64 (B + 1,): element offsets of the records in values.")
      .def_property_readonly("shapes", &RaggedBatch::shapes, "int64 (B, ndim): record shapes.")
      .def_property_readonly("max_seqlen", &RaggedBatch::max_seqlen,
                             "The largest first dimension of a record.")
      .def("__len__", &RaggedBatch::size)
      .def("__getitem__", &RaggedBatch::Record, py::arg("index"),
           "Record `index` as an ndarray view of the batch memory.")
      .def("__iter__", [](const RaggedBatch& r) { return py::iter(r.ToList()); })
      .def("tolist", &RaggedBatch::ToList,
           "The records as a list of ndarray views: the ragged='list' form.")
      .def("__repr__", &RaggedBatch::Repr);
}

}  // namespace loaderx::py_bind
