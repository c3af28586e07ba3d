// The JSON spec front end: reads a spec, and for each node the op's parameters, which it hands to the
// node kind's own builder (`XKind::from_spec`, in the kind's header). The op table is made from the list
// of kinds (dpipe/kinds.hpp); the functions a spec names by "fn" are this front end's builtins.
#include "json_spec.hpp"

#include <nlohmann/json.hpp>

#include <concepts>
#include <cstdint>
#include <optional>
#include <set>
#include <stdexcept>

#include "builtins.hpp"
#include "dpipe/field_function.hpp"
#include "dpipe/kinds.hpp"

namespace dpipe {

namespace {

using json = nlohmann::json;

/// A ConfigError that already names the node's position: passed through nested pipelines unchanged.
class PositionedError : public ConfigError {
 public:
  using ConfigError::ConfigError;
};

/// Whether a JSON value, if an integer, is one a std::int64_t holds.
bool fits_int64(const json& v) {
  return !v.is_number_unsigned() || v.get<std::uint64_t>() <= static_cast<std::uint64_t>(INT64_MAX);
}

std::string list_type_name(const std::string& t) { return t == "string" ? "strings" : t + "s"; }

/// A value as an error message shows it: a list or an object by its kind and size (never printed
/// whole: one may nest 100,000 deep), anything else as JSON, cut at 80 characters.
std::string shown(const json& v) {
  if (v.is_array()) return "a list of " + std::to_string(v.size());
  if (v.is_object()) return "an object of " + std::to_string(v.size()) + " keys";
  std::string text = v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (text.size() > 80) text = text.substr(0, 77) + "...";
  return text;
}

class JsonNode;
// The external functions of the spec being parsed on this thread (set by parse_spec for its nested
// chains too).
thread_local SpecOptions t_options{};

/// The branches of the spec being parsed. A `from` reads a node by name; when that node stands in a
/// pipeline not built yet (`zip` lists the branch before the chain with the fork), the pipeline is built
/// ahead up to it, and its build later goes on from there.
struct Branches {
  struct Place {
    const json* chain;
    std::size_t index;
    std::string where;  // the chain's position, as errors name it
  };
  struct Built {  // a chain's nodes built so far
    std::size_t count = 0;
    std::optional<SpecPipeline> pipeline;
    bool bytes = false;
  };
  std::map<std::string, SpecPipeline> named;         // named nodes built so far
  std::map<std::string, Place> places;               // where each named node stands
  std::map<std::string, std::size_t> outputs_read;   // name → 1 + the highest output a `from` reads
  std::set<std::pair<std::string, std::size_t>> taken;
  std::map<const json*, Built> built;
  std::set<std::string> ahead;                       // names being built ahead (met again: a cycle)
};
thread_local Branches* t_branches = nullptr;

/// Where the spec's named nodes stand and the outputs its `from` nodes read (a walk with its own stack:
/// a hostile spec may nest deeper than the call stack goes).
void survey(const json& root, Branches& b) {
  std::vector<std::pair<const json*, std::string>> stack{{&root, "pipeline"}};
  while (!stack.empty()) {
    const auto [chain, where] = stack.back();
    stack.pop_back();
    if (!chain->is_array()) continue;
    for (std::size_t i = 0; i < chain->size(); ++i) {
      const json& node = (*chain)[i];
      if (!node.is_object()) continue;
      const auto op = node.find("op"), name = node.find("name"), output = node.find("output"), with = node.find("with");
      const bool named = name != node.end() && name->is_string();
      if (op != node.end() && *op == "from") {
        if (named && output != node.end() && output->is_number_unsigned() && output->get<std::uint64_t>() < 1024) {
          std::size_t& n = b.outputs_read[name->get<std::string>()];
          n = std::max<std::size_t>(n, output->get<std::size_t>() + 1);
        }
      } else if (named) {
        b.places.emplace(name->get<std::string>(), Branches::Place{chain, i, where});
      }
      if (with != node.end() && with->is_array())
        for (std::size_t k = 0; k < with->size(); ++k)
          stack.push_back({&(*with)[k], where + "[" + std::to_string(i) + "].with[" + std::to_string(k) + "]"});
    }
  }
}

SpecPipeline build_chain(const json& chain, const std::string& where, bool* ends_in_bytes = nullptr);
/// Builds `chain` up to node `end` (exclusive), on from the nodes built before.
SpecPipeline build_nodes(const json& chain, const std::string& where, std::size_t end, bool* ends_in_bytes);

/// The front end's description of one op of the kind list.
struct OpEntry {
  std::string_view name;
  bool source;  // starts a pipeline
  std::span<const ParamSchema> params;
  SpecPipeline (*build)(JsonNode&);
};

// ---- the builtin functions' schemas (a spec names one with "fn") ----
constexpr ParamSchema kAffineParams[] = {
    {.name = "mul", .type = ParamType::integer, .doc = "the factor", .fallback = "1"},
    {.name = "add", .type = ParamType::integer, .doc = "the term added", .fallback = "0"},
};
constexpr ParamSchema kAddRandomParams[] = {
    {.name = "below", .type = ParamType::integer, .doc = "the bound above every draw (positive)"},
};
constexpr ParamSchema kStackParams[] = {
    {.name = "dtype", .type = ParamType::choice, .doc = "the array's type", .fallback = "\"int64\"",
     .choices = "int64|int32|uint32|int16|uint16|uint8"},
};
constexpr ParamSchema kSpinParams[] = {
    {.name = "ns", .type = ParamType::integer, .doc = "nanoseconds of work per element, 0 to 1e9"},
};
constexpr ParamSchema kThrowAtParams[] = {
    {.name = "index", .type = ParamType::integer, .doc = "the position (from 0) whose call throws"},
};
constexpr ParamSchema kModEqParams[] = {
    {.name = "mod", .type = ParamType::integer, .doc = "the modulus (positive)"},
    {.name = "eq", .type = ParamType::integer, .doc = "the remainder kept, in [0, mod)"},
};
constexpr ParamSchema kReplicateParams[] = {
    {.name = "times", .type = ParamType::integer, .doc = "copies of each element (not negative)"},
};
constexpr ParamSchema kCountParams[] = {
    {.name = "count", .type = ParamType::integer, .doc = "how many integers (not negative)"},
};
constexpr ParamSchema kRandomIntsParams[] = {
    {.name = "count", .type = ParamType::integer, .doc = "how many integers (not negative)"},
    {.name = "lo", .type = ParamType::integer, .doc = "the lowest value", .fallback = "0"},
    {.name = "hi", .type = ParamType::integer, .doc = "the bound above every value (above lo)"},
};
constexpr ParamSchema kExternalOutParams[] = {
    {.name = "id", .type = ParamType::integer, .doc = "the callable's number, given by the front end"},
    {.name = "out", .type = ParamType::text, .doc = "the element type it returns (absent: the input's; a generator's: value)",
     .fallback = "null"},
};
constexpr ParamSchema kExternalParams[] = {
    {.name = "id", .type = ParamType::integer, .doc = "the callable's number, given by the front end"},
};
constexpr FunctionSchema kFunctions[] = {
    {"affine", "map parallel_map", "x → x·mul + add (integers, wrapping)", kAffineParams},
    {"add_random", "map", "x → x + a draw from [0, below) of the element's own generator (with \"rng\": true)", kAddRandomParams},
    {"identity", "map parallel_map", "each element unchanged"},
    {"spin", "map parallel_map", "each element unchanged, after `ns` nanoseconds of work (benchmarks)", kSpinParams},
    {"stack", "map parallel_map", "a batch of equal rows of integers → one 2-D array value", kStackParams},
    {"throw_at", "map", "each element unchanged; the call at position `index` throws (tests)", kThrowAtParams},
    {"mod_eq", "filter", "keeps x with x mod `mod` == `eq` (floor modulo)", kModEqParams},
    {"replicate", "flat_map", "each element `times` times", kReplicateParams},
    {"flatten", "flat_map", "a list → its elements, in order (flat_map's function when none is named; torch's flatmap())"},
    {"range", "flat_map", "an integer n → 0, 1, …, n−1, one at a time"},
    {"mod", "demux", "an integer x → output x mod count (floor modulo)"},
    {"count", "generator", "0, 1, …, count−1", kCountParams},
    {"random_ints", "generator", "`count` integers drawn from [lo, hi) by the node's generator", kRandomIntsParams},
    {"external", "map parallel_map generator", "a Python callable (the Python package writes this)", kExternalOutParams},
    {"external", "filter flat_map demux", "a Python callable (the Python package writes this)", kExternalParams},
};

/// The builtin function `fn` of `op`, or null.
const FunctionSchema* find_function(std::string_view op, std::string_view fn) {
  for (const auto& f : kFunctions)
    if (f.name == fn && f.taken_by(op)) return &f;
  return nullptr;
}

/// The builtin functions of `op`, as a message lists them ("affine, identity, …").
std::string function_names(std::string_view op) {
  std::string out;
  for (const auto& f : kFunctions)
    if (f.taken_by(op) && f.name != "external") out += (out.empty() ? "" : ", ") + std::string(f.name);
  return out;
}

/// One node object of a spec: the parameter reader a kind's `from_spec` uses. Every parameter read is
/// marked; finish() refuses the ones nobody read (a typo must not pass silently). JSON null is absent.
class JsonNode {
 public:
  JsonNode(const json& j, std::string where, const SpecPipeline* input) : j_(j), where_(std::move(where)), input_(input) {
    if (!j_.is_object()) throw PositionedError(where_ + ": a node must be a JSON object");
    const auto it = j_.find("op");
    if (it == j_.end() || !it->is_string()) throw PositionedError(where_ + ": the node has no \"op\" string");
    op_ = it->get<std::string>();
    used_.insert("op");
    if (const auto at = j_.find("at"); t_options.places && at != j_.end()) {
      if (!at->is_string() || at->get_ref<const std::string&>().empty() || at->get_ref<const std::string&>().size() > 256)
        throw PositionedError(where_ + ": \"at\" must be a place of 1 to 256 characters");
      where_ = at->get<std::string>();
      used_.insert("at");
    }
    std::string name;
    param("name", name);
    name_ = name;
  }

