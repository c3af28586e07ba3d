#pragma once
/// Rescale rules: how the records of one node kind are dealt to another layout. Each kind declares its
/// rule next to its State, in its own header (`XKind::rescale()`); the driver (SnapshotSet::rescaled)
/// hands a rule the records of every old instance of one node together and places what it returns. The
/// driver never names a kind or a field: rules read and write records through the kind's own `fields`
/// visitor, instantiated on ElementBlobs so that elements stay encoded.
#include <charconv>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dpipe/error.hpp"
#include "dpipe/layout.hpp"
#include "dpipe/snapshot.hpp"
#include "dpipe/state.hpp"

namespace dpipe {

/// The records of one node on every old instance, in order, and the old and new layouts (rank unused).
/// A node that runs once per rank (before dispatch, after merge) has one record per rank ("slot" = rank);
/// any other has one per instance (slot = rank × workers + worker).
struct RescaleInput {
  std::vector<const NodeState*> old;
  Layout from, to;
  bool once_per_rank = false;
  const GraphNodeRecord* node = nullptr;  // the node's graph record (kind, parameters); null for engine nodes
  /// The new ranks whose records are wanted: [wanted_begin, wanted_end), or every rank from wanted_begin on
  /// when wanted_end is negative. A rank resuming from a set wants its own; an offline rescale, a batch.
  int wanted_begin = 0, wanted_end = -1;

  std::size_t new_slots() const {
    return static_cast<std::size_t>(once_per_rank ? to.world_size : to.instances());
  }
  /// Whether new slot `j`'s record is wanted: a rule computes every slot (the deal depends on all of
  /// them) but builds the records of the wanted ones only, so a rank's rescale holds what it receives.
  bool wanted(std::size_t j) const {
    const std::size_t rank = once_per_rank ? j : j / static_cast<std::size_t>(to.num_workers);
    return rank >= static_cast<std::size_t>(wanted_begin) && (wanted_end < 0 || rank < static_cast<std::size_t>(wanted_end));
  }
  /// Throws the SnapshotError of a refused rescale, naming this node.
  [[noreturn]] void refuse(const std::string& why) const {
    throw SnapshotError("cannot rescale: node '" + old.front()->key + "' (" + old.front()->kind + "): " + why);
  }

  /// Every old record read into a state struct `S` by its `fields` visitor (the node's own names and order).
  template <class S>
  std::vector<S> read(const S& prototype = S{}) const {
    std::vector<S> out(old.size(), prototype);  // a prototype sizes per-worker lists before they are read
    for (std::size_t i = 0; i < old.size(); ++i) {
      StateReader r(*old[i]);
      r.read(out[i]);
      r.finish();
    }
    return out;
  }
  /// One new record per state, for slots 0, 1, …, keyed like the old ones (a slot that is not wanted gets
  /// an empty record, which the driver drops).
  template <class S>
  std::vector<NodeState> write(const std::vector<S>& states) const {
    std::vector<NodeState> out(states.size());
    for (std::size_t j = 0; j < states.size(); ++j) {
      if (!wanted(j)) continue;
      out[j] = empty_record(j);
      StateWriter w(out[j]);
      w.write(states[j]);
    }
    return out;
  }
  /// Element lists pooled in order and dealt in contiguous runs (rescale::deal) to `per_slot` parts of each
  /// new slot (merge deals to every worker of a rank): the parts of wanted slots only are filled.
  std::vector<ElementBlobs> deal(const std::vector<const ElementBlobs*>& lists, std::size_t per_slot = 1) const;

  /// A record of this node for new slot `j`, with no fields yet.
  NodeState empty_record(std::size_t j) const {
    NodeState s;
    s.key = old.front()->key;
    s.kind = old.front()->kind;
    s.mode = old.front()->mode;
    s.instance = static_cast<std::uint32_t>(j);
    return s;
  }
};

/// The value of parameter `key` of a graph record ("" when it has none).
inline std::string_view param_of(const GraphNodeRecord& n, std::string_view key) {
  for (const auto& [k, v] : n.params)
    if (k == key) return v;
  return {};
}

/// The integer value of parameter `key` of a graph record, or nullopt when it has none or another value
/// ("forever"), for a kind's check_state.
inline std::optional<std::int64_t> int_param_of(const GraphNodeRecord& n, std::string_view key) {
  const std::string_view text = param_of(n, key);
  std::int64_t v = 0;
  const auto r = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || r.ec != std::errc{} || r.ptr != text.data() + text.size()) return std::nullopt;
  return v;
}

