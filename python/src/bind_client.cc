// _loaderx.DaemonLoader / _loaderx.daemon_stats: the loaderxd client.
//
// A DaemonLoader is a client::Loader (client/include/loaderx/client.h)
// behind the shared PySource face (py_source.h): the same poll loop, GIL
// rule, argument checks and array builder as the embedded Pipeline, so
// batches come back exactly like its (step, [values]). Every array of a
// batch has the same base, a capsule owning the slot lease; the slot returns
// to the daemon when the last array of the batch is freed. Arrays are
// writable (a private copy-on-write mapping of the slot) unless
// shared_view=True asks for read-only views of the shared ring itself.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "bindings.h"
#include "loaderx/group.h"
#include "loaderx/timeouts.h"
#include "loaderx/wire.h"
#include "py_source.h"

#ifdef LOADERX_HAVE_CLIENT
#include "loaderx/client.h"
#endif

namespace loaderx::py_bind {

#ifdef LOADERX_HAVE_CLIENT
namespace {

// Seconds from Python as the spec's milliseconds; the range is the spec's
// rule (LoaderSpec::ValidateOptions), only what cannot be a duration is
// refused here. Saturates far above any allowed value.
std::chrono::milliseconds Millis(const char* name, double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) {
    ThrowStatus(Status::InvalidArgument(std::string(name) +
                                        " must be a finite number of seconds >= 0, got " +
                                        std::to_string(seconds)));
  }
  return std::chrono::milliseconds(std::llround(std::min(seconds, 1e12) * 1000));
}

// The keyword constructor of _loaderx.LoaderSpec: Python's words (None, the
// mode's number, 'shard' / 'broadcast', seconds) mapped onto the C++ value.
client::LoaderSpec MakeLoaderSpec(
    std::vector<std::string> stores, uint64_t batch_size, uint32_t mode, uint64_t seed,
    uint64_t rank, uint64_t world_size, uint64_t start_step, uint32_t prefetch, uint32_t leases,
    uint64_t ring_bytes, const std::optional<std::string>& group, const std::string& group_mode,
    const std::optional<std::string>& join, bool shared_view, double liveness_timeout,
    std::optional<double> group_timeout, std::vector<uint64_t> mix_counts,
    std::vector<std::vector<std::string>> mix_parts, uint64_t ranks_first, uint64_t ranks_count,
    int64_t ranks_step, uint32_t replicas, uint64_t mix_datasets,
    const std::vector<std::tuple<uint64_t, uint64_t, uint64_t>>& segments) {
  if (mode > 2) ThrowStatus(Status::InvalidArgument("mode must be 0, 1 or 2"));
  client::LoaderSpec spec;
  if (group) {
    if (group->empty()) {
      ThrowStatus(Status::InvalidArgument("group must be 1.." + std::to_string(kMaxGroupName) +
                                          " UTF-8 bytes, got 0"));
    }
    spec.group = *group;
  }
  if (std::optional<GroupMode> gm = ParseGroupMode(group_mode)) {
    spec.group_mode = *gm;
  } else {
    ThrowStatus(Status::InvalidArgument("group_mode must be 'shard' or 'broadcast', got '" +
                                        group_mode + "'"));
  }
  if (join) {
    if (std::optional<GroupJoin> gj = ParseGroupJoin(*join)) {
      spec.join = *gj;
    } else {
      ThrowStatus(Status::InvalidArgument("join must be 'start_step', 'current' or None, got '" +
                                          *join + "'"));
    }
  }
  spec.stores = std::move(stores);
  spec.mix_counts = std::move(mix_counts);
  spec.mix_parts = std::move(mix_parts);
  spec.mix_datasets = mix_datasets;
  for (const auto& [start, base, size] : segments) {
    spec.segments.push_back(SamplerSegment{start, base, size});
  }
  spec.batch_size = batch_size;
  spec.mode = static_cast<SamplerMode>(mode);
  spec.seed = seed;
  spec.rank = rank;
  spec.world_size = world_size;
  spec.start_step = start_step;
  spec.prefetch = prefetch;
  spec.leases = leases;
  spec.ring_bytes = ring_bytes;
  spec.shared_view = shared_view;
  spec.liveness_timeout = Millis("liveness_timeout", liveness_timeout);
  if (group_timeout) spec.group_timeout = Millis("group_timeout", *group_timeout);
  spec.ranks_first = ranks_first;
  spec.ranks_count = ranks_count;
  spec.ranks_step = ranks_step;
  spec.replicas = replicas;
  return spec;
}

class DaemonLoader final : public PySource {
 public:
  DaemonLoader(const std::string& path, const client::LoaderSpec& spec, const py::object& ragged) {
    const RaggedForm form = ParseRaggedForm(ragged);
    Result<std::unique_ptr<client::Loader>> loader = WithoutGil([&] {
      Result<std::unique_ptr<Client>> c = Client::Connect(path);
      return c.ok() ? (*c)->OpenLoader(spec) : Result<std::unique_ptr<client::Loader>>(c.status());
    });
    std::unique_ptr<client::Loader> l = Unwrap(std::move(loader));
    loader_ = l.get();
    Init(std::move(l), form);
  }

