// _loaderx.Pipeline: the native batch source behind loaderx.dataloader.
//
// A thin face over loaderx::Pipeline (common/include/loaderx/loader.h). Every
// wait releases the GIL and polls in short slices, calling PyErr_CheckSignals
// between them, so Ctrl-C interrupts a blocked next() within kPollSlice.
// Batches come back as NumPy arrays viewing the batch memory without a copy:
// each array's base is one capsule that owns the BatchMemory, so the memory
// lives exactly as long as the last array of the batch.
//
// Thread-safety: all methods may be called from any thread; close() may race
// with a blocked next() in another thread (which then raises
// LoaderClosedError). No Python object is touched without the GIL.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <chrono>
#include <exception>
#include <memory>
#include <optional>
#include <vector>

#include "bindings.h"
#include "loaderx/loader.h"

namespace loaderx::py_bind {

namespace {

using Clock = std::chrono::steady_clock;

// Longest wait without looking at signals. Ctrl-C must land within 100 ms.
constexpr std::chrono::milliseconds kPollSlice{20};
static_assert(kPollSlice < std::chrono::milliseconds{100});

// Runs f() with the GIL released. Not gil_scoped_release: during interpreter
// finalization a daemon thread re-taking the GIL is ended by pthread_exit,
// a forced unwind that std::terminate()s when it leaves a destructor. Here
// the GIL is re-taken in plain code, so the unwind passes through.
template <typename F>
auto WithoutGil(F&& f) {
  using R = decltype(f());
  PyThreadState* state = PyEval_SaveThread();
  std::optional<R> result;
  std::exception_ptr error;
  try {
    result.emplace(f());
  } catch (...) {  // only f's exceptions: the forced unwind must pass freely
    error = std::current_exception();
  }
  PyEval_RestoreThread(state);
  if (error) std::rethrow_exception(error);
  return std::move(*result);
}

class PyPipeline {
 public:
  PyPipeline(std::vector<std::shared_ptr<const Store>> stores, const SamplerSpec& spec,
             const PipelineOptions& options)
      : stores_(stores) {
    for (const auto& s : stores_) {
      if (s == nullptr) ThrowStatus(Status::InvalidArgument("stores: a store is None"));
      dtypes_.push_back(py::dtype(s->schema().dtype.str));
    }
    Result<std::unique_ptr<Pipeline>> p =
        WithoutGil([&] { return Pipeline::Create(std::move(stores), spec, options); });
    pipeline_ = Unwrap(std::move(p));
  }

  // Returns (step, [value per store], indices) or None when `timeout` seconds
  // (None: forever) pass first. Raises the step's error, LoaderClosedError
  // after close(), KeyboardInterrupt on Ctrl-C.
  py::object Next(std::optional<double> timeout) {
    if (timeout && !(*timeout >= 0)) {
      ThrowStatus(Status::InvalidArgument("timeout must be >= 0 seconds"));
    }
    const auto deadline =
        timeout ? Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                     std::chrono::duration<double>(std::min(*timeout, 1e9)))
                : Clock::time_point::max();
    for (;;) {
      auto slice = kPollSlice;
      if (timeout) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
            deadline - Clock::now());
        slice = std::clamp(left, std::chrono::milliseconds{0}, kPollSlice);
      }
      Result<std::optional<Batch>> r = WithoutGil([&] { return pipeline_->NextFor(slice); });
      if (!r.ok()) ThrowStatus(r.status());
      if (r->has_value()) return ToPython(std::move(**r));
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();
      if (timeout && Clock::now() >= deadline) return py::none();
    }
  }

  void Seek(uint64_t step) {
    Check(WithoutGil([&] { return pipeline_->Seek(step); }));
  }

  uint64_t step() const { return pipeline_->step(); }

  void Close() {
    WithoutGil([&] {
      pipeline_->Close();
      return 0;
    });
  }

 private:
  py::object ToPython(Batch batch) {
    // One owner for every array of the batch.
    auto* owner = new std::shared_ptr<BatchMemory>(batch.memory);
    py::capsule base(owner, [](void* p) { delete static_cast<std::shared_ptr<BatchMemory>*>(p); });
    uint8_t* data = batch.memory->data();
    const auto b = static_cast<py::ssize_t>(batch.layout.batch_size);
    py::list values;
    for (size_t j = 0; j < stores_.size(); ++j) {
      const Schema& schema = stores_[j]->schema();
      const StreamLayout& s = batch.layout.streams[j];
      if (s.kind == Kind::kDense) {
        std::vector<py::ssize_t> shape{b};
        for (uint64_t d : schema.item_shape) shape.push_back(static_cast<py::ssize_t>(d));
        values.append(py::array(dtypes_[j], shape, {}, data + s.values_offset, base));
        continue;
      }
      const auto* shapes = reinterpret_cast<const uint64_t*>(data + s.shapes_offset);
      const auto* offsets = reinterpret_cast<const uint64_t*>(data + s.offsets_offset);
      py::list records;
      for (py::ssize_t k = 0; k < b; ++k) {
        std::vector<py::ssize_t> shape(shapes + k * schema.ndim, shapes + (k + 1) * schema.ndim);
        records.append(
            py::array(dtypes_[j], shape, {}, data + s.values_offset + offsets[k], base));
      }
      values.append(std::move(records));
    }
    py::array_t<uint64_t> indices(static_cast<py::ssize_t>(batch.indices.size()));
    std::copy(batch.indices.begin(), batch.indices.end(), indices.mutable_data());
    return py::make_tuple(batch.step, std::move(values), std::move(indices));
  }

  std::vector<std::shared_ptr<const Store>> stores_;
  std::vector<py::dtype> dtypes_;
  std::unique_ptr<Pipeline> pipeline_;
};

}  // namespace

void BindLoader(py::module_& m) {
  py::class_<PyPipeline>(m, "Pipeline", R"doc(
Native prefetching batch pipeline (internal; use loaderx.dataloader.DataLoader).

Pipeline(stores, n, batch_size, mode, seed, rank, world_size, start_step,
         prefetch, num_threads)

stores are native store handles of equal length n; mode is 0 Sequential,
1 IID, 2 Cyclic. next(timeout) returns (step, values, indices): values holds,
per store, a (batch_size, *item_shape) ndarray (dense) or a list of ndarrays
(ragged) viewing the batch memory without a copy; indices is a uint64 array.
)doc")
      .def(py::init([](std::vector<std::shared_ptr<Store>> stores, uint64_t n,
                       uint64_t batch_size, int mode, uint64_t seed, uint64_t rank,
                       uint64_t world_size, uint64_t start_step, uint32_t prefetch,
                       uint32_t num_threads) {
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
             PipelineOptions options;
             options.start_step = start_step;
             options.prefetch = prefetch;
             options.num_threads = num_threads;
             return std::make_unique<PyPipeline>(
                 std::vector<std::shared_ptr<const Store>>(stores.begin(), stores.end()), spec,
                 options);
           }),
           py::arg("stores"), py::arg("n"), py::arg("batch_size"), py::arg("mode"),
           py::arg("seed"), py::arg("rank"), py::arg("world_size"), py::arg("start_step"),
           py::arg("prefetch"), py::arg("num_threads"))
      .def("next", &PyPipeline::Next, py::arg("timeout") = py::none(),
           "(step, values, indices) of the next step, or None after `timeout` seconds.")
      .def("seek", &PyPipeline::Seek, py::arg("step"))
      .def_property_readonly("step", &PyPipeline::step)
      .def("close", &PyPipeline::Close);
}

}  // namespace loaderx::py_bind
