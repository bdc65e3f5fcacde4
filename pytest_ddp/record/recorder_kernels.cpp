// The recorder's hot path for the functional collectives, compiled (see pytest_ddp/record/compiled.py).
//
// A Python kernel on a functional collective and on wait_tensor costs about 35 us of CPU per
// call on two ranks, most of it the Python that runs after each wait with cold caches.  These
// kernels do the same work through the C API: they write the same call, wait and ret events as
// recorder._record_functional and recorder._record_wait_tensor, and keep the same state (the
// recorder's dicts and numbering), so the Python recorder and these kernels can take turns.
// Everything that describes a call (its group, tensors, site) is still Python's, asked once per
// distinct call and cached here; anything unusual (faults armed, a group passed as an object)
// goes the way the Python recorder goes in a torch whose waits do not cross threads: the c10d
// hook is armed and records the call at the c10d operation it issues.
//
// Every function here runs with the GIL held, except the redispatches.

#include <Python.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>
#include <unistd.h>

#include <charconv>
#include <ctime>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

// From libtorch_python (torch/csrc/autograd/python_variable.h, whose includes would triple the
// build time): a tensor's Python object.
PyObject* THPVariable_Wrap(const at::TensorBase& var);

namespace {

// A new reference, released at scope's end.
class Ref {
 public:
  explicit Ref(PyObject* object = nullptr) : object_(object) {}
  Ref(const Ref&) = delete;
  Ref& operator=(const Ref&) = delete;
  Ref(Ref&& other) noexcept : object_(other.release()) {}
  ~Ref() { Py_XDECREF(object_); }
  PyObject* get() const { return object_; }
  PyObject* release() { return std::exchange(object_, nullptr); }
  explicit operator bool() const { return object_ != nullptr; }

 private:
  PyObject* object_;
};

class Gil {
 public:
  Gil() : state_(PyGILState_Ensure()) {}
  ~Gil() { PyGILState_Release(state_); }

 private:
  PyGILState_STATE state_;
};

class WithoutGil {
 public:
  WithoutGil() : state_(PyEval_SaveThread()) {}
  ~WithoutGil() { PyEval_RestoreThread(state_); }

