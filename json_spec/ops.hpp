#pragma once
/// The op catalogue (ops.cpp): every op with its doc, parameters (name, type, default, required,
/// positional, doc, tuning, choices), whether it rescales (and why not), its state fields and builtin
/// functions; as one JSON array (`dpipe ops --json`), as text, as Markdown (docs/ops.md). A light header:
/// the catalogue needs the kinds' registry, not their code.
#include <span>
#include <string>
#include <string_view>

#include "dpipe/kit/schema.hpp"

namespace dpipe {

/// The builtin functions a spec names with "fn", each with the ops that take it and its parameters
/// (spec.cpp).
std::span<const FunctionSchema> spec_functions();

/// The catalogue; `only`: that op alone (a ConfigError listing the known ops when there is none).
std::string spec_ops_json(std::string_view only = {});
std::string spec_ops_text(std::string_view only = {});
std::string spec_ops_markdown();

}  // namespace dpipe
