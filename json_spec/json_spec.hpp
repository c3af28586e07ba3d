#pragma once
/// The JSON spec front end (the `dpipe` tool's): a spec's JSON text → a typed pipeline, through each node
/// kind's own builder (dpipe/spec.hpp). Not installed: a C++ user writes the pipeline itself.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "dpipe/spec.hpp"

namespace dpipe {

struct Spec {
  std::uint64_t seed = 0;
  SpecPipeline pipeline;
  /// The pipeline's strings are bytes (records), left raw because SpecOptions::base64_bytes was off.
  bool bytes = false;
};

/// Functions a front end provides besides the builtins (the Python package's callables), named in a spec
/// as `{"op": "map", "fn": "external", "id": N, "out": TYPE}` (`out`: an element type name, "integer",
/// "batch of string", …; absent: the input's type; filter and flat_map take no `out`). The provider builds
/// the node itself, so its callables' types stay in its own translation unit.
class ExternalFunctions {
 public:
  virtual ~ExternalFunctions() = default;
  /// `input | map(function id)`, named `name`; `input_bytes`: the input's strings are bytes (records).
  virtual SpecPipeline map(const SpecPipeline& input, std::int64_t id, const std::string& out, const std::string& name,
                           bool input_bytes) const = 0;
  virtual SpecPipeline filter(const SpecPipeline& input, std::int64_t id, const std::string& name,
                              bool input_bytes) const = 0;
  /// A source: the function is called once per instance and returns an iterable of `out` elements.
  virtual SpecPipeline generator(std::int64_t id, const std::string& out, const std::string& name) const = 0;
  /// The function returns an iterable of the input's element type.
  virtual SpecPipeline flat_map(const SpecPipeline& input, std::int64_t id, const std::string& name,
                                bool input_bytes) const = 0;
};

struct SpecOptions {
  /// Bytes (records) travel as base64 text, so that every element prints as JSON (the tool). Off, they
  /// stay raw and Spec::bytes says so (the Python front end hands them out as `bytes`).
  bool base64_bytes = true;
  /// Resolves `"fn": "external"` (borrowed for the parse; none: such a spec is refused).
  const ExternalFunctions* external = nullptr;
};

/// Parses and builds a JSON spec; a ConfigError names the node by its position and kind
/// (`pipeline[2] (batch): size must be positive, got 0`).
Spec parse_spec(std::string_view json_text, SpecOptions options = {});

/// The op names the JSON front end knows, in registry order.
std::vector<std::string> spec_ops();
/// The op names of the sources (the nodes that start a pipeline).
std::vector<std::string> spec_sources();

}  // namespace dpipe
