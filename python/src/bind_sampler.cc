// Placeholder: the sampler feature binds itself here.
#include "bindings.h"

namespace loaderx::py_bind {
void BindSampler(py::module_& m) {}
}  // namespace loaderx::py_bind
