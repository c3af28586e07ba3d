// The JSON spec front end: reads a spec, and for each node the op's parameters, which it hands to the
// node kind's own builder (`XKind::from_spec`, in the kind's header). The op table is made from the list
// of kinds (dpipe/kinds.hpp, in parts: ops.cpp); the functions a spec names by "fn" are this front end's
// builtins (json_node.hpp).
#include <algorithm>
#include <iterator>
#include <utility>

#include "json_node.hpp"

namespace dpipe {
namespace json_spec_detail {
namespace {

const std::vector<OpEntry>& ops() {
  static const std::vector<OpEntry> table = [] {
    std::vector<std::pair<std::size_t, OpEntry>> all;
    [&]<std::size_t... Part>(std::index_sequence<Part...>) {
      (std::ranges::copy(op_part<Part>(), std::back_inserter(all)), ...);
    }(std::make_index_sequence<kOpParts>{});
    std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    std::vector<OpEntry> v;
    for (auto& [index, e] : all) v.push_back(e);
    return v;
  }();
  return table;
}

const OpEntry* find_op(std::string_view name) {
  for (const auto& op : ops())
    if (op.name == name) return &op;
  return nullptr;
}

/// Records are bytes; JSON shows them as base64 strings.
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

/// The message of a node's own ConfigError without the node's label, which the position replaces.
std::string reason_of(const ConfigError& e, const std::string& label) {
  const std::string what = e.what();
  const std::string prefix = label + ": ";
  return what.rfind(prefix, 0) == 0 ? what.substr(prefix.size()) : what;
}

}  // namespace

/// How deep pipelines may nest through 'with'. Building recurses once per level, so an unbounded depth
/// would end in a stack overflow instead of an error.
constexpr int kMaxNesting = 256;

SpecPipeline build_chain(const json& chain, const std::string& where) {
  static thread_local int depth = 0;
  struct Level {
    Level() { ++depth; }
    ~Level() { --depth; }
  } level;
  if (depth > kMaxNesting + 1)  // the outermost pipeline is not nested
    throw PositionedError(where + ": pipelines nest more than " + std::to_string(kMaxNesting) + " levels deep through 'with'");
  if (!chain.is_array() || chain.empty())
    throw PositionedError(where + ": a pipeline must be a non-empty list of nodes");
  std::optional<SpecPipeline> p;
  bool bytes = false;  // the elements are bytes, shown as base64 once the sampler (if any) is past
  for (std::size_t i = 0; i < chain.size(); ++i) {
    if (bytes && i > 0) {
      const auto& node = chain[i];
      const OpEntry* next = node.is_object() && node.contains("op") && node["op"].is_string()
                                ? find_op(node["op"].get<std::string>())
                                : nullptr;
      if (!next || !next->reads_by_index) {
        p = p->get<std::string>() | map(ToBase64{});
        bytes = false;
      }
    }
    JsonNode n(chain[i], where + "[" + std::to_string(i) + "]", p ? &*p : nullptr);
    const OpEntry* op = find_op(n.op());
    if (!op) n.fail("unknown op '" + n.op() + "'");
    if (i == 0 && !op->source) {
      std::string sources;
      for (const auto& o : ops())
        if (o.source) sources += (sources.empty() ? "" : ", ") + std::string(o.name);
      n.fail("the first node must be a source (" + sources + "), not '" + n.op() + "'");
    }
    if (i > 0 && op->source)
      n.fail("a source can only start a pipeline (use concat, zip or mux with \"with\" to combine sources)");
    try {
      p = op->build(n);
    } catch (const PositionedError&) {
      throw;
    } catch (const ConfigError& e) {
      n.fail(reason_of(e, node_label(n.op(), n.name())));
    }
    n.finish();
    bytes = bytes || n.bytes_marked();
  }
  if (bytes) p = p->get<std::string>() | map(ToBase64{});
  return *p;
}

}  // namespace json_spec_detail

using json_spec_detail::json;

std::vector<std::string> spec_ops() {
  using json_spec_detail::ops;
  std::vector<std::string> v;
  for (const auto& op : ops()) v.emplace_back(op.name);
  return v;
}

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
  std::uint64_t seed = 0;
  if (j.contains("seed")) {
    const auto& s = j["seed"];
    if (!s.is_number_integer() || (!s.is_number_unsigned() && s.get<std::int64_t>() < 0))
      throw ConfigError("spec seed must be a non-negative integer");
    seed = s.get<std::uint64_t>();
  }
  if (!j.contains("pipeline")) throw ConfigError("spec has no \"pipeline\" list");
  return Spec{seed, json_spec_detail::build_chain(j["pipeline"], "pipeline")};
}

}  // namespace dpipe
