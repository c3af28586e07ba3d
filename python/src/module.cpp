// _dpipe: the C++ side of the Python package. A pipeline arrives as the tool's JSON spec (built by the
// Python node functions) and is built by the same spec front end into a typed C++ Pipeline<T>; a Loop
// runs it on the engine and hands each element to Python, converted once: integers and strings as int
// and str, records as bytes, batches of numbers as numpy arrays that own the C++ buffer (no copy).
// Waiting for an element releases the GIL.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <chrono>
#include <ctime>
#include <future>
#include <map>
#include <memory>
#include <stdexcept>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "dpipe/dpipe.hpp"
#include "json_spec.hpp"

namespace py = pybind11;

namespace dpipe::python {
namespace {

// ---- elements to Python -------------------------------------------------------------------------

struct Convert {
  bool bytes = false;      // strings are bytes (records)
  bool tuple_row = false;  // the element is a row of zip (one C++ type with a batch): a tuple

  /// An element as Python sees it: what operator() makes, but a zip row becomes a tuple of its items.
  template <class T>
  py::object element(T&& x) const {
    if constexpr (detail::is_vector_v<std::decay_t<T>>) {
      if (tuple_row) {
        const Convert item{.bytes = bytes};
        py::tuple out(x.size());
        for (std::size_t i = 0; i < x.size(); ++i) out[i] = item(std::move(x[i]));
        return out;
      }
    }
    return (*this)(std::forward<T>(x));
  }

