// Placeholder: the store feature binds itself here.
#include "bindings.h"

namespace loaderx::py_bind {
void BindStore(py::module_& m) {}
}  // namespace loaderx::py_bind
