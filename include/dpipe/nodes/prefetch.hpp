#pragma once
/// Sets how far each worker runs ahead of the consumer: up to `depth` elements wait in each worker's
/// queue (for a batching pipeline, `depth` batches), and the consumer takes up to half that at a time. It ends the worker segment, so it stands right
/// before `merge` or at the end of the pipeline. In: T → Out: T. State: none of its own (the queued
/// elements belong to the merge's state).
#include <string>

#include "dpipe/kit/length.hpp"
#include "dpipe/detail/prebuilt_types.hpp"
#include "dpipe/nodes/merge.hpp"
#include "dpipe/kit/rescale.hpp"
#include "dpipe/kit/spec.hpp"

namespace dpipe {

struct PrefetchOptions {
  std::int64_t depth = 8;
  std::string name{};
};

template <class T>
class PrefetchIter final : public Stateless<T> {
 public:
  PrefetchIter(BuildContext& ctx, const NodeDef<T>& input) : Stateless<T>(ctx, kPrefetchKind), input_(input.instantiate(ctx)) {}

 protected:
  std::size_t pull_chunk(std::vector<T>& out, std::size_t max) override {
    const std::size_t n = input_->pull(out, max);
    this->pass_traces(*input_);
    return n;
  }
  bool carries_provenance() const override { return true; }
  bool one_base() const override { return (*input_).one_base(); }
  bool recomputable() const override { return (*input_).recomputable(); }
  T recompute(const Provenance& p) const override { return (*input_).recompute(p); }
  bool holds_no_elements() const override { return true; }
  std::vector<IterBase*> inputs() const override { return {input_.get()}; }
  std::size_t min_useful_pull() const override { return input_->min_useful_pull(); }

 private:
  std::unique_ptr<Iter<T>> input_;
};

/// The options' parameters as the fingerprint writes them; throws ConfigError on invalid options (compiled
/// once, not once per element type).
inline Params checked_params(const PrefetchOptions& o) {
  if (o.depth < 1 || o.depth > (1 << 24))
    throw ConfigError(node_label(kPrefetchKind, o.name) + ": depth must be between 1 and 16777216, got " +
                      param_text(o.depth));
  return {{"depth", param_text(o.depth)}};
}

template <class T>
class PrefetchDef final : public NodeDef<T> {
 public:
  PrefetchDef(std::shared_ptr<const NodeDef<T>> in, PrefetchOptions o)
      : NodeDef<T>(kPrefetchKind, o.name, checked_params(o), {in}), input_(std::move(in)) {}
  std::unique_ptr<Iter<T>> instantiate(BuildContext& ctx) const override {
    return std::make_unique<PrefetchIter<T>>(ctx, *input_);
  }

 private:
  std::shared_ptr<const NodeDef<T>> input_;
};

inline auto prefetch(PrefetchOptions o = {}) {
  return make_closure([o = std::move(o)](const auto& p) {
    using T = typename std::decay_t<decltype(p)>::element_type;
    return make_pipeline<PrefetchDef<T>>(p.def(), o);
  });
}

struct PrefetchKind {
  static constexpr std::string_view name = "prefetch";
  static constexpr LengthFn length = &same_length;
  static constexpr std::string_view doc =
      "Sets how many elements wait in each worker's queue; it ends the worker segment.";
  /// Provenance (docs/design.md, "Provenance"; a kind without this line does not carry it).
  static constexpr std::string_view provenance = "passes its input's on; an element out of it is the one that went in";
  static constexpr ParamSchema params[] = {
      {.name = "depth", .type = ParamType::integer, .doc = "elements (or batches) queued per worker", .fallback = "8", .positional = true, .tuning = true},
  };
  using State = void;
  static constexpr SegmentRole segment = SegmentRole::worker_depth;
  /// Rescale: prefetch sets a queue depth and keeps no state of its own (the queue is the merge's).
  static RescaleRule rescale() { return RescaleRule::replicated(); }
  /// `{"op": "prefetch", "depth": 8}`
  template <class Spec>
  static SpecPipeline from_spec(Spec& s) {
    PrefetchOptions o{.name = s.name()};
    s.param("depth", o.depth);
    return s.input().apply([&](const auto& p) { return p | prefetch(o); });
  }
};

// Compiled once, in libdpipe, for the prebuilt element types (dpipe/detail/prebuilt_types.hpp).
DPIPE_DECLARE_PREBUILT_NODE(PrefetchDef, PrefetchIter)

}  // namespace dpipe
