// _dpipe: the C++ side of the Python package. A pipeline arrives as the tool's JSON spec (built by the
// Python node functions) and is built by the same spec front end into a typed C++ Pipeline<T>; a Loop
// runs it on the engine and hands each element to Python, converted once: integers and strings as int
// and str, records as bytes, batches of numbers as numpy arrays that own the C++ buffer (no copy).
// Waiting for an element releases the GIL.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <map>
#include <memory>
#include <stdexcept>
#include <optional>
#include <string>
#include <vector>

#include "dpipe/dpipe.hpp"
#include "json_spec.hpp"

namespace py = pybind11;

namespace dpipe::python {
namespace {

// ---- elements to Python -------------------------------------------------------------------------

struct Convert {
  bool bytes = false;  // strings are bytes (records)

  py::object operator()(SpecInt v) const { return py::int_(v); }
  py::object operator()(std::string&& s) const {
    if (bytes) return py::bytes(s);
    PyObject* o = PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "surrogateescape");
    if (!o) throw py::error_already_set();
    return py::reinterpret_steal<py::object>(o);
  }
  /// A batch of integers: a 1-D int64 array over the batch's own buffer, which the array keeps alive.
  py::object operator()(std::vector<SpecInt>&& v) const {
    auto* owned = new std::vector<SpecInt>(std::move(v));
    py::capsule keep(owned, [](void* p) { delete static_cast<std::vector<SpecInt>*>(p); });
    return py::array_t<SpecInt>({static_cast<py::ssize_t>(owned->size())}, {sizeof(SpecInt)}, owned->data(), keep);
  }
  /// A batch of equal-length rows (token windows): one contiguous 2-D int64 array (B, L); rows of other
  /// lengths: a list of 1-D arrays.
  py::object operator()(std::vector<std::vector<SpecInt>>&& rows) const {
    const std::size_t width = rows.empty() ? 0 : rows.front().size();
    bool rectangular = true;
    for (const auto& r : rows) rectangular = rectangular && r.size() == width;
    if (!rectangular) {
      py::list out;
      for (auto& r : rows) out.append((*this)(std::move(r)));
      return out;
    }
    auto* owned = new std::vector<SpecInt>();
    owned->reserve(rows.size() * width);
    for (const auto& r : rows) owned->insert(owned->end(), r.begin(), r.end());
    py::capsule keep(owned, [](void* p) { delete static_cast<std::vector<SpecInt>*>(p); });
    const auto b = static_cast<py::ssize_t>(rows.size()), l = static_cast<py::ssize_t>(width);
    return py::array_t<SpecInt>({b, l}, {static_cast<py::ssize_t>(width * sizeof(SpecInt)), py::ssize_t(sizeof(SpecInt))},
                                owned->data(), keep);
  }
  template <class T>
  py::object operator()(std::vector<T>&& v) const {  // batches of strings, batches of batches of strings
    py::list out;
    for (auto& x : v) out.append((*this)(std::move(x)));
    return out;
  }
};

// ---- Python callables in map, filter and flat_map --------------------------------------------------

/// A Python object held from C++ code that may drop it on any thread: released under the GIL.
struct PyRef {
  explicit PyRef(py::handle h) : p(h.inc_ref().ptr()) {}
  PyRef(const PyRef&) = delete;
  PyRef& operator=(const PyRef&) = delete;
  ~PyRef() {
    if (!Py_IsInitialized()) return;  // the interpreter is gone: nothing to release into
    const PyGILState_STATE s = PyGILState_Ensure();
    Py_XDECREF(p);
    PyGILState_Release(s);
  }
  PyObject* p;
};
using PyHandle = std::shared_ptr<const PyRef>;

/// A Python exception raised by a callable on an engine thread. The node wraps it in a NodeError (which
/// nests it); the consumer's translator makes the original the Python NodeError's __cause__.
class PythonCallError : public std::runtime_error {
 public:
  PythonCallError(const std::string& what, PyHandle exception) : std::runtime_error(what), exception(std::move(exception)) {}
  PyHandle exception;
};

/// Under the GIL, in a catch of error_already_set: the exception as a PythonCallError ("ValueError: …").
[[noreturn]] void rethrow_python(py::error_already_set& e) {
  const py::object value = e.value();
  std::string what = py::str(py::type::handle_of(value).attr("__name__"));
  const std::string text = py::str(value);
  if (!text.empty()) what += ": " + text;
  throw PythonCallError(what, std::make_shared<const PyRef>(value));
}

// Python → the element types of specs; a mismatch is an error naming the callable and what it returned.
template <class T>
struct FromPython;
[[noreturn]] void wrong_type(const py::handle& v, const std::string& want, const std::string& label) {
  throw std::runtime_error("the Python callable " + label + " returned " +
                           std::string(py::str(py::type::handle_of(v).attr("__name__"))) + ", expected " + want);
}
template <>
struct FromPython<SpecInt> {
  static SpecInt get(const py::handle& v, const std::string& label) {
    if (!PyIndex_Check(v.ptr())) wrong_type(v, "an integer", label);
    const long long x = PyLong_AsLongLong(py::reinterpret_steal<py::object>(PyNumber_Index(v.ptr())).ptr());
    if (x == -1 && PyErr_Occurred()) throw py::error_already_set();
    return x;
  }
};
template <>
struct FromPython<std::string> {
  static std::string get(const py::handle& v, const std::string& label) {
    if (PyBytes_Check(v.ptr())) return std::string(PyBytes_AS_STRING(v.ptr()), static_cast<std::size_t>(PyBytes_GET_SIZE(v.ptr())));
    if (!PyUnicode_Check(v.ptr())) wrong_type(v, "str or bytes", label);
    const auto b = py::reinterpret_steal<py::object>(PyUnicode_AsEncodedString(v.ptr(), "utf-8", "surrogateescape"));
    if (!b) throw py::error_already_set();
    return std::string(PyBytes_AS_STRING(b.ptr()), static_cast<std::size_t>(PyBytes_GET_SIZE(b.ptr())));
  }
};
template <>
struct FromPython<std::vector<SpecInt>> {
  static std::vector<SpecInt> get(const py::handle& v, const std::string& label) {
    if (PyUnicode_Check(v.ptr()) || PyBytes_Check(v.ptr())) wrong_type(v, "a 1-D array or a list of integers", label);
    if (py::isinstance<py::array>(v)) {
      auto a = py::array_t<SpecInt, py::array::c_style | py::array::forcecast>::ensure(v);
      if (!a || a.ndim() != 1) wrong_type(v, "a 1-D integer array", label);
      return std::vector<SpecInt>(a.data(), a.data() + a.size());
    }
    std::vector<SpecInt> out;
    for (const py::handle x : py::iterable(py::reinterpret_borrow<py::object>(v))) out.push_back(FromPython<SpecInt>::get(x, label));
    return out;
  }
};
template <class T>
struct FromPython<std::vector<T>> {  // lists of strings, of batches
  static std::vector<T> get(const py::handle& v, const std::string& label) {
    if (PyUnicode_Check(v.ptr()) || PyBytes_Check(v.ptr()) || !py::isinstance<py::iterable>(v))
      wrong_type(v, "a sequence", label);
    std::vector<T> out;
    for (const py::handle x : py::iterable(py::reinterpret_borrow<py::object>(v))) out.push_back(FromPython<T>::get(x, label));
    return out;
  }
};

/// What a Python callable is, for the fingerprint and messages: "module.qualname".
std::string callable_label(const py::handle& f) {
  const py::object module = py::getattr(f, "__module__", py::none());
  const py::object name = py::getattr(f, "__qualname__", py::getattr(f, "__name__", py::str(py::type::handle_of(f).attr("__name__"))));
  std::string label = py::str(name);
  if (!module.is_none()) label = std::string(py::str(module)) + "." + label;
  return label;
}

struct PyCallable {
  PyHandle fn;
  std::string label;
  bool input_bytes = false;