  /// The op's schema: every parameter its builder reads must be declared there (a builder that reads
  /// another is a bug of the kind, found by any spec that reaches it).
  void set_schema(std::span<const ParamSchema> params) { params_ = params; }

  const std::string& op() const { return op_; }
  const std::string& name() const { return name_; }
  const std::string& where() const { return where_; }
  bool bytes_marked() const { return bytes_; }

  [[noreturn]] void fail(const std::string& msg) const {
    throw PositionedError(where_ + " (" + node_label(op_, name_) + "): " + msg);
  }

  /// Reads parameter `key` into `v` when it is given; leaves the default otherwise.
  template <class T>
  void param(const std::string& key, T& v) {
    declared<T>(key, false);
    if (const json* x = get(key)) read(key, *x, v);
  }
  template <class T>
  void required(const std::string& key, T& v) {
    declared<T>(key, true);
    const json* x = get(key);
    if (!x) fail("missing parameter '" + key + "'" + undeclared_given());
    read(key, *x, v);
  }
  /// A string parameter naming one of `options`.
  template <class E>
  void choice(const std::string& key, E& v, std::initializer_list<std::pair<const char*, E>> options) {
    const ParamSchema& p = declared<std::string>(key, false);
    for (const auto& option : options)
      if (p.type != ParamType::choice || !p.is_choice(option.first))
        internal_error("reads choice '" + key + "' with option '" + option.first + "', which its schema does not list");
    std::string s;
    param(key, s);
    if (!get(key)) return;
    std::string known;
    for (const auto& [text, value] : options) {
      if (s == text) {
        v = value;
        return;
      }
      known += (known.empty() ? "" : " or ") + std::string(text);
    }
    fail(key + " must be " + known + ", got '" + s + "'");
  }
  /// Whether `key` is a list whose first element is a T (lists of several types are refused when read).
  template <class T>
  bool holds_list_of(const std::string& key) const {
    const auto it = j_.find(key);
    if (it == j_.end() || !it->is_array() || it->empty()) return false;
    if constexpr (std::is_same_v<T, std::string>) return (*it)[0].is_string();
    else return (*it)[0].is_number_integer();
  }

