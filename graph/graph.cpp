// The only translation unit that includes Boost.Graph.
#include "dpipe/graph.hpp"
#include "dpipe/kit/node_kind.hpp"

#include <boost/config.hpp>
#include <boost/graph/adjacency_list.hpp>
#include <boost/graph/graphviz.hpp>
#include <boost/graph/topological_sort.hpp>

#include <algorithm>
#include <cstdio>
#include <iterator>
#include <map>
#include <set>
#include <sstream>

namespace dpipe {
namespace {

using BoostGraph = boost::adjacency_list<boost::vecS, boost::vecS, boost::bidirectionalS>;

bool valid_name(const std::string& n) {
  if (n.empty() || n.size() > 128) return false;
  for (char c : n)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.')) return false;
  return true;
}

/// How messages name a node once it has its place: "pipeline[3] (batch 'b')".
std::string label(const GraphNode& n) { return n.place + " (" + node_label(n.kind, n.name) + ")"; }

/// The nodes of several outputs and their `from` nodes met so far: each may stand once in a graph. A
/// second meeting is recorded (the node index it got, not walked again) and refused once nodes have places.
struct Branching {
  std::set<const NodeDefBase*> met;
  std::vector<std::size_t> again;
};

void walk(const NodeDefBase& def, std::vector<GraphNode>& nodes, std::vector<const NodeDefBase*>& defs,
          Branching& branching, std::size_t depth) {
  if (depth > 10'000) throw ConfigError("pipeline is nested more than 10000 nodes deep");
  const bool again = (def.outputs() > 1 || def.reads()) && !branching.met.insert(&def).second;
  const std::size_t index = nodes.size();
  if (again) branching.again.push_back(index);
  GraphNode& n = nodes.emplace_back();
  n.kind = def.kind();
  n.name = def.name();
  n.place = def.place();
  n.element_type = def.element_type_tag();
  n.params = def.params();
  n.outputs = def.outputs();
  defs.push_back(&def);
  if (again) return;  // its inputs stand where it was met first
  for (const auto& in : def.inputs()) {
    if (!in) throw ConfigError(node_label(def.kind(), def.name()) + ": an input is missing");
    const std::size_t child = nodes.size();
    nodes[index].inputs.push_back(child);
    walk(*in, nodes, defs, branching, depth + 1);
  }
}

/// Gives every node a place: one its front end set, else its consumer's when it feeds input 0 of a placed
/// node (an op of a spec built of several nodes), else counted from the source along its chain: input 0
/// continues a node's chain, input k >= 1 starts the chain "<node's place>.with[k-1]", the output's chain
/// is "pipeline".
void assign_places(std::vector<GraphNode>& nodes) {
  const std::size_t n = nodes.size();
  std::vector<std::size_t> parent(n, GraphNode::kNone), slot(n, 0), chain(n, 0), depth(n, 0);
  std::vector<std::size_t> chain_length{1};  // chain 0: the output's
  std::vector<std::pair<std::size_t, std::size_t>> chain_start{{GraphNode::kNone, 0}};  // (node, input)
  for (std::size_t i = 0; i < n; ++i) {  // pre-order: a node comes before its inputs
    for (std::size_t k = 0; k < nodes[i].inputs.size(); ++k) {
      const std::size_t c = nodes[i].inputs[k];
      parent[c] = i;
      slot[c] = k;
      if (k == 0) {
        chain[c] = chain[i];
        depth[c] = depth[i] + 1;
      } else {
        chain[c] = chain_length.size();
        chain_length.push_back(1);
        chain_start.push_back({i, k});
      }
      chain_length[chain[c]] = std::max(chain_length[chain[c]], depth[c] + 1);
    }
  }
  const bool front_end = std::any_of(nodes.begin(), nodes.end(), [](const GraphNode& g) { return !g.place.empty(); });
  for (std::size_t i = 0; i < n; ++i) {  // pre-order: a consumer's place is known before its inputs'
    if (!nodes[i].place.empty()) continue;
    if (front_end && parent[i] != GraphNode::kNone && slot[i] == 0) {
      nodes[i].place = nodes[parent[i]].place;
      continue;
    }
    const auto [start, input] = chain_start[chain[i]];
    const std::string name =
        start == GraphNode::kNone ? "pipeline" : nodes[start].place + ".with[" + std::to_string(input - 1) + "]";
    nodes[i].place = name + "[" + std::to_string(chain_length[chain[i]] - 1 - depth[i]) + "]";
  }
}

/// Joins each `from` node to the node it reads; refuses an output read while its node is not in the
/// graph, and a node of several outputs with an output nobody reads.
void link_branches(std::vector<GraphNode>& nodes, const std::vector<const NodeDefBase*>& defs) {
  std::map<const NodeDefBase*, std::size_t> index_of;
  for (std::size_t i = 0; i < defs.size(); ++i) index_of.emplace(defs[i], i);
  std::map<std::size_t, std::set<std::size_t>> read;
  for (std::size_t i = 0; i < defs.size(); ++i) {
    const NodeDefBase* owner = defs[i]->reads();
    if (!owner) continue;
    const auto it = index_of.find(owner);
    const std::string label = it == index_of.end() ? node_label(owner->kind(), owner->name()) : dpipe::label(nodes[it->second]);
    if (it == index_of.end())
      throw ConfigError("output " + std::to_string(defs[i]->reads_output()) + " of " + label + " is read, but " + label +
                        " itself is not in the pipeline: its output 0 (the node itself) must be read too");
    nodes[i].reads = it->second;
    nodes[i].output = defs[i]->reads_output();
    if (!read[it->second].insert(nodes[i].output).second)  // two from nodes of one output
      throw ConfigError("output " + std::to_string(nodes[i].output) + " of " + label +
                        " is read twice; each output feeds one consumer (fork it again to read it twice)");
  }
  for (std::size_t i = 0; i < nodes.size(); ++i)
    for (std::size_t k = 1; k < nodes[i].outputs; ++k)
      if (!read[i].count(k))
        throw ConfigError(label(nodes[i]) + ": output " + std::to_string(k) +
                          " is never read; every output must be (the node would hold its elements until its buffer "
                          "fills): give a smaller count or read it");
}

/// Edges data flows along, input → consumer: inputs, and from each node of several outputs to its `from`s.
BoostGraph flow_graph(const std::vector<GraphNode>& nodes) {
  BoostGraph bg(nodes.size());
  for (std::size_t v = 0; v < nodes.size(); ++v) {
    for (std::size_t in : nodes[v].inputs) boost::add_edge(in, v, bg);
    if (nodes[v].reads != GraphNode::kNone) boost::add_edge(nodes[v].reads, v, bg);
  }
  return bg;
}

/// Keys that depend only on what lies upstream of a node (docs/snapshot-format.md, "Node keys"): a
/// named node's key is its name; an unnamed one's is its kind and a digest of its kind, element type
/// and inputs' digests (a named input contributes its name only). Parameters are left out: a changed
/// parameter is refused by name on resume, not as another node. Nodes added downstream or in another
/// branch leave a digest as it was. Equal digests (subgraphs of one shape, such as the two sides of
/// `zip(range | shuffle, range | shuffle)`) are numbered in pre-order: the first keeps the plain key,
/// then `.2`, `.3`.
/// A `from` node's digest is its kind's and element type's, the digest of the node it reads and the output.
void assign_stable_keys(std::vector<GraphNode>& nodes, const std::vector<std::size_t>& topo) {
  std::vector<std::uint64_t> digest(nodes.size());
  for (const std::size_t i : topo) {  // every node after its inputs and the node it reads
    const GraphNode& n = nodes[i];
    std::uint64_t h = fnv1a("dpipe-key-v1");
    auto add = [&h](std::string_view s) { h = mix64(mix64(h ^ fnv1a(s)) ^ s.size()); };
    if (!n.name.empty()) {
      add("name");
      add(n.name);
    } else {
      add(n.kind);
      add(n.element_type);
      for (std::size_t in : n.inputs) h = mix64(h ^ digest[in]);
      h = mix64(h ^ n.inputs.size());
      if (n.reads != GraphNode::kNone) h = mix64(mix64(h ^ digest[n.reads]) ^ n.output);
    }
    digest[i] = h;
  }
  std::map<std::string, std::size_t> seen;
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    GraphNode& n = nodes[i];
    if (!n.name.empty()) {
      n.key = n.name;
      continue;
    }
    char hex[9];
    std::snprintf(hex, sizeof hex, "%08llx", static_cast<unsigned long long>(digest[i] >> 32));
    const std::string base = n.kind + "@" + hex;
    const std::size_t count = ++seen[base];
    n.key = count == 1 ? base : base + "." + std::to_string(count);
  }
}

/// The keys of format versions 1 to 3: the name, or the kind and the node's pre-order index.
void assign_pre_order_keys(std::vector<GraphNode>& nodes) {
  for (std::size_t i = 0; i < nodes.size(); ++i)
    nodes[i].key = nodes[i].name.empty() ? nodes[i].kind + "@" + std::to_string(i) : nodes[i].name;
}

/// Checks where the segment boundaries stand (DESIGN §4): at most one merge; dispatch only in the
/// worker segment; prefetch only where the worker segment ends; no boundary below a cycle, which
/// rebuilds its upstream every pass.
/// Also records each node's segment.
/// A node's graph role, as its kind declares it (a user's own kind, or none: no role).
const KindInfo& role_of(const GraphNode& n) {
  static const KindInfo none{};
  const KindInfo* k = find_kind(n.kind);
  return k ? *k : none;
}

void check_segments(std::vector<GraphNode>& nodes) {
  std::size_t merges = 0;
  std::string merge_kind;
  for (const auto& n : nodes)
    if (role_of(n).segment == SegmentRole::ends_workers) {
      ++merges;
      merge_kind = n.kind;
    }
  if (merges > 1)
    throw ConfigError("the pipeline has " + std::to_string(merges) + " " + merge_kind + " nodes; a pipeline has at most one");
  using Seg = Segment;
  struct Frame {
    std::size_t node;
    Seg seg;
    std::string cycle;  // label of an enclosing cycle, empty if none
    std::size_t scope;  // the nearest dispatch or merge above it, or kNone
  };
  std::vector<std::size_t> scope(nodes.size(), GraphNode::kNone);
  std::vector<Frame> stack{{0, merges ? Seg::suffix : Seg::worker, {}, GraphNode::kNone}};
  while (!stack.empty()) {
    const Frame f = stack.back();
    stack.pop_back();
    GraphNode& n = nodes[f.node];
    n.segment = f.seg;  // merge itself runs after the workers, dispatch once per worker
    scope[f.node] = f.scope;
    const std::string label = dpipe::label(n);
    const KindInfo& role = role_of(n);
    if (!f.cycle.empty() && (n.outputs > 1 || n.reads != GraphNode::kNone))
      throw ConfigError(f.cycle + ": it rebuilds its upstream every pass, so it cannot contain " +
                        (n.reads != GraphNode::kNone ? "a branch read from " + dpipe::label(nodes[n.reads])
                                                     : label));
    const std::size_t below_scope =
        role.segment == SegmentRole::ends_workers || role.segment == SegmentRole::starts_workers ? f.node : f.scope;
    Seg below = f.seg;
    if (role.segment == SegmentRole::ends_workers) {
      below = Seg::worker;
    } else if (role.segment == SegmentRole::starts_workers) {
      if (f.seg != Seg::worker)
        throw ConfigError(label + ": " + n.kind + " starts the worker segment, so it must stand before the node that "
                                  "ends it (merge) and not in another " + n.kind + "'s prefix");
      below = Seg::prefix;
    } else if (role.segment == SegmentRole::worker_depth) {
      const bool ends_workers = f.seg == Seg::worker && (f.node == 0 || [&] {
        for (const auto& m : nodes)
          if (role_of(m).segment == SegmentRole::ends_workers && !m.inputs.empty() && m.inputs[0] == f.node) return true;
        return false;
      }());
      if (!ends_workers)
        throw ConfigError(label + ": " + n.kind + " sets the depth of the worker queues, so it must be the last node "
                                  "before merge (or of the pipeline)");
    }
    if (!f.cycle.empty() && (role.segment == SegmentRole::ends_workers || role.segment == SegmentRole::starts_workers))
      throw ConfigError(f.cycle + ": it rebuilds its upstream every pass, so it cannot contain " + label);
    const std::string cycle = role.restarts_upstream && f.cycle.empty() ? label : f.cycle;
    for (std::size_t in : n.inputs) stack.push_back({in, below, cycle, below_scope});
  }
  // The outputs of one node share its queues on one thread: a `from` stands where the node stands.
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    const GraphNode& n = nodes[i];
    if (n.reads == GraphNode::kNone || scope[i] == scope[n.reads]) continue;
    const GraphNode& owner = nodes[n.reads];
    throw ConfigError("output " + std::to_string(n.output) + " of " + label(owner) + " is read in the " +
                      segment_name(n.segment) + " segment" + (scope[i] == GraphNode::kNone ? "" : " of " + label(nodes[scope[i]])) +
                      ", the node stands in the " + segment_name(owner.segment) + " segment" +
                      (scope[n.reads] == GraphNode::kNone ? "" : " of " + label(nodes[scope[n.reads]])) +
                      ": read every output of a node on the same side of dispatch and merge");
  }
}

/// How the stream out of a node is split between the instances: the levels it is dealt over (by a
/// dealing source, a level-based sharding_filter, a round-robin dispatch) and the levels covered on
/// purpose (dealt, broadcast by dispatch, or marked with replicate); whether a source every instance
/// reads in full feeds it.
struct Flow {
  static constexpr unsigned kRank = Split::kRank, kWorker = Split::kWorker;
  unsigned dealt = 0, covered = 0;
  std::size_t dealer = 0;       // the node that dealt it (for messages)
  std::string full_source;      // label of a source read in full, if any
};

/// Split levels with kSegment resolved to the levels of the node's segment.
unsigned levels_of(const GraphNode& n, unsigned levels) {
  if (levels & Split::kSegment)
    levels = (levels & ~Split::kSegment) | (n.segment == Segment::worker ? Flow::kRank | Flow::kWorker : Flow::kRank);
  return levels;
}

std::string describe_levels(unsigned levels) {
  return levels == (Flow::kRank | Flow::kWorker) ? "every rank and worker" : levels == Flow::kRank ? "the ranks" : "the workers";
}

/// Computes every node's Flow (in topological order: inputs before the nodes that read them) and
/// refuses a level-based sharding_filter after a node that already deals its stream over that level.
std::vector<Flow> sharding_flows(const std::vector<GraphNode>& nodes, const std::vector<std::size_t>& topo) {
  std::vector<Flow> flows(nodes.size());
  for (const std::size_t i : topo) {
    const GraphNode& n = nodes[i];
    Flow& f = flows[i];
    if (n.reads != GraphNode::kNone) {  // a branch of a node of several outputs: split as that node
      f = flows[n.reads];
      continue;
    }
    const KindInfo* kind = find_kind(n.kind);
    const std::string label = dpipe::label(n);
    if (kind && kind->deals) {  // its input, if any, is read by index through it, never in full
      f.dealt = f.covered = n.segment == Segment::worker ? Flow::kRank | Flow::kWorker : Flow::kRank;
      f.dealer = i;
      flows[i] = f;
      continue;
    }
    if (n.inputs.empty()) {
      if (kind && kind->source) f.full_source = label;
      continue;
    }
    f = flows[n.inputs.front()];
    for (std::size_t k = 1; k < n.inputs.size(); ++k) {  // several inputs: split only as far as all are
      const Flow& g = flows[n.inputs[k]];
      f.dealt &= g.dealt;
      f.covered &= g.covered;
      if (f.full_source.empty()) f.full_source = g.full_source;
    }
    if (!kind || !kind->split) continue;
    const Split split = kind->split(n.params);
    if (split.by_hand) {  // the user splits the stream by hand, or copies it on purpose
      f.covered = Flow::kRank | Flow::kWorker;
      continue;
    }
    if (const unsigned levels = levels_of(n, split.shards)) {
      if (f.dealt & levels)
        throw ConfigError(label + " shards over " + describe_levels(levels) + ", but " + dpipe::label(nodes[f.dealer]) + " already deals its stream to " + describe_levels(f.dealt) +
                          ": each instance would keep a fraction of its own share and the rest would be lost. "
                          "Remove the " + n.kind);
      f.dealt |= levels;
      f.covered |= levels;
      f.dealer = i;
    }
    if (const unsigned levels = levels_of(n, split.deals)) {
      f.dealt |= levels;
      f.dealer = i;
    }
    f.covered |= levels_of(n, split.covers);
  }
  return flows;
}

}  // namespace