  py::object operator()(SpecInt v) const {
    PyObject* o = PyLong_FromLongLong(v);
    if (!o) throw py::error_already_set();
    return py::reinterpret_steal<py::object>(o);
  }
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
  /// A dynamic value: the Python object it was made from (arrays own the value's bytes, no copy).
  py::object operator()(Value&& v) const {
    switch (v.kind) {
      case Value::Kind::none: return py::none();
      case Value::Kind::boolean: return py::bool_(std::get<bool>(v.data));
      case Value::Kind::integer: return (*this)(std::get<std::int64_t>(v.data));
      case Value::Kind::real: return py::float_(std::get<double>(v.data));
      case Value::Kind::string: return Convert{}(std::move(std::get<std::string>(v.data)));
      case Value::Kind::bytes: return py::bytes(std::get<std::string>(v.data));
      case Value::Kind::list:
      case Value::Kind::tuple: {
        auto& items = std::get<std::vector<Value>>(v.data);
        const auto n = static_cast<Py_ssize_t>(items.size());
        const bool list = v.kind == Value::Kind::list;
        py::object out = py::reinterpret_steal<py::object>(list ? PyList_New(n) : PyTuple_New(n));
        if (!out) throw py::error_already_set();
        for (Py_ssize_t i = 0; i < n; ++i) {
          PyObject* item = (*this)(std::move(items[static_cast<std::size_t>(i)])).release().ptr();
          if (list) PyList_SET_ITEM(out.ptr(), i, item);
          else PyTuple_SET_ITEM(out.ptr(), i, item);
        }
        return out;
      }
      case Value::Kind::dict: {
        auto& items = std::get<std::vector<Value>>(v.data);
        py::dict out;
        for (std::size_t i = 0; i + 1 < items.size(); i += 2) out[(*this)(std::move(items[i]))] = (*this)(std::move(items[i + 1]));
        return out;
      }
      case Value::Kind::array: {
        auto* owned = new ValueArray(std::move(v.as_array()));
        py::capsule keep(owned, [](void* p) { delete static_cast<ValueArray*>(p); });
        std::vector<py::ssize_t> shape(owned->shape.begin(), owned->shape.end());
        return py::array(py::dtype(owned->dtype), shape, {}, owned->data.data(), keep);
      }
    }
    return py::none();
  }
  template <class T>
  py::object operator()(std::vector<T>&& v) const {  // batches of strings, of values, of batches of strings
    py::object out = py::reinterpret_steal<py::object>(PyList_New(static_cast<Py_ssize_t>(v.size())));
    if (!out) throw py::error_already_set();
    for (std::size_t i = 0; i < v.size(); ++i)
      PyList_SET_ITEM(out.ptr(), static_cast<Py_ssize_t>(i), (*this)(std::move(v[i])).release().ptr());
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
  PythonCallError(const std::string& what, PyHandle exception, bool interrupts)
      : std::runtime_error(what), exception(std::move(exception)), interrupts(interrupts) {}
  PyHandle exception;
  /// Not an Exception (KeyboardInterrupt, SystemExit): no error policy drops the element it was raised on.
  bool interrupts;
};

/// Under the GIL: repr(x) on one line, cut to about 80 bytes at a character's start ("<unprintable>" when
/// repr raises), for a message that shows the element a callable failed on.
std::string short_repr(const py::handle& x) {
  PyObject* r = PyObject_Repr(x.ptr());
  if (!r) {
    PyErr_Clear();
    return "<unprintable>";
  }
  const py::object text = py::reinterpret_steal<py::object>(r);
  Py_ssize_t size = 0;
  const char* utf8 = PyUnicode_AsUTF8AndSize(text.ptr(), &size);
  if (!utf8) {
    PyErr_Clear();
    return "<unprintable>";
  }
  std::string out(utf8, static_cast<std::size_t>(size));
  if (out.size() > 80) {
    std::size_t cut = 77;
    while (cut > 0 && (static_cast<unsigned char>(out[cut]) & 0xC0) == 0x80) --cut;  // not inside a character
    out = out.substr(0, cut) + "...";
  }
  for (char& c : out)
    if (c == '\n' || c == '\r') c = ' ';
  return out;
}

/// Under the GIL, in a catch of error_already_set: the exception as a PythonCallError ("ValueError: …",
/// then `where` it was raised). The exception keeps its traceback, so the Python NodeError's __cause__ shows
/// the frames of the user's callable.
[[noreturn]] void rethrow_python(py::error_already_set& e, const std::string& where = {}) {
  const py::object value = e.value();
  if (e.trace() && PyExceptionInstance_Check(value.ptr())) {
    const py::object had = py::reinterpret_steal<py::object>(PyException_GetTraceback(value.ptr()));
    if (!had) PyException_SetTraceback(value.ptr(), e.trace().ptr());
  }
  std::string what = py::str(py::type::handle_of(value).attr("__name__"));
  const std::string text = py::str(value);
  if (!text.empty()) what += ": " + text;
  what += where;
  const bool interrupts = !PyErr_GivenExceptionMatches(value.ptr(), PyExc_Exception);
  throw PythonCallError(what, std::make_shared<const PyRef>(value), interrupts);
}

// Python → the element types of specs; a mismatch is an error naming the callable and what it returned.
template <class T>
struct FromPython;
/// A callable returned a value of the wrong type: the pipeline's mistake, never skipped as the element's.
struct ResultTypeError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
[[noreturn]] void wrong_type(const py::handle& v, const std::string& want, const std::string& label) {
  throw ResultTypeError("the Python callable " + label + " returned " +
                           std::string(py::str(py::type::handle_of(v).attr("__name__"))) + ", expected " + want);
}
template <>
struct FromPython<SpecInt> {
  static SpecInt get(const py::handle& v, const std::string& label) {
    int overflow = 0;
    if (PyLong_CheckExact(v.ptr())) {
      const long long x = PyLong_AsLongLongAndOverflow(v.ptr(), &overflow);
      if (overflow) too_wide(v, label);
      if (x == -1 && PyErr_Occurred()) throw py::error_already_set();
      return x;
    }
    if (!PyIndex_Check(v.ptr())) wrong_type(v, "an integer", label);  // a bool is the int it is
    const auto index = py::reinterpret_steal<py::object>(PyNumber_Index(v.ptr()));
    if (!index) throw py::error_already_set();
    const long long x = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
    if (overflow) too_wide(v, label);
    if (x == -1 && PyErr_Occurred()) throw py::error_already_set();
    return x;
  }
  [[noreturn]] static void too_wide(const py::handle& v, const std::string& label) {
    std::string text;
    try {
      text = py::str(v);
      if (text.size() > 40) text = text.substr(0, 37) + "...";
    } catch (const py::error_already_set&) {  // past Python's digit limit for str(): its size instead
      text = "of " + std::string(py::str(v.attr("bit_length")())) + " bits";
    }
    throw ResultTypeError("the Python callable " + label + " returned the integer " + text +
                          ", outside the 64 bits dpipe's integers hold");
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
    if (PyUnicode_Check(v.ptr()) || PyBytes_Check(v.ptr()) || !py::isinstance<py::iterable>(v))
      wrong_type(v, "a 1-D array or a list of integers", label);
    if (py::isinstance<py::array>(v)) {
      const auto given = py::reinterpret_borrow<py::array>(v);
      const char kind = given.dtype().kind();
      if ((kind != 'i' && kind != 'u' && kind != 'b') || given.ndim() != 1)
        throw ResultTypeError("the Python callable " + label + " returned a " + std::to_string(given.ndim()) +
                              "-D array of " + std::string(py::str(given.dtype())) + ", expected a 1-D integer array");
      auto a = py::array_t<SpecInt, py::array::c_style | py::array::forcecast>::ensure(v);
      if (!a) throw py::error_already_set();
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

/// Any Python value of the kinds a Value holds; numpy scalars as the Python number they are.
template <>
struct FromPython<Value> {
  static Value get(const py::handle& v, const std::string& label, int depth = 0) {
    if (depth > kValueMaxDepth) throw std::runtime_error("the Python callable " + label + " returned a value nested deeper than " +
                                                         std::to_string(kValueMaxDepth) + " levels");
    PyObject* o = v.ptr();
    if (o == Py_None) return Value::none();
    if (PyBool_Check(o)) return Value::boolean(o == Py_True);
    if (PyLong_Check(o)) {
      int overflow = 0;
      const long long x = PyLong_AsLongLongAndOverflow(o, &overflow);
      if (overflow != 0) throw std::runtime_error("the Python callable " + label + " returned an integer outside 64 bits");
      if (x == -1 && PyErr_Occurred()) throw py::error_already_set();
      return Value::integer(x);
    }
    if (PyFloat_Check(o)) return Value::real(PyFloat_AS_DOUBLE(o));
    if (PyUnicode_Check(o)) return Value::string(FromPython<std::string>::get(v, label));
    if (PyBytes_Check(o)) return Value::bytes(FromPython<std::string>::get(v, label));
    if (PyByteArray_Check(o))
      return Value::bytes(std::string(PyByteArray_AS_STRING(o), static_cast<std::size_t>(PyByteArray_GET_SIZE(o))));
    if (PyList_Check(o)) {  // each item held while it converts (converting may run Python code)
      std::vector<Value> items;
      items.reserve(static_cast<std::size_t>(PyList_GET_SIZE(o)));
      for (Py_ssize_t i = 0; i < PyList_GET_SIZE(o); ++i) {
        PyObject* item = PyList_GET_ITEM(o, i);
        if (PyLong_CheckExact(item) && depth < kValueMaxDepth) {  // the common item (token ids), converted running no Python code
          int overflow = 0;
          const long long x = PyLong_AsLongLongAndOverflow(item, &overflow);
          if (overflow != 0) throw std::runtime_error("the Python callable " + label + " returned an integer outside 64 bits");
          items.push_back(Value::integer(x));
          continue;
        }
        items.push_back(get(py::reinterpret_borrow<py::object>(item), label, depth + 1));
      }
      return Value::list(std::move(items));
    }
    if (PyTuple_Check(o)) {
      std::vector<Value> items;
      items.reserve(static_cast<std::size_t>(PyTuple_GET_SIZE(o)));
      for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(o); ++i) items.push_back(get(PyTuple_GET_ITEM(o, i), label, depth + 1));
      return Value::tuple(std::move(items));
    }
    if (PyDict_Check(o)) {
      std::vector<Value> items;
      for (const auto& [k, x] : py::reinterpret_borrow<py::dict>(v)) {
        items.push_back(get(k, label, depth + 1));
        items.push_back(get(x, label, depth + 1));
      }
      return Value::dict(std::move(items));
    }
    if (py::isinstance<py::array>(v) || PyObject_HasAttrString(o, "dtype")) {  // arrays, numpy scalars
      const py::array a = py::array::ensure(v, py::array::c_style);
      if (!a) throw py::error_already_set();
      const char kind = a.dtype().kind();
      if (a.ndim() == 0 && kind != 'c') {  // a numpy scalar or 0-d array: the Python number it holds
        const py::object item = a.attr("item")();
        return get(item, label, depth + 1);
      }
      ValueArray out;
      out.dtype = py::str(a.dtype().attr("str"));
      for (py::ssize_t i = 0; i < a.ndim(); ++i) out.shape.push_back(static_cast<std::uint64_t>(a.shape(i)));
      out.data.assign(static_cast<const char*>(a.data()), static_cast<std::size_t>(a.nbytes()));
      if (const std::string why = out.check(); !why.empty())
        throw std::runtime_error("the Python callable " + label + " returned an array dpipe cannot hold: " + why);
      return Value::array(std::move(out));
    }
    wrong_type(v, "None, bool, int, float, str, bytes, tuple, list, dict or a numpy array", label);
  }
};

/// What a Python callable is, for the fingerprint and messages: "module.qualname", and for a lambda a digest
/// of its code (dpipe/_callables.py).
std::string callable_label(const py::handle& f) {
  static const auto* label = new py::object(py::module_::import("dpipe._callables").attr("label"));
  return py::str((*label)(f));
}

/// Held by map and filter over one chunk of calls: one acquisition of the GIL per chunk, not per element.
struct GilHeld {
  GilHeld() = default;
  py::gil_scoped_acquire gil;
};

/// Runs f() with the GIL — taken only if this thread lacks it (inside a chunk scope it has it) — and a
/// Python exception leaving it as a PythonCallError.
template <class F>
auto in_python(F&& f) -> decltype(f()) {
  auto run = [&]() -> decltype(f()) {
    try {
      return f();
    } catch (py::error_already_set& e) {
      rethrow_python(e);
    }
  };
  if (PyGILState_Check()) return run();
  py::gil_scoped_acquire gil;
  return run();
}

/// Which Loader's pipeline the Python code running on this thread belongs to (one token per built spec,
/// which each Loader makes for itself), and its label: a callable that calls back into its own Loader is
/// refused (CallingBack), since a snapshot would wait for the very worker that asks for it, and a pull
/// would take elements out of order.
struct CallOwner {};
struct Calling {
  const CallOwner* owner = nullptr;
  const std::string* label = nullptr;
};
thread_local Calling tls_calling;
/// Marks this thread as running Python code of `owner` for its lifetime (nested calls restore the outer).
class CallingScope {
 public:
  CallingScope(const CallOwner* owner, const std::string& label) : outer_(tls_calling) { tls_calling = {owner, &label}; }
  ~CallingScope() { tls_calling = outer_; }
  CallingScope(const CallingScope&) = delete;
  CallingScope& operator=(const CallingScope&) = delete;

 private:
  Calling outer_;
};
/// Raises if the Python code running on this thread is one of `owner`'s callables: it called `what` of its
/// own Loader.
void refuse_calling_back(const CallOwner* owner, const std::string& what) {
  if (tls_calling.owner == nullptr || tls_calling.owner != owner) return;
  throw std::runtime_error("dpipe: " + *tls_calling.label + " called " + what +
                           " of its own Loader from inside the pipeline: refused (a state would wait for the worker "
                           "that asks for it, a pull would take elements out of their order); call it from the loop "
                           "that iterates the Loader");
}

struct PyCallable {
  PyHandle fn;
  std::string label;
  std::shared_ptr<const CallOwner> owner;  // shared by the callables of one built spec
  bool input_bytes = false;
  bool input_tuple = false;  // its input is zip's rows
  bool fused = false;        // adjacent stages fused by the Python package: returns an iterable of outputs
  bool fused_expands = false;  // fused stages that include a flat_map (else each input gives at most one output)

  /// Elements of the node's input this copy was called on (one copy per node instance), counted from the
  /// start of its input (the run's; under `cycle`, the pass's). A node saves the count with its record and
  /// gives it back at restore (kit/call_count.hpp); `counted_from_resume` when the record had none (a file
  /// before format 6, a rescaled set).
  mutable std::uint64_t calls = 0;
  bool counted_from_resume = false;

  /// Under the GIL: fn(x), x converted as the consumer would see it. An exception it raises is a
  /// PythonCallError naming the callable and the element's index in the node's input (`at`, or the
  /// count of calls).
  /// `extra`: a second argument (a map's per-sample generator), borrowed.
  template <class In>
  py::object call(In&& x, std::optional<std::uint64_t> at = std::nullopt, PyObject* extra = nullptr) const {
    const std::uint64_t index = at ? *at : calls++;  // counted before converting, which may throw
    const py::object arg = Convert{.bytes = input_bytes, .tuple_row = input_tuple}.element(std::forward<In>(x));
    const CallingScope calling(owner.get(), label);
    PyObject* r = extra ? PyObject_CallFunctionObjArgs(fn->p, arg.ptr(), extra, nullptr) : PyObject_CallOneArg(fn->p, arg.ptr());
    if (!r) {
      py::error_already_set e;
      rethrow_python(e, " (raised by " + label + " on element " + std::to_string(index) + " of its input on this instance, " +
                            (counted_from_resume ? "counted from the resume (the snapshot resumed did not record the count)"
                                                 : "counted from the start of its input") +
                            ": " + short_repr(arg) + ")");
    }
    return py::reinterpret_steal<py::object>(r);
  }
  Params describe() const { return {{"fn", "python"}, {"callable", label}}; }
  GilHeld chunk_scope() const { return GilHeld(); }
  /// on_error = skip drops an element the callable raised an Exception on, never KeyboardInterrupt or
  /// SystemExit, nor one it returned a value of the wrong type for.
  bool skips(const std::exception& e) const {
    if (dynamic_cast<const ResultTypeError*>(&e)) return false;
    const auto* call = dynamic_cast<const PythonCallError*>(&e);
    return !call || !call->interrupts;
  }
};

// A map over a Python callable is a "map" node like dpipe::map makes (the same kind, parameters, keys and
// fingerprint), but one node class per output type whose input is reached through PyMapInput, one class
// per input type: 8 + 8 classes for the spec's element types instead of 64 input × output nodes.

/// The input side of a Python map on one instance: pulls a chunk of the input and calls the callable on
/// its elements.
class PyMapInput {
 public:
  virtual ~PyMapInput() = default;
  /// Pulls up to `max` elements of the input (the GIL not held); returns how many.
  virtual std::size_t pull(std::size_t max) = 0;
  /// Under the GIL: the callable's result for pulled element `i` (each element once); `extra`, borrowed:
  /// a second argument.
  virtual py::object call(std::size_t i, PyObject* extra = nullptr) = 0;
  /// Elements pulled since the node was first built (every one called on when the node is between pulls);
  /// nullopt when the count started at a resume that did not give it back.
  virtual std::optional<std::uint64_t> taken() const = 0;
  /// At restore: the saved count, or nullopt (the count starts at the resume; messages say so).
  virtual void restore_taken(std::optional<std::uint64_t> taken) = 0;
  virtual IterBase* iter() const = 0;
  virtual std::size_t min_useful_pull() const = 0;
  /// Under the GIL: the callable's result for the input element of provenance `p`, made again by the
  /// input (restore keys: Iter::recompute). Touches no state.
  virtual py::object recompute_call(const Provenance& p, PyObject* extra = nullptr) const = 0;
};

template <class In>
class TypedMapInput final : public PyMapInput {
 public:
  TypedMapInput(std::unique_ptr<Iter<In>> input, const PyCallable& fn) : input_(std::move(input)), fn_(fn) {}
  std::size_t pull(std::size_t max) override {
    chunk_.clear();  // keeps its capacity
    base_ = pulled_;
    const std::size_t n = input_->pull(chunk_, max);
    pulled_ += n;
    return n;
  }
  py::object call(std::size_t i, PyObject* extra = nullptr) override {
    return fn_.call(std::move(chunk_[i]), base_ + i, extra);
  }
  std::optional<std::uint64_t> taken() const override {
    if (fn_.counted_from_resume) return std::nullopt;
    return pulled_;
  }
  void restore_taken(std::optional<std::uint64_t> taken) override {
    pulled_ = base_ = taken.value_or(0);
    fn_.counted_from_resume = !taken;
  }
  IterBase* iter() const override { return input_.get(); }
  std::size_t min_useful_pull() const override { return input_->min_useful_pull(); }
  py::object recompute_call(const Provenance& p, PyObject* extra = nullptr) const override {
    In x;
    {
      const py::gil_scoped_release unlocked;  // the input's own nodes may call Python again
      x = input_->recompute(p);
    }
    return fn_.call(std::move(x), 0, extra);
  }

 private:
  std::unique_ptr<Iter<In>> input_;
  PyCallable fn_;  // a copy per worker
  std::vector<In> chunk_;
  std::uint64_t pulled_ = 0, base_ = 0;  // elements pulled since the node was first built; before this chunk
};

/// Instantiates a map's input (a NodeDef<In>) on one instance, behind PyMapInput.
using MakeMapInput = std::unique_ptr<PyMapInput> (*)(const NodeDefBase& input, BuildContext& ctx, const PyCallable& fn);
template <class In>
std::unique_ptr<PyMapInput> make_map_input(const NodeDefBase& input, BuildContext& ctx, const PyCallable& fn) {
  return std::make_unique<TypedMapInput<In>>(static_cast<const NodeDef<In>&>(input).instantiate(ctx), fn);
}

template <class Out>
class PyMapDef;

template <class Out>
class PyMapIter final : public HookedIf<Out> {
 public:
  // The input is instantiated after this node, as dpipe::map's is, so both number their nodes alike.
  PyMapIter(BuildContext& ctx, const PyMapDef<Out>& def)
      : HookedIf<Out>(def.on_error() == OnDataError::skip, ctx, "map"), input_(def.make_input(ctx)),
        callable_(def.callable()), skips_(def.on_error() == OnDataError::skip), rng_(def.rng()),
        seed_key_(detail::sample_seed_key(ctx.seed, this->key(), ctx.epoch)), keys_(ctx.keys) {
    if (rng_) detail::refuse_elements_held_upstream(this->label(), *input_->iter());
  }

 protected:
  std::size_t pull_chunk(std::vector<Out>& out, std::size_t max) override {
    for (;;) {
      const std::size_t n = input_->pull(max);
      if (n == 0) return 0;
      std::size_t kept = 0;
      const GilHeld gil;  // once per chunk, never while pulling the input
      std::vector<Provenance>& traces = input_->iter()->traces();  // compacted with the elements, traced
      const bool traced = this->traced();
      for (std::size_t i = 0; i < n; ++i) {
        try {
          out.push_back(in_python([&] {
            if (!rng_) return FromPython<Out>::get(input_->call(i), callable_.label);
            const py::object generator = sample_generator(traces[i]);
            return FromPython<Out>::get(input_->call(i, generator.ptr()), callable_.label);
          }));
          if (traced && kept != i) traces[kept] = std::move(traces[i]);
          ++kept;
        } catch (...) {
          if (!skip_current_exception(callable_, skips_, skipped_)) {
            this->pass_traces(*input_->iter(), kept);
            return this->fail_after(kept);
          }
        }
      }
      this->pass_traces(*input_->iter(), kept);
      if (kept > 0) return kept;  // with skip, a chunk of skipped elements only pulls again
    }
  }
  bool carries_provenance() const override { return true; }
  bool holds_no_elements() const override { return true; }
  bool one_base() const override { return input_->iter()->one_base(); }
  bool recomputable() const override { return input_->iter()->recomputable(); }
  Out recompute(const Provenance& p) const override {
    return in_python([&] {
      if (!rng_) return FromPython<Out>::get(input_->recompute_call(p), callable_.label);
      const py::object generator = sample_generator(p);
      return FromPython<Out>::get(input_->recompute_call(p, generator.ptr()), callable_.label);
    });
  }
  void save_state(StateWriter& w) const override {
    if (skips_) w.write(skipped_);
  }
  void restore_state(StateReader& r) override {
    if (skips_) r.read(skipped_);
  }
  std::uint64_t skipped_elements() const override { return skipped_.skipped; }
  std::optional<std::uint64_t> input_taken() const override { return input_->taken(); }
  bool counts_input() const override { return true; }
  void restore_input_taken(std::optional<std::uint64_t> taken) override { input_->restore_taken(taken); }
  std::vector<IterBase*> inputs() const override { return {input_->iter()}; }
  std::size_t min_useful_pull() const override { return input_->min_useful_pull(); }

 private:
  /// Under the GIL: rng=True's numpy.random.Generator for an element, seeded by its provenance.
  /// numpy missing is the run's failure, never an element's that on_error = skip would drop.
  py::object sample_generator(const Provenance& p) const {
    if (!generator_type_) {
      try {
        const py::module_ random = py::module_::import("numpy.random");
        generator_type_ = std::make_shared<const PyRef>(random.attr("Generator"));
        bit_generator_type_ = std::make_shared<const PyRef>(random.attr("PCG64"));
      } catch (py::error_already_set& e) {
        throw ResultTypeError(this->label() + ": map(fn, rng=True) gives fn a numpy.random.Generator, and numpy.random "
                              "did not import: " + std::string(e.what()));
      }
    }
    const std::uint64_t seed = detail::sample_seed(seed_key_, p, keys_, this->label());
    const py::handle generator(generator_type_->p), bit_generator(bit_generator_type_->p);
    return generator(bit_generator(py::int_(seed)));
  }

  std::unique_ptr<PyMapInput> input_;
  PyCallable callable_;
  bool skips_;
  SkipCountState skipped_;
  bool rng_;                                // fn(x, generator): the input is traced
  std::uint64_t seed_key_;
  const std::vector<std::string>* keys_;
  mutable PyHandle generator_type_, bit_generator_type_;  // numpy's, imported at the first call (released under the GIL)
};

template <class Out>
class PyMapDef final : public NodeDef<Out> {
 public:
  PyMapDef(std::shared_ptr<const NodeDefBase> input, MakeMapInput make, PyCallable fn, const ExternalNode& node)
      : NodeDef<Out>("map", node.name, map_params(fn, node), {input}), input_(std::move(input)), make_(make),
        fn_(std::move(fn)), on_error_(node.on_error), rng_(node.rng) {}
  std::unique_ptr<Iter<Out>> instantiate(BuildContext& ctx) const override {
    return std::make_unique<PyMapIter<Out>>(ctx, *this);
  }
  /// With rng, the input is traced: each element's provenance seeds its generator.
  std::unique_ptr<PyMapInput> make_input(BuildContext& ctx) const {
    const bool was = ctx.trace;
    ctx.trace = was || rng_;
    auto in = make_(*input_, ctx, fn_);
    ctx.trace = was;
    return in;
  }
  const PyCallable& callable() const { return fn_; }
  OnDataError on_error() const { return on_error_; }
  bool rng() const { return rng_; }

 private:
  static Params map_params(const PyCallable& fn, const ExternalNode& node) {
    Params p = describe_fn(fn, node.on_error);
    if (node.rng) p.push_back({"rng", "true"});  // as map_with_rng's
    return p;
  }
  std::shared_ptr<const NodeDefBase> input_;
  MakeMapInput make_;
  PyCallable fn_;
  OnDataError on_error_;
  bool rng_;
};

/// parallel_map over a Python callable: up to `max_in_flight` elements of a pulled chunk are mapped at once
/// on the engine's threads, each call taking the GIL for itself (so calls overlap only where the callable
/// releases it: numpy, a C tokenizer). The output keeps the input's order; nothing is in flight between
/// pulls, so it needs no state (as dpipe::parallel_map). Inline, the calls run one after another.
template <class Out>
class PyParallelMapDef;

template <class Out>
class PyParallelMapIter final : public Stateless<Out> {
 public:
  PyParallelMapIter(BuildContext& ctx, const PyParallelMapDef<Out>& def)
      : Stateless<Out>(ctx, "parallel_map"), input_(def.make_input(ctx)), label_(def.callable().label),
        executor_(ctx.inline_workers ? nullptr : ctx.executor), window_(def.max_in_flight()) {}

 protected:
  std::size_t pull_chunk(std::vector<Out>& out, std::size_t max) override {
    const std::size_t n = input_->pull(std::min(max, window_));  // without the GIL
    if (n == 0) return 0;
    results_.assign(n, std::nullopt);
    errors_.assign(n, nullptr);
    auto apply = [&](std::size_t i) {
      try {
        results_[i].emplace(in_python([&] { return FromPython<Out>::get(input_->call(i), label_); }));
      } catch (...) {
        errors_[i] = std::current_exception();
      }
    };
    if (executor_) {
      executor_->parallel_for(n, apply);
    } else {
      const GilHeld gil;
      for (std::size_t i = 0; i < n; ++i) apply(i);
    }
    const std::size_t delivered =
        detail::deliver_until_failure(out, results_, errors_, [this](std::size_t i) { return this->fail_after(i); });
    this->pass_traces(*input_->iter(), delivered);
    return delivered;
  }
  bool carries_provenance() const override { return true; }
  bool holds_no_elements() const override { return true; }
  bool one_base() const override { return input_->iter()->one_base(); }
  bool recomputable() const override { return input_->iter()->recomputable(); }
  Out recompute(const Provenance& p) const override {
    return in_python([&] { return FromPython<Out>::get(input_->recompute_call(p), label_); });
  }
  std::optional<std::uint64_t> input_taken() const override { return input_->taken(); }
  bool counts_input() const override { return true; }
  void restore_input_taken(std::optional<std::uint64_t> taken) override { input_->restore_taken(taken); }
  std::vector<IterBase*> inputs() const override { return {input_->iter()}; }
  std::size_t min_useful_pull() const override { return window_; }

 private:
  std::unique_ptr<PyMapInput> input_;
  std::string label_;
  detail::Executor* executor_;  // borrowed; null: map in this thread
  std::size_t window_;
  std::vector<std::optional<Out>> results_;
  std::vector<std::exception_ptr> errors_;
};

template <class Out>
class PyParallelMapDef final : public NodeDef<Out> {
 public:
  PyParallelMapDef(std::shared_ptr<const NodeDefBase> input, MakeMapInput make, PyCallable fn, const ExternalNode& node)
      : NodeDef<Out>("parallel_map", node.name,
                     checked_params(describe_fn(fn), {.max_in_flight = *node.max_in_flight, .name = node.name}), {input}),
        input_(std::move(input)), make_(make), fn_(std::move(fn)), window_(static_cast<std::size_t>(*node.max_in_flight)) {}
  std::unique_ptr<Iter<Out>> instantiate(BuildContext& ctx) const override {
    return std::make_unique<PyParallelMapIter<Out>>(ctx, *this);
  }
  std::unique_ptr<PyMapInput> make_input(BuildContext& ctx) const { return make_(*input_, ctx, fn_); }
  const PyCallable& callable() const { return fn_; }
  std::size_t max_in_flight() const { return window_; }

 private:
  std::shared_ptr<const NodeDefBase> input_;
  MakeMapInput make_;
  PyCallable fn_;
  std::size_t window_;
};

/// Adjacent Python stages (map, filter, flat_map) that the Python package fused into one callable, which
/// returns the outputs of one input as an iterable: the objects pass between the stages as Python made
/// them, converted once at each end instead of at every stage. The node is a "flat_map" whose output type
/// may differ from its input's; outputs beyond a pull's `max` wait in `pending_`, saved as flat_map's state.
///
/// On the engine's threads it takes one input when `pending_` is empty, as flat_map does: how many inputs
/// it has used and what it holds then depend only on how many outputs it has given, which a snapshot
/// settled to a point timing does not decide needs. Inline (one thread, pulls of sizes the program alone
/// decides) it takes up to a pull's worth of inputs under one acquisition of the GIL.
template <class Out>
class PyFlatChainDef;

template <class Out>
class PyFlatChainIter final : public Hooked<Out> {
 public:
  PyFlatChainIter(BuildContext& ctx, const PyFlatChainDef<Out>& def)
      : Hooked<Out>(ctx, "flat_map"), input_(def.make_input(ctx)), callable_(def.callable()),
        inputs_per_pull_(ctx.inline_workers ? 0 : 1) {}

 protected:
  std::size_t pull_chunk(std::vector<Out>& out, std::size_t max) override {
    std::size_t n = 0;
    const bool traced = this->traced();
    if (traced && pending_traces_.size() < pending_.size()) pending_traces_.resize(pending_.size(), unknown_provenance());
    while (n < max) {
      if (next_ < pending_.size()) {
        const std::size_t from = next_;
        n += detail::take_pending(pending_, next_, out, max - n);
        if (traced)
          for (std::size_t j = from; j < next_; ++j) this->traces().push_back(std::move(pending_traces_[j]));
        continue;
      }
      pending_.clear();
      pending_traces_.clear();
      next_ = 0;
      if (failure_) break;
      const std::size_t got = input_->pull(inputs_per_pull_ == 0 ? max - n : inputs_per_pull_);
      if (got == 0) break;
      const GilHeld gil;  // once per chunk of inputs
      for (std::size_t i = 0; i < got; ++i) {
        const std::size_t before = pending_.size();
        try {
          in_python([&] { expand(input_->call(i)); });
        } catch (...) {
          pending_.resize(before);  // a failing input yields nothing, as flat_map's does
          failure_ = std::current_exception();
          break;
        }
        if (traced) trace_outputs(input_->iter()->traces()[i], pending_.size() - before);
      }
    }
    if (failure_ && next_ >= pending_.size()) {  // raised once every output before the failing input is out
      const std::exception_ptr f = std::exchange(failure_, nullptr);
      try {
        std::rethrow_exception(f);
      } catch (...) {
        return this->fail_after(n);
      }
    }
    return n;
  }
  void save_state(StateWriter& w) const override {
    if (failure_)  // inline only: a pull of several inputs, one failed behind outputs not yet delivered
      throw SnapshotError(this->label() + " holds a failure of " + callable_.label + " behind " +
                          std::to_string(pending_.size() - next_) +
                          " outputs not yet delivered: a snapshot is taken before the failure or not at all");
    const TailView<Out> rest{&pending_, next_};
    if (!this->traced() || !recomputable()) return w.write(FlatMapState<std::vector<Out>>{{pending_.begin() + std::ptrdiff_t(next_), pending_.end()}});
    // Restore keys: this node makes its own outputs again (kit/restore_keys.hpp).
    std::vector<Provenance> keys(pending_traces_.begin() + std::ptrdiff_t(std::min(next_, pending_traces_.size())),
                                 pending_traces_.end());
    w.write(FlatMapState<KeysOut<Out, TailView<Out>>>{{&rest, &keys}});
  }
  void restore_state(StateReader& r) override {
    FlatMapState<KeysIn<Out>> st{.pending = {.from = this}};
    r.read(st);
    pending_ = std::move(st.pending.values);
    pending_traces_ = this->traced() ? std::move(st.pending.keys) : std::vector<Provenance>{};  // unknown for data
    this->recomputed_ = st.pending.recomputed;
    next_ = 0;
  }
  std::optional<std::uint64_t> input_taken() const override { return input_->taken(); }
  bool counts_input() const override { return true; }
  void restore_input_taken(std::optional<std::uint64_t> taken) override { input_->restore_taken(taken); }
  std::vector<IterBase*> inputs() const override { return {input_->iter()}; }
  std::size_t min_useful_pull() const override { return input_->min_useful_pull(); }
  bool carries_provenance() const override { return true; }
  /// Fused maps and filters give each input at most one output, so nothing is pending between pulls.
  bool holds_no_elements() const override { return !callable_.fused_expands; }
  bool one_base() const override { return input_->iter()->one_base(); }
  bool recomputable() const override { return input_->iter()->recomputable(); }
  /// The input expanded again; output j of it (with a flat_map among the stages), else its one output.
  Out recompute(const Provenance& p) const override {
    std::uint64_t j = 0;
    std::optional<Provenance> parent = p;
    if (callable_.fused_expands) parent = without_last_offset(p, j);
    if (!parent) throw SnapshotError(this->label() + ": restore key " + to_string(p) + " has no offset in an expansion");
    std::vector<Out> outputs;
    in_python([&] { expand_into(input_->recompute_call(*parent), outputs); });
    if (j >= outputs.size())
      throw SnapshotError(this->label() + ": restore key " + to_string(p) + " names output " + std::to_string(j) +
                          " of an expansion of " + std::to_string(outputs.size()));
    return std::move(outputs[j]);
  }

 private:
  /// Traced: the `count` outputs of an input have its provenance, with their offsets when the stages
  /// include a flat_map (as flat_map's); fused maps and filters give the input's own.
  void trace_outputs(const Provenance& input, std::size_t count) {
    for (std::size_t j = 0; j < count; ++j)
      pending_traces_.push_back(callable_.fused_expands ? at_offset(input, j) : input);
  }

  /// Under the GIL: the outputs of one input (an iterable, not a string) appended to `pending_`, each converted.
  void expand(const py::object& result) { expand_into(result, pending_); }
  void expand_into(const py::object& result, std::vector<Out>& into) const {
    PyObject* r = result.ptr();
    if (PyList_CheckExact(r) || PyTuple_CheckExact(r)) {  // the common result: its items by index
      // Each item held while it converts (converting may run Python code, which may even shrink the list:
      // its size is read again for every item).
      for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(r); ++i)
        into.push_back(FromPython<Out>::get(py::reinterpret_borrow<py::object>(PySequence_Fast_GET_ITEM(r, i)),
                                                callable_.label));
      return;
    }
    PyObject* it = PyUnicode_Check(r) || PyBytes_Check(r) ? nullptr : PyObject_GetIter(r);
    if (!it) {
      PyErr_Clear();
      throw ResultTypeError(callable_.label + " returned " + std::string(py::str(py::type::of(result).attr("__name__"))) +
                            ", not an iterable of outputs (a list, a tuple, a generator)");
    }
    const py::object iterator = py::reinterpret_steal<py::object>(it);
    while (PyObject* item = PyIter_Next(iterator.ptr()))
      into.push_back(FromPython<Out>::get(py::reinterpret_steal<py::object>(item), callable_.label));
    if (PyErr_Occurred()) throw py::error_already_set();
  }

  std::unique_ptr<PyMapInput> input_;
  PyCallable callable_;
  std::size_t inputs_per_pull_;  // 1 on the engine's threads; 0: what the pull asks for (inline)
  std::vector<Out> pending_;
  std::vector<Provenance> pending_traces_;  // traced: beside pending_ (a restored pending's are unknown)
  std::size_t next_ = 0;
  std::exception_ptr failure_;  // a stage's failure, held until the outputs before it are delivered
};

template <class Out>
class PyFlatChainDef final : public NodeDef<Out> {
 public:
  PyFlatChainDef(std::shared_ptr<const NodeDefBase> input, MakeMapInput make, PyCallable fn)
      : NodeDef<Out>("flat_map", "", describe_fn(fn, OnDataError::fail), {input}), input_(std::move(input)),
        make_(make), fn_(std::move(fn)) {}
  std::unique_ptr<Iter<Out>> instantiate(BuildContext& ctx) const override {
    return std::make_unique<PyFlatChainIter<Out>>(ctx, *this);
  }
  std::unique_ptr<PyMapInput> make_input(BuildContext& ctx) const { return make_(*input_, ctx, fn_); }
  const PyCallable& callable() const { return fn_; }

