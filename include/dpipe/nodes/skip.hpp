#pragma once
/// Drops the first `count` elements and passes the rest (tf.data's skip). In: T → Out: T.
/// State: how many were dropped.
#include <algorithm>
#include <string>

#include "dpipe/kit/length.hpp"
#include "dpipe/kit/rescale.hpp"
#include "dpipe/kit/spec.hpp"
#include "dpipe/kit/unary.hpp"

namespace dpipe {

/// A skip's saved state: how many elements it has dropped.
struct SkipState {
  std::uint64_t skipped = 0;
  template <class A>
  void fields(A& a) {
    a("skipped", skipped);
  }
  /// Its invariant: no more dropped than the count.
  void check(const StateReader& r, std::uint64_t count) const {
    if (skipped > count) r.fail("skipped " + std::to_string(skipped) + " exceeds count " + std::to_string(count));
  }
};

struct SkipOptions {
  std::int64_t count = 0;
  std::string name{};
};

template <class T>
class SkipIter final : public UnaryIter<T> {
 public:
  template <class Def>
  SkipIter(BuildContext& ctx, const Def& def)
      : UnaryIter<T>(ctx, def), count_(static_cast<std::uint64_t>(def.options().count)) {}

 protected:
  std::size_t pull_chunk(std::vector<T>& out, std::size_t max) override {
    while (st_.skipped < count_) {  // drop in chunks; a snapshot between pulls sees how many are gone
      dropped_.clear();
      const std::size_t n = this->input().pull(dropped_, static_cast<std::size_t>(std::min<std::uint64_t>(max, count_ - st_.skipped)));
      if (n == 0) return 0;
      st_.skipped += n;
    }
    const std::size_t n = this->input().pull(out, max);
    this->pass_traces(this->input());
    return n;
  }
  bool carries_provenance() const override { return true; }
  bool one_base() const override { return this->input().one_base(); }
  bool recomputable() const override { return this->input().recomputable(); }
  T recompute(const Provenance& p) const override { return this->input().recompute(p); }
  bool holds_no_elements() const override { return true; }
  void save_state(StateWriter& w) const override { w.write(st_); }
  void restore_state(StateReader& r) override {
    r.read(st_);
    st_.check(r, count_);
  }

 private:
  std::uint64_t count_;
  SkipState st_;
  std::vector<T> dropped_;
};

struct SkipKind;
template <class T>
using SkipDef = UnaryDef<SkipKind, T, T, SkipIter>;

inline auto skip(std::int64_t count, SkipOptions o = {}) {
  o.count = count;
  return unary<SkipDef>(std::move(o));
}

struct SkipKind {
  static constexpr std::string_view name = "skip";
  static std::optional<std::uint64_t> length(const Params& p, std::span<const std::uint64_t> in, const LengthAt&) {
    const auto count = count_param(p, "count");
    if (in.empty() || !count) return std::nullopt;
    return in[0] - std::min(in[0], *count);
  }
  static constexpr std::string_view doc = "Drops the first `count` elements and passes the rest.";
  /// Provenance (docs/design.md, "Provenance"; a kind without this line does not carry it).
  static constexpr std::string_view provenance = "passes its input's on; an element out of it is the one that went in";
  static constexpr ParamSchema params[] = {
      {.name = "count", .type = ParamType::integer, .doc = "how many elements to drop (not negative)", .positional = true},
  };
  using Options = SkipOptions;
  using State = SkipState;
  /// The parameters as the fingerprint writes them; throws ConfigError on an invalid count.
  static Params checked_params(const SkipOptions& o) {
    if (o.count < 0) throw ConfigError(node_label(std::string(name), o.name) + ": count must not be negative, got " + param_text(o.count));
    return {{"count", param_text(o.count)}};
  }
  /// Rescale: refused; each instance drops the first elements of its own stream, which another layout
  /// splits differently.
  static RescaleRule rescale() { return RescaleRule::refused(rescale::kNotDealt); }
  /// `snapshot show`: how many dropped of how many.
  static std::string summary(const NodeState& record, const GraphNodeRecord& node) {
    SkipState st;
    StateReader r(record);
    r.read(st);
    return std::to_string(st.skipped) + " of " + std::string(param_of(node, "count")) + " skipped";
  }
  /// Invariant: no more dropped than its count.
  static void check_state(const NodeState& record, const GraphNodeRecord& node) {
    check_against_param<SkipState>(record, node, "count");
  }
  template <class Spec>
  static SpecPipeline from_spec(Spec& s) {
    SkipOptions o{.name = s.name()};
    s.required("count", o.count);
    return s.input().apply([&](const auto& p) { return p | unary<SkipDef>(o); });
  }
};

}  // namespace dpipe
