#pragma once
/// Keeps the elements for which a pure predicate holds. In: T → Out: T. State: none.
#include <algorithm>
#include <string>

#include "dpipe/nodes/map.hpp"
#include "dpipe/kit/rescale.hpp"
#include "dpipe/kit/spec.hpp"

namespace dpipe {

struct FilterOptions {
  std::string name{};
};

template <class T, class Pred>
class FilterDef final : public NodeDef<T> {
 public:
  FilterDef(std::shared_ptr<const NodeDef<T>> in, Pred pred, FilterOptions o)
      : NodeDef<T>("filter", o.name, describe_fn(pred), {in}), input_(std::move(in)), pred_(std::move(pred)) {}
  std::unique_ptr<Iter<T>> instantiate(BuildContext& ctx) const override;
  const NodeDef<T>& input() const { return *input_; }
  const Pred& pred() const { return pred_; }

 private:
  std::shared_ptr<const NodeDef<T>> input_;
  Pred pred_;
};

template <class T, class Pred>
class FilterIter final : public Stateless<T> {
 public:
  FilterIter(BuildContext& ctx, const FilterDef<T, Pred>& def)
      : Stateless<T>(ctx, "filter"), input_(def.input().instantiate(ctx)), pred_(def.pred()) {}

 protected:
  std::size_t pull_chunk(std::vector<T>& out, std::size_t max) override {
    const std::size_t before = out.size();
    while (out.size() == before) {  // pull until something survives or the input ends
      const std::size_t n = input_->pull(out, max);
      if (n == 0) return 0;
      T* p = out.data() + before;
      std::size_t kept = 0, i = 0;
      [[maybe_unused]] const auto scope = chunk_scope(pred_);
      try {
        for (; i < n; ++i)
          if (static_cast<bool>(pred_(p[i]))) {
            if (kept != i) p[kept] = std::move(p[i]);
            ++kept;
          }
      } catch (...) {
        out.resize(before + kept);
        return this->fail_after(kept);
      }
      out.resize(before + kept);
    }
    return out.size() - before;
  }
  std::vector<IterBase*> inputs() const override { return {input_.get()}; }
  std::size_t min_useful_pull() const override { return input_->min_useful_pull(); }

 private:
  std::unique_ptr<Iter<T>> input_;
  Pred pred_;
};

template <class T, class Pred>
std::unique_ptr<Iter<T>> FilterDef<T, Pred>::instantiate(BuildContext& ctx) const {
  return std::make_unique<FilterIter<T, Pred>>(ctx, *this);
}

template <class Pred>
auto filter(Pred pred, FilterOptions o = {}) {
  return make_closure([pred = std::move(pred), o = std::move(o)](const auto& p) {
    using T = typename std::decay_t<decltype(p)>::element_type;
    return make_pipeline<FilterDef<T, Pred>>(p.def(), pred, o);
  });
}

struct FilterKind {
  static constexpr std::string_view name = "filter";
  static constexpr std::string_view doc =
      "Keeps the elements for which a pure predicate holds.";
  static constexpr ParamSchema params[] = {
      {.name = "fn", .type = ParamType::function, .doc = "the predicate: a builtin function's name, or a Python callable", .positional = true},
  };
  using State = void;
  /// Rescale: a filter keeps no state, so every new instance gets the same (empty) record.
  static RescaleRule rescale() { return RescaleRule::replicated(); }
  /// `{"op": "filter", "fn": NAME, ...the predicate's parameters}`: a predicate the front end provides.
  template <class Spec>
  static SpecPipeline from_spec(Spec& s) {
    FilterOptions o{.name = s.name()};
    return s.filter_function([&](const auto& p, auto fn) { return p | filter(std::move(fn), o); });
  }
};

}  // namespace dpipe