 private:
  PyThreadState* state_;
};

// What recorder._compiled_hooks() hands over: the recorder's state and its Python helpers.
struct Hooks {
  PyObject* recorder_globals;  // where recorder._log is (rebound by each install)
  PyObject* local;             // recorder._local: depth > 0 inside a recorded call
  PyObject* pending_works;     // recorder._pending.works
  PyObject* faults;            // injector.armed
  PyObject* numbers;           // recorder._numbers: lock, index, seq
  PyObject* unwaited;          // recorder._unwaited
  PyObject* backend_tensors;   // recorder._backend_tensors
  PyObject* functional;        // backend_hook._functional: the functional collective running
  PyObject* arm;               // backend_hook.arm()
  PyObject* sweep;             // recorder._pending.sweep(waited=None, error=None)
  PyObject* call_parts;        // (op, group name, tensors, reduce op | None) -> (head, tail, seq key) | None
  PyObject* frame_site;        // describe.frame_site(frame) -> (site, in a library) | None
  PyObject* site;              // describe.site(frame)
  PyObject* write_ret;         // numbering.write_ret(log, index, error)
  PyObject* returned;          // recorder._returned(log, index, error)
};

Hooks hooks{};
bool installed = false;

// Attribute names, interned once (a C string would be turned into one on every lookup).
struct Names {
  PyObject *log, *fd, *depth, *index, *seq, *lock, *acquire, *release, *running;
};
Names names{};

bool intern_names() {
  if (names.log != nullptr) return true;
  names = Names{PyUnicode_InternFromString("_log"),   PyUnicode_InternFromString("_fd"),
                PyUnicode_InternFromString("depth"),  PyUnicode_InternFromString("index"),
                PyUnicode_InternFromString("seq"),    PyUnicode_InternFromString("lock"),
                PyUnicode_InternFromString("acquire"), PyUnicode_InternFromString("release"),
                PyUnicode_InternFromString("running")};
  return !PyErr_Occurred();
}

void clear_hooks() {
  for (PyObject** field : {&hooks.recorder_globals, &hooks.local, &hooks.pending_works, &hooks.faults,
                           &hooks.numbers, &hooks.unwaited, &hooks.backend_tensors, &hooks.functional,
                           &hooks.arm, &hooks.sweep, &hooks.call_parts, &hooks.frame_site, &hooks.site,
                           &hooks.write_ret, &hooks.returned}) {
    Py_CLEAR(*field);
  }
}

// -- the caches: what Python said of a call, a frame ----------------------------------------

struct Parts {
  std::string head;  // "op":...,"group":...,"ranks":[...],
  std::string tail;  // ,"shapes":...,"async":true,"extra":{...}
  PyObject* key;     // the call's key in recorder._numbers.seq
};
std::unordered_map<std::string, Parts> parts_cache;  // op, group name, tensors' metadata -> parts

struct Site {
  PyObject* code;  // held, so that its address is not reused while cached
  bool internal;   // a frame of torch, pytest or this plugin: not a call site
  bool library;    // a site in an installed library: its caller is shown too (not cached)
  std::string text;
};
struct InstructionHash {
  size_t operator()(const std::pair<const void*, int>& key) const {
    return std::hash<const void*>()(key.first) ^ (std::hash<int>()(key.second) << 1);
  }
};
std::unordered_map<std::pair<const void*, int>, Site, InstructionHash> site_cache;  // (code, instruction) -> site
constexpr size_t MAX_CACHED = 10000;

void forget_cached() {
  for (auto& [_, parts] : parts_cache) Py_DECREF(parts.key);
  parts_cache.clear();
  for (auto& [_, site] : site_cache) Py_DECREF(site.code);
  site_cache.clear();
}

// -- what a call looks like -------------------------------------------------------------------

struct Op {
  std::string name;  // the table's name (pytest_ddp.common.ops.FUNCTIONAL_OPS)
  Ref py_name;
  size_t tensors;  // argument positions in the schema
  size_t group;
  size_t arguments;
  std::optional<size_t> reduce_op;  // where it reduces (all_reduce, reduce_scatter_tensor, ...)
};

void append_tensor_key(std::string& key, const at::Tensor& tensor) {
  for (auto size : tensor.sizes()) key += std::to_string(size) + ",";
  key += ";" + std::to_string(static_cast<int>(tensor.scalar_type())) + ";" + tensor.device().str() + "|";
}

// The tensors argument as Python sees it: a tensor, or a list of them.
PyObject* to_python(const c10::IValue& value) {
  if (value.isTensor()) return THPVariable_Wrap(value.toTensor());
  if (value.isTensorList()) {
    auto tensors = value.toTensorList();
    Ref list(PyList_New(static_cast<Py_ssize_t>(tensors.size())));
    if (!list) return nullptr;
    for (size_t i = 0; i < tensors.size(); ++i) {
      PyObject* tensor = THPVariable_Wrap(tensors.get(i));
      if (tensor == nullptr) return nullptr;
      PyList_SET_ITEM(list.get(), static_cast<Py_ssize_t>(i), tensor);
    }
    return list.release();
  }
  Py_RETURN_NONE;
}

std::vector<at::Tensor> tensors_of(const c10::IValue& value) {
  if (value.isTensor()) return {value.toTensor()};
  if (value.isTensorList()) return value.toTensorList().vec();
  return {};
}

// reduce_op: the functional collective's reduce op ("sum", "max"), nullptr where it has none.
const Parts* parts_of(const Op& op, const std::string& group, const c10::IValue& tensors, const std::string* reduce_op) {
  std::string key = op.name + "|" + group + "|" + (reduce_op ? *reduce_op : "") + "|";
  for (const auto& tensor : tensors_of(tensors)) append_tensor_key(key, tensor);
  auto found = parts_cache.find(key);
  if (found != parts_cache.end()) return &found->second;
  Ref py_tensors(to_python(tensors));
  Ref py_group(PyUnicode_FromStringAndSize(group.data(), static_cast<Py_ssize_t>(group.size())));
  Ref py_reduce_op(reduce_op ? PyUnicode_FromStringAndSize(reduce_op->data(), static_cast<Py_ssize_t>(reduce_op->size()))
                             : Py_NewRef(Py_None));
  if (!py_tensors || !py_group || !py_reduce_op) return nullptr;
  Ref described(PyObject_CallFunctionObjArgs(hooks.call_parts, op.py_name.get(), py_group.get(), py_tensors.get(),
                                             py_reduce_op.get(), nullptr));
  if (!described || described.get() == Py_None) return nullptr;
  PyObject *head, *tail, *seq_key;
  if (!PyArg_ParseTuple(described.get(), "UUO", &head, &tail, &seq_key)) return nullptr;
  if (parts_cache.size() > MAX_CACHED) forget_cached();
  Py_INCREF(seq_key);
  Parts parts{PyUnicode_AsUTF8(head), PyUnicode_AsUTF8(tail), seq_key};
  return &parts_cache.emplace(std::move(key), std::move(parts)).first->second;
}

// describe.site of the innermost Python frame: the first frame outside torch, pytest and this
// plugin, cached per instruction as describe.site caches it.
bool site_of_frames(std::string& site) {
  PyFrameObject* frame = PyEval_GetFrame();
  Py_XINCREF(frame);
  while (frame != nullptr) {
    Ref code(reinterpret_cast<PyObject*>(PyFrame_GetCode(frame)));
    std::pair<const void*, int> key{code.get(), PyFrame_GetLasti(frame)};
    auto found = site_cache.find(key);
    if (found == site_cache.end()) {
      Ref described(PyObject_CallOneArg(hooks.frame_site, reinterpret_cast<PyObject*>(frame)));
      if (!described) {
        Py_DECREF(frame);
        return false;
      }
      Site entry{code.get(), true, false, ""};
      if (described.get() != Py_None) {
        PyObject* text;
        int library;
        if (!PyArg_ParseTuple(described.get(), "Up", &text, &library)) {
          Py_DECREF(frame);
          return false;
        }
        entry = Site{code.get(), false, library != 0, PyUnicode_AsUTF8(text)};
      }
      if (site_cache.size() > MAX_CACHED) forget_cached();
      Py_INCREF(entry.code);
      found = site_cache.emplace(key, std::move(entry)).first;
    }
    if (!found->second.internal) {
      if (found->second.library) {
        Ref text(PyObject_CallOneArg(hooks.site, reinterpret_cast<PyObject*>(frame)));
        Py_DECREF(frame);
        if (!text) return false;
        site = PyUnicode_AsUTF8(text.get());
        return true;
      }
      site = found->second.text;
      Py_DECREF(frame);
      return true;
    }
    PyFrameObject* back = PyFrame_GetBack(frame);
    Py_DECREF(frame);
    frame = back;
  }
  site = "\"site\":\"?\"";
  return true;
}

// -- the event log ----------------------------------------------------------------------------

void append_time(std::string& line) {
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  char text[32];
  auto end = std::to_chars(text, text + sizeof text, static_cast<double>(now.tv_sec) + now.tv_nsec * 1e-9).ptr;
  line.append(text, end);
}

void write_line(PyObject* log, const std::string& line) {
  Ref fd(PyObject_GetAttr(log, names.fd));
  if (!fd) return PyErr_Clear();
  const int descriptor = static_cast<int>(PyLong_AsLong(fd.get()));
  for (size_t written = 0; written < line.size();) {
    const ssize_t now = ::write(descriptor, line.data() + written, line.size() - written);
    if (now <= 0) return;
    written += static_cast<size_t>(now);
  }
}

void write_wait_or_ret(PyObject* log, const char* event, long index) {
  std::string line = std::string("{\"e\":\"") + event + "\",\"i\":" + std::to_string(index) + ",\"t\":";
  append_time(line);
  line += std::string(event) == "ret" ? ",\"ok\":true}\n" : "}\n";
  write_line(log, line);
}

// numbering.Numbers.write_call: number the call and write it, under the numbering's lock.
bool write_call(PyObject* log, const Parts& parts, const std::string& site, long& index) {
  std::string body = parts.head + site + ",\"t\":";
  append_time(body);
  body += parts.tail;
  Ref lock(PyObject_GetAttr(hooks.numbers, names.lock));
  if (!lock) return false;
  Ref acquired(PyObject_CallMethodNoArgs(lock.get(), names.acquire));
  if (!acquired) return false;
  bool ok = false;
  Ref counted(PyObject_GetAttr(hooks.numbers, names.index));
  Ref seqs(PyObject_GetAttr(hooks.numbers, names.seq));
  if (counted && seqs) {
    index = PyLong_AsLong(counted.get());
    PyObject* previous = PyDict_GetItemWithError(seqs.get(), parts.key);
    const long seq = previous != nullptr ? PyLong_AsLong(previous) + 1 : 1;
    Ref next_index(PyLong_FromLong(index + 1));
    Ref py_seq(PyLong_FromLong(seq));
    if (!PyErr_Occurred() && next_index && py_seq && PyObject_SetAttr(hooks.numbers, names.index, next_index.get()) == 0 &&
        PyDict_SetItem(seqs.get(), parts.key, py_seq.get()) == 0) {
      write_line(log, "{\"e\":\"call\",\"i\":" + std::to_string(index) + ",\"seq\":" + std::to_string(seq) + "," + body + "}\n");
      ok = true;
    }
  }
  PyObject* error_type;
  PyObject* error;
  PyObject* trace;
  PyErr_Fetch(&error_type, &error, &trace);  // the lock is released whatever happened
  Ref released(PyObject_CallMethodNoArgs(lock.get(), names.release));
  PyErr_Restore(error_type, error, trace);
  return ok;
}

// The Python exception a failed redispatch stands for, as numbering.write_ret describes it.
PyObject* error_of(const std::exception_ptr& failure) {
  try {
    std::rethrow_exception(failure);
  } catch (const c10::Error& error) {
    return PyObject_CallFunction(PyExc_RuntimeError, "s", error.what_without_backtrace());
  } catch (const std::exception& error) {
    return PyObject_CallFunction(PyExc_RuntimeError, "s", error.what());
  } catch (...) {
    return PyObject_CallFunction(PyExc_RuntimeError, "s", "unknown C++ exception");
  }
}

// Runs the operation below BackendSelect without the GIL; the failure, if it threw.
std::exception_ptr redispatch(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  WithoutGil released;
  try {
    op.redispatchBoxed(keys & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, c10::DispatchKey::BackendSelect), stack);
  } catch (...) {
    return std::current_exception();
  }
  return nullptr;
}

