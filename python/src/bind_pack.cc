// _loaderx.Packer: sequence packing (common/include/loaderx/pack.h) for
// loaderx.packing. The constructor validates the settings (the one place they
// are checked); pack() takes one batch's documents (per packed stream a list
// of 1-D ndarrays, as a Ragged stream delivers them), packs them with the GIL
// released and returns ndarrays owning the packer's buffers (no copy).
//
// Thread-safety: a Packer is immutable after construction; any number of
// threads may call pack() at once (each call holds references to its input
// arrays while the GIL is released).
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bindings.h"
#include "loaderx/pack.h"

namespace loaderx::py_bind {

namespace {

[[noreturn]] void ThrowTypeError(const std::string& message) {
  py::object cls = py::module_::import("loaderx.errors").attr("ArgumentTypeError");
  PyErr_SetString(cls.ptr(), message.c_str());
  throw py::error_already_set();
}

// An int (or NumPy integer; not a bool) as int64, else ArgumentTypeError /
// InvalidArgumentError naming `what`.
int64_t ToInt64(const py::handle& obj, const std::string& what) {
  if (PyBool_Check(obj.ptr()) != 0) ThrowTypeError(what + " must be an int, got bool");
  PyObject* index = PyNumber_Index(obj.ptr());
  if (index == nullptr) {
    PyErr_Clear();
    ThrowTypeError(what + " must be an int, got " + std::string(Py_TYPE(obj.ptr())->tp_name));
  }
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(index, &overflow);  // NOLINT(google-runtime-int)
  Py_DECREF(index);
  if (overflow != 0) {
    ThrowStatus(Status::InvalidArgument(what + " is out of the int64 range"));
  }
  return static_cast<int64_t>(v);
}

uint64_t ToCount(const py::handle& obj, const std::string& what, int64_t minimum) {
  const int64_t v = ToInt64(obj, what);
  if (v < minimum) {
    ThrowStatus(Status::InvalidArgument(what + " must be >= " + std::to_string(minimum) + ", got " +
                                        std::to_string(v)));
  }
  return static_cast<uint64_t>(v);
}

template <typename T>
py::array Owning(std::unique_ptr<T[]> buf, const py::dtype& dtype, std::vector<py::ssize_t> shape) {
  T* data = buf.get();
  py::capsule owner(buf.release(), [](void* p) { delete[] static_cast<T*>(p); });
  return {dtype, std::move(shape), data, owner};
}

py::array OwningVector(std::vector<int32_t> v, std::vector<py::ssize_t> shape) {
  auto* heap = new std::vector<int32_t>(std::move(v));
  py::capsule owner(heap, [](void* p) { delete static_cast<std::vector<int32_t>*>(p); });
  return {py::dtype::of<int32_t>(), std::move(shape), heap->data(), owner};
}

class PyPacker {
 public:
  PyPacker(const py::object& seq_len, const py::object& rows, const py::object& docs,
           const py::object& policy, const std::vector<py::object>& pad,
           const py::object& cu_seqlens, const std::vector<py::object>& names) {
    for (const py::object& name : names) {
      if (!py::isinstance<py::str>(name)) {
        ThrowTypeError("packing streams must be str names, got " +
                       std::string(Py_TYPE(name.ptr())->tp_name));
      }
      std::string s = name.cast<std::string>();
      for (const std::string& seen : names_) {
        if (seen == s) {
          ThrowStatus(Status::InvalidArgument("packing streams name '" + s + "' twice"));
        }
      }
      names_.push_back(std::move(s));
    }
    if (!py::isinstance<py::str>(policy)) {
      ThrowTypeError("packing policy must be a str, got " +
                     std::string(Py_TYPE(policy.ptr())->tp_name));
    }
    if (PyBool_Check(cu_seqlens.ptr()) == 0) {
      ThrowTypeError("packing cu_seqlens must be a bool, got " +
                     std::string(Py_TYPE(cu_seqlens.ptr())->tp_name));
    }
    spec_.seq_len = ToCount(seq_len, "packing seq_len", 1);
    spec_.rows = ToCount(rows, "packing rows", 1);
    spec_.docs = docs.is_none() ? 0 : ToCount(docs, "packing docs", 1);
    spec_.policy = Unwrap(ParsePackPolicy(policy.cast<std::string>()));
    spec_.cu_seqlens = cu_seqlens.ptr() == Py_True;
    if (pad.size() != names_.size()) {
      ThrowStatus(Status::InvalidArgument("packing: " + std::to_string(names_.size()) +
                                          " streams but " + std::to_string(pad.size()) +
                                          " pad values"));
    }
    for (size_t s = 0; s < pad.size(); ++s) {
      spec_.pad.push_back(ToInt64(pad[s], "packing pad_id of '" + names_[s] + "'"));
    }
    Check(spec_.Validate());
  }

  // Units of a batch of `batch_size` documents whose packed streams have `dtypes`.
  uint64_t CheckBatch(const py::object& batch_size, const std::vector<std::string>& dtypes) const {
    const uint64_t units = Unwrap(spec_.Units(ToCount(batch_size, "batch_size", 1)));
    if (dtypes.size() != names_.size()) {
      ThrowStatus(Status::InvalidArgument("packing: " + std::to_string(dtypes.size()) +
                                          " dtypes for " + std::to_string(names_.size()) +
                                          " streams"));
    }
    for (size_t s = 0; s < dtypes.size(); ++s) {
      const DType dtype = Unwrap(DType::Parse(dtypes[s]));
      Check(spec_.CheckDType(s, dtype, names_[s]));
    }
    return units;
  }