 private:
  std::shared_ptr<const NodeDefBase> input_;
  MakeMapInput make_;
  PyCallable fn_;
};

template <class In>
struct PyFilter : PyCallable {
  bool operator()(const In& x) const {
    return in_python([&] {
      const py::object r = call(In(x));
      const int truth = PyObject_IsTrue(r.ptr());
      if (truth < 0) throw py::error_already_set();
      return truth != 0;
    });
  }
};
template <class In>
struct PyDemuxFn : PyCallable {
  std::int64_t operator()(const In& x) const {
    return in_python([&] {
      const py::object r = call(In(x));
      if (!PyLong_Check(r.ptr()))
        throw std::invalid_argument("demux: " + label + " returned " + std::string(py::str(py::type::of(r).attr("__name__"))) +
                          ", not the int of an output");
      return r.cast<std::int64_t>();
    });
  }
};
template <class In>
struct PyFlatMap : PyCallable {
  std::vector<In> operator()(In x) const {
    return in_python([&] { return FromPython<std::vector<In>>::get(call(std::move(x)), label); });
  }
};

/// One instance of a Python generator source: the iterator its function returned, stepped under the GIL.
/// It keeps no state a snapshot could hold: the node is restored by replay (the function is called again
/// with the same information and the iterator stepped as many times as before), so the function must
/// yield the same elements for the same information.
template <class T>
struct PyGeneratorStep {
  PyHandle iterator;
  std::string label;
  std::shared_ptr<const CallOwner> owner;
  GilHeld chunk_scope() const { return GilHeld(); }
  std::optional<T> operator()() const {
    return in_python([&]() -> std::optional<T> {
      PyObject* x = nullptr;
      {
        const CallingScope calling(owner.get(), label);
        x = PyIter_Next(iterator->p);
      }
      if (!x) {
        if (PyErr_Occurred()) throw py::error_already_set();
        return std::nullopt;
      }
      return FromPython<T>::get(py::reinterpret_steal<py::object>(x), label);
    });
  }
};

/// Calls the Python function once per instance with what it may depend on (a dict: seed, rank,
/// world_size, worker, workers, instance, epoch) and iterates what it returns.
template <class T>
struct PyGeneratorFactory {
  PyCallable f;
  PyGeneratorStep<T> operator()(const GeneratorContext& ctx) const {
    return in_python([&] {
      Rng rng = ctx.rng;
      py::dict info;
      info["seed"] = py::int_(rng());
      info["rank"] = ctx.layout.rank;
      info["world_size"] = ctx.layout.world_size;
      info["worker"] = ctx.worker;
      info["workers"] = ctx.layout.num_workers;
      info["instance"] = ctx.instance;
      info["epoch"] = ctx.epoch;
      const CallingScope calling(f.owner.get(), f.label);
      const py::object iterable = py::reinterpret_borrow<py::object>(f.fn->p)(info);
      PyObject* it = PyObject_GetIter(iterable.ptr());
      if (!it) throw py::error_already_set();
      const auto iterator = py::reinterpret_steal<py::object>(it);
      return PyGeneratorStep<T>{std::make_shared<const PyRef>(iterator), f.label, f.owner};
    });
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
  /// `tuple_inputs`: the ids of the callables whose input is zip's rows.
  PythonFunctions(const py::dict& callables, const std::set<std::int64_t>& tuple_inputs,
                  std::shared_ptr<const CallOwner> owner)
      : owner_(std::move(owner)) {
    for (const auto& [k, f] : callables) {
      if (!PyCallable_Check(f.ptr())) throw ConfigError("callable " + std::string(py::str(k)) + " is not callable");
      const auto id = k.cast<std::int64_t>();
      // The Python package's fused stages carry their outputs as an iterable and their stages as a label.
      const bool fused = py::hasattr(f, "_dpipe_fused_stages");
      const bool expands = fused && py::hasattr(f, "_dpipe_fused_expands") && py::bool_(f.attr("_dpipe_fused_expands"));
      by_id_.emplace(id, PyCallable{.fn = std::make_shared<const PyRef>(f),
                                    .label = fused ? std::string(py::str(f.attr("_dpipe_fused_stages"))) : callable_label(f),
                                    .owner = owner_,
                                    .input_tuple = tuple_inputs.count(id) > 0, .fused = fused, .fused_expands = expands});
    }
  }
  SpecPipeline map(const SpecPipeline& input, std::int64_t id, const std::string& out, const ExternalNode& node) const override {
    const PyCallable f = at(id, node.input_bytes);
    struct Input {
      std::shared_ptr<const NodeDefBase> def;
      MakeMapInput make;
      std::string type_name;
    };
    const Input in = input.visit([&]<class In>(const Pipeline<In>& p) {
      return Input{p.def(), &make_map_input<In>, SpecElement<In>::name()};
    });
    return with_element_type(out.empty() ? in.type_name : out, [&]<class Out>() -> SpecPipeline {
      if (f.fused) return make_pipeline<PyFlatChainDef<Out>>(in.def, in.make, f);
      if (node.max_in_flight) return make_pipeline<PyParallelMapDef<Out>>(in.def, in.make, f, node);
      return make_pipeline<PyMapDef<Out>>(in.def, in.make, f, node);
    }, SpecElementTypes{});
  }
  SpecPipeline filter(const SpecPipeline& input, std::int64_t id, const ExternalNode& node) const override {
    const PyCallable f = at(id, node.input_bytes);
    return input.visit([&]<class In>(const Pipeline<In>& p) -> SpecPipeline {
      return p | dpipe::filter(PyFilter<In>{f}, FilterOptions{.on_error = node.on_error, .name = node.name});
    });
  }
  SpecPipeline generator(std::int64_t id, const std::string& out, const std::string& name) const override {
    const PyCallable f = at(id, false);
    return with_element_type(out.empty() ? SpecElement<Value>::name() : out, [&]<class T>() -> SpecPipeline {
      return dpipe::generator(PyGeneratorFactory<T>{f}, GeneratorOptions{.name = name});
    }, SpecElementTypes{});
  }
  SpecPipeline flat_map(const SpecPipeline& input, std::int64_t id, const ExternalNode& node) const override {
    const PyCallable f = at(id, node.input_bytes);
    return input.visit([&]<class In>(const Pipeline<In>& p) -> SpecPipeline {
      return p | dpipe::flat_map(PyFlatMap<In>{f}, FlatMapOptions{.on_error = node.on_error, .name = node.name});
    });
  }
  SpecPipeline demux(const SpecPipeline& input, std::int64_t id, const DemuxOptions& o, bool input_bytes) const override {
    const PyCallable f = at(id, input_bytes);
    return input.visit([&]<class In>(const Pipeline<In>& p) -> SpecPipeline { return dpipe::demux_node(p, PyDemuxFn<In>{f}, o); });
  }

 private:
  PyCallable at(std::int64_t id, bool input_bytes) const {
    const auto it = by_id_.find(id);
    if (it == by_id_.end()) throw ConfigError("no Python callable with id " + std::to_string(id) + " was given");
    PyCallable f = it->second;
    f.input_bytes = input_bytes;
    return f;
  }
  std::shared_ptr<const CallOwner> owner_;
  std::map<std::int64_t, PyCallable> by_id_;
};

/// The readable part of a snapshot: what state_dict() shows beside the bytes.
py::dict describe(const Snapshot& s) {
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


// ---- a running pipeline -------------------------------------------------------------------------

/// How long a consumer waits for the workers between two looks for signals (Ctrl-C).
constexpr std::chrono::milliseconds kSignalCheck{50};

/// Ctrl-C while an inline run computes in next(): Python's handler would raise KeyboardInterrupt inside
/// a callable, halfway through a node's chunk, and lose the elements the nodes held. While an inline
/// loop lives, dpipe's handler stands in for Python's default one (on the main thread, the only one
/// Python runs handlers on; a program's own handler is left alone): outside a computation it raises
/// KeyboardInterrupt as Python's does; during one it only records the signal, and next() raises
/// KeyboardInterrupt at the end, before it takes the element, so the run stays whole and state_dict()
/// exact. Installing it once, not around every computation, keeps two system calls off each element.
namespace interrupts {
std::atomic<bool> recorded{false};
int computing = 0;       // inline computations under way (on the main thread, counted under the GIL)
int loops = 0;           // live loops that installed the handler
// What it replaced, and dpipe's own: never freed (they may outlive the interpreter's objects).
py::object* python_handler = nullptr;
py::object* dpipe_handler = nullptr;

unsigned long main_thread = 0;  // the thread Python runs handlers on

/// A first Ctrl-C during a computation is recorded; a second one, or one outside a computation, raises
/// KeyboardInterrupt where Python is (a callable that never returns can still be stopped: the run then
/// ends with that exception, as a callable's own would end it).
py::object handler() {
  return py::cpp_function([](py::args) {
    if (computing > 0 && !recorded.exchange(true)) return;
    recorded.store(false);
    PyErr_SetNone(PyExc_KeyboardInterrupt);
    throw py::error_already_set();
  });
}

/// With the GIL: whether this is the thread Python runs signal handlers on.
bool on_main_thread() { return main_thread != 0 && PyThread_get_thread_ident() == main_thread; }

/// With the GIL: installs the handler for one more loop; false when it is not dpipe's to install.
bool install() {
  try {
    const py::module_ threading = py::module_::import("threading");
    if (!threading.attr("current_thread")().is(threading.attr("main_thread")())) return false;
    main_thread = PyThread_get_thread_ident();
    const py::module_ signal = py::module_::import("signal");
    if (loops == 0) {
      py::object current = signal.attr("getsignal")(signal.attr("SIGINT"));
      if (!current.is(signal.attr("default_int_handler"))) return false;
      if (!dpipe_handler) dpipe_handler = new py::object(handler());
      if (!python_handler) python_handler = new py::object();
      signal.attr("signal")(signal.attr("SIGINT"), *dpipe_handler);
      *python_handler = std::move(current);
    }
    ++loops;
    return true;
  } catch (py::error_already_set&) {
    PyErr_Clear();
    return false;
  }
}

/// With the GIL: one loop less; the last puts Python's handler back (unless the program replaced ours).
void uninstall() noexcept {
  if (--loops > 0) return;
  try {
    const py::module_ signal = py::module_::import("signal");
    const py::object current = signal.attr("getsignal")(signal.attr("SIGINT"));
    if (current.is(*dpipe_handler)) signal.attr("signal")(signal.attr("SIGINT"), *python_handler);
  } catch (py::error_already_set&) {
    PyErr_Clear();
  }
}

/// Held (with the GIL) around an inline computation; `finish()` raises a Ctrl-C that came meanwhile.
class Computing {
 public:
  Computing() {
    recorded.store(false);  // a Ctrl-C recorded by an earlier computation that threw is not this one's
    ++computing;
  }
  ~Computing() {
    if (active_) --computing;
  }
  /// With the GIL, after the computation: runs the handlers of signals that came during C++ code (they
  /// record), then raises KeyboardInterrupt if Ctrl-C came.
  void finish() {
    const bool checked = PyErr_CheckSignals() == 0;
    --computing;
    active_ = false;
    if (!checked) throw py::error_already_set();
    if (recorded.exchange(false)) {
      PyErr_SetNone(PyExc_KeyboardInterrupt);
      throw py::error_already_set();
    }
  }
  Computing(const Computing&) = delete;
  Computing& operator=(const Computing&) = delete;

 private:
  bool active_ = true;
};
}  // namespace interrupts

class Loop {
 public:
  virtual ~Loop() = default;
  /// The next element, or nullopt at the end. Waits without the GIL.
  virtual std::optional<py::object> next() = 0;
  /// The state after the last element delivered: (snapshot bytes, what they hold as a dict).
  virtual py::tuple snapshot(bool reproducible, std::optional<std::uint64_t> step,
                             std::map<std::string, std::string> metadata) = 0;
  /// Takes the exact snapshot after the last element delivered and writes it as this rank's file of the
  /// set in `dir` on the background writer (SnapshotSet::write_rank_async): the caller pays the capture.
  virtual std::shared_future<void> save(const std::string& dir, std::optional<std::uint64_t> step,
                                        std::map<std::string, std::string> metadata) = 0;
  virtual std::uint64_t delivered() const = 0;
  virtual std::vector<std::string> warnings() const = 0;
  virtual Layout layout() const = 0;
  /// Elements each node dropped as bad (on_error = skip), by node key, summed over this rank's instances.
  virtual std::map<std::string, std::uint64_t> skipped() = 0;
  /// A traced run: the provenance of the last element next() returned, as `dpipe run --provenance`
  /// writes it ([[source, position], ...], an entry with {"epoch", "offsets"} when it has them, None for
  /// what a snapshot held); None before the first element. Not traced: None.
  virtual py::object provenance() const = 0;
  /// Ends this loop for good (a later iter(loader) took its place): every later call raises
  /// RuntimeError(`why`), and the run stops (its threads joined) now, or, when calls are in progress (on
  /// another thread, or a signal handler run inside next()), as the last of them returns.
  void invalidate(std::string why) {
    if (!invalid_.empty()) return;
    invalid_ = std::move(why);
    if (calls_ == 0) stop();
  }

 protected:
  virtual void stop() = 0;
  void check_live() const {
    if (!invalid_.empty()) throw std::runtime_error(invalid_);
  }
  /// Held (with the GIL) for the length of a call that uses the run: checks the loop is live, and stops
  /// the run at the end of the last call when the loop was invalidated meanwhile.
  class Call {
   public:
    /// `what` names the call in the refusal of a callable of this loop's pipeline calling back into it.
    explicit Call(Loop& l, const char* what) : l_(l) {
      refuse_calling_back(l_.owner_.get(), what);
      l_.check_live();
      ++l_.calls_;
    }
    ~Call() {
      if (--l_.calls_ == 0 && !l_.invalid_.empty()) {
        try {
          l_.stop();
        } catch (...) {  // stopping a run that failed rethrows nothing the caller can act on
        }
      }
    }
    Call(const Call&) = delete;
    Call& operator=(const Call&) = delete;

   private:
    Loop& l_;
  };

 private:
  std::string invalid_;
  int calls_ = 0;  // calls in progress (counted under the GIL)
  std::shared_ptr<const CallOwner> owner_;  // its pipeline's callables' (set_owner)

 public:
  void set_owner(std::shared_ptr<const CallOwner> owner) { owner_ = std::move(owner); }
};

template <class T>
class TypedLoop final : public Loop {
 public:
  /// `adaptive`: the workers run inline while the loop's steps are short or hold the GIL, and on the
  /// engine's threads while they are long and release it (a training step), so the next batch is made
  /// during the step (see adapt()).
  TypedLoop(Run<T> run, Convert convert, bool inline_workers, bool adaptive = false)
      : run_(std::move(run)), convert_(convert), inline_(inline_workers || adaptive), adaptive_(adaptive) {
    if (adaptive_) run_->set_inline_workers(true);  // until the loop's steps are known
  }
  /// Stopping the run joins its workers, which may be waiting for the GIL in a Python callable.
  ~TypedLoop() override {
    if (handler_installed_ && PyGILState_Check()) interrupts::uninstall();
    if (PyGILState_Check()) {
      py::gil_scoped_release nogil;
      run_.reset();
    }
  }
  /// Waits for the workers in slices, looking for signals between them: Ctrl-C raises KeyboardInterrupt
  /// before anything is taken, so the run goes on (and its state stays exact) if the caller continues.
  std::optional<py::object> next() override {
    const Call call(*this, "next()");
    std::optional<T> x;
    if (run_->at_hand()) {  // taken as it is: releasing the GIL would hand it to a worker for a switch interval
      x = run_->next();
    } else {
      const bool go_inline = adapt();
      if (inline_ && !handler_checked_) {
        handler_checked_ = true;
        handler_installed_ = interrupts::install();
      }
      std::optional<interrupts::Computing> deferred;
      if (handler_installed_ && interrupts::on_main_thread()) deferred.emplace();
      bool more = false;
      // Inline, Ctrl-C ends the pull at the next element: one element's delay, not a whole pull's.
      auto pull = [&] { return deferred ? run_->fill_until(1, [] { return interrupts::recorded.load(); }) : run_->fill(); };
      const bool switching = adaptive_ && go_inline != running_inline_;
      if (inline_ && go_inline && !switching) {
        // Every node runs on this thread and no other thread of the run waits for the GIL, so the pull
        // keeps it: each Python stage then takes it back for nothing instead of from the lock.
        more = pull();
      } else {
        py::gil_scoped_release nogil;
        if (switching) {
          run_->set_inline_workers(go_inline);  // going inline waits for the chunk under way: without the GIL
          running_inline_ = go_inline;
        }
        while (!run_->wait_ready(kSignalCheck)) {
          py::gil_scoped_acquire gil;
          if (PyErr_CheckSignals() != 0) throw py::error_already_set();
          check_live();  // a signal handler may have invalidated this loop
        }
        more = pull();
      }
      if (deferred) deferred->finish();  // before the element is taken: state_dict() stays exact
      if (more) x = run_->next();
      if (adaptive_) left_at_ = Clocks::now();
    }
    if (!x) {
      // An empty or mistyped data file would otherwise be a silent empty epoch (a resumed run that had
      // delivered before is not one).
      if (run_->delivered() == 0 && !warned_empty_) {
        warned_empty_ = true;
        const Layout l = run_->layout();
        const std::string message = "dpipe: this iteration delivered no element (rank " + std::to_string(l.rank) +
                                    " of " + std::to_string(l.world_size) +
                                    "): are the data files empty, or is every element filtered out?";
        if (PyErr_WarnEx(PyExc_RuntimeWarning, message.c_str(), 1) != 0) throw py::error_already_set();
      }
      return std::nullopt;
    }
    return convert_.element(std::move(*x));
  }
  py::tuple snapshot(bool reproducible, std::optional<std::uint64_t> step,
                     std::map<std::string, std::string> metadata) override {
    const Call call(*this, "state_dict()");
    std::optional<Snapshot> s;
    {
      py::gil_scoped_release nogil;
      s = reproducible ? run_->reproducible_snapshot(std::move(metadata), step) : run_->snapshot(std::move(metadata), step);
      s->write_bytes(bytes_);
    }
    py::tuple out = py::make_tuple(py::bytes(bytes_), describe(*s));
    run_->recycle(std::move(*s));
    return out;
  }
  std::shared_future<void> save(const std::string& dir, std::optional<std::uint64_t> step,
                                std::map<std::string, std::string> metadata) override {
    const Call call(*this, "save()");
    py::gil_scoped_release nogil;
    return SnapshotSet::write_rank_async(dir, run_->snapshot(std::move(metadata), step)).share();
  }
  std::uint64_t delivered() const override {
    check_live();
    return run_->delivered();
  }
  std::vector<std::string> warnings() const override {
    check_live();
    return run_->warnings();
  }
  py::object provenance() const override {
    check_live();
    const Provenance* p = run_->provenance();
    if (!p || p->empty() || is_unknown_element(*p)) return py::none();  // empty: nothing delivered yet
    const auto& keys = run_->graph().keys();
    py::list out;
    for (const SourcePos& s : *p) {
      if (s.source == SourcePos::kUnknown) {
        out.append(py::none());
        continue;
      }
      py::list entry;
      entry.append(py::str(s.source < keys.size() ? keys[s.source] : std::string("?")));
      entry.append(py::int_(s.position));
      if (s.epoch != 0 || !s.offsets.empty() || s.sliced()) {
        py::dict extra;
        if (s.epoch != 0) extra["epoch"] = py::int_(s.epoch);
        if (!s.offsets.empty()) extra["offsets"] = py::cast(s.offsets);
        if (s.sliced()) extra["tokens"] = py::cast(std::vector<std::uint64_t>{s.begin, s.end});
        entry.append(extra);
      }
      out.append(entry);
    }
    return out;
  }
  Layout layout() const override {
    check_live();
    return run_->layout();
  }
  std::map<std::string, std::uint64_t> skipped() override {
    const Call call(*this, "skipped()");
    std::map<std::string, std::uint64_t> out;
    std::vector<NodeStats> stats;
    {
      py::gil_scoped_release nogil;  // pauses production while it reads
      stats = run_->node_stats();
    }
    for (const auto& n : stats)
      if (n.skipped) out[n.key] += n.skipped;
    return out;
  }

 protected:
  void stop() override {
    if (!run_) return;
    py::gil_scoped_release nogil;  // the workers may be waiting for the GIL in a Python callable
    run_.reset();
  }

 private:
  std::optional<Run<T>> run_;
  Convert convert_;
  /// Adaptive: what the caller did since the last pull (its loop's step, averaged over the last few),
  /// and so where the workers run next: inline (true) unless the step takes a millisecond or more of
  /// which this thread spent less than half on the CPU (it slept or waited: a GPU step, I/O).
  /// Computing ahead on the engine's threads then overlaps the step; with short steps, or steps that
  /// hold the GIL, the hand-off between threads costs more than it saves.
  bool adapt() {
    if (!adaptive_) return inline_;  // (always inline, or never)
    if (left_at_.wall != 0) {
      const Clocks now = Clocks::now();
      step_wall_ = 0.5 * step_wall_ + 0.5 * (now.wall - left_at_.wall);
      step_cpu_ = 0.5 * step_cpu_ + 0.5 * (now.cpu - left_at_.cpu);
    }
    return !(step_wall_ >= 1e-3 && step_cpu_ < 0.5 * step_wall_);
  }
  struct Clocks {
    double wall = 0, cpu = 0;  // seconds: monotonic, and this thread's CPU time
    static Clocks now() {
      timespec w{}, c{};
      clock_gettime(CLOCK_MONOTONIC, &w);
      clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c);
      return {double(w.tv_sec) + double(w.tv_nsec) * 1e-9, double(c.tv_sec) + double(c.tv_nsec) * 1e-9};
    }
  };

  bool inline_;        // the workers may compute inside next(), on this thread
  bool adaptive_;      // ... when adapt() says so
  bool running_inline_ = true;
  Clocks left_at_{};   // when next() last returned an element it pulled
  double step_wall_ = 0, step_cpu_ = 0;
  bool handler_checked_ = false, handler_installed_ = false;  // dpipe's Ctrl-C handler (inline only)
  bool warned_empty_ = false;
  std::string bytes_;  // the last snapshot's bytes: its capacity is reused by the next
};

/// A write of Loop::save under way on the background writer.
class PendingSave {
 public:
  explicit PendingSave(std::shared_future<void> f) : f_(std::move(f)) {}
  bool done() const { return f_.wait_for(std::chrono::seconds(0)) == std::future_status::ready; }
  /// Waits (without the GIL) up to `timeout` seconds, or for good: whether the write is done; raises
  /// the write's error.
  bool wait(std::optional<double> timeout) const {
    {
      py::gil_scoped_release nogil;
      if (!timeout) f_.wait();
      else if (f_.wait_for(std::chrono::duration<double>(std::max(*timeout, 0.0))) != std::future_status::ready)
        return false;
    }
    f_.get();
    return true;
  }