void set_attribute(PyObject* owner, PyObject* name, PyObject* value) {
  if (PyObject_SetAttr(owner, name, value) != 0) PyErr_Clear();
}

// The log to record into, or nullptr where this call is not recorded (no log, or inside a
// recorded call: recorder._recording).
PyObject* recording_log() {
  PyObject* log = PyDict_GetItem(hooks.recorder_globals, names.log);
  if (log == nullptr || log == Py_None) return nullptr;
  Ref depth(PyObject_GetAttr(hooks.local, names.depth));
  if (!depth) {
    PyErr_Clear();
    return nullptr;
  }
  return PyLong_AsLong(depth.get()) == 0 ? log : nullptr;
}

// backend_hook._arming_kernel: recorded at the c10d operation it issues.
void run_armed(const Op& op_spec, const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  Ref armed(PyObject_CallNoArgs(hooks.arm));
  if (!armed) PyErr_Clear();
  Ref outer(PyObject_GetAttr(hooks.functional, names.running));
  if (!outer) PyErr_Clear();
  set_attribute(hooks.functional, names.running, op_spec.py_name.get());
  auto failure = redispatch(op, keys, stack);
  set_attribute(hooks.functional, names.running, outer ? outer.get() : Py_None);
  if (failure) std::rethrow_exception(failure);
}

