// _loaderx.DaemonLoader / _loaderx.daemon_stats: the loaderxd client.
//
// Batches come back exactly like the embedded Pipeline's (step, [values]):
// a dense stream is one (B, *item_shape) ndarray, a ragged stream a list of
// B ndarrays, all viewing the shared-memory ring without a copy and all
// READ-ONLY (the ring is mapped read-only: writing would fault). Every array
// of a batch has the same base, a capsule owning the slot lease; the slot
// returns to the daemon when the last array of the batch is freed.
//
// The GIL is released for every wait on the daemon; waits are sliced so
// Ctrl-C (PyErr_CheckSignals) and a daemon hang-up surface promptly.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <chrono>

#include "bindings.h"

#ifdef LOADERX_HAVE_CLIENT
#include "loaderx/client.h"
#endif

namespace loaderx::py_bind {

#ifdef LOADERX_HAVE_CLIENT
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::chrono::milliseconds kPollSlice{20};

class DaemonLoader {
 public:
  DaemonLoader(const std::string& path, std::vector<std::string> stores, uint64_t batch_size,
               uint32_t mode, uint64_t seed, uint64_t rank, uint64_t world_size,
               uint64_t start_step, uint32_t prefetch, uint32_t leases, uint64_t ring_bytes) {
    if (mode > 2) throw py::value_error("mode must be 0, 1 or 2");
    client::LoaderSpec spec;
    spec.stores = std::move(stores);
    spec.batch_size = batch_size;
    spec.mode = static_cast<SamplerMode>(mode);
    spec.seed = seed;
    spec.rank = rank;
    spec.world_size = world_size;
    spec.start_step = start_step;
    spec.prefetch = prefetch;
    spec.leases = leases;
    spec.ring_bytes = ring_bytes;
    Result<std::unique_ptr<client::Loader>> loader = Status::Internal("unset");
    {
      py::gil_scoped_release release;
      Result<std::unique_ptr<Client>> c = Client::Connect(path);
      loader = c.ok() ? (*c)->OpenLoader(spec) : Result<std::unique_ptr<client::Loader>>(c.status());
    }
    loader_ = Unwrap(std::move(loader));
    for (const client::StreamInfo& s : loader_->streams()) dtypes_.push_back(py::dtype(s.dtype));
  }

  // (step, [values]) or None if `timeout` (seconds, None = forever) passed.
  py::object Next(std::optional<double> timeout) {
    const auto deadline =
        timeout ? Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                     std::chrono::duration<double>(std::max(0.0, *timeout)))
                : Clock::time_point::max();
    for (;;) {
      auto slice = kPollSlice;
      if (timeout) {
        auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
        slice = std::clamp(left, std::chrono::milliseconds{0}, kPollSlice);
      }
      Result<std::optional<client::Batch>> r = std::optional<client::Batch>();
      {
        py::gil_scoped_release release;
        r = loader_->NextFor(slice);
      }
      if (!r.ok()) ThrowStatus(r.status());
      if (r->has_value()) return ToPython(std::move(**r));
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();
      if (timeout && Clock::now() >= deadline) return py::none();
    }
  }

  void Seek(uint64_t step) {
    Status st;
    {
      py::gil_scoped_release release;
      st = loader_->Seek(step, [] {
        py::gil_scoped_acquire acquire;
        return PyErr_CheckSignals() != 0 ? Status::Cancelled("interrupted") : Status::OK();
      });
    }
    if (PyErr_Occurred()) throw py::error_already_set();
    Check(st);
  }

  uint64_t step() const { return loader_->Step(); }
  void Close() { loader_->Close(); }
  uint32_t lease_cap() const { return loader_->lease_cap(); }
  uint32_t leases_held() const { return loader_->leases_held(); }
  uint64_t ring_bytes() const { return loader_->ring_bytes(); }
  uint64_t size() const { return loader_->size(); }

 private:
  py::object ToPython(client::Batch batch) {
    auto* owner = new std::shared_ptr<client::Lease>(batch.lease());
    py::capsule base(owner, "loaderx.DaemonLease",
                     [](void* p) { delete static_cast<std::shared_ptr<client::Lease>*>(p); });
    auto readonly = [](py::array a) {
      py::detail::array_proxy(a.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
      return a;
    };
    py::list values;
    for (size_t j = 0; j < batch.num_streams(); ++j) {
      const client::StreamInfo& s = loader_->streams()[j];
      if (s.kind == Kind::kDense) {
        client::ArrayView v = batch.Dense(j);
        std::vector<py::ssize_t> shape(v.shape.begin(), v.shape.end());
        values.append(readonly(py::array(dtypes_[j], shape, {}, v.data, base)));
        continue;
      }
      py::list records;
      for (uint64_t k = 0; k < batch.batch_size(); ++k) {
        client::ArrayView v = batch.Record(j, k);
        std::vector<py::ssize_t> shape(v.shape.begin(), v.shape.end());
        records.append(readonly(py::array(dtypes_[j], shape, {}, v.data, base)));
      }
      values.append(std::move(records));
    }
    return py::make_tuple(batch.step(), std::move(values));
  }

  std::unique_ptr<client::Loader> loader_;
  std::vector<py::dtype> dtypes_;
};

py::dict DaemonStats(const std::string& path) {
  Result<std::vector<std::pair<std::string, uint64_t>>> r = Status::Internal("unset");
  {
    py::gil_scoped_release release;
    Result<std::unique_ptr<Client>> c = Client::Connect(path);
    r = c.ok() ? (*c)->Stats() : Result<std::vector<std::pair<std::string, uint64_t>>>(c.status());
  }
  py::dict d;
  for (const auto& [k, v] : Unwrap(std::move(r))) d[py::str(k)] = v;
  return d;
}

}  // namespace
#endif  // LOADERX_HAVE_CLIENT

void BindClient(py::module_& m) {
#ifdef LOADERX_HAVE_CLIENT
  py::class_<DaemonLoader>(m, "DaemonLoader", R"doc(
A loader served by loaderxd (see loaderx.client). Opens the store files in
this process and passes their fds; batches are read-only zero-copy views of
the daemon's shared-memory ring.)doc")
      .def(py::init<const std::string&, std::vector<std::string>, uint64_t, uint32_t, uint64_t,
                    uint64_t, uint64_t, uint64_t, uint32_t, uint32_t, uint64_t>(),
           py::arg("path"), py::arg("stores"), py::arg("batch_size"), py::arg("mode"),
           py::arg("seed"), py::arg("rank"), py::arg("world_size"), py::arg("start_step"),
           py::arg("prefetch"), py::arg("leases"), py::arg("ring_bytes"))
      .def("next", &DaemonLoader::Next, py::arg("timeout") = py::none(),
           "(step, [values]) of the next batch, or None after `timeout` seconds.")
      .def("seek", &DaemonLoader::Seek, py::arg("step"))
      .def("close", &DaemonLoader::Close)
      .def_property_readonly("step", &DaemonLoader::step)
      .def_property_readonly("lease_cap", &DaemonLoader::lease_cap)
      .def_property_readonly("leases_held", &DaemonLoader::leases_held)
      .def_property_readonly("ring_bytes", &DaemonLoader::ring_bytes)
      .def_property_readonly("size", &DaemonLoader::size);
  m.def("daemon_stats", &DaemonStats, py::arg("path"),
        "loaderxd's counters as a dict (sessions, loaders, slots_held, ring_bytes, ...).");
  m.attr("HAVE_DAEMON_CLIENT") = true;
#else
  m.attr("HAVE_DAEMON_CLIENT") = false;
#endif
}

}  // namespace loaderx::py_bind
