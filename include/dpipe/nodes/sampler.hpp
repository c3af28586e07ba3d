#pragma once
/// Reads a random-access source (`range`, `from_vector`) in a global order and deals its positions to
/// the instances: over `epochs` passes, global position q (epoch q / n, index q mod n) goes to instance
/// q mod (world_size × num_workers), like `sharding_filter` deals positions, but each instance reads only
/// its own. With `shuffle = global` each epoch is a fresh keyed permutation of [0, n) computed on the
/// fly (O(1) memory); the order never depends on the layout. Before `dispatch` (the prefix, once per
/// rank) it deals to the ranks instead: position q to rank q mod world_size. In: the source's T → Out: T.
/// State: (base, stride, offset, next) and the positions at or after base that other instances already
/// took (non-empty only after a rescale), so a snapshot set rescales by re-slicing positions.
#include <algorithm>
#include <optional>
#include <string>

#include "dpipe/kit/length.hpp"
#include "dpipe/kit/node_kind.hpp"
#include "dpipe/detail/position_deal.hpp"
#include "dpipe/detail/prebuilt_types.hpp"
#include "dpipe/permutation.hpp"
#include "dpipe/pipeline.hpp"
#include "dpipe/kit/spec.hpp"

namespace dpipe {

enum class SamplerShuffle { none, global };

struct SamplerOptions {
  SamplerShuffle shuffle = SamplerShuffle::global;
  std::int64_t epochs = 1;
  std::string name{};
};

/// The options' parameters as the fingerprint writes them; throws ConfigError when the input (of kind
/// `input_kind`) is not random-access or an option is invalid (compiled once, not once per element type).
inline Params checked_params(const SamplerOptions& o, bool random_access_input, const std::string& input_kind) {
  if (!random_access_input)
    throw ConfigError(node_label("sampler", o.name) + ": a sampler reads its input by index, so it must follow a "
                      "random-access source (range, from_vector), not " + input_kind);
  if (o.epochs < 1 || o.epochs > (std::int64_t{1} << 32))
    throw ConfigError(node_label("sampler", o.name) + ": epochs must be between 1 and 4294967296, got " +
                      param_text(o.epochs));
  return {{"shuffle", o.shuffle == SamplerShuffle::global ? "global" : "none"}, {"epochs", param_text(o.epochs)}};
}

template <class T>
class SamplerDef final : public NodeDef<T> {
 public:
  SamplerDef(std::shared_ptr<const NodeDef<T>> source, SamplerOptions o)
      : NodeDef<T>("sampler", o.name,
                   checked_params(o, dynamic_cast<const RandomAccess<T>*>(source.get()) != nullptr, source->kind()),
                   {source}),
        source_(std::move(source)), shuffle_(o.shuffle) {
    access_ = dynamic_cast<const RandomAccess<T>*>(source_.get());  // not null: checked above
    epochs_ = static_cast<std::uint64_t>(o.epochs);
    detail::check_position_count(access_->size(), epochs_, node_label("sampler", o.name), "elements", "positions");
  }
  std::unique_ptr<Iter<T>> instantiate(BuildContext& ctx) const override;
  const RandomAccess<T>& source() const { return *access_; }
  bool shuffled() const { return shuffle_ == SamplerShuffle::global; }
  std::uint64_t epochs() const { return epochs_; }

 private:
  std::shared_ptr<const NodeDef<T>> source_;
  const RandomAccess<T>* access_ = nullptr;  // the source, seen by index
  SamplerShuffle shuffle_;
  std::uint64_t epochs_ = 1;
};

template <class T>
class SamplerIter final : public Hooked<T> {
 public:
  SamplerIter(BuildContext& ctx, const SamplerDef<T>& def)
      : Hooked<T>(ctx, "sampler"), def_(def),
        deal_(detail::PositionDeal::in(ctx, "sampler '" + this->key() + "'")) {
    ctx.next_key();  // the source's key: it is read through the sampler, never run itself
    n_ = def.source().size();
    total_ = n_ * def.epochs();
    key_ = derive_seed(ctx.seed, this->key(), ctx.epoch, kSamplerSalt);
    run_epoch_ = ctx.epoch;
    lookahead_ = def.source().prefetches();
  }

 protected:
  std::size_t pull_chunk(std::vector<T>& out, std::size_t max) override {
    std::size_t n = 0;
    const RandomAccess<T>& source = def_.source();
    for (; n < max; ++n) {
      const auto q = deal_.next(total_);
      if (!q) break;
      const std::uint64_t i = index_of(*q);
      // The element after this one starts loading while this one is read (a random order defeats the
      // hardware's prefetcher); its index is kept for the next round.
      if (lookahead_)
        if (const auto ahead = deal_.peek(total_)) source.prefetch(index_of(*ahead));
      out.push_back(source.at(i));
      // The dataset index it drew, in the epoch it drew it: its pass within the run's epoch.
      this->trace_source(run_epoch_ * def_.epochs() + *q / n_, i);
    }
    return n;
  }
  void save_state(StateWriter& w) const override { deal_.save(w); }
  void restore_state(StateReader& r) override { deal_.restore(r, "positions", total_); }
  std::vector<IterBase*> inputs() const override { return {}; }
  bool carries_provenance() const override { return true; }
  bool one_base() const override { return true; }
  bool recomputable() const override { return true; }
  T recompute(const Provenance& p) const override { return this->recompute_at(def_.source(), p); }
  bool holds_no_elements() const override { return true; }

