#pragma once
/// Re-runs the whole upstream `count` times (forever without a count); each pass is a new epoch for
/// the upstream, so shuffles reshuffle. A pass that yields nothing ends the stream. In: T → Out: T.
/// State: the pass number and the pass its upstream was built for (rebuilt on restore, then restored).
#include <optional>
#include <string>

#include "dpipe/kit/length.hpp"
#include "dpipe/detail/prebuilt_types.hpp"
#include "dpipe/pipeline.hpp"
#include "dpipe/kit/rescale.hpp"
#include "dpipe/kit/spec.hpp"

namespace dpipe {

/// A cycle's saved state: its pass, the pass its upstream was built for, whether the pass yielded
/// anything, and whether the cycle ended (a pass over an empty upstream ends it).
struct CycleState {
  std::uint64_t pass = 0;
  std::uint64_t input_pass = 0;
  bool yielded_in_pass = false;
  bool ended = false;
  template <class A>
  void fields(A& a) {
    a("pass", pass);
    a("input_pass", input_pass);
    a("yielded_in_pass", yielded_in_pass);
    a("ended", ended);
  }
  /// Its invariants: no pass beyond the count (none: forever), the upstream's pass not ahead of its own.
  void check(const StateReader& r, std::optional<std::int64_t> count) const {
    if (count && pass > static_cast<std::uint64_t>(*count))
      r.fail("pass " + std::to_string(pass) + " is beyond count " + std::to_string(*count));
    if (input_pass > pass) r.fail("the upstream's pass is ahead of the cycle's");
  }
};

struct CycleOptions {
  std::optional<std::int64_t> count{};  // nullopt: forever
  std::string name{};
};

/// The epoch an upstream sees in `pass` of a cycle whose own epoch is `epoch`: pass 0 keeps it, so a
/// cycle does not change its first pass; later passes get distinct, well-mixed epochs.
constexpr std::uint64_t cycle_epoch(std::uint64_t epoch, std::uint64_t pass) {
  return pass == 0 ? epoch : mix64(epoch ^ mix64(pass ^ 0xc7c1e5ULL));
}

/// The options' parameters as the fingerprint writes them; throws ConfigError on invalid options (compiled
/// once, not once per element type).
inline Params checked_params(const CycleOptions& o) {
  if (o.count && *o.count < 0)
    throw ConfigError(node_label("cycle", o.name) + ": count must not be negative, got " + param_text(*o.count));
  return {{"count", o.count ? param_text(*o.count) : std::string("forever")}};
}

template <class T>
class CycleDef final : public NodeDef<T> {
 public:
  CycleDef(std::shared_ptr<const NodeDef<T>> in, CycleOptions o)
      : NodeDef<T>("cycle", o.name, checked_params(o), {in}), input_(std::move(in)), count_(o.count) {}
  std::unique_ptr<Iter<T>> instantiate(BuildContext& ctx) const override;
  const NodeDef<T>& input() const { return *input_; }
  std::optional<std::int64_t> count() const { return count_; }

 private:
  std::shared_ptr<const NodeDef<T>> input_;
  std::optional<std::int64_t> count_;
};

template <class T>
class CycleIter final : public Hooked<T> {
 public:
  CycleIter(BuildContext& ctx, const CycleDef<T>& def) : Hooked<T>(ctx, "cycle"), def_(def), ctx_(ctx) {
    input_ = def_.input().instantiate(ctx);  // advances ctx past the upstream's keys
  }

 protected:
  std::size_t pull_chunk(std::vector<T>& out, std::size_t max) override {
    while (!finished()) {
      const std::size_t n = input_->pull(out, max);
      if (n > 0) {
        st_.yielded_in_pass = true;
        return n;
      }
      if (!st_.yielded_in_pass) {  // an empty pass: stop instead of spinning
        st_.ended = true;
        break;
      }
      ++st_.pass;
      st_.yielded_in_pass = false;
      if (!finished()) {
        st_.input_pass = st_.pass;
        rebuild();
      }
    }
    return 0;
  }
  void save_state(StateWriter& w) const override { w.write(st_); }
  void restore_state(StateReader& r) override {
    r.read(st_);
    st_.check(r, def_.count());
    // Rebuild the upstream of the pass it was saved in (the last one after the final pass); the caller
    // then restores it.
    if (st_.input_pass > 0) rebuild();
  }
  std::vector<IterBase*> inputs() const override { return {input_.get()}; }

 private:
  bool finished() const {
    return st_.ended || (def_.count() && st_.pass >= static_cast<std::uint64_t>(*def_.count()));
  }
  void rebuild() {
    BuildContext c = ctx_;  // cursor still points at the upstream's first key
    c.epoch = cycle_epoch(ctx_.epoch, st_.input_pass);
    input_ = def_.input().instantiate(c);
  }
  const CycleDef<T>& def_;
  BuildContext ctx_;
  std::unique_ptr<Iter<T>> input_;
  CycleState st_;
};

template <class T>
std::unique_ptr<Iter<T>> CycleDef<T>::instantiate(BuildContext& ctx) const {
  return std::make_unique<CycleIter<T>>(ctx, *this);
}

inline auto cycle(CycleOptions o = {}) {
  return make_closure([o = std::move(o)](const auto& p) {
    using T = typename std::decay_t<decltype(p)>::element_type;
    return make_pipeline<CycleDef<T>>(p.def(), o);
  });
}

struct CycleKind {
  static constexpr std::string_view name = "cycle";
  /// `count` passes over its input; none when it cycles forever.
  static std::optional<std::uint64_t> length(const Params& p, std::span<const std::uint64_t> in, const LengthAt&) {
    const auto n = count_param(p, "count");
    return in.empty() || !n ? std::nullopt : times(in[0], *n);
  }
  static constexpr std::string_view doc =
      "Re-runs the whole upstream `count` times (forever without a count); each pass is a new epoch for the upstream.";
  static constexpr ParamSchema params[] = {
      {.name = "count", .type = ParamType::integer, .doc = "passes (absent: forever)", .fallback = "null", .positional = true},
  };
  using State = CycleState;
  static constexpr bool restarts_upstream = true;
  /// `snapshot show`: which pass.
  static std::string summary(const NodeState& record, const GraphNodeRecord& node) {
    CycleState st;
    StateReader r(record);
    r.read(st);
    if (st.ended) return "ended after pass " + std::to_string(st.pass);
    const std::string count(param_of(node, "count"));
    return "pass " + std::to_string(st.pass + 1) + (count == "forever" ? " (forever)" : " of " + count);
  }
  static RescaleRule rescale() { return RescaleRule::refused(rescale::kNotDealt); }
  /// Invariants (CycleState::check), with the count from the graph record ("forever" without one).
  static void check_state(const NodeState& record, const GraphNodeRecord& node) {
    CycleState st;
    StateReader r(record);
    r.read(st);
    st.check(r, int_param_of(node, "count"));
  }
  /// `{"op": "cycle", "count": N}` (no count: forever)
  template <class Spec>
  static SpecPipeline from_spec(Spec& s) {
    CycleOptions o{.name = s.name()};
    s.param("count", o.count);
    return s.input().apply([&](const auto& p) { return p | cycle(o); });
  }
};

// Compiled once, in libdpipe, for the prebuilt element types (dpipe/detail/prebuilt_types.hpp).
DPIPE_DECLARE_PREBUILT_NODE(CycleDef, CycleIter)

}  // namespace dpipe