Graph Graph::build(const NodeDefBase& output, KeyScheme scheme) {
  Graph g;
  Branching branching;
  walk(output, g.nodes_, g.defs_, branching, 0);
  assign_places(g.nodes_);
  for (const std::size_t i : branching.again) {  // an output read twice, named where its node stands
    const NodeDefBase* owner = g.defs_[i]->reads() ? g.defs_[i]->reads() : g.defs_[i];
    const auto first = std::find(g.defs_.begin(), g.defs_.end(), owner);
    throw ConfigError("output " + std::to_string(g.defs_[i]->reads_output()) + " of " +
                      (first == g.defs_.end() ? node_label(owner->kind(), owner->name())
                                              : label(g.nodes_[static_cast<std::size_t>(first - g.defs_.begin())])) +
                      " is read twice; each output feeds one consumer (fork it again to read it twice)");
  }
  link_branches(g.nodes_, g.defs_);
  {
    const BoostGraph bg = flow_graph(g.nodes_);
    std::vector<BoostGraph::vertex_descriptor> order;
    try {
      boost::topological_sort(bg, std::back_inserter(order));
    } catch (const boost::not_a_dag&) {
      throw ConfigError("the pipeline graph has a cycle");
    }
    g.topo_.assign(order.rbegin(), order.rend());
  }
  if (scheme == KeyScheme::stable) assign_stable_keys(g.nodes_, g.topo_);
  else assign_pre_order_keys(g.nodes_);

  std::set<std::string> names;
  for (const auto& n : g.nodes_) {
    if (n.name.empty()) continue;
    if (!valid_name(n.name))
      throw ConfigError(label(n) +
                        ": a node name must be 1 to 128 letters, digits, '_', '-' or '.'");
    if (n.name == "run")  // the key of the engine's own record in every snapshot
      throw ConfigError(label(n) + ": the name 'run' is reserved by the engine's snapshots");
    if (!names.insert(n.name).second)
      throw ConfigError("the name '" + n.name + "' is used by more than one node; node names must be unique");
  }
  for (const auto& n : g.nodes_) {
    // An unnamed key could collide with a name written like a key.
    if (n.name.empty() && names.count(n.key))
      throw ConfigError("the name '" + n.key + "' collides with the key of an unnamed node");
    g.keys_.push_back(n.key);
    g.labels_.push_back(label(n));
  }

  check_segments(g.nodes_);
  {
    const std::vector<Flow> flows = sharding_flows(g.nodes_, g.topo_);
    g.full_source_ = flows.front().full_source;
    g.covered_levels_ = flows.front().covered;
  }
  for (const auto& n : g.nodes_) g.has_merge_ = g.has_merge_ || role_of(n).segment == SegmentRole::ends_workers;

  g.fingerprint_ = g.fingerprint_with({});
  return g;
}

