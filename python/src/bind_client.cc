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
//
// The hand-off path builds the fewest Python objects it can: one capsule per
// batch, one ndarray per dense stream (or per ragged record) made directly by
// PyArray_NewFromDescr with the cached dtype, read-only from birth, the
// (step, values) tuple and its list; no temporary shape/stride vectors.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <chrono>

#include "bindings.h"
#include "loaderx/wire.h"

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
               uint64_t start_step, uint32_t prefetch, uint32_t leases, uint64_t ring_bytes,
               std::string group, const std::string& group_mode, const std::string& join) {
    if (mode > 2) throw py::value_error("mode must be 0, 1 or 2");
    if (group.size() > kMaxGroupName) {
      throw py::value_error("group: at most " + std::to_string(kMaxGroupName) +
                            " bytes, got " + std::to_string(group.size()));
    }
    GroupMode gm = GroupMode::kShard;
    if (group_mode == "broadcast") {
      gm = GroupMode::kBroadcast;
    } else if (group_mode != "shard") {
      throw py::value_error("group_mode must be 'shard' or 'broadcast', got '" + group_mode + "'");
    }
    GroupJoin gj = GroupJoin::kDefault;
    if (join == "start_step") {
      gj = GroupJoin::kStartStep;
    } else if (join == "current") {
      gj = GroupJoin::kCurrent;
    } else if (!join.empty()) {
      throw py::value_error("join must be 'start_step', 'current' or None, got '" + join + "'");
    }
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
    spec.group = std::move(group);
    spec.group_mode = gm;
    spec.join = gj;
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
  uint64_t last_publish_ns() const { return last_publish_ns_; }
  bool request_ahead() const { return loader_->request_ahead(); }
  void set_request_ahead(bool on) { loader_->set_request_ahead(on); }

 private:
  // A read-only C-contiguous view of `data` with `base` as its base object.
  // `dims` are checked against the ring by the client (ValidateBatch).
  static py::object View(const py::dtype& dtype, int nd, const Py_intptr_t* dims, const void* data,
                         const py::capsule& base) {
    auto& api = py::detail::npy_api::get();
    // flags 0: not writeable (the ring is mapped read-only); NumPy derives
    // contiguity and alignment itself. NewFromDescr steals the dtype ref.
    PyObject* arr = api.PyArray_NewFromDescr_(api.PyArray_Type_, dtype.inc_ref().ptr(), nd,
                                              dims, nullptr,
                                              const_cast<void*>(data), 0, nullptr);
    if (arr == nullptr) throw py::error_already_set();
    py::object owned = py::reinterpret_steal<py::object>(arr);
    // SetBaseObject steals the reference it is given, also on failure.
    if (api.PyArray_SetBaseObject_(arr, base.inc_ref().ptr()) != 0) throw py::error_already_set();
    return owned;
  }

  py::object ToPython(client::Batch batch) {
    last_publish_ns_ = batch.publish_ns();
    auto* owner = new std::shared_ptr<client::Lease>(batch.lease());
    py::capsule base(owner, "loaderx.DaemonLease",
                     [](void* p) { delete static_cast<std::shared_ptr<client::Lease>*>(p); });
    const size_t num_streams = batch.num_streams();
    py::list values(num_streams);
    Py_intptr_t dims[kMaxWireDims + 1];
    for (size_t j = 0; j < num_streams; ++j) {
      const client::StreamInfo& s = loader_->streams()[j];
      if (s.kind == Kind::kDense) {
        dims[0] = static_cast<Py_intptr_t>(batch.batch_size());
        for (size_t d = 0; d < s.item_shape.size(); ++d) {
          dims[d + 1] = static_cast<Py_intptr_t>(s.item_shape[d]);
        }
        values[j] = View(dtypes_[j], static_cast<int>(s.item_shape.size() + 1), dims,
                         batch.values(j), base);
        continue;
      }
      const uint64_t b = batch.batch_size();
      py::list records(b);
      for (uint64_t k = 0; k < b; ++k) {
        client::ArrayView v = batch.Record(j, k);
        for (size_t d = 0; d < v.shape.size(); ++d) dims[d] = static_cast<Py_intptr_t>(v.shape[d]);
        records[k] = View(dtypes_[j], static_cast<int>(v.shape.size()), dims, v.data, base);
      }
      values[j] = std::move(records);
    }
    return py::make_tuple(batch.step(), std::move(values));
  }

  std::unique_ptr<client::Loader> loader_;
  std::vector<py::dtype> dtypes_;
  uint64_t last_publish_ns_ = 0;  // of the batch next() returned last
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
                    uint64_t, uint64_t, uint64_t, uint32_t, uint32_t, uint64_t, std::string,
                    const std::string&, const std::string&>(),
           py::arg("path"), py::arg("stores"), py::arg("batch_size"), py::arg("mode"),
           py::arg("seed"), py::arg("rank"), py::arg("world_size"), py::arg("start_step"),
           py::arg("prefetch"), py::arg("leases"), py::arg("ring_bytes"), py::arg("group") = "",
           py::arg("group_mode") = "shard", py::arg("join") = "")
      .def("next", &DaemonLoader::Next, py::arg("timeout") = py::none(),
           "(step, [values]) of the next batch, or None after `timeout` seconds.")
      .def("seek", &DaemonLoader::Seek, py::arg("step"))
      .def("close", &DaemonLoader::Close)
      .def_property_readonly("step", &DaemonLoader::step)
      .def_property_readonly("lease_cap", &DaemonLoader::lease_cap)
      .def_property_readonly("leases_held", &DaemonLoader::leases_held)
      .def_property_readonly("ring_bytes", &DaemonLoader::ring_bytes)
      .def_property_readonly("size", &DaemonLoader::size)
      .def_property_readonly("last_publish_ns", &DaemonLoader::last_publish_ns,
                             "When loaderxd published the batch next() returned last: "
                             "CLOCK_MONOTONIC ns, comparable with time.monotonic_ns() "
                             "(0 from a daemon without publish stamps).")
      .def_property("request_ahead", &DaemonLoader::request_ahead,
                    &DaemonLoader::set_request_ahead,
                    "Ask for the following batch as soon as next() returns one, so the next "
                    "next() finds it queued (one more slot held at the daemon; see "
                    "loaderx.client.DaemonOptions).");
  m.def("daemon_stats", &DaemonStats, py::arg("path"),
        "loaderxd's counters as a dict (sessions, loaders, slots_held, ring_bytes, ...).");
  m.attr("HAVE_DAEMON_CLIENT") = true;
#else
  m.attr("HAVE_DAEMON_CLIENT") = false;
#endif
  // The protocol's group-name limit (wire.h), so Python checks the same bound.
  m.attr("MAX_GROUP_NAME") = kMaxGroupName;
}

}  // namespace loaderx::py_bind
