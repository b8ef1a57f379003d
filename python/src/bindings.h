// Shared helpers of the _loaderx extension: Status -> Python exception mapping
// and the per-feature Bind* entry points registered by module.cc.
#pragma once

#include <pybind11/pybind11.h>

#include "loaderx/status.h"

namespace loaderx::py_bind {

namespace py = pybind11;

// Raises the loaderx.errors class matching status.code() with its message.
// REQUIRES: !status.ok(); the GIL is held.
[[noreturn]] void ThrowStatus(const Status& status);

// Convenience: throws if not ok.
inline void Check(const Status& status) {
  if (!status.ok()) ThrowStatus(status);
}
template <typename T>
T Unwrap(Result<T>&& r) {
  if (!r.ok()) ThrowStatus(r.status());
  return std::move(r).value();
}

// Feature entry points; each lives in its own bind_*.cc file.
void BindStore(py::module_& m);
void BindSampler(py::module_& m);
void BindLoader(py::module_& m);
void BindClient(py::module_& m);
void BindMix(py::module_& m);

}  // namespace loaderx::py_bind
