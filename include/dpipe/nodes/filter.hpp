#pragma once
/// Keeps the elements for which a pure predicate holds. In: T → Out: T. State: none; with on_error =
/// skip, how many elements it dropped because the predicate threw on them (kit/on_error.hpp).
#include <algorithm>
#include <string>

#include "dpipe/kit/call_count.hpp"
#include "dpipe/nodes/map.hpp"
#include "dpipe/kit/rescale.hpp"
#include "dpipe/kit/spec.hpp"

namespace dpipe {

struct FilterOptions {
  /// An element the predicate throws on: fail the run (after the elements kept before it), or skip it.
  OnDataError on_error = OnDataError::fail;
  std::string name{};
};

template <class T, class Pred>
class FilterDef final : public NodeDef<T> {
 public:
  FilterDef(std::shared_ptr<const NodeDef<T>> in, Pred pred, FilterOptions o)
      : NodeDef<T>("filter", o.name, describe_fn(pred, o.on_error), {in}), input_(std::move(in)),
        pred_(std::move(pred)), on_error_(o.on_error) {}
  std::unique_ptr<Iter<T>> instantiate(BuildContext& ctx) const override;
  const NodeDef<T>& input() const { return *input_; }
  const Pred& pred() const { return pred_; }
  OnDataError on_error() const { return on_error_; }

 private:
  std::shared_ptr<const NodeDef<T>> input_;
  Pred pred_;
  OnDataError on_error_;
};

template <class T, class Pred>
class FilterIter final : public HookedIf<T> {
 public:
  FilterIter(BuildContext& ctx, const FilterDef<T, Pred>& def)
      : HookedIf<T>(def.on_error() == OnDataError::skip, ctx, "filter"), input_(def.input().instantiate(ctx)),
        pred_(def.pred()), skips_(def.on_error() == OnDataError::skip) {}

 protected:
  std::size_t pull_chunk(std::vector<T>& out, std::size_t max) override {
    const std::size_t before = out.size();
    while (out.size() == before) {  // pull until something survives or the input ends
      const std::size_t n = input_->pull(out, max);
      if (n == 0) return 0;
      T* p = out.data() + before;
      Provenance* traces = this->traced() ? input_->traces().data() : nullptr;  // compacted alike
      std::size_t kept = 0, i = 0;
      [[maybe_unused]] const auto scope = chunk_scope(pred_);
      try {
        for (; i < n; ++i)
          if (holds(p[i])) {
            if (kept != i) {
              p[kept] = std::move(p[i]);
              if (traces) traces[kept] = std::move(traces[i]);
            }
            ++kept;
          }
      } catch (...) {
        out.resize(before + kept);
        this->pass_traces(*input_, kept);
        return this->fail_after(kept);
      }
      out.resize(before + kept);
      this->pass_traces(*input_, kept);
    }
    return out.size() - before;
  }
  void save_state(StateWriter& w) const override {
    if (skips_) w.write(skipped_);
  }
  void restore_state(StateReader& r) override {
    if (skips_) r.read(skipped_);
  }
  std::uint64_t skipped_elements() const override { return skipped_.skipped; }
  std::optional<std::uint64_t> input_taken() const override { return call_count(pred_); }
  bool counts_input() const override { return CountsCalls<Pred>; }
  void restore_input_taken(std::optional<std::uint64_t> taken) override { restore_call_count(pred_, taken); }
  std::vector<IterBase*> inputs() const override { return {input_.get()}; }
  std::size_t min_useful_pull() const override { return input_->min_useful_pull(); }
  bool carries_provenance() const override { return true; }
  bool one_base() const override { return (*input_).one_base(); }
  bool recomputable() const override { return (*input_).recomputable(); }
  T recompute(const Provenance& p) const override { return (*input_).recompute(p); }
  bool holds_no_elements() const override { return true; }

 private:

  /// Whether the predicate holds; with on_error = skip, an element it throws on is counted and dropped.
  bool holds(const T& x) {
    if (!skips_) return static_cast<bool>(pred_(x));
    try {
      return static_cast<bool>(pred_(x));
    } catch (...) {
      if (!skip_current_exception(pred_, true, skipped_)) throw;
      return false;
    }
  }

  std::unique_ptr<Iter<T>> input_;
  Pred pred_;
  bool skips_;
  SkipCountState skipped_;
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
  /// Provenance (docs/design.md, "Provenance"; a kind without this line does not carry it).
  static constexpr std::string_view provenance = "passes the kept elements' on; an element out of it is the one that went in";
  static constexpr ParamSchema params[] = {
      {.name = "fn", .type = ParamType::function, .doc = "the predicate: a builtin function's name, or a Python callable", .positional = true},
      kFieldParam,
      kOnErrorFunctionParam,
  };
  /// Only with on_error = skip (otherwise the node is stateless).
  using State = SkipCountState;
  /// Rescale: a stateless filter's (empty) record is replicated; a skipping filter's counts are summed.
  static RescaleRule rescale() { return rescale::summed_skip_count(); }
  /// `snapshot show`: elements skipped.
  static std::string summary(const NodeState& record, const GraphNodeRecord&) { return skip_count_summary(record, "elements"); }
  /// `{"op": "filter", "fn": NAME, ...the predicate's parameters, "field": F, "on_error": "skip"}`: a predicate
  /// the front end provides.
  template <class Spec>
  static SpecPipeline from_spec(Spec& s) {
    FilterOptions o{.name = s.name()};
    s.choice("on_error", o.on_error, {{"fail", OnDataError::fail}, {"skip", OnDataError::skip}});
    return s.filter_function([&](const auto& p, auto fn) { return p | filter(std::move(fn), o); }, o.on_error);
  }
};

}  // namespace dpipe
