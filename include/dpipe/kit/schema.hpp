#pragma once
/// A node kind's schema: its one-line contract and every parameter a spec, Python or the docs can give
/// it, declared once in the kind's header next to its State:
///
///   struct BatchKind {
///     static constexpr std::string_view doc = "Groups elements into batches of `size` ...";
///     static constexpr ParamSchema params[] = {
///         {.name = "size", .type = ParamType::integer, .doc = "elements per batch", .positional = true},
///         {.name = "drop_last", .type = ParamType::boolean, .doc = "...", .fallback = "false"},
///     };
///   };
///
/// From it come the spec front end's reading and checking of parameters (a builder reads only declared
/// parameters, a spec names only declared ones), the kind registry's tuning list, `dpipe ops`, the Python
/// node functions' signatures and docs/ops.md. Every kind also takes `name` (the node's name), which no
/// schema repeats.
///
/// The builtin functions a spec names with "fn" (map's "affine", filter's "mod_eq", …) have schemas of
/// the same form (FunctionSchema): their parameters are read only once the function is chosen.
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dpipe {

/// The type of a parameter's value, as a spec writes it.
enum class ParamType {
  integer,    // a JSON integer that fits in 64 signed bits
  number,     // any JSON number
  boolean,    // true or false
  text,       // a string
  choice,     // one of the strings in `choices`
  integers,   // a list of integers
  texts,      // a list of strings
  values,     // a list of integers or a list of strings
  pipelines,  // a list of pipelines (other inputs)
  function,   // a builtin function's name, or a Python callable
  fields,     // an object of field name → type name (parse_json)
  numbers,    // a list of numbers
};

/// How a type is named in `dpipe ops` and the docs ("integer", "list of strings", …).
constexpr std::string_view param_type_name(ParamType t) {
  switch (t) {
    case ParamType::integer: return "integer";
    case ParamType::number: return "number";
    case ParamType::boolean: return "boolean";
    case ParamType::text: return "string";
    case ParamType::choice: return "choice";
    case ParamType::integers: return "list of integers";
    case ParamType::texts: return "list of strings";
    case ParamType::values: return "list of integers or strings";
    case ParamType::pipelines: return "list of pipelines";
    case ParamType::function: return "function";
    case ParamType::fields: return "object of field types";
    case ParamType::numbers: return "list of numbers";
  }
  return "?";
}

/// Calls each(item) for every item of `list`, separated by `sep` ("a|b|c"), until it returns true;
/// returns whether one did. With a string_view for `each`: whether the list holds it.
template <class Each>
constexpr bool split_list(std::string_view list, char sep, Each each) {
  while (!list.empty()) {
    const auto at = list.find(sep);
    if (each(list.substr(0, at))) return true;
    if (at == std::string_view::npos) break;
    list.remove_prefix(at + 1);
  }
  return false;
}
constexpr bool split_list(std::string_view list, char sep, std::string_view item) {
  return split_list(list, sep, [item](std::string_view x) { return x == item; });
}

/// One parameter. Declared with designated initializers, in this member order.
struct ParamSchema {
  std::string_view name;
  ParamType type = ParamType::integer;
  std::string_view doc{};
  /// The default as JSON text ("1", "false", "\"all\""; "null": absent means something of its own, which
  /// `doc` says). Empty: the parameter is required.
  std::string_view fallback{};
  /// For a choice: the strings it takes, separated by '|'.
  std::string_view choices{};
  /// Python: may be passed positionally, in declaration order (`batch(256)`).
  bool positional = false;
  /// Changes no element (a queue depth, a window of work in flight): a resume may change it.
  bool tuning = false;
  /// A semantic parameter a resume may change when asked to by name (ResumeOptions::overrides, the tool's
  /// --override, Python's override=): mix's weights. The state restores as it was; what follows differs.
  bool overridable = false;
  /// The keys it is written as in the fingerprint (dpipe/graph.hpp), separated by ' ', when they are not
  /// its name: a list of files as "file*" (file0, file1, …), a list of values as "size digest".
  std::string_view fingerprint{};
  /// torch's name for the same parameter (`buffer_size` for shuffle's `buffer`), which Python accepts
  /// too; specs and fingerprints use `name` only.
  std::string_view torch{};

  constexpr bool required() const { return fallback.empty(); }
  /// Whether `text` is one of the choices.
  constexpr bool is_choice(std::string_view text) const { return split_list(choices, '|', text); }
};

/// A builtin function a spec names with "fn": the ops that take it and its own parameters.
struct FunctionSchema {
  std::string_view name;
  std::string_view ops;  // the ops that take it, separated by ' '
  std::string_view doc;
  std::span<const ParamSchema> params{};
  constexpr bool taken_by(std::string_view op) const { return split_list(ops, ' ', op); }
};

/// The parameter every kind takes.
inline constexpr ParamSchema kNameParam{.name = "name",
                                        .type = ParamType::text,
                                        .doc = "the node's name: its key in snapshots and the seed of its random stream (default: kind@digest of what lies upstream)",
                                        .fallback = "null"};

/// The parameter of `params` called `name`, or null.
inline const ParamSchema* find_param(std::span<const ParamSchema> params, std::string_view name) {
  if (name == kNameParam.name) return &kNameParam;
  for (const auto& p : params)
    if (p.name == name) return &p;
  return nullptr;
}

/// The parameters' names, in order, as a message lists them ("size, drop_last, name").
inline std::string param_names(std::span<const ParamSchema> params) {
  std::string out;
  for (const auto& p : params) out += std::string(p.name) + ", ";
  return out + std::string(kNameParam.name);
}

/// Where a kind stands in the engine's segments (DESIGN §4).
enum class SegmentRole {
  none,
  ends_workers,    // merge: the nodes above it run once per worker, it runs once per rank
  starts_workers,  // dispatch: the nodes above it run once per rank, it hands each worker its share
  worker_depth,    // prefetch: sets the worker queues' depth, so it ends the worker segment
};

/// What a node does to how its stream is split between instances (the graph's sharding check, from its parameters).
/// Levels: Split::kRank, Split::kWorker; kSegment stands for "every level the node's segment has".
struct Split {
  static constexpr unsigned kRank = 1, kWorker = 2, kSegment = 4;
  unsigned shards = 0;      // it keeps one share per instance of these levels (refused if already dealt)
  unsigned deals = 0;       // it deals its stream over these levels (never refused)
  unsigned covers = 0;      // these levels see distinct or deliberately copied elements after it
  bool by_hand = false;     // the user split the stream by hand: every level is covered
};

/// A `fields` visitor that collects a state's field names (for `dpipe ops`).
struct StateFieldNames {
  std::vector<std::string> names;
  template <class T>
  void operator()(std::string_view name, T&) {
    names.emplace_back(name);
  }
};

}  // namespace dpipe
