#pragma once
/// Yields each element `times` times in a row (1 is a pass-through). In: T → Out: T.
/// State: the current element and how many copies of it are still due.
#include <optional>
#include <string>

#include "dpipe/pipeline.hpp"
#include "dpipe/rescale.hpp"
#include "dpipe/spec.hpp"

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
  std::string name{};
};

/// The parameters as the fingerprint writes them; throws ConfigError on an invalid count (compiled once,
/// not once per element type).
inline Params checked_params(std::int64_t times, const RepeatOptions& o) {
  if (times < 1) throw ConfigError(node_label("repeat", o.name) + ": times must be at least 1, got " + param_text(times));
  return {{"times", param_text(times)}};
}

template <Snapshottable T>
class RepeatDef final : public NodeDef<T> {
 public:
  RepeatDef(std::shared_ptr<const NodeDef<T>> in, std::int64_t times, RepeatOptions o)
      : NodeDef<T>("repeat", o.name, checked_params(times, o), {in}), input_(std::move(in)),
        times_(static_cast<std::uint64_t>(times)) {}
  std::unique_ptr<Iter<T>> instantiate(BuildContext& ctx) const override;
  const NodeDef<T>& input() const { return *input_; }
  std::uint64_t times() const { return times_; }

 private:
  std::shared_ptr<const NodeDef<T>> input_;
  std::uint64_t times_ = 1;
};

template <Snapshottable T>
class RepeatIter final : public Hooked<T> {
 public:
  RepeatIter(BuildContext& ctx, const RepeatDef<T>& def)
      : Hooked<T>(ctx, "repeat"), input_(def.input().instantiate(ctx)), times_(def.times()) {}

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
      if (input_->pull(scratch_, k) == 0) break;
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
  std::vector<IterBase*> inputs() const override { return {input_.get()}; }

 private:
  std::unique_ptr<Iter<T>> input_;
  std::uint64_t times_;
  RepeatState<T> st_;
  std::vector<T> scratch_, pending_;
};

template <Snapshottable T>
std::unique_ptr<Iter<T>> RepeatDef<T>::instantiate(BuildContext& ctx) const {
  return std::make_unique<RepeatIter<T>>(ctx, *this);
}

inline auto repeat(std::int64_t times, RepeatOptions o = {}) {
  return make_closure([times, o = std::move(o)](const auto& p) {
    using T = typename std::decay_t<decltype(p)>::element_type;
    return make_pipeline<RepeatDef<T>>(p.def(), times, o);
  });
}

struct RepeatKind {
  static constexpr std::string_view name = "repeat";
  static constexpr std::string_view doc =
      "Yields each element `times` times in a row (1 is a pass-through).";
  static constexpr ParamSchema params[] = {
      {.name = "times", .type = ParamType::integer, .doc = "copies of each element (not negative)", .positional = true},
  };
  using State = RepeatState<std::int64_t>;  // the field names, whatever the element
  static RescaleRule rescale() { return RescaleRule::refused(rescale::kNotDealt); }
  /// `{"op": "repeat", "times": N}`
  template <class Spec>
  static SpecPipeline from_spec(Spec& s) {
    std::int64_t times = 1;
    RepeatOptions o{.name = s.name()};
    s.required("times", times);
    return s.input().apply([&](const auto& p) { return p | repeat(times, o); });
  }
};

}  // namespace dpipe