  const SpecPipeline& input() const { return *input_; }
  /// The pipelines of `key` (a list of pipelines), each of the input's element type T.
  template <class T>
  std::vector<Pipeline<T>> inputs(const std::string& key) {
    if (const ParamSchema* p = find_param(params_, key); !p || p->type != ParamType::pipelines)
      internal_error("reads pipelines '" + key + "', which its schema does not declare as such");
    const json* with = get(key);
    if (!with) fail("missing parameter '" + key + "' (a list of pipelines)");
    if (!with->is_array() || with->empty()) fail("'" + key + "' must be a non-empty list of pipelines");
    std::vector<Pipeline<T>> out;
    for (std::size_t i = 0; i < with->size(); ++i) {
      SpecPipeline q = build_chain((*with)[i], where_ + "." + key + "[" + std::to_string(i) + "]");
      if (!q.holds<T>())
        fail("input " + std::to_string(i + 1) + " yields " + q.type_name() + "s, the first input yields " +
             SpecElement<T>::name() + "s");
      out.push_back(q.get<T>());
    }
    return out;
  }
  /// The pipelines of `key` (a list of pipelines), of any element types (the caller checks them).
  std::vector<SpecPipeline> pipelines(const std::string& key) {
    if (const ParamSchema* p = find_param(params_, key); !p || p->type != ParamType::pipelines)
      internal_error("reads pipelines '" + key + "', which its schema does not declare as such");
    const json* with = get(key);
    if (!with) fail("missing parameter '" + key + "' (a list of pipelines)");
    if (!with->is_array() || with->empty()) fail("'" + key + "' must be a non-empty list of pipelines");
    std::vector<SpecPipeline> out;
    for (std::size_t i = 0; i < with->size(); ++i)
      out.push_back(build_chain((*with)[i], where_ + "." + key + "[" + std::to_string(i) + "]"));
    return out;
  }
  /// The elements of `p` are bytes: JSON shows them as base64 strings once a node that reads by index
  /// (a sampler) is past.
  SpecPipeline bytes(Pipeline<std::string> p) {
    bytes_ = true;
    return p;
  }

  // ---- branches: the outputs of fork, demux and unzip ----

