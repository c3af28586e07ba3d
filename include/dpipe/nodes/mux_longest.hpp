#pragma once
/// One element from each input in turn, skipping exhausted inputs, until all are exhausted
/// (torchdata's mux_longest). In: T, T, … → Out: T. State: as `mux` (shared implementation).
#include "dpipe/nodes/mux.hpp"

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

}  // namespace dpipe