  template <class In>
  py::object call(In&& x) const {
    py::object arg = Convert{.bytes = input_bytes}(std::forward<In>(x));
    return py::reinterpret_borrow<py::object>(fn->p)(arg);
  }
  Params describe() const { return {{"fn", "python"}, {"callable", label}}; }
};

template <class In, class Out>
struct PyMap : PyCallable {
  Out operator()(In x) const {
    py::gil_scoped_acquire gil;
    try {
      return FromPython<Out>::get(call(std::move(x)), label);
    } catch (py::error_already_set& e) {
      rethrow_python(e);
    }
  }
};
template <class In>
struct PyFilter : PyCallable {
  bool operator()(const In& x) const {
    py::gil_scoped_acquire gil;
    try {
      const py::object r = call(In(x));
      const int truth = PyObject_IsTrue(r.ptr());
      if (truth < 0) throw py::error_already_set();
      return truth != 0;
    } catch (py::error_already_set& e) {
      rethrow_python(e);
    }
  }
};
template <class In>
struct PyFlatMap : PyCallable {
  std::vector<In> operator()(In x) const {
    py::gil_scoped_acquire gil;
    try {
      return FromPython<std::vector<In>>::get(call(std::move(x)), label);
    } catch (py::error_already_set& e) {
      rethrow_python(e);
    }
  }
};

/// Calls f.template operator()<T>() with the spec element type named `name` ("integer", "batch of string").
template <class F, class... Ts>
SpecPipeline with_element_type(const std::string& name, F&& f, TypeList<Ts...>) {
  std::optional<SpecPipeline> out;
  ((SpecElement<Ts>::name() == name ? (out.emplace(f.template operator()<Ts>()), true) : false) || ...);
  if (!out) {
    std::string known;
    ((known += (known.empty() ? "" : ", ") + SpecElement<Ts>::name()), ...);
    throw ConfigError("out: unknown element type '" + name + "' (known: " + known + ")");
  }
  return *out;
}

/// The Python callables of one pipeline, by the ids its spec names them with.
class PythonFunctions final : public ExternalFunctions {
 public:
  explicit PythonFunctions(const py::dict& callables) {
    for (const auto& [k, f] : callables) {
      if (!PyCallable_Check(f.ptr())) throw ConfigError("callable " + std::string(py::str(k)) + " is not callable");
      by_id_.emplace(k.cast<std::int64_t>(), PyCallable{std::make_shared<const PyRef>(f), callable_label(f)});
    }
  }
  SpecPipeline map(const SpecPipeline& input, std::int64_t id, const std::string& out, const std::string& name,
                   bool input_bytes) const override {
    const PyCallable f = at(id, input_bytes);
    return input.visit([&]<class In>(const Pipeline<In>& p) -> SpecPipeline {
      const std::string out_name = out.empty() ? SpecElement<In>::name() : out;
      return with_element_type(out_name, [&]<class Out>() -> SpecPipeline {
        return p | dpipe::map(PyMap<In, Out>{f}, MapOptions{.name = name});
      }, SpecElementTypes{});
    });
  }
  SpecPipeline filter(const SpecPipeline& input, std::int64_t id, const std::string& name, bool input_bytes) const override {
    const PyCallable f = at(id, input_bytes);
    return input.visit([&]<class In>(const Pipeline<In>& p) -> SpecPipeline {
      return p | dpipe::filter(PyFilter<In>{f}, FilterOptions{.name = name});
    });
  }
  SpecPipeline flat_map(const SpecPipeline& input, std::int64_t id, const std::string& name, bool input_bytes) const override {
    const PyCallable f = at(id, input_bytes);
    return input.visit([&]<class In>(const Pipeline<In>& p) -> SpecPipeline {
      return p | dpipe::flat_map(PyFlatMap<In>{f}, FlatMapOptions{.name = name});
    });
  }

