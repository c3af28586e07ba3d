#pragma once
/// The graph of a pipeline, built with Boost.Graph (kept out of this header): validation, stable node
/// keys, a fingerprint, topological order and DOT export.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dpipe/layout.hpp"
#include "dpipe/kit/node.hpp"

namespace dpipe {

/// How unnamed nodes are keyed. A key names a node's records in snapshots and seeds its random stream.
enum class KeyScheme : std::uint8_t {
  stable,     // "<kind>@<digest of the node's upstream subgraph>": format version 4 on
  pre_order,  // "<kind>@<pre-order index>": versions 1 to 3, kept to resume their snapshots exactly
};

struct GraphNode {
  std::string key;   // the node's name, or "<kind>@…" for unnamed nodes (KeyScheme)
  std::string kind;
  std::string name;
  std::string place;  // where the user put it: "pipeline[3]" (see NodeDefBase::place)
  std::string element_type;
  Params params;
  std::vector<std::size_t> inputs;  // indices into Graph::nodes()
  /// A `from` node's edge: the node of several outputs it reads (an index, or kNone) and which output.
  static constexpr std::size_t kNone = static_cast<std::size_t>(-1);
  std::size_t reads = kNone;
  std::size_t output = 0;
  std::size_t outputs = 1;  // fork, demux, unzip: their count
  Segment segment = Segment::worker;  // where it runs: per rank before dispatch, per worker, after merge
};

class Graph {
 public:
  /// Walks the definitions from the output, validates them and assigns keys; throws ConfigError.
  static Graph build(const NodeDefBase& output, KeyScheme keys = KeyScheme::stable);

  /// Nodes in pre-order: a node, then its inputs in order. Index 0 is the output. A `from` node has no
  /// inputs: it reads the node of several outputs at GraphNode::reads, which stands in its own chain.
  const std::vector<GraphNode>& nodes() const { return nodes_; }
  /// Keys in pre-order, the order in which iterators take them when built.
  const std::vector<std::string>& keys() const { return keys_; }
  /// How every message names node i: its place counted from the source, its kind and its name when it has
  /// one ("pipeline[3] (batch)", "pipeline[1].with[0][2] (map 'tok')"); in pre-order, as keys().
  const std::vector<std::string>& labels() const { return labels_; }
  /// The label of the node keyed `key`, else "node 'KEY'" (a snapshot's node this graph lacks).
  std::string label_of(const std::string& key) const;
  /// Hash of kinds, names, parameters, element types and edges.
  /// (Of data files: path and size; their modification times are compared on restore, see is_data_param.)
  std::uint64_t fingerprint() const { return fingerprint_; }
  /// The fingerprint the graph would have if node i had parameters `params[i]` (nodes past the end keep
  /// theirs): a restore takes tuning parameters from the snapshot, which change no element.
  std::uint64_t fingerprint_with(const std::vector<Params>& params) const;
  /// Node indices with every node after its inputs (sources first).
  const std::vector<std::size_t>& topological_order() const { return topo_; }
  /// Graphviz DOT text; edges point in the direction data flows.
  std::string to_dot() const;
  /// Whether the pipeline ends its worker segment with an explicit `merge` (otherwise the whole
  /// pipeline is the worker segment, merged at its end).
  bool has_merge() const { return has_merge_; }
  /// Bad data records skipped by the pipeline's sources (`on_error = skip`).
  std::uint64_t skipped_records() const {
    std::uint64_t n = 0;
    for (const auto* d : defs_) n += d->skipped();
    return n;
  }
  /// What a run on `layout` delivers that the user may not mean: a source read in full by several
  /// instances with nothing splitting it (silenced by replicate()).
  std::vector<std::string> warnings(const Layout& layout) const;
  /// Bytes of data files the pipeline's sources did not deliver for being bad (`on_error = skip`).
  std::uint64_t skipped_bytes() const {
    std::uint64_t n = 0;
    for (const auto* d : defs_) n += d->skipped_bytes();
    return n;
  }
  /// How many elements the rank `layout.rank` delivers in an epoch (its workers' streams, merged) when
  /// every node can say (kit/length.hpp); else nullopt, and `why` says which node cannot.
  std::optional<std::uint64_t> length(const Layout& layout, std::string* why = nullptr) const;
  /// Checks every node against a layout (shard ids, …); throws ConfigError.
  void check_layout(const Layout& layout) const;

 private:
  std::vector<GraphNode> nodes_;
  std::vector<std::string> keys_;
  std::vector<std::string> labels_;
  std::vector<std::size_t> topo_;
  std::vector<const NodeDefBase*> defs_;  // borrowed from the pipeline
  std::uint64_t fingerprint_ = 0;
  bool has_merge_ = false;
  std::string full_source_;       // a source every instance reads in full that reaches the output, if any
  unsigned covered_levels_ = 0;   // levels (rank 1, worker 2) the output is split over or replicated on purpose
};

}  // namespace dpipe
