// Python face of the Zrecord store engine: _loaderx.StoreWriter, _loaderx.Store
// and _loaderx.train_dictionary. loaderx.zrecord wraps these with the public
// Dense/Ragged API; the argument checks users see live there, the engine
// re-checks everything.
//
// GIL: every call that touches files or decodes records releases the GIL.
// NumPy outputs are allocated with the GIL held, then filled without it; no
// Python object is touched while the GIL is released.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <mutex>
#include <unordered_map>

#include "bindings.h"
#include "loaderx/loader.h"
#include "loaderx/store.h"
#include "loaderx/thread_pool.h"

namespace loaderx::py_bind {
namespace {

// A StoreWriter plus the lock that serialises Python threads using one
// builder (the engine allows one thread at a time).
struct PyWriter {
  std::unique_ptr<StoreWriter> writer;
  std::mutex mu;  // taken only with the GIL released
};

// NumPy dtype for a store dtype string, parsed once per string. REQUIRES: GIL.
// The cache is leaked on purpose: Python objects must not be destroyed after
// the interpreter has finalised. Its own mutex, not the GIL, guards it (a
// free-threaded build has none); the mutex is held only for the lookup and
// the insertion, never while Python code (the dtype's parsing) may run.
py::dtype NumpyDType(const DType& d) {
  static auto* mu = new std::mutex();
  static auto* cache = new std::unordered_map<std::string, py::dtype>();
  {
    std::lock_guard<std::mutex> lock(*mu);
    auto it = cache->find(d.str);
    if (it != cache->end()) return it->second;
  }
  py::dtype parsed = py::dtype::from_args(py::str(d.str));
  std::lock_guard<std::mutex> lock(*mu);
  return cache->try_emplace(d.str, std::move(parsed)).first->second;  // the first one stays
}

// Below this many bytes a read is cheaper than releasing and retaking the GIL.
constexpr uint64_t kReleaseGilBytes = uint64_t{64} << 10;

// Gather outputs of at least this many bytes come from a process-wide
// HeapAllocator instead of NumPy: a fresh multi-MiB NumPy buffer is mmap'd by
// malloc and the kernel faults in and zeroes every page of it on each call,
// which costs about as much CPU as the gather itself. The allocator keeps up to
// two freed buffers and hands them back to the next gather of a similar size,
// so a loop `batch = store[idx]` reuses memory instead of faulting it again.
constexpr uint64_t kReusedOutputBytes = uint64_t{4} << 20;

// A writable, C-contiguous NumPy array of `shape` whose memory is `bytes`
// bytes from the reuse allocator when large enough, from NumPy otherwise. The
// array's base keeps the buffer alive; dropping the last view gives it back to
// the allocator's cache. REQUIRES: GIL.
py::array OutputArray(const py::dtype& dt, const std::vector<py::ssize_t>& shape, uint64_t bytes) {
  if (bytes < kReusedOutputBytes) return py::array(dt, shape);
  // Leaked on purpose: batches may be freed during interpreter shutdown.
  static auto* allocator = new std::shared_ptr<BatchAllocator>(HeapAllocator());
  auto mem = Unwrap((*allocator)->Allocate(0, bytes));
  uint8_t* data = mem->data();
  py::capsule owner(new std::shared_ptr<BatchMemory>(std::move(mem)),
                    [](void* p) { delete static_cast<std::shared_ptr<BatchMemory>*>(p); });
  return py::array(dt, shape, data, owner);
}

std::vector<py::ssize_t> ToShape(const uint64_t* dims, size_t n) {
  return std::vector<py::ssize_t>(dims, dims + n);
}

// Indices as a contiguous uint64 vector (Python has already rejected negative,
// bool and float indices).
std::vector<uint64_t> Indices(const py::array& idx) {
  auto a = py::array_t<uint64_t, py::array::c_style | py::array::forcecast>::ensure(idx);
  if (!a) throw py::error_already_set();
  return std::vector<uint64_t>(a.data(), a.data() + a.size());
}

py::array ReadOne(const Store& s, uint64_t i) {
  const Schema& sc = s.schema();
  std::vector<uint64_t> dims(sc.ndim);
  Check(s.RecordShape(i, dims.data()));  // no I/O beyond one index block
  const uint64_t bytes = Unwrap(s.RecordBytes(i));
  py::array out(NumpyDType(sc.dtype), ToShape(dims.data(), dims.size()));
  void* p = out.mutable_data();
  Status st;
  if (bytes < kReleaseGilBytes) {
    st = s.ReadRecord(i, p, bytes);
  } else {
    st = WithoutGil([&] { return s.ReadRecord(i, p, bytes); });
  }
  Check(st);
  return out;
}

py::array GatherDense(const Store& s, const py::array& idx_arr) {
  const Schema& sc = s.schema();
  std::vector<uint64_t> idx = Indices(idx_arr);
  std::vector<py::ssize_t> shape{static_cast<py::ssize_t>(idx.size())};
  for (uint64_t d : sc.item_shape) shape.push_back(static_cast<py::ssize_t>(d));
  const uint64_t item = sc.DenseItemBytes();
  uint64_t bytes = 0;
  // On overflow NumPy refuses the shape itself (ValueError).
  const bool huge = __builtin_mul_overflow(item, uint64_t{idx.size()}, &bytes);
  py::array out = huge ? py::array(NumpyDType(sc.dtype), shape)
                       : OutputArray(NumpyDType(sc.dtype), shape, bytes);
  uint8_t* base = static_cast<uint8_t*>(out.mutable_data());
  Check(WithoutGil([&] {
    std::vector<void*> outs(idx.size());
    for (size_t k = 0; k < idx.size(); ++k) outs[k] = base + k * item;
    return s.Gather(idx, outs, &ThreadPool::Default());
  }));
  return out;
}

// Ragged: one NumPy values buffer for the whole batch and per-record views
// into it (each view's base keeps the buffer alive).
py::list GatherRagged(const Store& s, const py::array& idx_arr) {
  const Schema& sc = s.schema();
  std::vector<uint64_t> idx = Indices(idx_arr);
  const size_t b = idx.size();
  std::vector<uint64_t> dims(b * sc.ndim), offsets(b + 1, 0);
  Check(WithoutGil([&] {
    for (size_t k = 0; k < b; ++k) {
      Result<uint64_t> bytes = s.RecordBytes(idx[k]);
      if (!bytes.ok()) return bytes.status();
      offsets[k + 1] = offsets[k] + *bytes;
      if (sc.ndim == 1) {
        // Rank 1: the shape follows from the length (RecordShape would locate
        // the record a second time in a store without a shape table).
        dims[k] = *bytes / sc.dtype.itemsize;
      } else {
        Status st = s.RecordShape(idx[k], dims.data() + k * sc.ndim);
        if (!st.ok()) return st;
      }
    }
    return Status::OK();
  }));
  py::array values =
      OutputArray(py::dtype::of<uint8_t>(), {static_cast<py::ssize_t>(offsets[b])}, offsets[b]);
  uint8_t* base = static_cast<uint8_t*>(values.mutable_data());
  Check(WithoutGil([&] {
    std::vector<void*> outs(b);
    for (size_t k = 0; k < b; ++k) outs[k] = base + offsets[k];
    return s.Gather(idx, outs, &ThreadPool::Default());
  }));
  py::dtype dt = NumpyDType(sc.dtype);
  py::list result(b);
  for (size_t k = 0; k < b; ++k) {
    result[k] =
        py::array(dt, ToShape(dims.data() + k * sc.ndim, sc.ndim), base + offsets[k], values);
  }
  return result;
}

const char* KindName(Kind k) { return k == Kind::kDense ? "dense" : "ragged"; }

// StoreWriter(path, kind, dtype, item_shape, ndim, codec, data_shards, dict_bytes, level,
// metadata, narrow): the schema and options, checked by the engine.
std::unique_ptr<PyWriter> MakeWriter(const std::string& path, const std::string& kind,
                                     const std::string& dtype, std::vector<uint64_t> item_shape,
                                     uint32_t ndim, const std::string& codec, uint32_t data_shards,
                                     std::optional<py::bytes> dict_bytes, int level,
                                     const std::string& metadata, bool narrow) {
  Schema schema;
  if (kind == "dense") {
    schema.kind = Kind::kDense;
    schema.item_shape = std::move(item_shape);
    schema.ndim = static_cast<uint32_t>(schema.item_shape.size());
  } else if (kind == "ragged") {
    schema.kind = Kind::kRagged;
    schema.ndim = ndim;
  } else {
    ThrowStatus(Status::InvalidArgument("kind must be 'dense' or 'ragged'"));
  }
  schema.dtype = Unwrap(DType::Parse(dtype));
  WriteOptions opt;
  opt.codec = Unwrap(ParseCodec(codec));
  opt.data_shards = data_shards;
  opt.level = level;
  if (dict_bytes) opt.dictionary = std::string(*dict_bytes);
  opt.user_metadata = metadata;
  opt.narrow_integers = narrow;
  auto w = std::make_unique<PyWriter>();
  w->writer = Unwrap(WithoutGil([&] { return StoreWriter::Create(path, schema, opt); }));
  return w;
}

// StoreWriter.append_ragged_from: takes records from the iterator `it` until
// `max_records` records or `max_bytes` bytes of them (or the end), checks each
// as it is taken, then appends them all in one engine call, so a large
// append is a few calls whose chunks the writer pipelines (compressing one
// while writing the one before). Returns (records appended, None): 0 at the
// end of `it`; or (i, record) for the first record i of this batch that is not
// an ndarray of `dt` and rank `ndim`: then nothing of the batch is appended.
// An exception of the iterator propagates, nothing of the batch appended.
py::tuple AppendRaggedFrom(PyWriter& w, const py::iterator& it, const py::dtype& dt, uint32_t ndim,
                           uint64_t max_records, uint64_t max_bytes) {
  if (max_records == 0 || max_bytes == 0) {
    ThrowStatus(Status::InvalidArgument("max_records and max_bytes must be > 0"));
  }
  std::vector<py::array> arrs;
  uint64_t bytes = 0;
  while (arrs.size() < max_records && bytes < max_bytes) {
    PyObject* next = PyIter_Next(it.ptr());
    if (next == nullptr) {
      if (PyErr_Occurred() != nullptr) throw py::error_already_set();
      break;
    }
    auto obj = py::reinterpret_steal<py::object>(next);
    auto bad = [&] { return py::make_tuple(static_cast<py::ssize_t>(arrs.size()), obj); };
    if (!py::isinstance<py::array>(obj)) return bad();
    auto a = py::reinterpret_borrow<py::array>(obj);
    py::dtype adt = a.dtype();
    if (adt.ptr() != dt.ptr() && (!adt.equal(dt) || adt.attr("str").cast<std::string>() !=
                                                        dt.attr("str").cast<std::string>())) {
      return bad();
    }
    if (static_cast<uint32_t>(a.ndim()) != ndim) return bad();
    if (!(a.flags() & py::array::c_style)) {
      a = py::array::ensure(a, py::array::c_style);
      if (!a) throw py::error_already_set();
    }
    bytes += static_cast<uint64_t>(a.nbytes());
    arrs.push_back(std::move(a));
  }
  const size_t n = arrs.size();
  std::vector<const void*> ptrs(n);
  std::vector<uint64_t> shapes(n * ndim);
  for (size_t k = 0; k < n; ++k) {
    ptrs[k] = arrs[k].data();
    for (uint32_t d = 0; d < ndim; ++d) shapes[k * ndim + d] = arrs[k].shape(d);
  }
  // `arrs` keeps every buffer alive while the GIL is released; the
  // writer reads each record from its own buffer (no gathering copy).
  if (n > 0) {
    Check(WithoutGil([&] {
      std::lock_guard<std::mutex> lock(w.mu);
      return w.writer ? w.writer->AppendRaggedRecords(ptrs.data(), shapes.data(), n)
                      : Status::State("builder is closed");
    }));
  }
  return py::make_tuple(static_cast<py::ssize_t>(n), py::none());
}

// loaderx._loaderx.StoreWriter: the builder behind Dense/Ragged.create.
void BindWriter(py::module_& m) {
  py::class_<PyWriter>(m, "StoreWriter", "Native Zrecord builder (use loaderx.zrecord).")
      .def(py::init(&MakeWriter), py::arg("path"), py::arg("kind"), py::arg("dtype"),
           py::arg("item_shape"), py::arg("ndim"), py::arg("codec"), py::arg("data_shards"),
           py::arg("dict_bytes"), py::arg("level") = 3, py::arg("metadata") = "",
           py::arg("narrow").noconvert() = true)
      .def(
          "append_dense",
          [](PyWriter& w, const py::array& data, uint64_t n) {
            if (!(data.flags() & py::array::c_style)) {
              ThrowStatus(Status::InvalidArgument("append_dense needs a C-contiguous array"));
            }
            const void* p = data.data();
            Check(WithoutGil([&] {
              std::lock_guard<std::mutex> lock(w.mu);
              return w.writer ? w.writer->AppendDense(p, n) : Status::State("builder is closed");
            }));
          },
          py::arg("data"), py::arg("n"))
      .def(
          "append_ragged",
          [](PyWriter& w, const py::array& values,
             const py::array_t<uint64_t, py::array::c_style>& shapes, uint64_t count) {
            if (!(values.flags() & py::array::c_style)) {
              ThrowStatus(Status::InvalidArgument("append_ragged needs C-contiguous values"));
            }
            const void* p = values.data();
            const uint64_t* sh = shapes.data();
            Check(WithoutGil([&] {
              std::lock_guard<std::mutex> lock(w.mu);
              return w.writer ? w.writer->AppendRagged(p, sh, count)
                              : Status::State("builder is closed");
            }));
          },
          py::arg("values"), py::arg("shapes"), py::arg("count"))
      .def("append_ragged_from", &AppendRaggedFrom, py::arg("it"), py::arg("dtype"),
           py::arg("ndim"), py::arg("max_records"), py::arg("max_bytes"),
           "Takes records from `it` up to `max_records` or `max_bytes`, checks them, appends "
           "them; returns (count, None), count 0 at the end, or (i, record) for the first "
           "record that is not an ndarray of `dtype` and rank `ndim` (nothing appended).")
      .def("publish",
           [](PyWriter& w) {
             Check(WithoutGil([&] {
               std::lock_guard<std::mutex> lock(w.mu);
               return w.writer ? w.writer->Publish() : Status::State("builder is closed");
             }));
           })
      .def("abort",
           [](PyWriter& w) {
             WithoutGil([&] {
               std::lock_guard<std::mutex> lock(w.mu);
               if (w.writer) w.writer->Abort();
             });
           })
      .def("__len__", [](PyWriter& w) {
        return WithoutGil([&] {
          std::lock_guard<std::mutex> lock(w.mu);
          return w.writer ? w.writer->size() : 0;
        });
      });
}

// loaderx._loaderx.Store: an open store's schema, reads, gathers and verify.
void BindReader(py::module_& m) {
  py::class_<Store, std::shared_ptr<Store>>(m, "Store",
                                            "Native read-only Zrecord store (use loaderx.zrecord).")
      .def_static(
          "open",
          [](const std::string& path) {
            return Unwrap(WithoutGil([&] { return Store::Open(path); }));
          },
          py::arg("path"))
      .def_property_readonly("kind", [](const Store& s) { return KindName(s.schema().kind); })
      .def_property_readonly("dtype", [](const Store& s) { return s.schema().dtype.str; })
      .def_property_readonly("item_shape", [](const Store& s) { return s.schema().item_shape; })
      .def_property_readonly("ndim", [](const Store& s) { return s.schema().ndim; })
      .def_property_readonly("codec", [](const Store& s) { return CodecName(s.codec()); })
      .def_property_readonly("data_shards", &Store::data_shards)
      .def_property_readonly("nbytes", &Store::nbytes)
      .def_property_readonly("stored_bytes", &Store::stored_bytes)
      .def_property_readonly("label", &Store::label)
      .def_property_readonly("metadata",
                             [](const Store& s) -> py::object {
                               if (s.user_metadata().empty()) return py::none();
                               return py::module_::import("json").attr("loads")(s.user_metadata());
                             })
      .def_property_readonly("format_version", &Store::format_version)
      .def("__len__", &Store::size)
      .def("read", &ReadOne, py::arg("i"), "Record i as an ndarray of its own shape.")
      .def("gather_dense", &GatherDense, py::arg("indices"),
           "Dense: records at `indices` (uint64) as one (B, *item_shape) ndarray.")
      .def("gather_ragged", &GatherRagged, py::arg("indices"),
           "Ragged: records at `indices` as a list of ndarrays viewing one buffer.")
      .def("record_shape",
           [](const Store& s, uint64_t i) {
             std::vector<uint64_t> dims(s.schema().ndim);
             Check(s.RecordShape(i, dims.data()));
             return py::tuple(py::cast(dims));
           })
      .def(
          "verify",
          [](const Store& s, std::optional<py::function> progress) {
            Check(WithoutGil([&] {
              // Called between verify rounds on this thread: takes the GIL to
              // report progress and to let Ctrl-C (or a raising callback) stop it.
              auto cb = [&](uint64_t done, uint64_t total) {
                py::gil_scoped_acquire gil;
                if (PyErr_CheckSignals() != 0) throw py::error_already_set();
                if (progress) (*progress)(done, total);
              };
              return s.Verify(cb);
            }));
          },
          py::arg("progress") = py::none());
}

void BindTrainDictionary(py::module_& m) {
  m.def(
      "train_dictionary",
      [](const std::vector<py::buffer>& samples, size_t capacity, const std::string& narrow_as) {
        std::optional<DType> dt;
        if (!narrow_as.empty()) dt = Unwrap(DType::Parse(narrow_as));
        std::vector<py::buffer_info> infos;
        infos.reserve(samples.size());
        std::vector<std::string_view> views;
        for (const auto& b : samples) {
          infos.push_back(b.request());
          const auto& i = infos.back();
          views.emplace_back(static_cast<const char*>(i.ptr),
                             static_cast<size_t>(i.size * i.itemsize));
        }
        return py::bytes(Unwrap(
            WithoutGil([&] { return TrainDictionary(views, capacity, dt ? &*dt : nullptr); })));
      },
      py::arg("samples"), py::arg("capacity"), py::arg("narrow_as") = "",
      "Trains a zstd dictionary of at most `capacity` bytes from C-contiguous sample buffers; "
      "with `narrow_as` (a dtype string), samples are narrowed as stores of that dtype narrow "
      "records.");
}

}  // namespace

void BindStore(py::module_& m) {
  BindWriter(m);
  BindReader(m);
  BindTrainDictionary(m);
}

}  // namespace loaderx::py_bind
