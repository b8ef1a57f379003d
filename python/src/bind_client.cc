// Placeholder: the client feature binds itself here.
#include "bindings.h"

namespace loaderx::py_bind {
void BindClient(py::module_& m) {}
}  // namespace loaderx::py_bind
