// JSON spec → typed Pipeline. Every op is checked here, when the spec is built, so a bad spec fails
// before anything runs, with the node's position and the parameter in the message.
#include "dpipe/spec.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <set>

#include "dpipe/builtins.hpp"
#include "dpipe/dpipe.hpp"
#include "../serialize/json_text.hpp"

namespace dpipe {
namespace {

using json = nlohmann::json;

template <class T>
constexpr int depth_of = 0;
template <class T>
constexpr int depth_of<std::vector<T>> = 1 + depth_of<T>;

template <class T>
std::string type_name() {
  if constexpr (std::is_same_v<T, SpecInt>) return "integer";
  else if constexpr (std::is_same_v<T, SpecStr>) return "string";
  else return "batch of " + type_name<typename T::value_type>();
}

std::string type_name_of(const AnyPipeline& p) {
  return std::visit([](const auto& q) { return type_name<typename std::decay_t<decltype(q)>::element_type>(); }, p);
}

/// Whether a JSON value, if an integer, is one a std::int64_t holds.
bool fits_int64(const json& v) {
  return !v.is_number_unsigned() || v.get<std::uint64_t>() <= static_cast<std::uint64_t>(INT64_MAX);
}

/// One node object of a spec: typed access to its parameters, and a check that none is unknown.
class NodeSpec {
 public:
  NodeSpec(const json& j, std::string where) : j_(j), where_(std::move(where)) {
    if (!j_.is_object()) throw ConfigError(where_ + ": a node must be a JSON object");
    const auto it = j_.find("op");
    if (it == j_.end() || !it->is_string()) throw ConfigError(where_ + ": the node has no \"op\" string");
    op = it->get<std::string>();
    used_.insert("op");
    name = string("name", "");
  }
  std::string op, name;

  [[noreturn]] void fail(const std::string& msg) const {
    throw ConfigError(where_ + " (" + node_label(op, name) + "): " + msg);
  }
  const json* get(const std::string& key) {
    used_.insert(key);
    const auto it = j_.find(key);
    return it == j_.end() ? nullptr : &*it;
  }
  std::int64_t integer(const std::string& key, std::optional<std::int64_t> dflt = std::nullopt) {
    const json* v = get(key);
    if (!v) {
      if (!dflt) fail("missing parameter '" + key + "'");
      return *dflt;
    }
    // JSON integers from 2^63 up parse as unsigned (is_number_integer() holds for them too).
    if (!fits_int64(*v)) fail("parameter '" + key + "' does not fit in a 64-bit signed integer");
    if (v->is_number_integer()) return v->get<std::int64_t>();
    fail("parameter '" + key + "' must be an integer, got " + std::string(v->type_name()));
  }
  std::optional<std::int64_t> optional_integer(const std::string& key) {
    if (!j_.contains(key) || j_.at(key).is_null()) {
      used_.insert(key);
      return std::nullopt;
    }
    return integer(key);
  }
  bool boolean(const std::string& key, bool dflt) {
    const json* v = get(key);
    if (!v) return dflt;
    if (!v->is_boolean()) fail("parameter '" + key + "' must be true or false");
    return v->get<bool>();
  }
  std::string string(const std::string& key, std::optional<std::string> dflt = std::nullopt) {
    const json* v = get(key);
    if (!v) {
      if (!dflt) fail("missing parameter '" + key + "'");
      return *dflt;
    }
    if (!v->is_string()) fail("parameter '" + key + "' must be a string");
    return v->get<std::string>();
  }
  /// Throws on a parameter this op does not take (a typo must not pass silently).
  void finish() const {
    for (auto it = j_.begin(); it != j_.end(); ++it)
      if (!used_.count(it.key())) fail("unknown parameter '" + it.key() + "'");
  }
  const std::string& where() const { return where_; }

