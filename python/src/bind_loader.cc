// Placeholder: the loader feature binds itself here.
#include "bindings.h"

namespace loaderx::py_bind {
void BindLoader(py::module_& m) {}
}  // namespace loaderx::py_bind