std::string Graph::label_of(const std::string& key) const { return label_in(&keys_, &labels_, key); }

std::uint64_t Graph::fingerprint_with(const std::vector<Params>& params) const {
  std::uint64_t h = fnv1a("dpipe-graph-v1");
  auto add = [&h](std::string_view s) {
    h = mix64(h ^ fnv1a(s));
    h = mix64(h ^ s.size());
  };
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    const auto& n = nodes_[i];
    add(n.kind);
    add(n.name);
    add(n.element_type);
    for (const auto& [k, v] : i < params.size() ? params[i] : n.params) {
      add(k);
      if (is_data_param(k)) add(data_file_key(v));
      else add(v);
    }
    add("inputs");
    for (std::size_t in : n.inputs) h = mix64(h ^ in);
    if (n.reads != GraphNode::kNone) {  // only branches add to it: other graphs keep their fingerprints
      add("reads");
      h = mix64(mix64(h ^ n.reads) ^ n.output);
    }
  }
  return h;
}

std::optional<std::uint64_t> Graph::length(const Layout& layout, std::string* why) const {
  std::string unknown;  // the first node that cannot say
  // A sum of workers' streams; past 2^64 - 1 it cannot be said either.
  const auto add = [&](std::optional<std::uint64_t> sum, std::uint64_t part) -> std::optional<std::uint64_t> {
    std::uint64_t out = 0;
    if (!sum || __builtin_add_overflow(*sum, part, &out)) {
      if (sum) unknown = "the workers together deliver more than 2^64 - 1 elements";
      return std::nullopt;
    }
    return out;
  };
  const auto length_of = [&](const auto& self, std::size_t i, int worker) -> std::optional<std::uint64_t> {
    const GraphNode& n = nodes_[i];
    if (n.reads != GraphNode::kNone) return self(self, n.reads, worker);  // a branch: as long as the node it reads
    const KindInfo& role = role_of(n);
    if (role.segment == SegmentRole::ends_workers) {  // merge: every worker's stream
      std::optional<std::uint64_t> sum = 0;
      for (int w = 0; w < layout.num_workers && sum; ++w) {
        const auto part = self(self, n.inputs.at(0), w);
        if (!part) return std::nullopt;
        sum = add(sum, *part);
      }
      return sum;
    }
    if (role.segment == SegmentRole::starts_workers) {
      unknown = label(n) + " hands its stream to the workers in an order only the run decides";
      return std::nullopt;
    }
    std::vector<std::uint64_t> inputs;
    for (std::size_t in : n.inputs) {
      const auto part = self(self, in, worker);
      if (!part) return std::nullopt;
      inputs.push_back(*part);
    }
    const KindInfo* kind = find_kind(n.kind);
    const LengthAt at{.rank = layout.rank, .world_size = layout.world_size, .worker = worker,
                      .num_workers = layout.num_workers, .worker_segment = n.segment == Segment::worker};
    const auto out = kind && kind->length ? kind->length(n.params, inputs, at) : std::nullopt;
    if (!out) unknown = label(n) + " cannot say how many elements it gives";
    return out;
  };
  std::optional<std::uint64_t> total;
  if (has_merge_) {
    total = length_of(length_of, 0, 0);
  } else {  // the whole pipeline runs per worker, merged at its end
    total = 0;
    for (int w = 0; w < layout.num_workers && total; ++w) {
      const auto part = length_of(length_of, 0, w);
      total = part ? add(total, *part) : std::nullopt;
    }
  }
  if (!total && why) *why = unknown;
  return total;
}