 private:
  PyCallable at(std::int64_t id, bool input_bytes) const {
    const auto it = by_id_.find(id);
    if (it == by_id_.end()) throw ConfigError("no Python callable with id " + std::to_string(id) + " was given");
    PyCallable f = it->second;
    f.input_bytes = input_bytes;
    return f;
  }
  std::map<std::int64_t, PyCallable> by_id_;
};

// ---- a running pipeline -------------------------------------------------------------------------

class Loop {
 public:
  virtual ~Loop() = default;
  /// The next element, or nullopt at the end. Waits without the GIL.
  virtual std::optional<py::object> next() = 0;
  virtual py::bytes snapshot(bool reproducible, std::optional<std::uint64_t> step,
                             std::map<std::string, std::string> metadata) = 0;
  virtual std::uint64_t delivered() const = 0;
  virtual std::vector<std::string> warnings() const = 0;
  virtual Layout layout() const = 0;
};

template <class T>
class TypedLoop final : public Loop {
 public:
  TypedLoop(Run<T> run, Convert convert) : run_(std::move(run)), convert_(convert) {}
  /// Stopping the run joins its workers, which may be waiting for the GIL in a Python callable.
  ~TypedLoop() override {
    if (PyGILState_Check()) {
      py::gil_scoped_release nogil;
      run_.reset();
    }
  }
  std::optional<py::object> next() override {
    std::optional<T> x;
    {
      py::gil_scoped_release nogil;
      x = run_->next();
    }
    if (!x) return std::nullopt;
    return convert_(std::move(*x));
  }
  py::bytes snapshot(bool reproducible, std::optional<std::uint64_t> step,
                     std::map<std::string, std::string> metadata) override {
    std::string bytes;
    {
      py::gil_scoped_release nogil;
      Snapshot s = reproducible ? run_->reproducible_snapshot(std::move(metadata), step)
                                : run_->snapshot(std::move(metadata), step);
      bytes = s.to_bytes();
    }
    return py::bytes(bytes);
  }
  std::uint64_t delivered() const override { return run_->delivered(); }
  std::vector<std::string> warnings() const override { return run_->warnings(); }
  Layout layout() const override { return run_->layout(); }