  uint32_t lease_cap() const { return loader_->lease_cap(); }
  uint32_t leases_held() const { return loader_->leases_held(); }
  uint64_t batches_moved_out() const { return loader_->batches_moved_out(); }
  uint64_t ring_bytes() const { return loader_->ring_bytes(); }
  uint64_t size() const { return loader_->size(); }
  uint64_t last_publish_ns() const { return loader_->last_publish_ns(); }

 private:
  client::Loader* loader_ = nullptr;  // owned by the PySource base
};

py::dict DaemonStats(const std::string& path) {
  using Counters = std::vector<std::pair<std::string, uint64_t>>;
  Result<Counters> r = WithoutGil([&] {
    Result<std::unique_ptr<Client>> c = Client::Connect(path);
    return c.ok() ? (*c)->Stats() : Result<Counters>(c.status());
  });
  py::dict d;
  for (const auto& [k, v] : Unwrap(std::move(r))) d[py::str(k)] = v;
  return d;
}

// (counters, status JSON); the JSON is "" from a daemon older than 1.2.
py::tuple DaemonStatus(const std::string& path) {
  Result<client::DaemonReport> r = WithoutGil([&] {
    Result<std::unique_ptr<Client>> c = Client::Connect(path);
    return c.ok() ? (*c)->Report() : Result<client::DaemonReport>(c.status());
  });
  client::DaemonReport reply = Unwrap(std::move(r));
  py::dict d;
  for (const auto& [k, v] : reply.counters) d[py::str(k)] = v;
  return py::make_tuple(d, py::str(reply.status));
}

}  // namespace
#endif  // LOADERX_HAVE_CLIENT