std::string Graph::to_dot() const {
  const BoostGraph bg = flow_graph(nodes_);
  auto escape = [](const std::string& s) {
    std::string r;
    for (char c : s) {
      if (c == '\n') {
        r += "\\n";
        continue;
      }
      if (c == '"' || c == '\\') r += '\\';
      r += c;
    }
    return r;
  };
  std::ostringstream os;
  boost::write_graphviz(
      os, bg,
      [&](std::ostream& out, std::size_t v) {
        const auto& n = nodes_[v];
        std::string label = n.key;
        if (n.key != n.kind) label += "\n" + n.kind;
        for (const auto& [k, val] : n.params) label += "\n" + k + "=" + val;
        label += "\n→ " + n.element_type;
        out << " [label=\"" << escape(label) << "\", shape=box]";
      },
      boost::default_writer{},
      [](std::ostream& out) { out << "rankdir=LR;\n"; });
  return os.str();
}

std::vector<std::string> Graph::warnings(const Layout& layout) const {
  std::vector<std::string> out;
  if (full_source_.empty()) return out;
  unsigned missing = 0;
  if (layout.world_size > 1 && !(covered_levels_ & Flow::kRank)) missing |= Flow::kRank;
  if (layout.num_workers > 1 && !(covered_levels_ & Flow::kWorker)) missing |= Flow::kWorker;
  if (!missing) return out;
  const int copies = (missing & Flow::kRank ? layout.world_size : 1) * (missing & Flow::kWorker ? layout.num_workers : 1);
  out.push_back(full_source_ + " is read in full by " + describe_levels(missing) +
                " (no sampler, sharding_filter or dispatch splits it), so each of its elements is delivered " +
                std::to_string(copies) + " times. Add sharding_filter() to split it, or replicate() to say the copies "
                "are on purpose");
  return out;
}

void Graph::check_layout(const Layout& layout) const {
  validate_layout(layout);
  for (const auto* d : defs_) d->check_layout(layout);
}

}  // namespace dpipe