  /// How many outputs the node named `name` has when its count is not given: output 0 and every output a
  /// `from` of the spec reads.
  std::size_t outputs_read(const std::string& name) const {
    const auto it = t_branches ? t_branches->outputs_read.find(name) : decltype(t_branches->outputs_read)::iterator{};
    return t_branches && it != t_branches->outputs_read.end() ? std::max<std::size_t>(it->second, 1) : 1;
  }
  /// Output `output` of the node named `name` (built ahead when its pipeline is not built yet); each output
  /// is read once.
  SpecPipeline read_output(const std::string& name, std::size_t output) {
    if (!t_branches) fail("a `from` is read only in a spec");
    auto it = t_branches->named.find(name);
    if (it == t_branches->named.end()) {
      const auto place = t_branches->places.find(name);
      if (place == t_branches->places.end()) fail("no node of the spec is named '" + name + "'");
      if (!t_branches->ahead.insert(name).second)
        fail("'" + name + "' stands downstream of a branch it feeds: the graph would have a cycle");
      build_nodes(*place->second.chain, place->second.where, place->second.index + 1, nullptr);
      t_branches->ahead.erase(name);
      it = t_branches->named.find(name);
      if (it == t_branches->named.end()) fail("internal: '" + name + "' was not built with its pipeline");
    }
    if (!t_branches->taken.insert({name, output}).second)
      fail("output " + std::to_string(output) + " of '" + name + "' is read twice; each output feeds one consumer (fork it again to read it twice)");
    return it->second.visit([&]<class T>(const Pipeline<T>& p) -> SpecPipeline { return dpipe::output(p, output); });
  }
  /// demux's function: element → output.
  SpecPipeline demux_function(const DemuxOptions& o) {
    const std::string fn = function();
    if (fn == "external") return external().demux(input(), external_id(), o, input_bytes_);
    if (fn != "mod") internal_error("has no builder for its function '" + fn + "'");
    return demux_node(integers("mod"), builtins::Mod{o.count}, o);
  }

  // ---- the builtin functions a spec names with "fn" ----

  /// A map function for `apply(pipeline, fn)` (map's or parallel_map's: the op's functions are its schema's).
  /// Whether this node's input carries bytes (records) as strings.
  void set_input_bytes(bool b) { input_bytes_ = b; }

