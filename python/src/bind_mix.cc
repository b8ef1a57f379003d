// _loaderx.mixed_store / mix_source_store: the virtual stores of weighted
// mixing (common/include/loaderx/mix.h), returned as ordinary _loaderx.Store
// handles so readers, the DataLoader and the pipeline use them unchanged.
// The weights -> counts apportionment lives in python/loaderx/mix.py.
#include <pybind11/stl.h>

#include <memory>
#include <vector>

#include "bindings.h"
#include "loaderx/mix.h"

namespace loaderx::py_bind {

void BindMix(py::module_& m) {
  m.def(
      "mixed_store",
      [](const std::vector<std::shared_ptr<Store>>& parts, std::vector<uint64_t> counts,
         size_t segments) {
        return Unwrap(
            MixedStore(std::vector<std::shared_ptr<const Store>>(parts.begin(), parts.end()),
                       std::move(counts), segments));
      },
      py::arg("parts"), py::arg("counts"), py::arg("segments") = 1,
      "One stream of a mixture: position start_e + j of count entry e is record j mod "
      "len(parts[e % len(parts)]) (len(counts) a multiple of len(parts): a schedule's "
      "segments one after the other).");
  m.def(
      "mix_source_store",
      [](std::vector<uint64_t> counts, size_t datasets) {
        return Unwrap(MixSourceStore(std::move(counts), datasets));
      },
      py::arg("counts"), py::arg("datasets") = 0,
      "Dense int64 scalars: the dataset number e mod datasets of every position of count entry "
      "e (datasets 0: len(counts)).");
}

}  // namespace loaderx::py_bind