// A traced call (fake or meta tensors: torch.compile, torch.export, make_fx), which issues no
// collective: Meta is among its keys (see backend_hook._META).  Handed on unrecorded.
bool traced(c10::DispatchKeySet keys) { return keys.has_backend(c10::BackendComponent::MetaBit); }

// -- the kernels ------------------------------------------------------------------------------

// recorder._record_functional, for one functional collective.
class FunctionalKernel final : public c10::OperatorKernel {
 public:
  explicit FunctionalKernel(Op spec) : spec_(std::move(spec)) {}

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
    Gil gil;
    PyObject* log = installed && !traced(keys) ? recording_log() : nullptr;
    if (log == nullptr) {
      if (auto failure = redispatch(op, keys, stack)) std::rethrow_exception(failure);
      return;
    }
    Ref log_held(Py_NewRef(log));
    const size_t first = stack->size() - spec_.arguments;
    const c10::IValue& group = (*stack)[first + spec_.group];
    if (!group.isString() || PyDict_Size(hooks.faults) > 0) return run_armed(spec_, op, keys, stack);
    if (PyDict_Size(hooks.pending_works) > 0) {
      Ref swept(PyObject_CallNoArgs(hooks.sweep));
      if (!swept) PyErr_Clear();
    }
    const std::string* reduce_op = nullptr;
    if (spec_.reduce_op) {
      const c10::IValue& given = (*stack)[first + *spec_.reduce_op];
      if (given.isString()) reduce_op = &given.toStringRef();
    }
    const Parts* parts = parts_of(spec_, group.toStringRef(), (*stack)[first + spec_.tensors], reduce_op);
    std::string site;
    long index = 0;
    if (parts == nullptr || !site_of_frames(site) || !write_call(log, *parts, site, index)) {
      PyErr_Clear();  // describing must never break the call: it goes unrecorded
      if (auto failure = redispatch(op, keys, stack)) std::rethrow_exception(failure);
      return;
    }
    Ref one(PyLong_FromLong(1));
    Ref zero(PyLong_FromLong(0));
    set_attribute(hooks.local, names.depth, one.get());  // the c10d operation it issues, if hooked, is not recorded again
    auto failure = redispatch(op, keys, stack);
    set_attribute(hooks.local, names.depth, zero.get());
    Ref py_index(PyLong_FromLong(index));
    if (failure) {
      Ref error(error_of(failure));
      Ref written(PyObject_CallFunctionObjArgs(hooks.write_ret, log, py_index.get(), error.get(), nullptr));
      if (!written) PyErr_Clear();
      std::rethrow_exception(failure);
    }
    const c10::IValue& result = stack->back();
    Ref py_result(to_python(result));
    if (!py_result || PyDict_SetItem(hooks.unwaited, py_index.get(), py_result.get()) != 0) PyErr_Clear();
    for (const auto& tensor : tensors_of(result)) {
      Ref pointer(PyLong_FromVoidPtr(tensor.data_ptr()));
      if (!pointer || PyDict_SetItem(hooks.backend_tensors, pointer.get(), py_index.get()) != 0) PyErr_Clear();
    }
  }

 private:
  Op spec_;
};

