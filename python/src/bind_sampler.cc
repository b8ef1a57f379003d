// _loaderx.SamplerCore: the native face of loaderx.zsampler.Sampler.
//
// Written against the CPython C API instead of pybind11's generic dispatch:
// next() runs once per training step with batches as small as 256 indices,
// where pybind11's argument dispatch costs about as much as drawing the batch
// (measured in docs/benchmarks.md, "## Sampler"). next() and iteration do no
// allocation: they fill the sampler's one buffer and return the same cached
// read-only ndarray that views it. The array's base owns the buffer (a
// capsule holding a shared_ptr), so a view outlives the Sampler safely.
//
// Thread-safety: every call holds the GIL except the fill of a large batch
// (>= kReleaseGilAt indices), which runs without the GIL under the sampler's
// own mutex, taken after the GIL is released. The cursor (step) is read and
// advanced under a mutex of its own, not under the GIL, so concurrent draws
// get distinct steps on a free-threaded build too. Sharing one Sampler between
// threads is memory-safe but the view is overwritten by whichever draw comes
// last; use one Sampler per thread (or peek(step)).
#include <Python.h>
#include <pybind11/numpy.h>

#include <memory>
#include <mutex>
#include <string>

#include "bindings.h"
#include "loaderx/sampler.h"

namespace loaderx::py_bind {

namespace {

// Below this many indices a fill takes a few microseconds, less than
// releasing and re-acquiring the GIL is worth.
constexpr uint64_t kReleaseGilAt = uint64_t{1} << 16;

struct Core {
  explicit Core(Sampler s) : sampler(std::move(s)) {}

  // The step of the next draw, advanced by one: each caller gets its own.
  uint64_t TakeStep() {
    std::lock_guard<std::mutex> lock(cursor_mu);
    const uint64_t step = sampler.step();
    sampler.Seek(step + 1);
    return step;
  }
  void Seek(uint64_t step) {
    std::lock_guard<std::mutex> lock(cursor_mu);
    sampler.Seek(step);
  }
  uint64_t Step() {
    std::lock_guard<std::mutex> lock(cursor_mu);
    return sampler.step();
  }