/// What a kind does with its records on a rescale: copy them to every new instance (nothing in them
/// depends on the instance), deal them with a function of the kind's, or refuse with a reason.
class RescaleRule {
 public:
  using Deal = std::vector<NodeState> (*)(const RescaleInput&);

  static RescaleRule replicated() { return RescaleRule(nullptr, {}); }
  static RescaleRule dealt(Deal deal) { return RescaleRule(deal, {}); }
  static RescaleRule refused(std::string reason) { return RescaleRule(nullptr, std::move(reason)); }

  bool refuses() const { return !reason_.empty(); }
  const std::string& reason() const { return reason_; }
  /// The records of every new slot, in slot order.
  std::vector<NodeState> apply(const RescaleInput& in) const {
    if (refuses()) in.refuse(reason_);
    if (deal_) return deal_(in);
    std::vector<NodeState> out;
    out.resize(in.new_slots());
    for (std::size_t j = 0; j < out.size(); ++j) {
      if (!in.wanted(j)) continue;
      out[j] = *in.old.front();
      out[j].instance = static_cast<std::uint32_t>(j);
    }
    return out;
  }

 private:
  RescaleRule(Deal deal, std::string reason) : deal_(deal), reason_(std::move(reason)) {}
  Deal deal_;
  std::string reason_;
};

namespace rescale {

/// The reason a kind gives when it keeps a position in a stream every instance reads in full.
inline constexpr const char* kReadInFull =
    "it keeps a position in a stream that every instance reads in full, so its instances' states are not "
    "parts of one whole; read it through sampler() to rescale";
/// The reason a kind gives when its state has no rule to be dealt.
inline constexpr const char* kNotDealt =
    "it keeps state that cannot be dealt to another layout; rescalable pipelines read through a sampler and use "
    "shuffle, batch, flat_map and stateless nodes";

/// Every slot is kept (deal's default).
struct AllSlots {
  bool operator()(std::size_t) const { return true; }
};

/// Pools element lists (in order) and deals them in contiguous runs: of N pooled elements, slot j gets
/// elements [N·j/n, N·(j+1)/n). Slots differ by at most one element, and each takes its elements from as
/// few old lists as it can, so a rescale that reads only what it deals opens few of them. Slots for which
/// `keep(j)` is false are left empty (their share is still counted).
template <class Keep = AllSlots>
std::vector<ElementBlobs> deal(const std::vector<const ElementBlobs*>& lists, std::size_t n, Keep keep = {}) {
  std::vector<ElementBlobs> out(n);
  if (lists.empty()) return out;
  const std::string& tag = lists.front()->tag;
  for (auto& b : out) b.tag = tag;
  std::size_t total = 0;
  for (const ElementBlobs* l : lists) {
    if (l->tag != tag)
      throw SnapshotError("cannot rescale: elements of types " + tag + " and " + l->tag + " in one list");
    total += l->size();
  }
  // The first pooled index of slot j, without overflow (total % n < n, j <= n).
  const auto start = [&](std::size_t j) { return total / n * j + total % n * j / n; };
  std::size_t slot = 0, first = 0;  // first: the pooled index of the current list's element 0
  for (const ElementBlobs* l : lists) {
    const std::size_t len = l->size();
    for (std::size_t k = 0; k < len;) {
      while (first + k >= start(slot + 1)) ++slot;
      const std::size_t stop = std::min(len, start(slot + 1) - first);
      if (keep(slot)) out[slot].append_from(*l, k, stop);
      k = stop;
    }
    first += len;
  }
  return out;
}

/// The element lists `member` of every state, in order (for deal()).
template <class S, class M>
std::vector<const ElementBlobs*> lists(const std::vector<S>& states, M S::*member) {
  std::vector<const ElementBlobs*> v;
  for (const S& s : states) v.push_back(&(s.*member));
  return v;
}

}  // namespace rescale

inline std::vector<ElementBlobs> RescaleInput::deal(const std::vector<const ElementBlobs*>& lists,
                                                    std::size_t per_slot) const {
  return rescale::deal(lists, new_slots() * per_slot, [&](std::size_t k) { return wanted(k / per_slot); });
}

}  // namespace dpipe