 private:
  std::uint64_t index_of(std::uint64_t q) {
    const std::uint64_t epoch = q / n_, i = q % n_;
    if (!def_.shuffled()) return i;
    if (q == memo_q_) return memo_index_;  // computed by the look-ahead
    if (!perm_ || perm_epoch_ != epoch) {
      perm_.emplace(n_, mix64(key_ ^ mix64(epoch)));
      perm_epoch_ = epoch;
    }
    memo_q_ = q;
    memo_index_ = (*perm_)(i);
    return memo_index_;
  }

  const SamplerDef<T>& def_;
  detail::PositionDeal deal_;
  std::uint64_t n_ = 0, total_ = 0, key_ = 0;
  std::uint64_t run_epoch_ = 0;  // the run's epoch it was built in (provenance: its passes within it)
  std::optional<KeyedPermutation> perm_;
  std::uint64_t perm_epoch_ = 0;
  std::uint64_t memo_q_ = ~std::uint64_t{0}, memo_index_ = 0;  // the last position's index
  bool lookahead_ = false;  // the source uses prefetch hints: look one position ahead
};

template <class T>
std::unique_ptr<Iter<T>> SamplerDef<T>::instantiate(BuildContext& ctx) const {
  return std::make_unique<SamplerIter<T>>(ctx, *this);
}

inline auto sampler(SamplerOptions o = {}) {
  return make_closure([o = std::move(o)](const auto& p) {
    using T = typename std::decay_t<decltype(p)>::element_type;
    return make_pipeline<SamplerDef<T>>(p.def(), o);
  });
}

struct SamplerKind {
  static constexpr std::string_view name = "sampler";
  /// Its `epochs` passes over the source, dealt over the instances of its segment.
  static std::optional<std::uint64_t> length(const Params& p, std::span<const std::uint64_t> in, const LengthAt& at) {
    const auto epochs = count_param(p, "epochs");
    if (in.empty() || !epochs) return std::nullopt;
    const auto all = times(in[0], *epochs);
    return all ? std::optional<std::uint64_t>(at.share(*all, Split::kSegment)) : std::nullopt;
  }
  static constexpr std::string_view doc =
      "Reads a random-access source in a global order (a keyed permutation per epoch, or in order) and deals its positions to the instances.";
  /// Provenance (docs/design.md, "Provenance"; a kind without this line does not carry it).
  static constexpr std::string_view provenance = "names an element by the dataset index it drew and its pass; reads it again from its key";
  static constexpr ParamSchema params[] = {
      {.name = "shuffle", .type = ParamType::choice, .doc = "the order of each epoch", .fallback = "\"global\"", .choices = "global|none", .positional = true},
      {.name = "epochs", .type = ParamType::integer, .doc = "passes over the source", .fallback = "1"},
  };
  using State = detail::DealState;
  /// Invariant: its deal lies within the source's positions (its size × epochs), as a restore checks; the
  /// size is read from the source's record (its first input) where the source's kind can say (range,
  /// from_vector), so an offline rescale refuses what a resume would.
  static void check_state(const NodeState& record, const GraphNodeRecord& node, const GraphNodeRecord* source) {
    const KindInfo* source_kind = source ? find_kind(source->kind) : nullptr;
    const auto epochs = count_param(node.params, "epochs");
    if (!source_kind || !source_kind->length || !epochs) return;
    const auto size = source_kind->length(source->params, {}, LengthAt{});
    const auto total = size ? times(*size, *epochs) : std::nullopt;
    if (!total) return;
    detail::DealState st;
    StateReader r(record);
    try {
      r.read(st);
    } catch (const ElementsNotLoaded&) {  // a rescale's plan left the skipped positions in the file: the
      st.skip.clear();                    // rule checks them when it reads them; the rest is read by now
    }
    st.check(r, "positions", *total);
  }
  /// `snapshot show`: where this instance is in the global sequence.
  static std::string summary(const NodeState& record, const GraphNodeRecord&) {
    detail::DealState st;
    StateReader r(record);
    r.read(st);
    return "next position " + std::to_string(st.base + st.offset + st.next * st.stride) + " (every " +
           std::to_string(st.stride) + "th from " + std::to_string(st.base + st.offset) + ")" +
           (st.skip.empty() ? "" : ", " + std::to_string(st.skip.size()) + " later ones taken elsewhere");
  }
  /// It deals its positions to the instances: a level-based sharding_filter after it would shard again.
  static constexpr bool deals = true;
  /// Rescale: positions are re-sliced over the new instances from the slowest old instance's position;
  /// positions faster instances already took are skipped by whoever they fall to.
  static RescaleRule rescale() {
    return RescaleRule::dealt([](const RescaleInput& in) {
      const auto states = detail::redeal_positions(in, detail::read_deals(in));
      const std::size_t first = in.wanted_slots().first;
      return in.write_slots([&](std::size_t j) { return states[j - first]; });
    });
  }
  /// `{"op": "sampler", "shuffle": "global" | "none", "epochs": 1}`, right after a random-access source.
  template <class Spec>
  static SpecPipeline from_spec(Spec& s) {
    SamplerOptions o{.name = s.name()};
    s.choice("shuffle", o.shuffle, {{"global", SamplerShuffle::global}, {"none", SamplerShuffle::none}});
    s.param("epochs", o.epochs);
    return s.input().apply([&](const auto& p) { return p | sampler(o); });
  }
};

// Compiled once, in libdpipe, for the prebuilt element types (dpipe/detail/prebuilt_types.hpp).
DPIPE_DECLARE_PREBUILT_NODE(SamplerDef, SamplerIter)

}  // namespace dpipe