// recorder._record_wait_tensor: the caller blocks until a functional collective is done.
void wait_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  Gil gil;
  PyObject* log = installed && !traced(keys) ? PyDict_GetItem(hooks.recorder_globals, names.log) : nullptr;
  PyObject* index = nullptr;
  if (log != nullptr && log != Py_None) {
    Ref pointer(PyLong_FromVoidPtr(stack->back().toTensor().data_ptr()));
    index = pointer ? PyDict_GetItemWithError(hooks.backend_tensors, pointer.get()) : nullptr;
    if (index != nullptr && PyDict_Contains(hooks.unwaited, index) != 1 && PyDict_Contains(hooks.pending_works, index) != 1) {
      index = nullptr;  // waited for already (each tensor of a coalesced call, or twice)
    }
    PyErr_Clear();
  }
  if (index == nullptr) {
    if (auto failure = redispatch(op, keys, stack)) std::rethrow_exception(failure);
    return;
  }
  Ref log_held(Py_NewRef(log));
  Ref index_held(Py_NewRef(index));
  const long number = PyLong_AsLong(index);
  write_wait_or_ret(log, "wait", number);
  auto failure = redispatch(op, keys, stack);
  if (failure) {
    Ref error(error_of(failure));
    Ref done(PyObject_CallFunctionObjArgs(hooks.returned, log, index, error.get(), nullptr));
    if (!done) PyErr_Clear();
    std::rethrow_exception(failure);
  }
  if (PyDict_Contains(hooks.unwaited, index) == 1) {  // recorder._returned
    if (PyDict_DelItem(hooks.unwaited, index) != 0) PyErr_Clear();
    write_wait_or_ret(log, "ret", number);
  } else {
    Ref swept(PyObject_CallFunctionObjArgs(hooks.sweep, index, Py_None, nullptr));
    if (!swept) PyErr_Clear();
  }
}

