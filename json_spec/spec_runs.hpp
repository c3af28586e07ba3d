#pragma once
/// Runs of spec pipelines: `Run<T>` for every spec element type is compiled once, in spec.cpp, and
/// whatever includes json_spec.hpp (the tool, the Python module, tests) links it instead of each
/// building a run's iterators (the merge, the lanes, snapshot and restore) for all of the types.
/// A type added to SpecElementTypes without a line here still works: the front ends then compile its
/// Run themselves.
#include "dpipe/engine.hpp"
#include "dpipe/spec.hpp"

/// Calls DO(T) for each spec element type whose Run is compiled once: the one list behind both the
/// declarations below and the instantiations in spec.cpp.
#define DPIPE_FOR_EACH_SPEC_RUN_TYPE(DO)                                                              \
  DO(SpecInt) DO(SpecStr) DO(std::vector<SpecInt>) DO(std::vector<SpecStr>)                         \
  DO(std::vector<std::vector<SpecInt>>) DO(std::vector<std::vector<SpecStr>>) DO(Value)             \
  DO(std::vector<Value>)

namespace dpipe {

#define DPIPE_DECLARE_SPEC_RUN(T) extern template class Run<T>;
DPIPE_FOR_EACH_SPEC_RUN_TYPE(DPIPE_DECLARE_SPEC_RUN)
#undef DPIPE_DECLARE_SPEC_RUN

}  // namespace dpipe
