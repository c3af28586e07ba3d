#pragma once
/// The JSON spec front end (the `dpipe` tool's): a spec's JSON text → a typed pipeline, through each node
/// kind's own builder (dpipe/kit/spec.hpp). Not installed: a C++ user writes the pipeline itself.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <span>
#include <vector>

#include "dpipe/kit/on_error.hpp"
#include "dpipe/kit/spec.hpp"
#include "dpipe/nodes/demux.hpp"
#include "ops.hpp"
#include "dpipe/engine.hpp"  // the runs of the spec element types are libdpipe's (detail/prebuilt_types.hpp)

namespace dpipe {

struct Spec {
  std::uint64_t seed = 0;
  SpecPipeline pipeline;
  /// The pipeline's strings are bytes (records): Python hands them out as `bytes`, the tool prints them
  /// as base64 text (append_spec_element_json).
  bool bytes = false;
};

/// One element as the tool prints it: JSON (append_element_json), and with `bytes` (Spec::bytes) every
/// string as the JSON string of its base64 text.
template <class T>
void append_spec_element_json(std::string& out, const T& v, bool bytes) {
  if constexpr (std::is_same_v<T, SpecStr>) {
    if (!bytes) return append_element_json(out, v);
    out += '"';
    detail::append_base64(out, v);
    out += '"';
  } else if constexpr (detail::is_vector_v<T>) {
    if (!bytes) return append_element_json(out, v);
    out += '[';
    for (std::size_t i = 0; i < v.size(); ++i) {
      if (i) out += ", ";
      append_spec_element_json(out, v[i], true);
    }
    out += ']';
  } else {
    append_element_json(out, v);
  }
}

/// How a node running an external function is made: its name, whether its input's strings are bytes
/// (records), and its error policy.
struct ExternalNode {
  std::string name;
  bool input_bytes = false;
  OnDataError on_error = OnDataError::fail;
  /// A parallel_map's max_in_flight (elements mapped at once, checked by the node); none: a map.
  std::optional<std::int64_t> max_in_flight{};
  /// A map's "rng": the callable takes each element's own generator as a second argument.
  bool rng = false;
};

/// Functions a front end provides besides the builtins (the Python package's callables), named in a spec
/// as `{"op": "map", "fn": "external", "id": N, "out": TYPE}` (`out`: an element type name, "integer",
/// "batch of string", …; absent: the input's type; filter and flat_map take no `out`). The provider builds
/// the node itself, so its callables' types stay in its own translation unit.
class ExternalFunctions {
 public:
  virtual ~ExternalFunctions() = default;
  /// `input | map(function id)`, or a parallel_map when `node.max_in_flight` is given; `out`: the element type
  /// it returns (empty: the input's).
  virtual SpecPipeline map(const SpecPipeline& input, std::int64_t id, const std::string& out, const ExternalNode& node) const = 0;
  virtual SpecPipeline filter(const SpecPipeline& input, std::int64_t id, const ExternalNode& node) const = 0;
  /// A source: the function is called once per instance and returns an iterable of `out` elements.
  virtual SpecPipeline generator(std::int64_t id, const std::string& out, const std::string& name) const = 0;
  /// The function returns an iterable of the input's element type.
  virtual SpecPipeline flat_map(const SpecPipeline& input, std::int64_t id, const ExternalNode& node) const = 0;
  /// A demux whose function (element → output) is the callable.
  virtual SpecPipeline demux(const SpecPipeline& input, std::int64_t id, const DemuxOptions& o, bool input_bytes) const = 0;
};

struct SpecOptions {
  /// Resolves `"fn": "external"` (borrowed for the parse; none: such a spec is refused).
  const ExternalFunctions* external = nullptr;
  /// Where the file sources' relative names are resolved and how their files are identified.
  DataFiles data{};
  /// A front end that rewrites the user's pipeline (the Python package fuses stages) gives each node the
  /// place the user put it at in an "at" string ("pipeline[4]", "pipeline[1..3]"): messages name it so.
  bool places = false;
};

/// Parses and builds a JSON spec; a ConfigError names the node by its position and kind
/// (`pipeline[2] (batch): size must be positive, got 0`).
Spec parse_spec(std::string_view json_text, SpecOptions options = {});

/// The op names the JSON front end knows, in registry order.
std::vector<std::string> spec_ops();


}  // namespace dpipe
