#pragma once
/// Node kinds as the generic parts of dpipe see them. Each kind's header declares, next to its State, a
/// `XKind` struct with the kind's whole story beyond Def and Iter:
///
///   struct BatchKind {
///     static constexpr std::string_view name = "batch";             // the kind string everywhere
///     static constexpr std::string_view doc = "...";                 // its one-line contract
///     static constexpr ParamSchema params[] = {...};                 // dpipe/kit/schema.hpp
///     using State = BatchState<ElementBlobs>;                        // its saved state (void: none)
///     static State state_prototype();                                // optional: every field present
///                                                                    //   (per-worker ones for 1 worker)
///     static RescaleRule rescale();                                  // dpipe/kit/rescale.hpp
///     template <class Spec> static SpecPipeline from_spec(Spec&);   // the spec builder
///     static void check_state(const NodeState&, const GraphNodeRecord&);  // optional: invariants
///         (or with a third parameter, `const GraphNodeRecord* first_input`: see KindInfo)
///     static std::string summary(const NodeState&, const GraphNodeRecord&);  // optional: for show
///     static constexpr bool source = false;                          // optional: starts a pipeline
///     static constexpr bool deals = false;                           // optional: deals to instances
///     static constexpr SegmentRole segment = SegmentRole::none;      // optional: engine segments
///     static constexpr bool restarts_upstream = false;               // optional: rebuilds its input
///     static Split split(const Params&);                             // optional: splits its stream
///     static std::optional<std::uint64_t> length(const Params&,      // optional: its stream's length
///         std::span<const std::uint64_t> inputs, const LengthAt&);   //   (dpipe/kit/length.hpp)
///   };
///
/// `dpipe/kinds.hpp` lists every kind on one line each; the registry below (rescale rules, invariants,
/// schemas and graph roles, used by the graph check, the rescale driver, restore, `dpipe ops`) and the
/// spec front end's op table are made from that list, so none of them names a kind.
#include <iterator>
#include <span>
#include <type_traits>
#include <string>
#include <string_view>
#include <vector>

#include "dpipe/kit/length.hpp"
#include "dpipe/kit/rescale.hpp"
#include "dpipe/kit/schema.hpp"
#include "dpipe/snapshot.hpp"

namespace dpipe {

struct KindInfo {
  std::string_view name;
  std::string_view doc{};
  std::span<const ParamSchema> params{};
  /// The names of its state's fields, in order (none: it keeps no state of its own).
  std::vector<std::string> state_fields{};
  RescaleRule rescale = RescaleRule::refused("it declares no rescale rule");
  /// Throws SnapshotError when a saved record of the kind is impossible for the node's parameters (and its
  /// first input's: the record after it in the graph's pre-order, given for a node with inputs when the
  /// graph records one; null otherwise); checked for every record of a snapshot before any node is
  /// restored, by a resume and by an offline rescale alike. Null: the kind checks in restore only.
  void (*check_state)(const NodeState&, const GraphNodeRecord& node, const GraphNodeRecord* first_input) = nullptr;
  /// One line for `snapshot show` saying what a record of the kind means ("12 of 100 buffered"); null:
  /// the fields speak for themselves. May throw SnapshotError for a record it cannot read.
  std::string (*summary)(const NodeState&, const GraphNodeRecord&) = nullptr;
  /// A source (it starts a pipeline); one that deals its stream to the instances (sampler, lines, …)
  /// rather than having every instance read it in full.
  bool source = false, deals = false;
  SegmentRole segment = SegmentRole::none;
  /// It rebuilds its upstream every pass (cycle), so no segment boundary may stand above it.
  bool restarts_upstream = false;
  /// How it splits its stream, from its parameters; null: it leaves the split as its inputs have it.
  Split (*split)(const std::vector<std::pair<std::string, std::string>>& params) = nullptr;
  /// Its stream's length on one instance (len(loader)); null: it cannot say (a filter, a file source).
  LengthFn length = nullptr;
  /// How it carries provenance and whether it makes its elements again from restore keys (recompute);
  /// empty: it does not carry provenance, so a traced run refuses it.
  std::string_view provenance{};

  /// Parameters that change no element (the schema's tuning ones): a resume may change them, and the
  /// snapshot restores into the new values.
  bool is_tuning(std::string_view param) const {
    const ParamSchema* p = find_param(params, param);
    return p && p->tuning;
  }
  /// Semantic parameters a resume may change when asked to by name (ResumeOptions::overrides).
  bool is_overridable(std::string_view param) const {
    const ParamSchema* p = find_param(params, param);
    return p && p->overridable;
  }
  const ParamSchema* param(std::string_view param_name) const { return find_param(params, param_name); }
};

template <class K>
KindInfo kind_info() {
  static_assert(requires { K::doc; }, "a kind declares its one-line contract, `doc`");
  static_assert(requires { K::params; }, "a kind declares its parameters, `params` (an empty span: none)");
  static_assert(requires { typename K::State; }, "a kind declares its saved state, `State` (void: none)");
  KindInfo k{K::name, K::doc, std::span<const ParamSchema>(K::params), {}, K::rescale()};
  if constexpr (!std::is_void_v<typename K::State>) {
    StateFieldNames names;
    typename K::State state{};
    if constexpr (requires { K::state_prototype(); }) state = K::state_prototype();
    state.fields(names);
    for (auto& n : names.names)  // a prototype sized for one worker names per-worker fields `x_0`
      if (n.size() > 2 && n.ends_with("_0")) n.back() = 'N';
    k.state_fields = std::move(names.names);
  }
  if constexpr (requires { &K::check_state; }) {
    if constexpr (std::is_invocable_v<decltype(&K::check_state), const NodeState&, const GraphNodeRecord&,
                                      const GraphNodeRecord*>)
      k.check_state = &K::check_state;
    else
      k.check_state = [](const NodeState& st, const GraphNodeRecord& node, const GraphNodeRecord*) { K::check_state(st, node); };
  }
  if constexpr (requires { &K::summary; }) k.summary = &K::summary;
  if constexpr (requires { K::source; }) k.source = K::source;
  if constexpr (requires { K::deals; }) k.deals = K::deals;
  if constexpr (requires { K::segment; }) k.segment = K::segment;
  if constexpr (requires { K::restarts_upstream; }) k.restarts_upstream = K::restarts_upstream;
  if constexpr (requires { &K::split; }) k.split = &K::split;
  if constexpr (requires { K::length; }) k.length = K::length;
  if constexpr (requires { K::provenance; }) k.provenance = K::provenance;
  return k;
}

template <class... K>
struct KindList {};

/// The registered kind of that name, or null (a user's own kind, or the engine's "run" record).
const KindInfo* find_kind(std::string_view name);

/// The record of graph node `i`'s first input: the next record of the graph's pre-order, for a node of a
/// registered kind that is no source; null otherwise (a source's next record is another branch's node).
inline const GraphNodeRecord* first_input_record(const std::vector<GraphNodeRecord>& graph, std::size_t i) {
  const KindInfo* kind = i < graph.size() ? find_kind(graph[i].kind) : nullptr;
  return kind && !kind->source && i + 1 < graph.size() ? &graph[i + 1] : nullptr;
}
/// Every registered kind, in the order of dpipe/kinds.hpp.
const std::vector<KindInfo>& registered_kinds();

}  // namespace dpipe