std::unique_ptr<torch::Library> library;

// -- the module -------------------------------------------------------------------------------

PyObject* take_hooks(PyObject* given) {
  struct Field {
    const char* name;
    PyObject** slot;
  };
  for (Field field : std::initializer_list<Field>{
           {"recorder_globals", &hooks.recorder_globals}, {"local", &hooks.local}, {"pending_works", &hooks.pending_works},
           {"faults", &hooks.faults}, {"numbers", &hooks.numbers}, {"unwaited", &hooks.unwaited},
           {"backend_tensors", &hooks.backend_tensors}, {"functional", &hooks.functional}, {"arm", &hooks.arm},
           {"sweep", &hooks.sweep}, {"call_parts", &hooks.call_parts}, {"frame_site", &hooks.frame_site},
           {"site", &hooks.site}, {"write_ret", &hooks.write_ret}, {"returned", &hooks.returned}}) {
    *field.slot = PyObject_GetAttrString(given, field.name);
    if (*field.slot == nullptr) return nullptr;
  }
  return given;
}

// install(hooks, [(registered name, operation, overload, table name, tensors argument), ...])
PyObject* install(PyObject*, PyObject* args) {
  PyObject* given;
  PyObject* operations;
  if (!PyArg_ParseTuple(args, "OO!", &given, &PyList_Type, &operations)) return nullptr;
  if (installed) {
    PyErr_SetString(PyExc_RuntimeError, "the compiled recorder kernels are installed already");
    return nullptr;
  }
  if (!intern_names() || take_hooks(given) == nullptr) {
    clear_hooks();
    return nullptr;
  }
  try {
    auto made = std::make_unique<torch::Library>(torch::Library::IMPL, "_c10d_functional", c10::DispatchKey::BackendSelect,
                                                 __FILE__, __LINE__);
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(operations); ++i) {
      const char *registered, *name, *overload, *table_name, *tensors;
      if (!PyArg_ParseTuple(PyList_GET_ITEM(operations, i), "sssss", &registered, &name, &overload, &table_name, &tensors)) {
        clear_hooks();
        return nullptr;
      }
      auto handle = c10::Dispatcher::singleton().findSchemaOrThrow(name, overload);
      const auto& schema = handle.schema();
      Op spec{table_name, Ref(PyUnicode_FromString(table_name)), *schema.argumentIndexWithName(tensors),
              *schema.argumentIndexWithName("group_name"), schema.arguments().size(),
              schema.argumentIndexWithName("reduce_op")};
      made->impl(registered, torch::CppFunction::makeFromBoxedFunctor(std::make_unique<FunctionalKernel>(std::move(spec))));
    }
    made->impl("wait_tensor", torch::CppFunction::makeFromBoxedFunction<&wait_kernel>());
    library = std::move(made);
  } catch (const std::exception& error) {
    clear_hooks();
    PyErr_SetString(PyExc_RuntimeError, error.what());
    return nullptr;
  }
  installed = true;
  Py_RETURN_NONE;
}

PyObject* uninstall(PyObject*, PyObject*) {
  library.reset();
  installed = false;
  forget_cached();
  clear_hooks();
  Py_RETURN_NONE;
}

// A new test: groups are named again (describe.start_test), so what was said of calls goes.
PyObject* forget(PyObject*, PyObject*) {
  forget_cached();
  Py_RETURN_NONE;
}

PyMethodDef methods[] = {
    {"install", install, METH_VARARGS, "Register the kernels of these functional collectives and wait_tensor."},
    {"uninstall", uninstall, METH_NOARGS, "Deregister them."},
    {"forget", forget, METH_NOARGS, "Forget what was said of calls and frames (a new test)."},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "pytest_ddp_recorder_kernels", nullptr, -1, methods};

}  // namespace

PyMODINIT_FUNC PyInit_pytest_ddp_recorder_kernels() { return PyModule_Create(&module); }
