// Non-template parts of a Run: layout resolution and snapshot checks.
#include <algorithm>
#include <cstdlib>
#include <string>

#include "dpipe/engine.hpp"
#include "dpipe/kit/node_kind.hpp"
#include "../serialize/json_text.hpp"

namespace dpipe {
namespace {

std::optional<int> env_int(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const long x = std::strtol(v, &end, 10);
  if (*end != '\0' || errno != 0 || x < 0 || x > 1'000'000)
    throw ConfigError(std::string("environment variable ") + name + "='" + v + "' is not a valid number");
  return static_cast<int>(x);
}

}  // namespace

void validate_layout(const Layout& l) {
  if (l.world_size < 1) throw ConfigError("world_size must be at least 1, got " + std::to_string(l.world_size));
  if (l.rank < 0 || l.rank >= l.world_size)
    throw ConfigError("rank " + std::to_string(l.rank) + " is outside world_size " + std::to_string(l.world_size));
  if (l.num_workers < 1 || l.num_workers > kMaxWorkers)
    throw ConfigError("num_workers must be between 1 and " + std::to_string(kMaxWorkers) + ", got " +
                      std::to_string(l.num_workers));
  if (!l.possible())
    throw ConfigError("world_size " + std::to_string(l.world_size) + " × " + std::to_string(l.num_workers) +
                      " workers is more instances than dpipe counts");
}

Layout layout_from_environment(int num_workers) {
  Layout l;
  l.num_workers = num_workers;
  auto rank = env_int("RANK");
  auto world = env_int("WORLD_SIZE");
  if (!rank && !world) {
    rank = env_int("OMPI_COMM_WORLD_RANK");
    world = env_int("OMPI_COMM_WORLD_SIZE");
  }
  if (rank.has_value() != world.has_value())
    throw ConfigError("the environment gives a rank without a world size (or the reverse)");
  if (rank) {
    l.rank = *rank;
    l.world_size = *world;
  }
  validate_layout(l);
  return l;
}

namespace detail {

Layout resolve_layout(const RunOptions& o) {
  Layout l = o.layout ? *o.layout : layout_from_environment(1);
  validate_layout(l);
  return l;
}

SnapshotMeta make_meta(const Graph& g, const RunOptions& o, const Layout& l, std::uint64_t delivered) {
  SnapshotMeta m;
  m.fingerprint = g.fingerprint();
  m.seed = o.seed;
  m.epoch = o.epoch;
  m.layout = l;
  m.elements_delivered = delivered;
  for (const auto& n : g.nodes()) m.graph.push_back({n.key, n.kind, n.element_type, segment_name(n.segment), n.params});
  return m;
}

namespace {

[[noreturn]] void refuse_graph(const std::string& what) {
  throw SnapshotError("snapshot was taken from a different pipeline: " + what);
}

/// The parameter a front end names its function with (Python's callables: "module.qualname", a lambda's
/// with a digest of its code); a resume may accept another when asked to, as an overridable parameter.
const std::string kFunctionParam = "callable";

/// The resume's overrides (ResumeOptions::overrides): which it names, and which it applied.
struct Overrides {
  const std::vector<std::string>& asked;
  std::vector<std::string> applied{};
  /// Whether the resume asks to override `param` of node `key` (its kind declares the parameter overridable).
  bool asks(const std::string& key, const std::string& param) const {
    return std::any_of(asked.begin(), asked.end(), [&](const std::string& a) { return a == param || a == key + "." + param; });
  }
};

/// Compares the snapshot's description of node `a` with this pipeline's node `b`: the first parameter that
/// differs is named. Tuning parameters may differ, and overridable ones the resume names (the saved values
/// go into `saved` for the fingerprint); a data file whose modification time differs is listed in `changed`.
void compare_node(const GraphNodeRecord& a, const GraphNode& b, const std::string& label, Params& saved,
                  std::vector<std::string>& changed, Overrides& overrides) {
  if (a.segment != segment_name(b.segment))
    refuse_graph(label + " runs in the " + segment_name(b.segment) + " segment here, in the " + a.segment +
                 " segment in the snapshot");
  const KindInfo* kind = find_kind(b.kind);
  saved = b.params;
  for (auto& [k, v] : saved) {
    const auto stored = std::find_if(a.params.begin(), a.params.end(), [&](const auto& p) { return p.first == k; });
    if (stored == a.params.end()) refuse_graph(label + ": " + k + " is " + v + ", the snapshot has no " + k);
    if (stored->second == v) continue;
    if (kind && kind->is_tuning(k)) {  // changes no element: restore into the new value
      v = stored->second;
      continue;
    }
    // A front end's function (Python's "callable": module.qualname, a lambda's code digest) is the user's
    // to vouch for, as overridable parameters are.
    const bool vouched = k == kFunctionParam;
    if ((vouched || (kind && kind->is_overridable(k))) && overrides.asks(b.key, k)) {  // asked for: what follows differs
      overrides.applied.push_back(b.key + "." + k + ": " + stored->second + " → " + v);
      v = stored->second;
      continue;
    }
    if (is_data_param(k) && data_file_key(stored->second) == data_file_key(v)) {
      // Same path and size. A snapshot that recorded no modification time cannot tell: accepted.
      if (data_file_key(stored->second) != stored->second)
        changed.push_back(label + ": " + v + ", the snapshot has " + stored->second);
      continue;
    }
    refuse_graph(label + ": " + k + " is " + v + ", the snapshot has " + stored->second +
                 (vouched ? " (another function: if it computes the same, resume with the override '" + k +
                                "', Python's Loader(same_function=True))"
                  : kind && kind->is_overridable(k) ? " (resume with the override '" + k + "' to change it)"
                                                    : ""));
  }
  for (const auto& [k, v] : a.params)
    if (std::none_of(b.params.begin(), b.params.end(), [&](const auto& p) { return p.first == k; }))
      refuse_graph(label + ": the snapshot has " + k + " = " + v + ", this pipeline has no " + k);
}

}  // namespace

std::string check_snapshot(const Snapshot& s, const Graph& g, const RunOptions& o, const Layout& l, const ResumeOptions& r) {
  const auto& m = s.meta;
  // The stored description first, node by node, so a refusal names what differs; then the fingerprint,
  // which also covers the edges.
  if (m.graph.size() != g.nodes().size())
    refuse_graph("the snapshot's graph has " + std::to_string(m.graph.size()) + " nodes, this pipeline's " +
                 std::to_string(g.nodes().size()));
  const bool details = std::all_of(m.graph.begin(), m.graph.end(), [](const auto& n) { return !n.segment.empty(); });
  std::vector<Params> saved(details ? m.graph.size() : 0);
  std::vector<std::string> changed;
  for (const std::string& name : r.overrides) {  // a name no node can override is a mistake, refused first
    const bool known = std::any_of(g.nodes().begin(), g.nodes().end(), [&](const GraphNode& n) {
      const KindInfo* kind = find_kind(n.kind);
      if (!kind) return false;
      for (const ParamSchema& p : kind->params)
        if (p.overridable && (name == p.name || name == n.key + "." + std::string(p.name))) return true;
      const bool has_function = std::any_of(n.params.begin(), n.params.end(), [](const auto& p) { return p.first == kFunctionParam; });
      return has_function && (name == kFunctionParam || name == n.key + "." + kFunctionParam);
    });
    if (!known)
      throw ConfigError("override '" + name + "': no node of this pipeline has an overridable parameter of that name (" +
                        "PARAM or KEY.PARAM; overridable: mix's weights, and a Python callable's 'callable')");
  }
  Overrides overrides{r.overrides};
  for (std::size_t i = 0; i < m.graph.size(); ++i) {
    const auto& a = m.graph[i];
    const auto& b = g.nodes()[i];
    if (a.key != b.key || a.kind != b.kind || a.element_type != b.element_type)
      refuse_graph(g.labels()[i] + " is " + b.key + " (" + b.kind + ", " + b.element_type + ") here and " + a.key +
                   " (" + a.kind + ", " + a.element_type + ") in the snapshot");
    if (details) compare_node(a, b, g.labels()[i], saved[i], changed, overrides);
  }
  const std::uint64_t expected = details ? g.fingerprint_with(saved) : g.fingerprint();
  if (m.fingerprint != expected)
    refuse_graph(std::string(details ? "every node and parameter matches, so the nodes are connected otherwise"
                                     : "the nodes match by kind and key, so a parameter or an edge differs") +
                 " (graph fingerprint " + hex64(m.fingerprint) + ", this pipeline's is " + hex64(expected) + ")");
  if (!changed.empty() && !r.allow_changed_data) {
    std::string list;
    for (const auto& c : changed) list += (list.empty() ? "" : "; ") + c;
    throw SnapshotError("data changed since the snapshot (same name and size, another modification time or digest): " + list +
                        ". Resume with allow_changed_data (the tool's --allow-changed-data) if the data is the same");
  }
  if (m.seed != o.seed)
    throw SnapshotError("snapshot was taken with seed " + std::to_string(m.seed) + ", this run has seed " +
                        std::to_string(o.seed));
  if (m.epoch != o.epoch)
    throw SnapshotError("snapshot was taken in epoch " + std::to_string(m.epoch) + ", this run is epoch " +
                        std::to_string(o.epoch));
  if (!(m.layout == l))
    throw SnapshotError("snapshot was taken with layout " + m.layout.to_string() + ", this run has layout " +
                        l.to_string() + " (restoring on another layout is a rescale, which must be asked for)");
  // The invariants each kind declares for its records, before any node is restored.
  std::map<std::string_view, std::size_t> records;  // key → place in the graph's pre-order
  for (std::size_t i = 0; i < m.graph.size(); ++i) records.emplace(m.graph[i].key, i);
  for (const auto& st : s.states) {
    if (st.mode == StateMode::replay)
      for (const auto& f : st.fields)
        if (f.name == "count" && f.type == FieldType::u64 && f.u > r.max_replay)
          throw SnapshotError(g.label_of(st.key) + " (instance " + std::to_string(st.instance) + ") would replay " +
                              std::to_string(f.u) + " elements, more than max_replay " + std::to_string(r.max_replay) +
                              " (ResumeOptions::max_replay, the tool's --max-replay)");
    const KindInfo* kind = find_kind(st.kind);
    const auto node = records.find(st.key);
    if (kind && kind->check_state && node != records.end())
      kind->check_state(st, m.graph[node->second], first_input_record(m.graph, node->second));
  }
  std::string history;
  if (const auto it = m.user_metadata.find(kOverridesKey); it != m.user_metadata.end()) history = it->second;
  // Where the change took effect: the user's step, else this rank's element, or the rescale the snapshot
  // came from (a rescaled rank starts its count at 0).
  std::string where = "at element " + std::to_string(m.elements_delivered);
  if (const auto it = m.user_metadata.find("rescaled_from"); it != m.user_metadata.end() && m.elements_delivered == 0)
    where = "at the rescale from " + it->second;
  if (m.step) where = "at step " + std::to_string(*m.step);
  for (const auto& change : overrides.applied) history += (history.empty() ? "" : "; ") + change + " " + where;
  return history;
}

KeyScheme key_scheme_of(const SnapshotMeta& m, const NodeDefBase& output) {
  const auto keys_match = [&](const Graph& g) {
    if (g.nodes().size() != m.graph.size()) return false;
    for (std::size_t i = 0; i < m.graph.size(); ++i)
      if (g.nodes()[i].key != m.graph[i].key) return false;
    return true;
  };
  // The scheme whose keys match; when none does, the file's own (pre-order for versions 1 to 3), so
  // that check_snapshot names the first node that differs rather than node 0 under other keys.
  if (m.graph.empty() || keys_match(Graph::build(output, KeyScheme::stable))) return KeyScheme::stable;
  if (keys_match(Graph::build(output, KeyScheme::pre_order))) return KeyScheme::pre_order;
  return m.format_version >= 1 && m.format_version <= 3 ? KeyScheme::pre_order : KeyScheme::stable;
}

void collect_node_stats(const IterBase& it, std::vector<NodeStats>& out) {
  NodeStats st;
  st.key = it.key();
  st.kind = it.kind();
  st.instance = it.instance();
  st.elements = it.produced();
  st.skipped = it.skipped_elements();
  st.seconds = static_cast<double>(it.busy_ns()) * 1e-9;
  std::uint64_t inner = 0;
  if (it.runs_inputs_inline())
    for (const IterBase* in : it.inputs()) inner += in->busy_ns();
  st.self_seconds = it.busy_ns() > inner ? static_cast<double>(it.busy_ns() - inner) * 1e-9 : 0.0;
  out.push_back(std::move(st));
  for (const IterBase* in : it.inputs()) collect_node_stats(*in, out);
}

}  // namespace detail
}  // namespace dpipe
