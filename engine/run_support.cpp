// Non-template parts of a Run: layout resolution and snapshot checks.
#include <cstdlib>
#include <string>

#include "dpipe/engine.hpp"
#include "dpipe/node_kind.hpp"
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
  if (l.num_workers < 1 || l.num_workers > 4096)
    throw ConfigError("num_workers must be between 1 and 4096, got " + std::to_string(l.num_workers));
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

void check_snapshot(const Snapshot& s, const Graph& g, const RunOptions& o, const Layout& l) {
  const auto& m = s.meta;
  if (m.fingerprint != g.fingerprint()) {
    std::string detail;
    if (m.graph.size() != g.nodes().size()) {
      detail = "the snapshot's graph has " + std::to_string(m.graph.size()) + " nodes, this pipeline's " +
               std::to_string(g.nodes().size());
    } else {
      for (std::size_t i = 0; i < m.graph.size(); ++i) {
        const auto& a = m.graph[i];
        const auto& b = g.nodes()[i];
        if (a.key != b.key || a.kind != b.kind || a.element_type != b.element_type) {
          detail = "node " + std::to_string(i) + " is " + a.key + " (" + a.kind + ", " + a.element_type +
                   ") in the snapshot and " + b.key + " (" + b.kind + ", " + b.element_type + ") here";
          break;
        }
      }
      if (detail.empty()) detail = "the nodes match by kind and key, so a parameter or an edge differs";
    }
    throw SnapshotError("snapshot was taken from a different pipeline (graph fingerprint " + hex64(m.fingerprint) +
                        ", this pipeline's is " + hex64(g.fingerprint()) + "): " + detail);
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
  std::map<std::string_view, const GraphNodeRecord*> records;
  for (const auto& n : m.graph) records.emplace(n.key, &n);
  for (const auto& st : s.states) {
    const KindInfo* kind = find_kind(st.kind);
    const auto node = records.find(st.key);
    if (kind && kind->check_state && node != records.end()) kind->check_state(st, *node->second);
  }
}

void collect_node_stats(const IterBase& it, std::vector<NodeStats>& out) {
  NodeStats st;
  st.key = it.key();
  st.kind = it.kind();
  st.instance = it.instance();
  st.elements = it.produced();
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
