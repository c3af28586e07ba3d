#pragma once
/// `map` with the function applied to up to `max_in_flight` elements at once on the engine's threads;
/// the output keeps the input's order. Each pull takes a chunk of at most `max_in_flight` elements
/// from its input and returns only when all of them are mapped, so no element is ever in flight
/// between pulls and a snapshot needs no state of its own. The function must be safe to call
/// concurrently. In: T → Out: fn(T). State: none.
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include "dpipe/kit/length.hpp"
#include "dpipe/detail/executor.hpp"
#include "dpipe/nodes/map.hpp"
#include "dpipe/kit/rescale.hpp"
#include "dpipe/kit/spec.hpp"

namespace dpipe {

struct ParallelMapOptions {
  std::int64_t max_in_flight = 64;
  std::string name{};
};

template <class In, class Fn>
class ParallelMapDef;

/// The function's parameters and the window, as the fingerprint writes them; throws ConfigError on an
/// invalid window (compiled once, not once per function and element type).
inline Params checked_params(Params fn_params, const ParallelMapOptions& o) {
  if (o.max_in_flight < 1 || o.max_in_flight > (1 << 20))
    throw ConfigError(node_label("parallel_map", o.name) + ": max_in_flight must be between 1 and 1048576, got " +
                      param_text(o.max_in_flight));
  fn_params.emplace_back("max_in_flight", param_text(o.max_in_flight));
  return fn_params;
}

namespace detail {
/// The results of a chunk mapped at once, in order, up to the first failure: the elements before it go on
/// and `fail(i)` (a node's fail_after, called while the failure is being handled) decides what follows.
template <class Out, class Fail>
std::size_t deliver_until_failure(std::vector<Out>& out, std::vector<std::optional<Out>>& results,
                                  const std::vector<std::exception_ptr>& errors, Fail fail) {
  for (std::size_t i = 0; i < results.size(); ++i) {
    if (errors[i]) {
      try {
        std::rethrow_exception(errors[i]);
      } catch (...) {
        return fail(i);
      }
    }
    out.push_back(std::move(*results[i]));
  }
  return results.size();
}
}  // namespace detail

template <class In, class Fn>
class ParallelMapIter final : public Stateless<map_result_t<In, Fn>> {
 public:
  using Out = map_result_t<In, Fn>;
  ParallelMapIter(BuildContext& ctx, const ParallelMapDef<In, Fn>& def)
      : Stateless<Out>(ctx, "parallel_map"), input_(def.input().instantiate(ctx)), fn_(def.fn()),
        executor_(ctx.inline_workers ? nullptr : ctx.executor), window_(def.max_in_flight()) {}

 protected:
  std::size_t pull_chunk(std::vector<Out>& out, std::size_t max) override {
    in_.clear();
    const std::size_t n = input_->pull(in_, std::min(max, window_));
    if (n == 0) return 0;
    results_.assign(n, std::nullopt);
    errors_.assign(n, nullptr);
    auto apply = [&](std::size_t i) {
      try {
        results_[i].emplace(fn_(std::move(in_[i])));
      } catch (...) {
        errors_[i] = std::current_exception();
      }
    };
    if (executor_) executor_->parallel_for(n, apply);
    else for (std::size_t i = 0; i < n; ++i) apply(i);
    const std::size_t delivered =
        detail::deliver_until_failure(out, results_, errors_, [this](std::size_t i) { return this->fail_after(i); });
    this->pass_traces(*input_, delivered);
    return delivered;
  }
  std::vector<IterBase*> inputs() const override { return {input_.get()}; }
  std::size_t min_useful_pull() const override { return window_; }
  bool carries_provenance() const override { return true; }
  bool holds_no_elements() const override { return true; }
  bool one_base() const override { return input_->one_base(); }
  bool recomputable() const override { return input_->recomputable(); }
  Out recompute(const Provenance& p) const override { return fn_(input_->recompute(p)); }

 private:
  std::unique_ptr<Iter<In>> input_;
  Fn fn_;
  detail::Executor* executor_;  // borrowed; null: map in this thread
  std::size_t window_;
  std::vector<In> in_;
  std::vector<std::optional<Out>> results_;
  std::vector<std::exception_ptr> errors_;
};

template <class In, class Fn>
class ParallelMapDef final : public NodeDef<map_result_t<In, Fn>> {
 public:
  using Out = map_result_t<In, Fn>;
  ParallelMapDef(std::shared_ptr<const NodeDef<In>> in, Fn fn, ParallelMapOptions o)
      : NodeDef<Out>("parallel_map", o.name, checked_params(describe_fn(fn), o), {in}), input_(std::move(in)),
        fn_(std::move(fn)), window_(static_cast<std::size_t>(o.max_in_flight)) {}
  std::unique_ptr<Iter<Out>> instantiate(BuildContext& ctx) const override {
    return std::make_unique<ParallelMapIter<In, Fn>>(ctx, *this);
  }
  const NodeDef<In>& input() const { return *input_; }
  const Fn& fn() const { return fn_; }
  std::size_t max_in_flight() const { return window_; }

 private:
  std::shared_ptr<const NodeDef<In>> input_;
  Fn fn_;
  std::size_t window_ = 1;
};

template <class Fn>
auto parallel_map(Fn fn, ParallelMapOptions o = {}) {
  return make_closure([fn = std::move(fn), o = std::move(o)](const auto& p) {
    using In = typename std::decay_t<decltype(p)>::element_type;
    return make_pipeline<ParallelMapDef<In, Fn>>(p.def(), fn, o);
  });
}

struct ParallelMapKind {
  static constexpr std::string_view name = "parallel_map";
  static constexpr LengthFn length = &same_length_unless_skipping;
  static constexpr std::string_view doc =
      "`map` with the function applied to up to `max_in_flight` elements at once; the output keeps the input's order.";
  /// Provenance (docs/design.md, "Provenance"; a kind without this line does not carry it).
  static constexpr std::string_view provenance = "passes its input's on; makes an element again by calling the function again";
  static constexpr ParamSchema params[] = {
      {.name = "fn", .type = ParamType::function, .doc = "the function: a builtin function's name, or a Python callable (each call takes the GIL: it pays where the callable releases it, numpy, a C tokenizer)", .positional = true},
      {.name = "max_in_flight", .type = ParamType::integer, .doc = "elements mapped at once", .fallback = "64", .tuning = true},
  };
  using State = void;
  /// Rescale: a parallel_map keeps no state between pulls, so every new instance gets the same record.
  static RescaleRule rescale() { return RescaleRule::replicated(); }
  /// `{"op": "parallel_map", "fn": NAME, "max_in_flight": 64, ...}`: a function the front end provides,
  /// which must not count positions (several run at once).
  template <class Spec>
  static SpecPipeline from_spec(Spec& s) {
    ParallelMapOptions o{.name = s.name()};
    s.param("max_in_flight", o.max_in_flight);
    return s.map_function([&](const auto& p, auto fn) { return p | parallel_map(std::move(fn), o); }, OnDataError::fail,
                          o.max_in_flight);
  }
};

}  // namespace dpipe
