// _loaderx.Pipeline: the embedded batch source, a loaderx::Pipeline
// (common/include/loaderx/loader.h) behind the shared PySource face
// (py_source.h: poll loop, GIL rule, array builder). Batches are writable
// views of heap memory owned by the arrays' base.
#include <pybind11/stl.h>

#include <memory>
#include <tuple>
#include <vector>

#include "bindings.h"
#include "loaderx/loader.h"
#include "py_source.h"

namespace loaderx::py_bind {

namespace {

class PyPipeline final : public PySource {
 public:
  PyPipeline(std::vector<std::shared_ptr<const Store>> stores, const SamplerSpec& spec,
             const PipelineOptions& options, RaggedForm ragged) {
    for (const auto& s : stores) {
      if (s == nullptr) ThrowStatus(Status::InvalidArgument("stores: a store is None"));
    }
    Result<std::unique_ptr<Pipeline>> p =
        WithoutGil([&] { return Pipeline::Create(std::move(stores), spec, options); });
    Init(Unwrap(std::move(p)), ragged);
  }
};

}  // namespace

void BindLoader(py::module_& m) {
  m.def(
      "effective_batch_size",
      [](uint64_t n, uint64_t batch_size, uint32_t mode, uint64_t world_size) {
        SamplerSpec spec;
        spec.n = n;
        spec.batch_size = batch_size;
        spec.mode = static_cast<SamplerMode>(mode);
        spec.world_size = world_size;
        return spec.Effective().batch_size;
      },
      py::arg("n"), py::arg("batch_size"), py::arg("mode"), py::arg("world_size"),
      "The per-rank batch a sampler of this spec draws (SamplerSpec::Effective: one Cyclic "
      "rank with batch_size > n draws whole cycles of n).");
  py::class_<PyPipeline, PySource>(m, "Pipeline", R"doc(
Native prefetching batch pipeline (internal; use loaderx.dataloader.DataLoader).

Pipeline(stores, *, n, batch_size, mode, seed, rank, world_size, start_step,
         prefetch, num_threads, ragged="list", segments=[])

segments: (start_step, base, size) triples of a mixture schedule (see
loaderx/sampler.h, "Segments"); empty draws over all n from step 0.
stores are native store handles of equal length n; mode is 0 Sequential,
1 IID, 2 Cyclic; ragged is "list" or "packed" (see Source). next/seek/step/
close: see Source; the arrays are writable.
)doc")
      .def(py::init([](std::vector<std::shared_ptr<Store>> stores, uint64_t n, uint64_t batch_size,
                       int mode, uint64_t seed, uint64_t rank, uint64_t world_size,
                       uint64_t start_step, uint32_t prefetch, uint32_t num_threads,
                       const py::object& ragged,
                       const std::vector<std::tuple<uint64_t, uint64_t, uint64_t>>& segments) {
             const RaggedForm form = ParseRaggedForm(ragged);
             if (mode < 0 || mode > 2) {
               ThrowStatus(Status::InvalidArgument("mode must be 0, 1 or 2"));
             }
             SamplerSpec spec;
             spec.n = n;
             spec.batch_size = batch_size;
             spec.mode = static_cast<SamplerMode>(mode);
             spec.seed = seed;
             spec.rank = rank;
             spec.world_size = world_size;
             for (const auto& [start, base, size] : segments) {
               spec.segments.push_back(SamplerSegment{start, base, size});
             }
             PipelineOptions options;
             options.start_step = start_step;
             options.prefetch = prefetch;
             options.num_threads = num_threads;
             return std::make_unique<PyPipeline>(
                 std::vector<std::shared_ptr<const Store>>(stores.begin(), stores.end()), spec,
                 options, form);
           }),
           py::arg("stores"), py::kw_only(), py::arg("n"), py::arg("batch_size"), py::arg("mode"),
           py::arg("seed"), py::arg("rank"), py::arg("world_size"), py::arg("start_step"),
           py::arg("prefetch"), py::arg("num_threads"), py::arg("ragged") = "list",
           py::arg("segments") = std::vector<std::tuple<uint64_t, uint64_t, uint64_t>>{});
}

}  // namespace loaderx::py_bind