 private:
  std::optional<Run<T>> run_;
  Convert convert_;
};

/// A built spec: its pipeline, seed, and how its strings reach Python.
struct BuiltSpec {
  Spec spec;
  std::string type_name() const { return spec.pipeline.type_name(); }
};

BuiltSpec build(const std::string& json_text, const py::dict& callables) {
  const PythonFunctions functions(callables);
  return BuiltSpec{parse_spec(json_text, SpecOptions{.base64_bytes = false, .external = &functions})};
}

/// A NodeError reaches Python as dpipe.NodeError (with `node` and `worker`), and the exception a Python
/// callable raised as its __cause__.
void translate_node_error(const dpipe::NodeError& e, const py::object& node_error_type) {
  py::object exc = node_error_type(e.what());
  exc.attr("node") = e.node_key();
  exc.attr("worker") = e.worker();
  try {
    if (e.nested_ptr()) std::rethrow_exception(e.nested_ptr());
  } catch (const PythonCallError& original) {
    PyException_SetCause(exc.ptr(), py::handle(original.exception->p).inc_ref().ptr());
  } catch (...) {
  }
  PyErr_SetObject(node_error_type.ptr(), exc.ptr());
}

struct LoopOptions {
  std::uint64_t seed = 0;
  std::uint64_t epoch = 0;
  int rank = 0, world_size = 1, workers = 1, threads = 0;
  bool inline_workers = false;
};

RunOptions run_options(const LoopOptions& o) {
  return RunOptions{.seed = o.seed, .epoch = o.epoch, .layout = Layout{o.rank, o.world_size, o.workers},
                    .inline_workers = o.inline_workers};
}

std::unique_ptr<Loop> start(const BuiltSpec& b, const LoopOptions& o, std::optional<std::string> state,
                            bool allow_changed_data) {
  auto engine = std::make_shared<Engine>(EngineOptions{.threads = o.threads});
  const RunOptions ro = run_options(o);
  ResumeOptions rz{.allow_changed_data = allow_changed_data};
  const Convert convert{.bytes = b.spec.bytes};
  std::optional<Snapshot> snap;
  if (state) snap = Snapshot::from_bytes(*state);
  py::gil_scoped_release nogil;  // a restore may replay for a while; the engine's threads never need the GIL here
  return b.spec.pipeline.visit([&]<class T>(const Pipeline<T>& p) -> std::unique_ptr<Loop> {
    // The engine outlives the Run: it is kept by the loop through the run's shared executor.
    if (snap) return std::make_unique<TypedLoop<T>>(engine->resume(p, *snap, ro, rz), convert);
    return std::make_unique<TypedLoop<T>>(engine->start(p, ro), convert);
  });
}

/// Runs the pipeline to its end in C++ without handing elements to Python (the benchmarks' baseline):
/// the number of elements.
std::uint64_t drain(const BuiltSpec& b, const LoopOptions& o) {
  py::gil_scoped_release nogil;
  Engine engine(EngineOptions{.threads = o.threads});
  const RunOptions ro = run_options(o);
  return b.spec.pipeline.visit([&]<class T>(const Pipeline<T>& p) -> std::uint64_t {
    auto run = engine.start(p, ro);
    std::uint64_t n = 0;
    while (auto x = run.next()) ++n;
    return n;
  });
}

/// Every rank's snapshot bytes of one step → the bytes for each rank of another layout.
std::vector<py::bytes> rescale(const std::vector<std::string>& ranks, int world_size, int workers) {
  std::vector<std::string> out;
  {
    py::gil_scoped_release nogil;
    std::vector<Snapshot> snaps;
    snaps.reserve(ranks.size());
    for (const auto& r : ranks) snaps.push_back(Snapshot::from_bytes(r));
    const SnapshotSet set = SnapshotSet(std::move(snaps)).rescaled(world_size, workers);
    for (int r = 0; r < world_size; ++r) out.push_back(set.rank(r).to_bytes());
  }
  std::vector<py::bytes> result;
  for (auto& s : out) result.emplace_back(s);
  return result;
}

/// The readable part of a snapshot: what state_dict() shows beside the bytes.
py::dict describe(const std::string& bytes) {
  const Snapshot s = Snapshot::from_bytes(bytes);
  py::dict d;
  d["format_version"] = Snapshot::kFormatVersion;
  d["id"] = s.meta.id;
  d["step"] = s.meta.step ? py::object(py::int_(*s.meta.step)) : py::object(py::none());
  d["seed"] = s.meta.seed;
  d["epoch"] = s.meta.epoch;
  d["rank"] = s.meta.layout.rank;
  d["world_size"] = s.meta.layout.world_size;
  d["workers"] = s.meta.layout.num_workers;
  d["delivered"] = s.meta.elements_delivered;
  d["metadata"] = s.meta.user_metadata;
  d["fingerprint"] = s.meta.fingerprint;
  return d;
}

}  // namespace
}  // namespace dpipe::python

