#pragma once
/// The first `count` elements (torch's header); pulls no element past them. In: T → Out: T.
/// State: how many were taken.
#include <optional>
#include <string>

#include "dpipe/kit/length.hpp"
#include "dpipe/detail/prebuilt_types.hpp"
#include "dpipe/pipeline.hpp"
#include "dpipe/kit/rescale.hpp"
#include "dpipe/kit/spec.hpp"

namespace dpipe {

/// A take's saved state: how many elements it has taken.
struct TakeState {
  std::uint64_t taken = 0;
  template <class A>
  void fields(A& a) {
    a("taken", taken);
  }
  /// Its invariant: no more taken than the count.
  void check(const StateReader& r, std::uint64_t count) const {
    if (taken > count) r.fail("taken " + std::to_string(taken) + " exceeds count " + std::to_string(count));
  }
};

struct TakeOptions {
  std::string name{};
};

/// The parameters as the fingerprint writes them; throws ConfigError on an invalid count (compiled once,
/// not once per element type).
inline Params checked_params(std::int64_t count, const TakeOptions& o) {
  if (count < 0) throw ConfigError(node_label("take", o.name) + ": count must not be negative, got " + param_text(count));
  return {{"count", param_text(count)}};
}

template <class T>
class TakeDef final : public NodeDef<T> {
 public:
  TakeDef(std::shared_ptr<const NodeDef<T>> in, std::int64_t count, TakeOptions o)
      : NodeDef<T>("take", o.name, checked_params(count, o), {in}), input_(std::move(in)),
        count_(static_cast<std::uint64_t>(count)) {}
  std::unique_ptr<Iter<T>> instantiate(BuildContext& ctx) const override;
  const NodeDef<T>& input() const { return *input_; }
  std::uint64_t count() const { return count_; }

 private:
  std::shared_ptr<const NodeDef<T>> input_;
  std::uint64_t count_ = 0;
};

template <class T>
class TakeIter final : public Hooked<T> {
 public:
  TakeIter(BuildContext& ctx, const TakeDef<T>& def)
      : Hooked<T>(ctx, "take"), input_(def.input().instantiate(ctx)), count_(def.count()) {}

 protected:
  std::size_t pull_chunk(std::vector<T>& out, std::size_t max) override {
    if (st_.taken >= count_) return 0;
    const std::size_t n = input_->pull(out, static_cast<std::size_t>(std::min<std::uint64_t>(max, count_ - st_.taken)));
    st_.taken += n;
    this->pass_traces(*input_);
    return n;
  }
  bool carries_provenance() const override { return true; }
  bool one_base() const override { return (*input_).one_base(); }
  bool recomputable() const override { return (*input_).recomputable(); }
  T recompute(const Provenance& p) const override { return (*input_).recompute(p); }
  bool holds_no_elements() const override { return true; }
  void save_state(StateWriter& w) const override { w.write(st_); }
  void restore_state(StateReader& r) override {
    r.read(st_);
    st_.check(r, count_);
  }
  std::vector<IterBase*> inputs() const override { return {input_.get()}; }

 private:
  std::unique_ptr<Iter<T>> input_;
  std::uint64_t count_;
  TakeState st_;
};

template <class T>
std::unique_ptr<Iter<T>> TakeDef<T>::instantiate(BuildContext& ctx) const {
  return std::make_unique<TakeIter<T>>(ctx, *this);
}

/// `take(std::nullopt)`: no limit, no node (torch's header(None)).
inline auto take(std::nullopt_t, TakeOptions = {}) {
  return make_closure([](const auto& p) { return p; });
}

inline auto take(std::int64_t count, TakeOptions o = {}) {
  return make_closure([count, o = std::move(o)](const auto& p) {
    using T = typename std::decay_t<decltype(p)>::element_type;
    return make_pipeline<TakeDef<T>>(p.def(), count, o);
  });
}

struct TakeKind {
  static constexpr std::string_view name = "take";
  static std::optional<std::uint64_t> length(const Params& p, std::span<const std::uint64_t> in, const LengthAt&) {
    const auto count = count_param(p, "count");
    if (in.empty() || !count) return std::nullopt;
    return std::min(in[0], *count);
  }
  static constexpr std::string_view doc =
      "The first `count` elements; pulls no element past them.";
  /// Provenance (docs/design.md, "Provenance"; a kind without this line does not carry it).
  static constexpr std::string_view provenance = "passes its input's on; an element out of it is the one that went in";
  static constexpr ParamSchema params[] = {
      {.name = "count", .type = ParamType::integer, .doc = "how many elements pass (not negative; absent or null: every one)",
       .fallback = "null", .positional = true},
  };
  using State = TakeState;
  /// `snapshot show`: how many taken of how many.
  static std::string summary(const NodeState& record, const GraphNodeRecord& node) {
    TakeState st;
    StateReader r(record);
    r.read(st);
    return std::to_string(st.taken) + " of " + std::string(param_of(node, "count")) + " taken";
  }
  static RescaleRule rescale() { return RescaleRule::refused(rescale::kNotDealt); }
  /// Invariant: no more taken than its count.
  static void check_state(const NodeState& record, const GraphNodeRecord& node) {
    check_against_param<TakeState>(record, node, "count");
  }
  /// `{"op": "take", "count": N}`; without a count (or null), no node: every element passes.
  template <class Spec>
  static SpecPipeline from_spec(Spec& s) {
    std::optional<std::int64_t> count;
    TakeOptions o{.name = s.name()};
    s.param("count", count);
    if (!count) return s.input();
    return s.input().apply([&](const auto& p) { return p | take(*count, o); });
  }
};

// Compiled once, in libdpipe, for the prebuilt element types (dpipe/detail/prebuilt_types.hpp).
DPIPE_DECLARE_PREBUILT_NODE(TakeDef, TakeIter)

}  // namespace dpipe
