#pragma once
/// Yields each element `times` times in a row (1 is a pass-through). In: T → Out: T.
/// State: the current element and how many copies of it are still due.
#include <optional>
#include <string>

#include "dpipe/kit/length.hpp"
#include "dpipe/kit/rescale.hpp"
#include "dpipe/kit/spec.hpp"
#include "dpipe/kit/unary.hpp"

namespace dpipe {

/// A repeat's saved state: the current element and how many copies of it are still due.
template <class T>
struct RepeatState {
  std::optional<T> current;
  std::uint64_t due = 0;
  template <class A>
  void fields(A& a) {
    a("current", current);
    a("due", due);
  }
};

struct RepeatOptions {
  std::int64_t times = 1;
  std::string name{};
};

template <class T>
class RepeatIter final : public UnaryIter<T> {
  static_assert(Snapshottable<T>, "repeat keeps an element as state, so its type must be Snapshottable");

 public:
  template <class Def>
  RepeatIter(BuildContext& ctx, const Def& def) : UnaryIter<T>(ctx, def), times_(static_cast<std::uint64_t>(def.options().times)) {}

 protected:
  std::size_t pull_chunk(std::vector<T>& out, std::size_t max) override {
    std::size_t n = 0;
    while (n < max) {
      if (st_.due > 0) {
        out.push_back(*st_.current);
        ++n;
        if (--st_.due == 0) st_.current.reset();
        continue;
      }
      scratch_.clear();
      const std::size_t k = std::max<std::size_t>(1, (max - n) / times_);
      if (this->input().pull(scratch_, k) == 0) break;
      for (auto& x : scratch_) {
        if (st_.due > 0 || n + times_ > max) {  // cannot finish this one now: keep it as state
          pending_.push_back(std::move(x));
          continue;
        }
        for (std::uint64_t i = 0; i < times_; ++i) out.push_back(x);
        n += times_;
      }
      // At most one element can be left over, since k ≤ room / times unless k == 1.
      if (!pending_.empty()) {
        st_.current = std::move(pending_.front());
        st_.due = times_;
        pending_.clear();
      }
    }
    return n;
  }
  void save_state(StateWriter& w) const override { w.write(st_); }
  void restore_state(StateReader& r) override {
    r.read(st_);
    if (st_.due > times_ || (st_.due > 0) != st_.current.has_value())
      r.fail("due count " + std::to_string(st_.due) + " does not match the saved element");
  }

 private:
  std::uint64_t times_;
  RepeatState<T> st_;
  std::vector<T> scratch_, pending_;
};

struct RepeatKind;
template <class T>
using RepeatDef = UnaryDef<RepeatKind, T, T, RepeatIter>;

inline auto repeat(std::int64_t times, RepeatOptions o = {}) {
  o.times = times;
  return unary<RepeatDef>(std::move(o));
}

struct RepeatKind {
  static constexpr std::string_view name = "repeat";
  static std::optional<std::uint64_t> length(const Params& p, std::span<const std::uint64_t> in, const LengthAt&) {
    const auto n = count_param(p, "times");
    return in.empty() || !n ? std::nullopt : times(in[0], *n);
  }
  static constexpr std::string_view doc =
      "Yields each element `times` times in a row (1 is a pass-through).";
  static constexpr ParamSchema params[] = {
      {.name = "times", .type = ParamType::integer, .doc = "copies of each element (at least 1)", .positional = true},
  };
  using Options = RepeatOptions;
  using State = RepeatState<std::int64_t>;  // the field names, whatever the element
  /// The parameters as the fingerprint writes them; throws ConfigError on an invalid count.
  static Params checked_params(const RepeatOptions& o) {
    if (o.times < 1) throw ConfigError(node_label(std::string(name), o.name) + ": times must be at least 1, got " + param_text(o.times));
    return {{"times", param_text(o.times)}};
  }
  static RescaleRule rescale() { return RescaleRule::refused(rescale::kNotDealt); }
  /// `{"op": "repeat", "times": N}`
  template <class Spec>
  static SpecPipeline from_spec(Spec& s) {
    RepeatOptions o{.name = s.name()};
    s.required("times", o.times);
    return s.input().apply([&](const auto& p) { return p | unary<RepeatDef>(o); });
  }
};

}  // namespace dpipe
