#include <pybind11/pybind11.h>

#include "bindings.h"

namespace loaderx::py_bind {

namespace {
// Looked up lazily so importing _loaderx alone does not import the package.
py::object ErrorClass(Status::Code code) {
  py::module_ errors = py::module_::import("loaderx.errors");
  switch (code) {
    case Status::Code::kInvalidArgument:
      return errors.attr("InvalidArgumentError");
    case Status::Code::kIndexError:
      return errors.attr("RecordIndexError");
    case Status::Code::kSchemaError:
      return errors.attr("SchemaError");
    case Status::Code::kCorruption:
      return errors.attr("CorruptStoreError");
    case Status::Code::kIOError:
      return errors.attr("StoreIOError");
    case Status::Code::kNotFound:
      return errors.attr("StoreNotFoundError");
    case Status::Code::kAlreadyExists:
      return errors.attr("StoreExistsError");
    case Status::Code::kResourceExhausted:
      return errors.attr("ResourceExhausted");
    case Status::Code::kCancelled:
      return errors.attr("LoaderClosedError");
    case Status::Code::kProtocol:
      return errors.attr("ProtocolError");
    case Status::Code::kDaemon:
      return errors.attr("DaemonError");
    case Status::Code::kState:
      return errors.attr("StateError");
    case Status::Code::kTimeout:
      return errors.attr("GroupTimeoutError");
    default:
      return errors.attr("LoaderxError");
  }
}
}  // namespace

void ThrowStatus(const Status& status) {
  py::object cls = ErrorClass(status.code());
  PyErr_SetString(cls.ptr(), status.message().c_str());
  throw py::error_already_set();
}

}  // namespace loaderx::py_bind

PYBIND11_MODULE(_loaderx, m) {
  m.doc() = "loaderx native engine (stores, sampler, loader pipeline, daemon client)";
  using namespace loaderx::py_bind;
  BindStore(m);
  BindSampler(m);
  BindSource(m);
  BindLoader(m);
  BindClient(m);
  BindMix(m);
  BindPack(m);
}