PYBIND11_MODULE(_dpipe, m) {
  using namespace dpipe::python;
  m.doc() = "dpipe's C++ engine (use the dpipe package)";

  auto error = py::register_exception<dpipe::Error>(m, "Error", PyExc_RuntimeError);
  py::register_exception<dpipe::ConfigError>(m, "ConfigError", error.ptr());
  py::register_exception<dpipe::SnapshotError>(m, "SnapshotError", error.ptr());
  py::register_exception<dpipe::DataError>(m, "DataError", error.ptr());
  py::register_exception<dpipe::FileError>(m, "FileError", error.ptr());
  // Kept for the process's life: a static py::object would be released after the interpreter is gone.
  static const auto* node_error = new py::object(py::register_exception<dpipe::NodeError>(m, "NodeError", error.ptr()));
  py::register_exception_translator([](std::exception_ptr p) {
    if (!p) return;
    try {
      std::rethrow_exception(p);
    } catch (const dpipe::NodeError& e) {
      translate_node_error(e, *node_error);
    }
  });

  m.def("spec_ops", &dpipe::spec_ops, "The op names specs know, in registry order.");
  m.def("spec_sources", &dpipe::spec_sources, "The op names of sources.");
  m.def("snapshot_format_version", [] { return dpipe::Snapshot::kFormatVersion; });

  py::class_<BuiltSpec>(m, "BuiltSpec")
      .def_property_readonly("seed", [](const BuiltSpec& b) { return b.spec.seed; })
      .def_property_readonly("element_type", &BuiltSpec::type_name)
      .def_property_readonly("bytes", [](const BuiltSpec& b) { return b.spec.bytes; });
  m.def("build", &build, py::arg("spec_json"), py::arg("callables") = py::dict(),
        "Builds a JSON spec into a typed pipeline; `callables` maps the ids of \"fn\": \"external\" to Python callables.");

  py::class_<LoopOptions>(m, "LoopOptions")
      .def(py::init<>())
      .def_readwrite("seed", &LoopOptions::seed)
      .def_readwrite("epoch", &LoopOptions::epoch)
      .def_readwrite("rank", &LoopOptions::rank)
      .def_readwrite("world_size", &LoopOptions::world_size)
      .def_readwrite("workers", &LoopOptions::workers)
      .def_readwrite("threads", &LoopOptions::threads)
      .def_readwrite("inline_workers", &LoopOptions::inline_workers);

  py::class_<Loop>(m, "Loop")
      .def("next", &Loop::next, "The next element, or None at the end of the stream.")
      .def("snapshot", &Loop::snapshot, py::arg("reproducible") = true, py::arg("step") = py::none(),
           py::arg("metadata") = std::map<std::string, std::string>{})
      .def_property_readonly("delivered", &Loop::delivered)
      .def_property_readonly("warnings", &Loop::warnings)
      .def_property_readonly("layout", [](const Loop& l) {
        const auto x = l.layout();
        return py::make_tuple(x.rank, x.world_size, x.num_workers);
      });
  m.def("start", &start, py::arg("spec"), py::arg("options"), py::arg("state") = py::none(),
        py::arg("allow_changed_data") = false, "Starts the pipeline, or resumes it from snapshot bytes.");
  m.def("drain", &drain, py::arg("spec"), py::arg("options"), "Runs to the end in C++; returns the element count.");
  m.def("rescale", &rescale, py::arg("ranks"), py::arg("world_size"), py::arg("workers"));
  m.def("describe", &describe, py::arg("snapshot"));
  m.def(
      "write_records",
      [](const std::string& path, const std::vector<std::string>& records) {
        py::gil_scoped_release nogil;
        dpipe::write_records(path, records);
      },
      py::arg("path"), py::arg("records"), "Writes a records file (written whole or not at all).");
}
