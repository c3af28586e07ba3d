// _dpipe: the C++ side of the Python package. A pipeline arrives as the tool's JSON spec (built by the
// Python node functions) and is built by the same spec front end into a typed C++ Pipeline<T>; a Loop
// runs it on the engine and hands each element to Python, converted once: integers and strings as int
// and str, records as bytes, batches of numbers as numpy arrays that own the C++ buffer (no copy).
// Waiting for an element releases the GIL.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
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
  std::optional<py::object> next() override {
    std::optional<T> x;
    {
      py::gil_scoped_release nogil;
      x = run_.next();
    }
    if (!x) return std::nullopt;
    return convert_(std::move(*x));
  }
  py::bytes snapshot(bool reproducible, std::optional<std::uint64_t> step,
                     std::map<std::string, std::string> metadata) override {
    std::string bytes;
    {
      py::gil_scoped_release nogil;
      Snapshot s = reproducible ? run_.reproducible_snapshot(std::move(metadata), step)
                                : run_.snapshot(std::move(metadata), step);
      bytes = s.to_bytes();
    }
    return py::bytes(bytes);
  }
  std::uint64_t delivered() const override { return run_.delivered(); }
  std::vector<std::string> warnings() const override { return run_.warnings(); }
  Layout layout() const override { return run_.layout(); }

 private:
  Run<T> run_;
  Convert convert_;
};

/// A built spec: its pipeline, seed, and how its strings reach Python.
struct BuiltSpec {
  Spec spec;
  std::string type_name() const { return spec.pipeline.type_name(); }
};

BuiltSpec build(const std::string& json_text) {
  return BuiltSpec{parse_spec(json_text, SpecOptions{.base64_bytes = false})};
}

struct LoopOptions {
  std::uint64_t seed = 0;
  std::uint64_t epoch = 0;
  int rank = 0, world_size = 1, workers = 1, threads = 0;
  bool inline_workers = false;
};

std::unique_ptr<Loop> start(const BuiltSpec& b, const LoopOptions& o, std::optional<std::string> state,
                            bool allow_changed_data) {
  auto engine = std::make_shared<Engine>(EngineOptions{.threads = o.threads});
  RunOptions ro{.seed = o.seed, .epoch = o.epoch, .layout = Layout{o.rank, o.world_size, o.workers},
                .inline_workers = o.inline_workers};
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
  auto node_error = py::register_exception<dpipe::NodeError>(m, "NodeError", error.ptr());
  (void)node_error;

  m.def("spec_ops", &dpipe::spec_ops, "The op names specs know, in registry order.");
  m.def("spec_sources", &dpipe::spec_sources, "The op names of sources.");
  m.def("snapshot_format_version", [] { return dpipe::Snapshot::kFormatVersion; });

  py::class_<BuiltSpec>(m, "BuiltSpec")
      .def_property_readonly("seed", [](const BuiltSpec& b) { return b.spec.seed; })
      .def_property_readonly("element_type", &BuiltSpec::type_name)
      .def_property_readonly("bytes", [](const BuiltSpec& b) { return b.spec.bytes; });
  m.def("build", &build, py::arg("spec_json"), "Builds a JSON spec into a typed pipeline.");

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