 private:
  std::shared_future<void> f_;
};

/// A built spec: its pipeline, seed, and how its elements reach Python.
struct BuiltSpec {
  Spec spec;
  bool tuple_rows = false;  // the elements are zip's rows
  std::shared_ptr<const CallOwner> owner;  // its callables' (CallingScope)

  std::string type_name() const { return spec.pipeline.type_name(); }
};

BuiltSpec build(const std::string& json_text, const py::dict& callables, const std::set<std::int64_t>& tuple_inputs,
                bool tuple_rows, const std::string& data_root, bool file_digest, bool places) {
  auto owner = std::make_shared<const CallOwner>();
  const PythonFunctions functions(callables, tuple_inputs, owner);
  const DataFiles data{.root = data_root, .identity = file_digest ? FileIdentity::digest : FileIdentity::mtime};
  return BuiltSpec{parse_spec(json_text, SpecOptions{.external = &functions, .data = data, .places = places}), tuple_rows,
                   std::move(owner)};
}

/// A NodeError reaches Python as dpipe.NodeError (with `node`: its key, `label`: its place and kind, `worker`), and the exception a Python
/// callable raised as its __cause__.
void translate_node_error(const dpipe::NodeError& e, const py::object& node_error_type) {
  py::object exc = node_error_type(e.what());
  exc.attr("node") = e.node_key();
  exc.attr("label") = e.label();
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
  bool adaptive_workers = false;  // see TypedLoop: inline or on the engine's threads, as the loop's steps say
  bool trace = false;             // carry each element's provenance (Loop::provenance)
};

RunOptions run_options(const LoopOptions& o) {
  return RunOptions{.seed = o.seed, .epoch = o.epoch, .layout = Layout{o.rank, o.world_size, o.workers},
                    .inline_workers = o.inline_workers, .trace = o.trace};
}

std::unique_ptr<Loop> start(const BuiltSpec& b, const LoopOptions& o, std::optional<std::string> state,
                            bool allow_changed_data, std::vector<std::string> overrides) {
  refuse_calling_back(b.owner.get(), "iter() or load_state_dict()");
  auto engine = std::make_shared<Engine>(EngineOptions{.threads = o.threads});
  const RunOptions ro = run_options(o);
  ResumeOptions rz{.allow_changed_data = allow_changed_data, .overrides = std::move(overrides)};
  const Convert convert{.bytes = b.spec.bytes, .tuple_row = b.tuple_rows};
  std::optional<Snapshot> snap;
  if (state) snap = Snapshot::from_bytes(*state);
  py::gil_scoped_release nogil;  // a restore may replay for a while; the engine's threads never need the GIL here
  auto loop = b.spec.pipeline.visit([&]<class T>(const Pipeline<T>& p) -> std::unique_ptr<Loop> {
    // The engine outlives the Run: it is kept by the loop through the run's shared executor.
    if (snap)
      return std::make_unique<TypedLoop<T>>(engine->resume(p, *snap, ro, rz), convert, o.inline_workers,
                                            o.adaptive_workers);
    return std::make_unique<TypedLoop<T>>(engine->start(p, ro), convert, o.inline_workers, o.adaptive_workers);
  });
  loop->set_owner(b.owner);
  return loop;
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
  m.def("spec_ops_json", [] { return dpipe::spec_ops_json(); },
        "The op catalogue as JSON text (dpipe ops --json): each op's doc, parameters, rescale rule and state.");
  m.def("snapshot_format_version", [] { return dpipe::Snapshot::kFormatVersion; });
  m.attr("__version__") = DPIPE_VERSION;  // the project's version, as libdpipe's pkg-config says

  py::class_<BuiltSpec>(m, "BuiltSpec")
      .def_property_readonly("seed", [](const BuiltSpec& b) { return b.spec.seed; })
      .def_property_readonly("element_type", &BuiltSpec::type_name)
      .def_property_readonly("bytes", [](const BuiltSpec& b) { return b.spec.bytes; })
      .def(
          "length",
          [](const BuiltSpec& b, int rank, int world_size, int workers) -> std::pair<py::object, std::string> {
            const dpipe::Layout layout{rank, world_size, workers};
            dpipe::validate_layout(layout);
            std::string why;
            const auto n = dpipe::Graph::build(b.spec.pipeline.def()).length(layout, &why);
            return {n ? py::object(py::int_(*n)) : py::object(py::none()), why};
          },
          py::arg("rank"), py::arg("world_size"), py::arg("workers"),
          "(elements the rank delivers in an epoch, or None; which node cannot say)");
  m.def("build", &build, py::arg("spec_json"), py::arg("callables") = py::dict(),
        py::arg("tuple_inputs") = std::set<std::int64_t>(), py::arg("tuple_rows") = false,
        py::arg("data_root") = std::string(), py::arg("file_digest") = false, py::arg("places") = false,
        "Builds a JSON spec into a typed pipeline; `callables` maps the ids of \"fn\": \"external\" to Python "
        "callables, `tuple_inputs` names those that receive zip's rows (as tuples), and `tuple_rows` says whether "
        "the pipeline's elements are such rows; `data_root` and `file_digest`: where the file sources' names are "
        "resolved and whether their files are identified by a digest of their bytes; `places`: nodes carry the "
        "user's place of each in \"at\" (a rewritten pipeline).");

  py::class_<LoopOptions>(m, "LoopOptions")
      .def(py::init<>())
      .def_readwrite("seed", &LoopOptions::seed)
      .def_readwrite("epoch", &LoopOptions::epoch)
      .def_readwrite("rank", &LoopOptions::rank)
      .def_readwrite("world_size", &LoopOptions::world_size)
      .def_readwrite("workers", &LoopOptions::workers)
      .def_readwrite("threads", &LoopOptions::threads)
      .def_readwrite("inline_workers", &LoopOptions::inline_workers)
      .def_readwrite("trace", &LoopOptions::trace)
      .def_readwrite("adaptive_workers", &LoopOptions::adaptive_workers);

  py::class_<Loop>(m, "Loop")
      .def("next", &Loop::next, "The next element, or None at the end of the stream.")
      .def("__iter__", [](py::object self) { return self; })
      .def("__next__", [](Loop& l) {
        std::optional<py::object> x = l.next();
        if (!x) throw py::stop_iteration();
        return std::move(*x);
      })
      .def("snapshot", &Loop::snapshot, py::arg("reproducible") = true, py::arg("step") = py::none(),
           py::arg("metadata") = std::map<std::string, std::string>{})
      .def("save", [](Loop& l, const std::string& dir, std::optional<std::uint64_t> step,
                      std::map<std::string, std::string> metadata) { return PendingSave(l.save(dir, step, std::move(metadata))); },
           py::arg("dir"), py::arg("step") = py::none(), py::arg("metadata") = std::map<std::string, std::string>{})
      .def_property_readonly("delivered", &Loop::delivered)
      .def_property_readonly("warnings", &Loop::warnings)
      .def("skipped", &Loop::skipped)
      .def("provenance", &Loop::provenance)
      .def("invalidate", &Loop::invalidate, py::arg("why"),
           "Stops the run; every later call raises RuntimeError(why).")
      .def_property_readonly("layout", [](const Loop& l) {
        const auto x = l.layout();
        return py::make_tuple(x.rank, x.world_size, x.num_workers);
      });
  m.def("start", &start, py::arg("spec"), py::arg("options"), py::arg("state") = py::none(),
        py::arg("allow_changed_data") = false, py::arg("overrides") = std::vector<std::string>{},
        "Starts the pipeline, or resumes it from snapshot bytes.");
  py::class_<PendingSave>(m, "PendingSave", "A Loader.save() under way: its file is written on a background thread.")
      .def("done", &PendingSave::done, "Whether the write has ended (written, or failed).")
      .def("wait", &PendingSave::wait, py::arg("timeout") = py::none(),
           "Waits for the write (up to `timeout` seconds; None: until it ends): True once it is done, False "
           "if the timeout passed first. Raises the write's error.");
  m.def(
      "read_rank",
      [](const std::string& dir, int rank, int world_size, int workers, bool rescale) {
        std::string bytes;
        {
          py::gil_scoped_release nogil;
          const dpipe::Layout layout{rank, world_size, workers};
          dpipe::validate_layout(layout);
          bytes = dpipe::SnapshotSet::read_rank(dir, layout, rescale).to_bytes();
        }
        return py::bytes(bytes);
      },
      py::arg("dir"), py::arg("rank"), py::arg("world_size"), py::arg("workers"), py::arg("rescale") = false,
      "This rank's snapshot bytes of the set in `dir` (SnapshotSet::read_rank): on the set's layout its own "
      "file only; on another (with rescale) the set's index and the elements dealt to this rank.");
  m.def("drain", &drain, py::arg("spec"), py::arg("options"), "Runs to the end in C++; returns the element count.");
  m.def("rescale", &rescale, py::arg("ranks"), py::arg("world_size"), py::arg("workers"));
  m.def("describe", [](const std::string& bytes) { return describe(dpipe::Snapshot::from_bytes(bytes)); }, py::arg("snapshot"));
  m.def(
      "write_records",
      [](const std::string& path, const std::vector<std::string>& records) {
        py::gil_scoped_release nogil;
        dpipe::write_records(path, records);
      },
      py::arg("path"), py::arg("records"), "Writes a records file (written whole or not at all).");
}