  Sampler sampler;
  // Guards sampler's cursor. Held for a few instructions and never while
  // taking or releasing the GIL, so it cannot deadlock with it.
  std::mutex cursor_mu;
  std::mutex fill_mu;  // serialises GIL-free fills of sampler's buffer
};

struct SamplerObject {
  PyObject_HEAD
      // Placement-constructed in tp_new, destroyed in tp_dealloc. Null until
      // __init__ succeeded; never replaced afterwards.
      std::shared_ptr<Core>
          core;
  PyObject* view;  // owned; read-only uint64 ndarray over the buffer
};

// Sets the Python error for `status` (mapped by ThrowStatus).
void SetStatus(const Status& status) {
  try {
    ThrowStatus(status);
  } catch (py::error_already_set& e) {
    e.restore();
  }
}

// Converts an integral object (int, numpy integer; not bool) to uint64.
// TypeError for other types, InvalidArgumentError naming `name` when out of
// 0..2**64-1.
bool ToU64(PyObject* obj, const char* name, uint64_t* out) {
  if (PyBool_Check(obj) || !PyIndex_Check(obj)) {
    PyErr_Format(PyExc_TypeError, "%s must be an int, got %s", name, Py_TYPE(obj)->tp_name);
    return false;
  }
  PyObject* idx = PyNumber_Index(obj);
  if (idx == nullptr) return false;
  const unsigned long long v = PyLong_AsUnsignedLongLong(idx);
  if (v == static_cast<unsigned long long>(-1) && PyErr_Occurred()) {
    PyErr_Clear();
    PyObject* repr = PyObject_Repr(idx);
    const char* text = repr ? PyUnicode_AsUTF8(repr) : nullptr;
    std::string shown = text ? text : "?";
    PyErr_Clear();  // a failed repr only degrades the message
    Py_XDECREF(repr);
    Py_DECREF(idx);
    SetStatus(
        Status::InvalidArgument(std::string(name) + " must be in 0..2**64-1 (got " + shown + ")"));
    return false;
  }
  Py_DECREF(idx);
  *out = v;
  return true;
}

SamplerObject* Self(PyObject* o) { return reinterpret_cast<SamplerObject*>(o); }

Core* CoreOrRaise(PyObject* o) {
  Core* core = Self(o)->core.get();
  if (core == nullptr) {
    SetStatus(Status::State("Sampler is not initialised (__init__ was not called)"));
  }
  return core;
}

PyObject* SamplerNew(PyTypeObject* type, PyObject*, PyObject*) {
  PyObject* o = type->tp_alloc(type, 0);
  if (o == nullptr) return nullptr;
  new (&Self(o)->core) std::shared_ptr<Core>();
  Self(o)->view = nullptr;
  return o;
}

void SamplerDealloc(PyObject* o) {
  PyTypeObject* type = Py_TYPE(o);
  Py_CLEAR(Self(o)->view);
  Self(o)->core.~shared_ptr<Core>();
  type->tp_free(o);
  Py_DECREF(type);  // heap type: instances own a reference to it
}

int SamplerInit(PyObject* o, PyObject* args, PyObject* kwds) {
  static const char* kwlist[] = {"n",    "batch_size", "mode",       "seed",
                                 "rank", "world_size", "start_step", nullptr};
  PyObject *n_obj, *batch_obj, *mode_obj = nullptr, *seed_obj = nullptr, *rank_obj = nullptr,
                               *world_obj = nullptr, *start_obj = nullptr;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO|OO$OOO", const_cast<char**>(kwlist), &n_obj,
                                   &batch_obj, &mode_obj, &seed_obj, &rank_obj, &world_obj,
                                   &start_obj)) {
    return -1;
  }
  if (Self(o)->core) {
    SetStatus(Status::State("Sampler is already initialised"));
    return -1;
  }
  SamplerSpec spec;
  uint64_t mode = static_cast<uint64_t>(SamplerMode::kIID), start = 0;
  if (!ToU64(n_obj, "n", &spec.n) || !ToU64(batch_obj, "batch_size", &spec.batch_size) ||
      (mode_obj && !ToU64(mode_obj, "mode", &mode)) ||
      (seed_obj && !ToU64(seed_obj, "seed", &spec.seed)) ||
      (rank_obj && !ToU64(rank_obj, "rank", &spec.rank)) ||
      (world_obj && !ToU64(world_obj, "world_size", &spec.world_size)) ||
      (start_obj && !ToU64(start_obj, "start_step", &start))) {
    return -1;
  }
  if (mode > 2) {
    SetStatus(Status::InvalidArgument("mode: unknown sampler mode " + std::to_string(mode) +
                                      " (expected Sampler.Mode.Sequential, IID or Cyclic)"));
    return -1;
  }
  spec.mode = static_cast<SamplerMode>(mode);
  Result<Sampler> made = Sampler::Make(spec, start);
  if (!made.ok()) {
    SetStatus(made.status());
    return -1;
  }
  try {
    auto core = std::make_shared<Core>(std::move(made).value());
    auto* owner = new std::shared_ptr<Core>(core);
    py::capsule base(owner, [](void* p) { delete static_cast<std::shared_ptr<Core>*>(p); });
    py::array_t<uint64_t> view({static_cast<py::ssize_t>(core->sampler.spec().batch_size)},
                               {static_cast<py::ssize_t>(sizeof(uint64_t))},
                               core->sampler.buffer_data(), base);
    py::detail::array_proxy(view.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
    Self(o)->view = view.release().ptr();
    Self(o)->core = std::move(core);
  } catch (py::error_already_set& e) {
    e.restore();
    return -1;
  } catch (const std::bad_alloc&) {
    PyErr_NoMemory();
    return -1;
  }
  return 0;
}

// Fills `out` with the batch of `step`, without the GIL for large batches.
void FillBatch(Core* core, uint64_t step, uint64_t* out) {
  if (core->sampler.spec().batch_size < kReleaseGilAt) {
    core->sampler.Fill(step, out);
    return;
  }
  Py_BEGIN_ALLOW_THREADS;
  {
    std::lock_guard<std::mutex> lock(core->fill_mu);
    core->sampler.Fill(step, out);
  }
  Py_END_ALLOW_THREADS;
}

PyObject* SamplerNext(PyObject* o) {
  Core* core = CoreOrRaise(o);
  if (core == nullptr) return nullptr;
  // The cursor moves before any GIL-free fill, so concurrent callers draw
  // distinct steps.
  const uint64_t step = core->TakeStep();
  FillBatch(core, step, core->sampler.buffer_data());
  PyObject* view = Self(o)->view;
  Py_INCREF(view);
  return view;
}

PyObject* SamplerNextMethod(PyObject* o, PyObject*) { return SamplerNext(o); }

PyObject* SamplerSeek(PyObject* o, PyObject* arg) {
  Core* core = CoreOrRaise(o);
  uint64_t step = 0;
  if (core == nullptr || !ToU64(arg, "step", &step)) return nullptr;
  core->Seek(step);
  Py_RETURN_NONE;
}

PyObject* SamplerPeek(PyObject* o, PyObject* arg) {
  Core* core = CoreOrRaise(o);
  uint64_t step = 0;
  if (core == nullptr || !ToU64(arg, "step", &step)) return nullptr;
  try {
    py::array_t<uint64_t> out(static_cast<py::ssize_t>(core->sampler.spec().batch_size));
    FillBatch(core, step, out.mutable_data());
    return out.release().ptr();
  } catch (py::error_already_set& e) {
    e.restore();
    return nullptr;
  } catch (const std::bad_alloc&) {
    return PyErr_NoMemory();
  }
}

// Read-only integer attributes (the spec's are immutable).
template <uint64_t (*Get)(const Sampler&)>
PyObject* GetU64(PyObject* o, void*) {
  Core* core = CoreOrRaise(o);
  if (core == nullptr) return nullptr;
  return PyLong_FromUnsignedLongLong(Get(core->sampler));
}
PyObject* GetStep(PyObject* o, void*) {
  Core* core = CoreOrRaise(o);
  if (core == nullptr) return nullptr;
  return PyLong_FromUnsignedLongLong(core->Step());
}
uint64_t GetN(const Sampler& s) { return s.spec().n; }
uint64_t GetBatch(const Sampler& s) { return s.spec().batch_size; }
uint64_t GetModeValue(const Sampler& s) { return static_cast<uint64_t>(s.spec().mode); }
uint64_t GetSeed(const Sampler& s) { return s.spec().seed; }
uint64_t GetRank(const Sampler& s) { return s.spec().rank; }
uint64_t GetWorld(const Sampler& s) { return s.spec().world_size; }
uint64_t GetGlobal(const Sampler& s) { return s.spec().global_batch(); }
uint64_t GetCycleSteps(const Sampler& s) { return s.cycle_steps(); }

PyMethodDef kMethods[] = {
    {"next", SamplerNextMethod, METH_NOARGS,
     "next() -> ndarray[uint64, (batch_size,)]\n\nDraws the batch of the current step and "
     "advances. Returns a read-only view of the sampler's one reusable buffer, "
     "overwritten by the next draw (the same array object every time)."},
    {"seek", SamplerSeek, METH_O,
     "seek(step) -> None\n\nPositions the sampler so the next draw is the batch of `step`. "
     "O(1)."},
    {"peek", SamplerPeek, METH_O,
     "peek(step) -> ndarray[uint64, (batch_size,)]\n\nA new writable array holding the "
     "batch of `step`; neither the cursor nor the reusable buffer changes."},
    {nullptr, nullptr, 0, nullptr},
};

PyGetSetDef kGetSet[] = {
    {"step", GetStep, nullptr, "Step of the next draw.", nullptr},
    {"n", GetU64<GetN>, nullptr, "Number of records indexed (indices are in 0..n-1).", nullptr},
    {"batch_size", GetU64<GetBatch>, nullptr, "Indices per draw for this rank.", nullptr},
    {"mode_value", GetU64<GetModeValue>, nullptr, "Mode as an int (0 Seq, 1 IID, 2 Cyclic).",
     nullptr},
    {"seed", GetU64<GetSeed>, nullptr, "Seed of the counter-based streams.", nullptr},
    {"rank", GetU64<GetRank>, nullptr, "This sampler's slice of the global batch.", nullptr},
    {"world_size", GetU64<GetWorld>, nullptr, "Number of ranks sharing a global batch.", nullptr},
    {"global_batch", GetU64<GetGlobal>, nullptr, "batch_size * world_size.", nullptr},
    {"cycle_steps", GetU64<GetCycleSteps>, nullptr,
     "Cyclic: steps per cycle, n // global_batch. 0 in the other modes.", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

PyType_Slot kSlots[] = {
    {Py_tp_new, reinterpret_cast<void*>(SamplerNew)},
    {Py_tp_init, reinterpret_cast<void*>(SamplerInit)},
    {Py_tp_dealloc, reinterpret_cast<void*>(SamplerDealloc)},
    {Py_tp_iter, reinterpret_cast<void*>(PyObject_SelfIter)},
    {Py_tp_iternext, reinterpret_cast<void*>(SamplerNext)},
    {Py_tp_methods, kMethods},
    {Py_tp_getset, kGetSet},
    {Py_tp_doc,
     const_cast<char*>("SamplerCore(n, batch_size, mode=1, seed=42, *, rank=0, world_size=1, "
                       "start_step=0)\n\nNative counter-based batch index generator; use "
                       "loaderx.zsampler.Sampler.")},
    {0, nullptr},
};

PyType_Spec kSpec = {
    "loaderx._loaderx.SamplerCore",
    sizeof(SamplerObject),
    0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    kSlots,
};

}  // namespace

void BindSampler(py::module_& m) {
  PyObject* type = PyType_FromSpec(&kSpec);
  if (type == nullptr) throw py::error_already_set();
  m.add_object("SamplerCore", py::reinterpret_steal<py::object>(type));
}

}  // namespace loaderx::py_bind