  /// `max_in_flight`: parallel_map's window, which a front end's function needs to be told. `kMap`: the op
  /// is map, whose functions may draw per sample ("rng").
  template <bool kMap = false, class Apply>
  SpecPipeline map_function(Apply apply, OnDataError on_error = OnDataError::fail,
                            std::optional<std::int64_t> max_in_flight = std::nullopt) {
    const std::string fn = function();
    const std::optional<FieldInto> on = field_into();
    if constexpr (kMap) if (fn == "add_random") {  // the function draws from the element's generator
      bool rng = false;
      param("rng", rng);
      if (!rng) fail("add_random draws from each element's own generator: give \"rng\": true");
      if (on) fail("add_random maps integers; field= is not for it");
      builtins::AddRandom f;
      required("below", f.below);
      if (f.below <= 0) fail("below must be positive, got " + std::to_string(f.below));
      return apply(integers("add_random"), SeededFn<builtins::AddRandom>{f});
    }
    bool rng = false;
    if (kMap) {
      param("rng", rng);
      if (rng && fn != "external")
        fail("\"rng\": true is for a function that draws per sample (add_random, a Python callable); '" + fn +
             "' takes no generator");
    }
    if (fn == "external") {
      if (on) fail(kPythonField);
      std::string out;
      param("out", out);
      return external().map(input(), external_id(), out, {name(), input_bytes_, on_error, max_in_flight, rng});
    }
    if (fn == "affine") {
      builtins::Affine f;
      param("mul", f.mul);
      param("add", f.add);
      if (on) return apply(records(), field_map<SpecInt>(f, on->field, on->into));
      return apply(integers("affine"), f);
    }
    if (fn == "stack") {
      builtins::Stack f;
      param("dtype", f.dtype);
      if (!builtins::Stack::known(f.dtype))
        fail("dtype must be one of int64, int32, uint32, int16, uint16, uint8, got '" + f.dtype + "'");
      if (on) fail("stack makes an array of a whole batch; field= is not for it");
      if (!input().holds<std::vector<std::vector<SpecInt>>>())
        fail("stack takes batches of rows of integers (token windows | batch), but its input yields " + input().type_name() + "s");
      return apply(input().get<std::vector<std::vector<SpecInt>>>(), f);
    }
    // identity, spin and throw_at are one function type: one map node per element type for the three.
    std::optional<builtins::Passthrough> pass;
    if (fn == "identity") pass.emplace();
    if (fn == "spin") {
      std::int64_t ns = 0;
      required("ns", ns);
      if (ns < 0 || ns > 1'000'000'000) fail("ns must be between 0 and 1e9, got " + std::to_string(ns));
      pass = builtins::Passthrough::spin(ns);
    }
    if (fn == "throw_at") {
      std::int64_t index = 0;
      required("index", index);
      if (index < 0) fail("index must not be negative, got " + std::to_string(index));
      pass = builtins::Passthrough::throw_at(index);
    }
    if (pass && on) return apply(records(), field_map<Value>(*pass, on->field, on->into));
    if (pass) return input().apply([&](const auto& p) { return apply(p, *pass); });
    internal_error("has no builder for its function '" + fn + "'");
  }
  template <class Apply>
  SpecPipeline filter_function(Apply apply, OnDataError on_error = OnDataError::fail) {
    const std::string fn = function();
    const std::optional<FieldInto> on = field_into();
    if (fn == "external") {
      if (on) fail(kPythonField);
      return external().filter(input(), external_id(), {name(), input_bytes_, on_error});
    }
    if (fn != "mod_eq") internal_error("has no builder for its function '" + fn + "'");
    builtins::ModEq f;
    required("mod", f.mod);
    required("eq", f.eq);
    if (f.mod <= 0) fail("mod must be positive, got " + std::to_string(f.mod));
    if (f.eq < 0 || f.eq >= f.mod) fail("eq must be in [0, mod), got " + std::to_string(f.eq));
    if (on) return apply(records(), field_filter<SpecInt>(f, on->field));
    return apply(integers("mod_eq"), f);
  }
  template <class Apply>
  SpecPipeline flat_map_function(Apply apply, OnDataError on_error = OnDataError::fail) {
    const std::string fn = function();
    const std::optional<FieldInto> on = field_into();
    if (fn == "external") {
      if (on) fail(kPythonField);
      return external().flat_map(input(), external_id(), {name(), input_bytes_, on_error});
    }
    if (fn == "replicate") {
      builtins::Replicate f;
      required("times", f.times);
      if (f.times < 0) fail("times must not be negative");
      if (on) return apply(records(), field_flat_map<Value>(f, on->field, on->into));
      return input().apply([&](const auto& p) { return apply(p, f); });
    }
    if (fn == "flatten") {
      if (on) fail("flatten reads the elements themselves (lists); field= is not for it");
      return input().apply([&]<class T>(const Pipeline<T>& p) requires detail::is_vector_v<T> { return apply(p, builtins::Flatten{}); },
                           "flat_map without a function flattens lists");
    }
    if (fn == "range") {
      if (on) return apply(records(), field_flat_map<SpecInt>(builtins::Iota{}, on->field, on->into));
      return apply(integers("range"), builtins::Iota{});
    }
    internal_error("has no builder for its function '" + fn + "'");
  }
  template <class Apply>
  SpecPipeline generator_function(Apply apply) {
    const std::string fn = function();
    if (fn == "external") {
      std::string out;
      param("out", out);
      return external().generator(external_id(), out, name());
    }
    std::int64_t count = 0;
    required("count", count);
    if (count < 0) fail("count must not be negative, got " + std::to_string(count));
    if (fn == "count") return apply(CountFactory{count});
    if (fn == "random_ints") {
      std::int64_t lo = 0, hi = 0;
      param("lo", lo);
      required("hi", hi);
      if (hi <= lo) fail("hi must be above lo");
      return apply(RandomIntsFactory{count, lo, hi});
    }
    internal_error("has no builder for its function '" + fn + "'");
  }

  /// The data root and file identity of the spec's file sources (SpecOptions::data).
  const DataFiles& data_files() const { return t_options.data; }
  const ExternalFunctions& external() const {
    if (!t_options.external)
      fail("\"fn\": \"external\" names a function of a front end that provides them (the Python package)");
    return *t_options.external;
  }
  std::int64_t external_id() {
    std::int64_t id = 0;
    required("id", id);
    return id;
  }

  /// Throws on a parameter this op does not take, naming the ones it takes.
  void finish() const {
    for (auto it = j_.begin(); it != j_.end(); ++it)
      if (!used_.count(it.key())) {
        std::string known = param_names(params_);
        if (function_) {
          const std::string fn_params = function_->params.empty() ? "" : param_names(function_->params);
          known += "; its function '" + std::string(function_->name) + "' takes " +
                   (fn_params.empty() ? "none" : fn_params.substr(0, fn_params.rfind(", ")));
        }
        fail("unknown parameter '" + it.key() + "' (" + op_ + " takes " + known + ")");
      }
  }

 private:
  struct CountFactory {  // generator "count": 0, 1, …, count−1
    std::int64_t count;
    auto operator()(const GeneratorContext&) const {
      return [n = count, i = std::int64_t{0}]() mutable -> std::optional<SpecInt> {
        if (i >= n) return std::nullopt;
        return i++;
      };
    }
  };
  struct RandomIntsFactory {  // generator "random_ints": count draws from [lo, hi) by the node's generator
    std::int64_t count, lo, hi;
    auto operator()(const GeneratorContext& ctx) const {
      return [n = count, lo = lo, span = static_cast<std::uint64_t>(hi - lo), rng = ctx.rng,
              i = std::int64_t{0}]() mutable -> std::optional<SpecInt> {
        if (i >= n) return std::nullopt;
        ++i;
        return lo + static_cast<std::int64_t>(rng.below(span));
      };
    }
  };

  /// The input as integers, for a builtin that takes only integers.
  static constexpr const char* kPythonField =
      "field= on a Python callable is applied by the Python front end (dpipe.map(fn, field=...)), not by the spec";
  /// `field` and `into` (the op's schema declares them; absent `into`: `field`); none when `field` is absent.
  /// A Python callable's field is read by the Python front end, which wraps the callable.
  struct FieldInto {
    std::string field, into;
  };
  std::optional<FieldInto> field_into() {
    if (!find_param(params_, "field")) return std::nullopt;
    FieldInto f;
    param("field", f.field);
    if (find_param(params_, "into")) param("into", f.into);
    if (f.field.empty()) {
      if (!f.into.empty()) fail("into names the field the result goes into; it needs field, the field the function reads");
      return std::nullopt;
    }
    if (f.into.empty()) f.into = f.field;
    return f;
  }
  /// The input, whose elements must be records (field=).
  Pipeline<Value> records() const {
    if (!input().holds<Value>())
      fail("field= reads a field of records (parse_json's), but its input yields " + input().type_name() + "s");
    return input().get<Value>();
  }
  Pipeline<SpecInt> integers(const std::string& fn) const {
    if (!input().holds<SpecInt>()) fail(fn + " takes integers, but its input yields " + input().type_name() + "s");
    return input().get<SpecInt>();
  }

  /// The given parameters that are not declared, for the message of a missing one (a misspelling).
  std::string undeclared_given() const {
    std::string out;
    for (auto it = j_.begin(); it != j_.end(); ++it)
      if (it.key() != "op" && !find_param(params_, it.key()) && !(function_ && find_param(function_->params, it.key())))
        out += (out.empty() ? "" : ", ") + ("'" + it.key() + "'");
    if (out.empty()) return out;
    return " (it was given " + out + ", which " + op_ + " does not take; it takes " + param_names(params_) + ")";
  }

  /// The parameter `fn`: the name of one of the op's builtin functions, whose parameters may then be read.
  std::string function() {
    std::string fn;
    if (const ParamSchema* p = find_param(params_, "fn"); p && !p->required()) {
      const auto fallback = nlohmann::json::parse(p->fallback);  // the op's own default function
      if (!fallback.is_string()) internal_error("declares a default fn that is not a function's name");
      fn = fallback.get<std::string>();
      param("fn", fn);
    } else {
      required("fn", fn);
    }
    function_ = find_function(op_, fn);
    if (!function_ || (fn == "external" && !t_options.external)) {
      if (fn == "external") external();  // the refusal that says where external functions come from
      fail("unknown " + op_ + " function '" + fn + "' (known: " + function_names(op_) + ")");
    }
    return fn;
  }

  [[noreturn]] void internal_error(const std::string& what) const {
    throw std::logic_error("internal: the builder of op '" + op_ + "' " + what);
  }
  /// The schema of parameter `key` (the op's, or its function's once chosen), checked against how the
  /// builder reads it: a C++ type `T`, required or not.
  template <class T>
  const ParamSchema& declared(const std::string& key, bool required) const {
    const ParamSchema* p = find_param(params_, key);
    if (!p && function_) p = find_param(function_->params, key);
    if (!p) internal_error("reads parameter '" + key + "', which its schema does not declare");
    if (p->required() != required)
      internal_error("reads parameter '" + key + "' as " + (required ? "required" : "optional") + ", its schema says " +
                     (p->required() ? "required" : "optional"));
    bool fits = false;
    if constexpr (std::is_same_v<T, std::int64_t> || std::is_same_v<T, std::optional<std::int64_t>>) fits = p->type == ParamType::integer;
    else if constexpr (std::is_same_v<T, double>) fits = p->type == ParamType::number;
    else if constexpr (std::is_same_v<T, bool>) fits = p->type == ParamType::boolean;
    else if constexpr (std::is_same_v<T, std::string>)
      fits = p->type == ParamType::text || p->type == ParamType::choice || p->type == ParamType::function;
    else if constexpr (std::is_same_v<T, std::vector<std::int64_t>>) fits = p->type == ParamType::integers || p->type == ParamType::values;
    else if constexpr (std::is_same_v<T, std::vector<std::string>>) fits = p->type == ParamType::texts || p->type == ParamType::values;
    else if constexpr (std::is_same_v<T, std::vector<double>>) fits = p->type == ParamType::numbers;
    else if constexpr (std::is_same_v<T, std::vector<std::pair<std::string, std::string>>>) fits = p->type == ParamType::fields;
    if (!fits) internal_error("reads parameter '" + key + "' as another type than its schema's " + std::string(param_type_name(p->type)));
    return *p;
  }

  const json* get(const std::string& key) {
    used_.insert(key);
    const auto it = j_.find(key);
    return it == j_.end() || it->is_null() ? nullptr : &*it;
  }

  void read(const std::string& key, const json& x, std::int64_t& v) const {
    // JSON integers from 2^63 up parse as unsigned (is_number_integer() holds for them too).
    if (!fits_int64(x)) fail("parameter '" + key + "' does not fit in a 64-bit signed integer");
    if (!x.is_number_integer()) fail("parameter '" + key + "' must be an integer, got " + std::string(x.type_name()));
    v = x.get<std::int64_t>();
  }
  void read(const std::string& key, const json& x, std::optional<std::int64_t>& v) const {
    std::int64_t i = 0;
    read(key, x, i);
    v = i;
  }
  void read(const std::string& key, const json& x, double& v) const {
    if (!x.is_number()) fail("parameter '" + key + "' must be a number, got " + std::string(x.type_name()));
    v = x.get<double>();
  }
  void read(const std::string& key, const json& x, bool& v) const {
    if (!x.is_boolean()) fail("parameter '" + key + "' must be true or false");
    v = x.get<bool>();
  }
  void read(const std::string& key, const json& x, std::string& v) const {
    if (!x.is_string()) fail("parameter '" + key + "' must be a string");
    v = x.get<std::string>();
  }
  void read(const std::string& key, const json& x, std::vector<std::pair<std::string, std::string>>& v) const {
    if (!x.is_object() || x.empty()) fail("parameter '" + key + "' must be a non-empty object of field name → type name");
    v.clear();
    for (auto it = x.begin(); it != x.end(); ++it) {
      if (!it->is_string()) fail("'" + key + "': the type of field '" + it.key() + "' must be a string, got " + shown(*it));
      v.emplace_back(it.key(), it->get<std::string>());
    }
  }
  void read(const std::string& key, const json& x, std::vector<double>& v) const {
    if (!x.is_array()) fail("parameter '" + key + "' must be a list of numbers");
    v.clear();
    for (const auto& e : x) {
      if (!e.is_number()) fail("'" + key + "' must hold only numbers, found " + shown(e));
      v.push_back(e.get<double>());
    }
  }
  template <class T>
  void read(const std::string& key, const json& x, std::vector<T>& v) const {
    const std::string what = list_type_name(SpecElement<T>::name());
    if (!x.is_array()) fail("parameter '" + key + "' must be a list of " + what);
    v.clear();
    for (const auto& e : x) {
      if constexpr (std::is_same_v<T, std::string>) {
        if (!e.is_string()) fail("'" + key + "' must hold only " + what + ", found " + shown(e));
        v.push_back(e.get<std::string>());
      } else {
        if (!e.is_number_integer()) fail("'" + key + "' must hold only " + what + ", found " + shown(e));
        if (!fits_int64(e)) fail("'" + key + "' holds " + shown(e) + ", which does not fit in a 64-bit signed integer");
        v.push_back(e.get<std::int64_t>());
      }
    }
  }

  const json& j_;
  std::string where_;
  const SpecPipeline* input_;  // null for a source
  std::string op_, name_;
  std::set<std::string> used_;
  std::span<const ParamSchema> params_{};
  const FunctionSchema* function_ = nullptr;  // the builtin function `fn` names, once read
  bool bytes_ = false;
  bool input_bytes_ = false;
};

template <class K>
constexpr bool is_source() {
  if constexpr (requires { K::source; }) return K::source;
  else return false;
}
template <class... K>
std::vector<OpEntry> make_ops(KindList<K...>) {
  return {OpEntry{K::name, is_source<K>(), std::span<const ParamSchema>(K::params),
                  [](JsonNode& n) { return K::from_spec(n); }}...};
}

const std::vector<OpEntry>& ops() {
  static const std::vector<OpEntry> table = make_ops(AllKinds{});
  return table;
}

const OpEntry* find_op(std::string_view name) {
  for (const auto& op : ops())
    if (op.name == name) return &op;
  return nullptr;
}

/// The message of a node's own ConfigError without the node's label, which the position replaces.
std::string reason_of(const ConfigError& e, const std::string& label) {
  const std::string what = e.what();
  const std::string prefix = label + ": ";
  return what.rfind(prefix, 0) == 0 ? what.substr(prefix.size()) : what;
}

/// How deep pipelines may nest through 'with'. Building recurses once per level, so an unbounded depth
/// would end in a stack overflow instead of an error.
constexpr int kMaxNesting = 256;

SpecPipeline build_chain(const json& chain, const std::string& where, bool* ends_in_bytes) {
  if (!chain.is_array() || chain.empty())
    throw PositionedError(where + ": a pipeline must be a non-empty list of nodes");
  return build_nodes(chain, where, chain.size(), ends_in_bytes);
}

SpecPipeline build_nodes(const json& chain, const std::string& where, std::size_t end, bool* ends_in_bytes) {
  static thread_local int depth = 0;
  struct Level {
    Level() { ++depth; }
    ~Level() { --depth; }
  } level;
  if (depth > kMaxNesting + 1)  // the outermost pipeline is not nested
    throw PositionedError(where + ": pipelines nest more than " + std::to_string(kMaxNesting) + " levels deep through 'with'");
  Branches::Built scratch;
  Branches::Built& done = t_branches ? t_branches->built[&chain] : scratch;  // on from a build ahead
  for (std::size_t i = done.count; i < end; ++i) {
    std::optional<SpecPipeline>& p = done.pipeline;
    JsonNode n(chain[i], where + "[" + std::to_string(i) + "]", p ? &*p : nullptr);
    n.set_input_bytes(done.bytes);
    const OpEntry* op = find_op(n.op());
    if (!op) {
      std::string known;
      for (const auto& o : ops()) known += (known.empty() ? "" : ", ") + std::string(o.name);
      n.fail("unknown op '" + n.op() + "' (known: " + known + ")");
    }
    n.set_schema(op->params);
    if (i == 0 && !op->source) {
      std::string sources;
      for (const auto& o : ops())
        if (o.source) sources += (sources.empty() ? "" : ", ") + std::string(o.name);
      n.fail("the first node must be a source (" + sources + "), not '" + n.op() + "'");
    }
    if (i > 0 && op->source)
      n.fail("a source can only start a pipeline (use concat, zip or mux with \"with\" to combine sources)");
    SpecPipeline built = [&] {
      try {
        return op->build(n);
      } catch (const PositionedError&) {
        throw;
      } catch (const ConfigError& e) {
        n.fail(reason_of(e, node_label(n.op(), n.name())));
      }
    }();
    n.finish();
    built.def().set_place(n.where());  // nodes the op made below it take this place too (Graph::labels)
    if (t_branches && !n.name().empty() && n.op() != "from") t_branches->named.emplace(n.name(), built);
    p = std::move(built);
    done.bytes = done.bytes || n.bytes_marked();
    done.count = i + 1;
  }
  if (ends_in_bytes) *ends_in_bytes = done.bytes;
  return *done.pipeline;
}

}  // namespace

std::vector<std::string> spec_ops() {
  std::vector<std::string> v;
  for (const auto& op : ops()) v.emplace_back(op.name);
  return v;
}

std::span<const FunctionSchema> spec_functions() { return kFunctions; }

Spec parse_spec(std::string_view text, SpecOptions options) {
  struct Scope {
    explicit Scope(SpecOptions o) : saved(t_options) { t_options = o; }
    ~Scope() { t_options = saved; }
    SpecOptions saved;
  } scope(options);
  json j;
  // Keys seen in each open object: a key given twice is refused (JSON parsers differ on which one wins).
  std::vector<std::set<std::string>> keys;
  std::string duplicate;
  const json::parser_callback_t check_keys = [&](int, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::object_start) keys.emplace_back();
    else if (event == json::parse_event_t::object_end && !keys.empty()) keys.pop_back();
    else if (event == json::parse_event_t::key && !keys.empty() && !keys.back().insert(parsed.get<std::string>()).second &&
             duplicate.empty())
      duplicate = parsed.get<std::string>();
    return true;
  };
  try {
    j = json::parse(text.begin(), text.end(), check_keys);
  } catch (const json::exception& e) {  // parse errors, and numbers too large for a double
    throw ConfigError(std::string("spec is not valid JSON: ") + e.what());
  }
  if (!duplicate.empty()) throw ConfigError("spec gives the key '" + duplicate + "' twice in one object");
  if (!j.is_object()) throw ConfigError("spec must be a JSON object with a \"pipeline\" list");
  for (auto it = j.begin(); it != j.end(); ++it)
    if (it.key() != "seed" && it.key() != "pipeline")
      throw ConfigError("spec has an unknown key '" + it.key() + "' (expected seed and pipeline)");
  std::uint64_t seed = 0;
  if (j.contains("seed")) {
    const auto& s = j["seed"];
    if (!s.is_number_integer() || (!s.is_number_unsigned() && s.get<std::int64_t>() < 0))
      throw ConfigError("spec seed must be a non-negative integer");
    seed = s.get<std::uint64_t>();
  }
  if (!j.contains("pipeline")) throw ConfigError("spec has no \"pipeline\" list");
  struct BranchScope {
    Branches branches;
    Branches* saved = t_branches;
    BranchScope() { t_branches = &branches; }
    ~BranchScope() { t_branches = saved; }
  } branch_scope;
  survey(j["pipeline"], branch_scope.branches);
  bool bytes = false;
  SpecPipeline p = build_chain(j["pipeline"], "pipeline", &bytes);
  return Spec{seed, std::move(p), bytes};
}

}  // namespace dpipe