 private:
  const json& j_;
  std::string where_;
  std::set<std::string> used_;
};

AnyPipeline build_chain(const json& chain, const std::string& where);

/// The `with` inputs of a multi-input node, each of the same element type as `first`.
template <class T>
std::vector<Pipeline<T>> other_inputs(NodeSpec& n, const AnyPipeline& first) {
  const json* with = n.get("with");
  if (!with) n.fail("missing parameter 'with' (a list of pipelines)");
  if (!with->is_array() || with->empty()) n.fail("'with' must be a non-empty list of pipelines");
  std::vector<Pipeline<T>> out;
  for (std::size_t i = 0; i < with->size(); ++i) {
    AnyPipeline q = build_chain((*with)[i], n.where() + ".with[" + std::to_string(i) + "]");
    if (q.index() != first.index())
      n.fail("input " + std::to_string(i + 1) + " yields " + type_name_of(q) + "s, the first input yields " +
             type_name_of(first) + "s");
    out.push_back(std::get<Pipeline<T>>(q));
  }
  return out;
}

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

std::vector<std::string> files_of(NodeSpec& n) {
  const json* f = n.get("files");
  if (!f || !f->is_array() || f->empty()) n.fail("missing parameter 'files' (a non-empty list of paths)");
  std::vector<std::string> out;
  for (const auto& x : *f) {
    if (!x.is_string()) n.fail("'files' must hold only paths (strings)");
    out.push_back(x.get<std::string>());
  }
  return out;
}

/// Spec elements are integers, strings and batches of them: a text block becomes the batch of its lines.
struct BlockToLines {
  std::vector<std::string> operator()(const TextBlock& b) const { return b.to_strings(); }
};

/// Records are bytes; specs print them as base64 strings.
struct ToBase64 {
  std::string operator()(const std::string& bytes) const {
    static const char* kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    std::string out;
    out.reserve((bytes.size() + 2) / 3 * 4);
    for (std::size_t i = 0; i < bytes.size(); i += 3) {
      const std::uint32_t b0 = static_cast<unsigned char>(bytes[i]);
      const std::uint32_t b1 = i + 1 < bytes.size() ? static_cast<unsigned char>(bytes[i + 1]) : 0;
      const std::uint32_t b2 = i + 2 < bytes.size() ? static_cast<unsigned char>(bytes[i + 2]) : 0;
      const std::uint32_t v = (b0 << 16) | (b1 << 8) | b2;
      out += kAlphabet[(v >> 18) & 63];
      out += kAlphabet[(v >> 12) & 63];
      out += i + 1 < bytes.size() ? kAlphabet[(v >> 6) & 63] : '=';
      out += i + 2 < bytes.size() ? kAlphabet[v & 63] : '=';
    }
    return out;
  }
  Params describe() const { return {{"fn", "base64"}}; }
};

AnyPipeline build_source(NodeSpec& n) {
  if (n.op == "range") {
    const auto start = n.integer("start", 0);
    const auto stop = n.integer("stop");
    const auto step = n.integer("step", 1);
    if (step == 0) n.fail("step must not be 0");
    return range(start, stop, {.step = step, .name = n.name});
  }
  if (n.op == "from_vector") {
    const json* v = n.get("values");
    if (!v || !v->is_array()) n.fail("missing parameter 'values' (a list of integers or of strings)");
    if (!v->empty() && (*v)[0].is_string()) {
      std::vector<SpecStr> s;
      for (const auto& x : *v) {
        if (!x.is_string()) n.fail("'values' mixes strings with other values");
        s.push_back(x.get<std::string>());
      }
      return from_vector(std::move(s), {.name = n.name});
    }
    std::vector<SpecInt> s;
    for (const auto& x : *v) {
      if (!x.is_number_integer()) n.fail("'values' must hold only integers or only strings");
      if (!fits_int64(x)) n.fail("'values' holds " + x.dump() + ", which does not fit in a 64-bit signed integer");
      s.push_back(x.get<SpecInt>());
    }
    return from_vector(std::move(s), {.name = n.name});
  }
  if (n.op == "generator") {
    const auto fn = n.string("fn");
    const auto count = n.integer("count");
    if (count < 0) n.fail("count must not be negative, got " + std::to_string(count));
    if (fn == "count") return generator(CountFactory{count}, {.name = n.name});
    if (fn == "random_ints") {
      const auto lo = n.integer("lo", 0);
      const auto hi = n.integer("hi");
      if (hi <= lo) n.fail("hi must be above lo");
      return generator(RandomIntsFactory{count, lo, hi}, {.name = n.name});
    }
    n.fail("unknown generator function '" + fn + "' (known: count, random_ints)");
  }
  if (n.op == "token_windows") {
    const auto dtype = n.string("dtype", "uint16");
    if (dtype != "uint16" && dtype != "uint32") n.fail("dtype must be uint16 or uint32, got '" + dtype + "'");
    const auto seq_len = n.integer("seq_len");
    if (seq_len < 1) n.fail("seq_len must be positive, got " + std::to_string(seq_len));
    return token_windows(files_of(n), {.dtype = dtype == "uint16" ? TokenType::uint16 : TokenType::uint32,
                                       .seq_len = seq_len,
                                       .name = n.name});
  }
  if (n.op == "lines" || n.op == "line_blocks") {
    const auto shards = n.integer("logical_shards", 64);
    if (shards < 1) n.fail("logical_shards must be positive, got " + std::to_string(shards));
    const auto epochs = n.integer("epochs", 1);
    if (epochs < 1) n.fail("epochs must be at least 1, got " + std::to_string(epochs));
    const bool shuffle_shards = n.boolean("shuffle_shards", true);
    if (n.op == "lines")
      return lines(files_of(n),
                   {.logical_shards = shards, .epochs = epochs, .shuffle_shards = shuffle_shards, .name = n.name});
    const auto block_bytes = n.integer("block_bytes", 64 << 10);
    if (block_bytes < 1) n.fail("block_bytes must be positive, got " + std::to_string(block_bytes));
    return line_blocks(files_of(n), {.logical_shards = shards,
                                     .epochs = epochs,
                                     .shuffle_shards = shuffle_shards,
                                     .block_bytes = block_bytes,
                                     .name = n.name}) |
           map(BlockToLines{});
  }
  if (n.op == "records") {
    const auto on_error = n.string("on_error", "fail");
    if (on_error != "fail" && on_error != "skip") n.fail("on_error must be fail or skip, got '" + on_error + "'");
    return records(files_of(n), {.on_error = on_error == "skip" ? OnDataError::skip : OnDataError::fail,
                                 .name = n.name});
  }
  n.fail("the first node must be a source (range, from_vector, generator, lines, line_blocks, records, token_windows), not '" + n.op + "'");
}

/// Applies a builtin map function through `apply(pipeline, fn)` (map or parallel_map).
template <class Apply>
AnyPipeline with_map_fn(NodeSpec& n, const AnyPipeline& in, bool concurrent, Apply apply) {
  const auto fn = n.string("fn");
  if (fn == "affine") {
    builtins::Affine f{n.integer("mul", 1), n.integer("add", 0)};
    auto* p = std::get_if<Pipeline<SpecInt>>(&in);
    if (!p) n.fail("affine takes integers, but its input yields " + type_name_of(in) + "s");
    return apply(*p, f);
  }
  if (fn == "identity") return std::visit([&](const auto& p) -> AnyPipeline { return apply(p, builtins::Identity{}); }, in);
  if (fn == "spin") {
    const auto ns = n.integer("ns");
    if (ns < 0 || ns > 1'000'000'000) n.fail("ns must be between 0 and 1e9, got " + std::to_string(ns));
    return std::visit([&](const auto& p) -> AnyPipeline { return apply(p, builtins::Spin(ns)); }, in);
  }
  if (fn == "throw_at") {
    if (concurrent) n.fail("throw_at counts positions, which a parallel_map does not have; use map");
    const auto index = n.integer("index");
    if (index < 0) n.fail("index must not be negative, got " + std::to_string(index));
    return std::visit([&](const auto& p) -> AnyPipeline { return apply(p, builtins::ThrowAt{index}); }, in);
  }
  n.fail("unknown map function '" + fn + "' (known: affine, identity, spin, throw_at)");
}

AnyPipeline apply_map(NodeSpec& n, const AnyPipeline& in) {
  return with_map_fn(n, in, false, [&](const auto& p, auto fn) -> AnyPipeline { return p | map(fn, {.name = n.name}); });
}

AnyPipeline apply_parallel_map(NodeSpec& n, const AnyPipeline& in) {
  const auto window = n.integer("max_in_flight", 64);
  if (window < 1 || window > (1 << 20)) n.fail("max_in_flight must be between 1 and 1048576, got " + std::to_string(window));
  return with_map_fn(n, in, true, [&](const auto& p, auto fn) -> AnyPipeline {
    return p | parallel_map(fn, {.max_in_flight = window, .name = n.name});
  });
}

/// Dereferences the shared elements of a broadcast: spec elements are small values, so the spec's
/// broadcast hands each worker its own copy after the shared hand-off.
struct Unshare {
  template <class T>
  T operator()(const std::shared_ptr<const T>& p) const {
    return *p;
  }
  Params describe() const { return {{"fn", "unshare"}}; }
};

AnyPipeline apply_node(NodeSpec& n, const AnyPipeline& in) {
  const std::string& op = n.op;
  const std::string& name = n.name;
  if (op == "map") return apply_map(n, in);
  if (op == "parallel_map") return apply_parallel_map(n, in);
  if (op == "dispatch") {
    const auto mode = n.string("mode", "round_robin");
    if (mode == "round_robin")
      return std::visit([&](const auto& p) -> AnyPipeline { return p | dispatch(round_robin, {.name = name}); }, in);
    if (mode == "broadcast")
      return std::visit(
          [&](const auto& p) -> AnyPipeline { return p | dispatch(broadcast, {.name = name}) | map(Unshare{}); }, in);
    n.fail("mode must be round_robin or broadcast, got '" + mode + "'");
  }
  if (op == "sampler") {
    const auto mode = n.string("shuffle", "global");
    if (mode != "global" && mode != "none") n.fail("shuffle must be global or none, got '" + mode + "'");
    const auto epochs = n.integer("epochs", 1);
    if (epochs < 1) n.fail("epochs must be at least 1, got " + std::to_string(epochs));
    try {
      return std::visit(
          [&](const auto& p) -> AnyPipeline {
            return p | sampler({.shuffle = mode == "global" ? SamplerShuffle::global : SamplerShuffle::none,
                                .epochs = epochs,
                                .name = name});
          },
          in);
    } catch (const ConfigError& e) {
      n.fail(std::string(e.what()) + " (place it right after range or from_vector)");
    }
  }
  if (op == "merge") return std::visit([&](const auto& p) -> AnyPipeline { return p | merge({.name = name}); }, in);
  if (op == "prefetch") {
    const auto depth = n.integer("depth", 8);
    if (depth < 1 || depth > (1 << 24)) n.fail("depth must be between 1 and 16777216, got " + std::to_string(depth));
    return std::visit([&](const auto& p) -> AnyPipeline { return p | prefetch({.depth = depth, .name = name}); }, in);
  }
  if (op == "filter") {
    const auto fn = n.string("fn");
    if (fn != "mod_eq") n.fail("unknown filter function '" + fn + "' (known: mod_eq)");
    const auto mod = n.integer("mod");
    const auto eq = n.integer("eq");
    if (mod <= 0) n.fail("mod must be positive, got " + std::to_string(mod));
    if (eq < 0 || eq >= mod) n.fail("eq must be in [0, mod), got " + std::to_string(eq));
    auto* p = std::get_if<Pipeline<SpecInt>>(&in);
    if (!p) n.fail("mod_eq takes integers, but its input yields " + type_name_of(in) + "s");
    return *p | filter(builtins::ModEq{mod, eq}, {.name = name});
  }
  if (op == "flat_map") {
    const auto fn = n.string("fn");
    if (fn == "replicate") {
      const auto times = n.integer("times");
      if (times < 0) n.fail("times must not be negative");
      return std::visit([&](const auto& p) -> AnyPipeline { return p | flat_map(builtins::Replicate{times}, {.name = name}); }, in);
    }
    if (fn == "range") {
      auto* p = std::get_if<Pipeline<SpecInt>>(&in);
      if (!p) n.fail("range takes integers, but its input yields " + type_name_of(in) + "s");
      return *p | flat_map(builtins::Iota{}, {.name = name});
    }
    n.fail("unknown flat_map function '" + fn + "' (known: replicate, range)");
  }
  if (op == "sharding_filter") {
    ShardingOptions o{.name = name};
    const auto level = n.string("level", "all");
    if (level == "all") o.level = ShardLevel::all;
    else if (level == "rank") o.level = ShardLevel::rank;
    else if (level == "worker") o.level = ShardLevel::worker;
    else n.fail("level must be all, rank or worker, got '" + level + "'");
    const auto shards = n.optional_integer("num_shards");
    const auto id = n.optional_integer("shard_id");
    if (shards.has_value() != id.has_value()) n.fail("num_shards and shard_id go together");
    if (shards) {
      if (*shards <= 0) n.fail("num_shards must be positive, got " + std::to_string(*shards));
      if (*id < 0 || *id >= *shards)
        n.fail("shard_id " + std::to_string(*id) + " must be in [0, num_shards = " + std::to_string(*shards) + ")");
      o.num_shards = *shards;
      o.shard_id = *id;
    }
    return std::visit([&](const auto& p) -> AnyPipeline { return p | sharding_filter(o); }, in);
  }
  if (op == "shuffle") {
    const auto buffer = n.integer("buffer");
    if (buffer <= 0) n.fail("buffer must be positive, got " + std::to_string(buffer));
    return std::visit([&](const auto& p) -> AnyPipeline { return p | shuffle({.buffer = buffer, .name = name}); }, in);
  }
  if (op == "batch") {
    const auto size = n.integer("size");
    const bool drop_last = n.boolean("drop_last", false);
    if (size <= 0) n.fail("size must be positive, got " + std::to_string(size));
    return std::visit(
        [&](const auto& p) -> AnyPipeline {
          using T = typename std::decay_t<decltype(p)>::element_type;
          if constexpr (depth_of<T> >= 2) n.fail("batches of batches of batches are deeper than specs go");
          else return p | batch({.size = size, .drop_last = drop_last, .name = name});
        },
        in);
  }
  if (op == "unbatch") {
    return std::visit(
        [&](const auto& p) -> AnyPipeline {
          using T = typename std::decay_t<decltype(p)>::element_type;
          if constexpr (depth_of<T> == 0) n.fail("unbatch takes batches, but its input yields " + type_name<T>() + "s");
          else return p | unbatch({.name = name});
        },
        in);
  }
  if (op == "take") {
    const auto count = n.integer("count");
    if (count < 0) n.fail("count must not be negative, got " + std::to_string(count));
    return std::visit([&](const auto& p) -> AnyPipeline { return p | take(count, {.name = name}); }, in);
  }
  if (op == "repeat") {
    const auto times = n.integer("times");
    if (times < 1) n.fail("times must be at least 1, got " + std::to_string(times));
    return std::visit([&](const auto& p) -> AnyPipeline { return p | repeat(times, {.name = name}); }, in);
  }
  if (op == "cycle") {
    const auto count = n.optional_integer("count");
    if (count && *count < 0) n.fail("count must not be negative, got " + std::to_string(*count));
    return std::visit([&](const auto& p) -> AnyPipeline { return p | cycle({.count = count, .name = name}); }, in);
  }
  if (op == "concat" || op == "mux" || op == "mux_longest" || op == "zip") {
    return std::visit(
        [&](const auto& p) -> AnyPipeline {
          using T = typename std::decay_t<decltype(p)>::element_type;
          auto others = other_inputs<T>(n, in);
          if (op == "concat") return p | concat_with(others, {.name = name});
          if (op == "mux") return p | mux_with(others, {.name = name});
          if (op == "mux_longest") return p | mux_longest_with(others, {.name = name});
          if constexpr (depth_of<T> >= 2) n.fail("zip of batches of batches is deeper than specs go");
          else {
            others.insert(others.begin(), p);
            return zip_all(others, {.name = name});
          }
        },
        in);
  }
  if (op == "range" || op == "from_vector" || op == "generator" || op == "lines" || op == "line_blocks" ||
      op == "records" || op == "token_windows")
    n.fail("a source can only start a pipeline (use concat, zip or mux with \"with\" to combine sources)");
  n.fail("unknown op '" + op + "'");
}

/// How deep pipelines may nest through 'with'. Building recurses once per level, so an unbounded depth
/// would end in a stack overflow instead of an error.
constexpr int kMaxNesting = 256;

AnyPipeline build_chain(const json& chain, const std::string& where) {
  static thread_local int depth = 0;
  struct Level {
    Level() { ++depth; }
    ~Level() { --depth; }
  } level;
  if (depth > kMaxNesting + 1)  // the outermost pipeline is not nested
    throw ConfigError(where + ": pipelines nest more than " + std::to_string(kMaxNesting) + " levels deep through 'with'");
  if (!chain.is_array() || chain.empty()) throw ConfigError(where + ": a pipeline must be a non-empty list of nodes");
  std::optional<AnyPipeline> p;
  bool bytes = false;  // the elements are records' bytes, shown as base64 once the random access is done
  for (std::size_t i = 0; i < chain.size(); ++i) {
    NodeSpec n(chain[i], where + "[" + std::to_string(i) + "]");
    if (i == 0) {
      p = build_source(n);
      bytes = n.op == "records";
    } else {
      if (bytes && n.op != "sampler") {
        p = std::get<Pipeline<SpecStr>>(*p) | map(ToBase64{});
        bytes = false;
      }
      p = apply_node(n, *p);
    }
    n.finish();
  }
  if (bytes) p = std::get<Pipeline<SpecStr>>(*p) | map(ToBase64{});
  return *p;
}

}  // namespace

void append_element_json(std::string& out, const SpecStr& v) { append_json_string(out, v); }

Spec parse_spec(std::string_view text) {
  json j;
  try {
    j = json::parse(text.begin(), text.end());
  } catch (const json::parse_error& e) {
    throw ConfigError(std::string("spec is not valid JSON: ") + e.what());
  }
  if (!j.is_object()) throw ConfigError("spec must be a JSON object with a \"pipeline\" list");
  for (auto it = j.begin(); it != j.end(); ++it)
    if (it.key() != "seed" && it.key() != "pipeline")
      throw ConfigError("spec has an unknown key '" + it.key() + "' (expected seed and pipeline)");
  Spec s{0, range(0)};
  if (j.contains("seed")) {
    const auto& seed = j["seed"];
    if (!seed.is_number_integer() || (seed.is_number_integer() && !seed.is_number_unsigned() && seed.get<std::int64_t>() < 0))
      throw ConfigError("spec seed must be a non-negative integer");
    s.seed = seed.get<std::uint64_t>();
  }
  if (!j.contains("pipeline")) throw ConfigError("spec has no \"pipeline\" list");
  s.pipeline = build_chain(j["pipeline"], "pipeline");
  return s;
}

}  // namespace dpipe
