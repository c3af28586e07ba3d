#pragma once
/// Runs of spec pipelines: `Run<T>` for every spec element type is compiled once, in spec.cpp, and
/// whatever includes json_spec.hpp (the tool, the Python module, tests) links it instead of each
/// building a run's iterators (the merge, the lanes, snapshot and restore) for all of the types.
/// A type added to SpecElementTypes without a line here still works: the front ends then compile its
/// Run themselves.
#include "dpipe/engine.hpp"
#include "dpipe/spec.hpp"

namespace dpipe {

extern template class Run<SpecInt>;
extern template class Run<SpecStr>;
extern template class Run<std::vector<SpecInt>>;
extern template class Run<std::vector<SpecStr>>;
extern template class Run<std::vector<std::vector<SpecInt>>>;
extern template class Run<std::vector<std::vector<SpecStr>>>;
extern template class Run<Value>;
extern template class Run<std::vector<Value>>;

}  // namespace dpipe