void BindClient(py::module_& m) {
  // The wire protocol this build speaks, "major.minor" (docs/protocol.md).
  m.attr("PROTOCOL_VERSION") =
      std::to_string(kProtocolMajor) + "." + std::to_string(kProtocolMinor);
#ifdef LOADERX_HAVE_CLIENT
  py::class_<client::LoaderSpec>(m, "LoaderSpec", R"doc(
Everything a loaderxd loader is opened with (client/include/loaderx/client.h
LoaderSpec), built from keywords: the loader's sampler settings, its stores
(paths; a mixture's parts in mix_parts), and the DaemonOptions fields.
validate_options() checks the DaemonOptions fields alone, validate() all of
it; both raise ValueError naming the field, and DaemonLoader validates
before it connects.)doc")
      .def(py::init(&MakeLoaderSpec), py::kw_only(), py::arg("stores") = std::vector<std::string>(),
           py::arg("batch_size") = 0, py::arg("mode") = 1, py::arg("seed") = 42,
           py::arg("rank") = 0, py::arg("world_size") = 1, py::arg("start_step") = 0,
           py::arg("prefetch") = 4, py::arg("leases") = 8, py::arg("ring_bytes") = 0,
           py::arg("group") = py::none(), py::arg("group_mode") = "shard",
           py::arg("join") = py::none(), py::arg("shared_view") = false,
           py::arg("liveness_timeout") =
               std::chrono::duration<double>(client::kDefaultLivenessTimeout).count(),
           py::arg("group_timeout") = py::none(), py::arg("mix_counts") = std::vector<uint64_t>(),
           py::arg("mix_parts") = std::vector<std::vector<std::string>>(),
           py::arg("ranks_first") = 0, py::arg("ranks_count") = 0, py::arg("ranks_step") = 1,
           py::arg("replicas") = 1, py::arg("mix_datasets") = 0,
           py::arg("segments") = std::vector<std::tuple<uint64_t, uint64_t, uint64_t>>{})
      .def(
          "validate_options", [](const client::LoaderSpec& s) { Check(s.ValidateOptions()); },
          "Raises ValueError naming the first DaemonOptions field that breaks a rule.")
      .def(
          "validate", [](const client::LoaderSpec& s) { Check(s.Validate()); },
          "Raises ValueError naming the first field that breaks a rule.");
  py::class_<DaemonLoader, PySource>(m, "DaemonLoader", R"doc(
A loader served by loaderxd (see loaderx.client), opened with a LoaderSpec.
Opens the store files in this process and passes their fds; batches are
zero-copy views of the daemon's shared-memory ring: writable copy-on-write
mappings of their slot, or read-only views of the ring itself with
shared_view=True. ragged: "list" or "packed", as for Pipeline (see Source).)doc")
      .def(py::init<const std::string&, const client::LoaderSpec&, const py::object&>(),
           py::arg("path"), py::arg("spec"), py::arg("ragged") = "list")
      .def_property_readonly("lease_cap", &DaemonLoader::lease_cap)
      .def_property_readonly("leases_held", &DaemonLoader::leases_held)
      .def_property_readonly("batches_moved_out", &DaemonLoader::batches_moved_out,
                             "Held batches moved out of the ring to stay under the lease cap.")
      .def_property_readonly("ring_bytes", &DaemonLoader::ring_bytes)
      .def_property_readonly("size", &DaemonLoader::size)
      .def_property_readonly("last_publish_ns", &DaemonLoader::last_publish_ns,
                             "When loaderxd published the batch next() returned last: "
                             "CLOCK_MONOTONIC ns, comparable with time.monotonic_ns() "
                             "(0 from a daemon without publish stamps).");
  m.def("daemon_stats", &DaemonStats, py::arg("path"),
        "loaderxd's counters as a dict (sessions, loaders, slots_held, ring_bytes, ...).");
  m.def("daemon_status", &DaemonStatus, py::arg("path"),
        "(counters, status JSON) of loaderxd (docs/daemon.md \"Status\"); the JSON is '' "
        "from a daemon older than protocol 1.2.");
  m.attr("HAVE_DAEMON_CLIENT") = true;
#else
  m.attr("HAVE_DAEMON_CLIENT") = false;
#endif
  // The protocol's group-name limit (loaderx/group.h), so Python checks the same bound.
  m.attr("MAX_GROUP_NAME") = kMaxGroupName;
  // The client's timeout bounds in seconds (loaderx/timeouts.h), in every build.
  auto seconds = [](std::chrono::milliseconds ms) {
    return std::chrono::duration<double>(ms).count();
  };
  m.attr("DEFAULT_LIVENESS_TIMEOUT") = seconds(client::kDefaultLivenessTimeout);
  m.attr("MIN_LIVENESS_TIMEOUT") = seconds(client::kMinLivenessTimeout);
  m.attr("MIN_GROUP_TIMEOUT") = seconds(client::kMinGroupTimeout);
}

}  // namespace loaderx::py_bind
