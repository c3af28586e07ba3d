#pragma once
/// Says "every instance reads this stream in full, on purpose": passes its input through unchanged and
/// silences the warning a run gives when a source that is not dealt to the instances reaches several of
/// them with no sharding_filter, sampler or dispatch between (each element would be delivered once per
/// instance, as torch does silently). In: T → Out: T. State: none.
#include <string>

#include "dpipe/kit/length.hpp"
#include "dpipe/pipeline.hpp"
#include "dpipe/kit/rescale.hpp"
#include "dpipe/kit/spec.hpp"

namespace dpipe {

struct ReplicateOptions {
  std::string name{};
};

template <class T>
class ReplicateIter final : public Stateless<T> {
 public:
  ReplicateIter(BuildContext& ctx, const NodeDef<T>& input) : Stateless<T>(ctx, "replicate"), input_(input.instantiate(ctx)) {}

 protected:
  std::size_t pull_chunk(std::vector<T>& out, std::size_t max) override { return input_->pull(out, max); }
  std::vector<IterBase*> inputs() const override { return {input_.get()}; }
  std::size_t min_useful_pull() const override { return input_->min_useful_pull(); }

 private:
  std::unique_ptr<Iter<T>> input_;
};

template <class T>
class ReplicateDef final : public NodeDef<T> {
 public:
  ReplicateDef(std::shared_ptr<const NodeDef<T>> in, ReplicateOptions o)
      : NodeDef<T>("replicate", o.name, {}, {in}), input_(std::move(in)) {}
  std::unique_ptr<Iter<T>> instantiate(BuildContext& ctx) const override {
    return std::make_unique<ReplicateIter<T>>(ctx, *input_);
  }

 private:
  std::shared_ptr<const NodeDef<T>> input_;
};

inline auto replicate(ReplicateOptions o = {}) {
  return make_closure([o = std::move(o)](const auto& p) {
    using T = typename std::decay_t<decltype(p)>::element_type;
    return make_pipeline<ReplicateDef<T>>(p.def(), o);
  });
}

struct ReplicateKind {
  static constexpr std::string_view name = "replicate";
  static constexpr LengthFn length = &same_length;
  static constexpr std::string_view doc =
      "Passes its input through and says every instance reads this stream in full on purpose (no warning).";
  static constexpr std::span<const ParamSchema> params{};
  using State = void;
  /// Every instance reads the stream in full on purpose.
  static Split split(const Params&) { return {.by_hand = true}; }
  /// Rescale: no state; every new instance reads the stream in full again.
  static RescaleRule rescale() { return RescaleRule::replicated(); }
  /// `{"op": "replicate"}`
  template <class Spec>
  static SpecPipeline from_spec(Spec& s) {
    ReplicateOptions o{.name = s.name()};
    return s.input().apply([&](const auto& p) { return p | replicate(o); });
  }
};

}  // namespace dpipe
