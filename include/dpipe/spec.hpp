#pragma once
/// Pipelines from JSON specs: `{"seed": S, "pipeline": [{"op": KIND, ...params}, ...]}`. The builder
/// makes the same typed Pipeline<T> a C++ user would write (builtin functions are concrete function
/// objects, not an interpreter), so `dpipe bench` measures real pipelines. Element types of specs:
/// 64-bit integers, strings, and batches (vectors) of them up to two levels deep.
#include <cstdint>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "dpipe/pipeline.hpp"

namespace dpipe {

using SpecInt = std::int64_t;
using SpecStr = std::string;

using AnyPipeline =
    std::variant<Pipeline<SpecInt>, Pipeline<SpecStr>, Pipeline<std::vector<SpecInt>>, Pipeline<std::vector<SpecStr>>,
                 Pipeline<std::vector<std::vector<SpecInt>>>, Pipeline<std::vector<std::vector<SpecStr>>>>;

struct Spec {
  std::uint64_t seed = 0;
  AnyPipeline pipeline;
};

/// Parses and builds a spec; a ConfigError names the node (by its position) and the parameter.
Spec parse_spec(std::string_view json_text);

/// Appends one element as JSON (numbers, strings, arrays for batches and tuples).
inline void append_element_json(std::string& out, SpecInt v) { out += std::to_string(v); }
void append_element_json(std::string& out, const SpecStr& v);
template <class T>
void append_element_json(std::string& out, const std::vector<T>& v) {
  out += '[';
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (i) out += ", ";
    append_element_json(out, v[i]);
  }
  out += ']';
}

}  // namespace dpipe
