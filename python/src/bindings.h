// Shared helpers of the _loaderx extension: Status -> Python exception mapping
// and the per-feature Bind* entry points registered by module.cc.
#pragma once

#include <cxxabi.h>
#include <pybind11/pybind11.h>

#include <exception>
#include <optional>
#include <utility>

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

// The extension's one rule for native work: run f() with the GIL released
// and re-take it in plain code, never in a destructor. Not
// py::gil_scoped_release: during interpreter finalization a daemon thread
// that re-takes the GIL is ended by pthread_exit, a forced unwind, which
// std::terminate()s (exit code 134) when it starts inside a destructor. Here
// the unwind starts in PyEval_RestoreThread called from ordinary code and
// passes through (pybind11 rethrows abi::__forced_unwind). f() must not
// touch Python objects; if it takes the GIL (a progress callback), it does so
// in plain code too, and a forced unwind started there passes through here.
template <typename F>
auto WithoutGil(F&& f) {
  using R = decltype(f());
  PyThreadState* state = PyEval_SaveThread();
  if constexpr (std::is_void_v<R>) {
    std::exception_ptr error;
    try {
      f();
    } catch (abi::__forced_unwind&) {  // the thread is ending: let the unwind pass
      throw;
    } catch (...) {
      error = std::current_exception();
    }
    PyEval_RestoreThread(state);
    if (error) std::rethrow_exception(error);
  } else {
    std::optional<R> result;
    std::exception_ptr error;
    try {
      result.emplace(f());
    } catch (abi::__forced_unwind&) {  // the thread is ending: let the unwind pass
      throw;
    } catch (...) {
      error = std::current_exception();
    }
    PyEval_RestoreThread(state);
    if (error) std::rethrow_exception(error);
    return std::move(*result);
  }
}

// Feature entry points; each lives in its own bind_*.cc file.
void BindStore(py::module_& m);
void BindSampler(py::module_& m);
void BindSource(py::module_& m);  // the Source base class; before Loader/Client
void BindLoader(py::module_& m);
void BindClient(py::module_& m);
void BindMix(py::module_& m);
void BindPack(py::module_& m);

}  // namespace loaderx::py_bind
