#pragma once
/// Node kinds as the generic parts of dpipe see them. Each kind's header declares, next to its State, a
/// `XKind` struct with the kind's whole story beyond Def and Iter:
///
///   struct BatchKind {
///     static constexpr std::string_view name = "batch";             // the kind string everywhere
///     static RescaleRule rescale();                                  // dpipe/rescale.hpp
///     static void check_state(const NodeState&, const GraphNodeRecord&);  // optional: invariants
///     template <class Spec> static SpecPipeline from_spec(Spec&);   // the spec builder
///     static constexpr bool source = false;                          // optional: starts a pipeline
///     static std::string summary(const NodeState&, const GraphNodeRecord&);  // optional: for show
///     static constexpr bool deals = false;                           // optional: deals to instances
///     static constexpr std::string_view tuning[] = {"depth"};         // optional: parameters that
///   };                                                               //   change no element
///
/// `dpipe/kinds.hpp` lists every kind on one line each; the registry below (rescale rules and invariants,
/// used by the rescale driver and by restore) and the spec front end's op table are both made from that
/// list, so neither names a kind.
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

#include "dpipe/rescale.hpp"
#include "dpipe/snapshot.hpp"

namespace dpipe {

struct KindInfo {
  std::string_view name;
  RescaleRule rescale = RescaleRule::refused("it declares no rescale rule");
  /// Throws SnapshotError when a saved record of the kind is impossible for the node's parameters; checked
  /// for every record of a snapshot before any node is restored. Null: the kind checks in restore only.
  void (*check_state)(const NodeState&, const GraphNodeRecord&) = nullptr;
  /// Parameters that change no element (a queue depth, a window of work in flight): a resume may change
  /// them, and the snapshot restores into the new values.
  std::vector<std::string_view> tuning{};
  /// One line for `snapshot show` saying what a record of the kind means ("12 of 100 buffered"); null:
  /// the fields speak for themselves. May throw SnapshotError for a record it cannot read.
  std::string (*summary)(const NodeState&, const GraphNodeRecord&) = nullptr;
  /// A source (it starts a pipeline); one that deals its stream to the instances (sampler, lines, …)
  /// rather than having every instance read it in full.
  bool source = false, deals = false;

  bool is_tuning(std::string_view param) const {
    for (auto t : tuning)
      if (t == param) return true;
    return false;
  }
};

template <class K>
KindInfo kind_info() {
  KindInfo k{K::name, K::rescale()};
  if constexpr (requires { &K::check_state; }) k.check_state = &K::check_state;
  if constexpr (requires { &K::summary; }) k.summary = &K::summary;
  if constexpr (requires { K::source; }) k.source = K::source;
  if constexpr (requires { K::deals; }) k.deals = K::deals;
  if constexpr (requires { K::tuning; }) k.tuning.assign(std::begin(K::tuning), std::end(K::tuning));
  return k;
}

template <class... K>
struct KindList {};

/// The registered kind of that name, or null (a user's own kind, or the engine's "run" record).
const KindInfo* find_kind(std::string_view name);
/// Every registered kind, in the order of dpipe/kinds.hpp.
const std::vector<KindInfo>& registered_kinds();

}  // namespace dpipe