  py::tuple Pack(const py::sequence& streams) const {
    if (static_cast<size_t>(py::len(streams)) != names_.size()) {
      ThrowStatus(Status::InvalidArgument("packing: " + std::to_string(py::len(streams)) +
                                          " streams given for " + std::to_string(names_.size())));
    }
    std::vector<PackStream> in(names_.size());
    std::vector<py::dtype> dtypes;
    std::vector<py::array> keep;  // the documents stay alive while the GIL is released
    for (size_t s = 0; s < names_.size(); ++s) {
      PackStream& st = in[s];
      st.name = names_[s];
      py::object docs = streams[s];
      if (!py::isinstance<py::sequence>(docs) || py::isinstance<py::str>(docs)) {
        ThrowTypeError("packed stream '" + st.name + "' must be a list of 1-D ndarrays, got " +
                       std::string(Py_TYPE(docs.ptr())->tp_name));
      }
      auto seq = py::reinterpret_borrow<py::sequence>(docs);
      const size_t n = py::len(seq);
      st.docs.reserve(n);
      for (size_t i = 0; i < n; ++i) {
        py::object item = seq[i];
        if (!py::isinstance<py::array>(item)) {
          ThrowTypeError("packed stream '" + st.name + "': document " + std::to_string(i) +
                         " must be an ndarray, got " + std::string(Py_TYPE(item.ptr())->tp_name));
        }
        auto arr = py::reinterpret_borrow<py::array>(item);
        if (arr.ndim() != 1) {
          ThrowStatus(Status::SchemaError("packed stream '" + st.name + "': document " +
                                          std::to_string(i) + " has " + std::to_string(arr.ndim()) +
                                          " dimensions, not 1"));
        }
        if ((arr.flags() & py::array::c_style) == 0) {
          ThrowStatus(Status::SchemaError("packed stream '" + st.name + "': document " +
                                          std::to_string(i) + " is not contiguous"));
        }
        if (i == 0) {
          dtypes.push_back(arr.dtype());
          st.dtype = Unwrap(DType::Parse(py::str(arr.dtype().attr("str")).cast<std::string>()));
        } else if (!arr.dtype().is(dtypes.back()) &&
                   py::str(arr.dtype().attr("str")).cast<std::string>() != st.dtype.str) {
          ThrowStatus(Status::SchemaError("packed stream '" + st.name + "': document " +
                                          std::to_string(i) + " has dtype " +
                                          py::str(arr.dtype().attr("str")).cast<std::string>() +
                                          ", document 0 " + st.dtype.str));
        }
        st.docs.push_back({arr.data(), static_cast<uint64_t>(arr.shape(0))});
        keep.push_back(std::move(arr));
      }
      if (n == 0) dtypes.emplace_back("<i4");  // refused by Units() below
    }
    Result<PackedBatch> r = WithoutGil([&] { return loaderx::Pack(spec_, in); });
    PackedBatch b = Unwrap(std::move(r));
    const auto rows = static_cast<py::ssize_t>(b.rows);
    const auto len = static_cast<py::ssize_t>(b.seq_len);
    py::list out;
    for (size_t s = 0; s < b.streams.size(); ++s) {
      out.append(Owning(std::move(b.streams[s]), dtypes[s], {rows, len}));
    }
    py::object cu = py::none();
    if (spec_.cu_seqlens) {
      const auto n = static_cast<py::ssize_t>(b.cu_seqlens.size());
      cu = OwningVector(std::move(b.cu_seqlens), {n});
    }
    py::dict counts;
    counts["tokens"] = b.counts.tokens;
    counts["tokens_padded"] = b.counts.tokens_padded;
    counts["tokens_dropped"] = b.counts.tokens_dropped;
    counts["docs_split"] = b.counts.docs_split;
    counts["docs_truncated"] = b.counts.docs_truncated;
    return py::make_tuple(out, OwningVector(std::move(b.segment_ids), {rows, len}),
                          OwningVector(std::move(b.positions), {rows, len}), cu, counts);
  }

  const PackSpec& spec() const { return spec_; }

 private:
  PackSpec spec_;
  std::vector<std::string> names_;
};

}  // namespace

void BindPack(py::module_& m) {
  py::class_<PyPacker>(m, "Packer", R"doc(
Native sequence packer (internal; use loaderx.packing.Packing).

Packer(seq_len, rows, docs, policy, pad, cu_seqlens, names)

Validates the settings (InvalidArgumentError / ArgumentTypeError naming the
bad one). pack(streams) takes, per packed stream, the batch's documents as a
list of 1-D integer ndarrays and returns (arrays, segment_ids, positions,
cu_seqlens or None, counts); see common/include/loaderx/pack.h.
)doc")
      .def(py::init<const py::object&, const py::object&, const py::object&, const py::object&,
                    const std::vector<py::object>&, const py::object&,
                    const std::vector<py::object>&>(),
           py::arg("seq_len"), py::arg("rows"), py::arg("docs"), py::arg("policy"), py::arg("pad"),
           py::arg("cu_seqlens"), py::arg("names"))
      .def("check", &PyPacker::CheckBatch, py::arg("batch_size"), py::arg("dtypes"),
           "Units per batch of batch_size documents with these dtypes; raises if they cannot "
           "be packed.")
      .def("pack", &PyPacker::Pack, py::arg("streams"),
           "Packs one batch: (arrays, segment_ids, positions, cu_seqlens or None, counts).")
      .def_property_readonly("seq_len", [](const PyPacker& p) { return p.spec().seq_len; })
      .def_property_readonly("rows", [](const PyPacker& p) { return p.spec().rows; })
      .def_property_readonly("docs", [](const PyPacker& p) { return p.spec().docs; })
      .def_property_readonly("policy",
                             [](const PyPacker& p) { return PackPolicyName(p.spec().policy); });
}

}  // namespace loaderx::py_bind
