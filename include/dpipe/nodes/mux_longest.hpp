#pragma once
/// One element from each input in turn, skipping exhausted inputs, until all are exhausted
/// (torchdata's mux_longest). In: T, T, … → Out: T. State: as `mux` (shared implementation).
#include "dpipe/kit/length.hpp"
#include "dpipe/nodes/mux.hpp"
#include "dpipe/kit/rescale.hpp"
#include "dpipe/kit/spec.hpp"

namespace dpipe {

template <class T>
auto mux_longest_with(std::vector<Pipeline<T>> others, MuxOptions o = {}) {
  return make_closure([others = std::move(others), o = std::move(o)](const Pipeline<T>& p) {
    auto defs = defs_of(others);
    defs.insert(defs.begin(), p.def());
    return make_pipeline<MuxDef<T>>(std::move(defs), true, o);
  });
}

template <class T, class... More>
Pipeline<T> mux_longest(const Pipeline<T>& first, const More&... more) {
  return make_pipeline<MuxDef<T>>(defs_of(std::vector<Pipeline<T>>{first, more...}), true, MuxOptions{});
}

struct MuxLongestKind {
  static constexpr std::string_view name = "mux_longest";
  static constexpr LengthFn length = &summed_length;  // every element of every input
  static constexpr std::string_view doc =
      "One element from each input in turn, skipping exhausted inputs, until all are exhausted.";
  static constexpr ParamSchema params[] = {
      {.name = "with", .type = ParamType::pipelines, .doc = "the other inputs (Python: positional)"},
  };
  using State = MuxState<ElementBlobs>;
  static RescaleRule rescale() { return RescaleRule::refused(rescale::kNotDealt); }
  /// `{"op": "mux_longest", "with": [PIPELINE, ...]}`: as mux, going on with the inputs that remain.
  template <class Spec>
  static SpecPipeline from_spec(Spec& s) {
    MuxOptions o{.name = s.name()};
    return s.input().apply(
        [&]<class T>(const Pipeline<T>& p) { return p | mux_longest_with(s.template inputs<T>("with"), o); },
        "mux_longest");
  }
};

}  // namespace dpipe
