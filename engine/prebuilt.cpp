// The code libdpipe compiles once for the prebuilt element types (dpipe/detail/prebuilt_types.hpp): each
// Run<T> with the merge and worker lanes it builds, the dispatch of T to its workers, and the nodes whose
// only parameter is the element type (each header declares its own `extern template` lines).
#include "dpipe/engine.hpp"
#include "dpipe/nodes/batch.hpp"
#include "dpipe/nodes/cycle.hpp"
#include "dpipe/nodes/dispatch.hpp"
#include "dpipe/nodes/prefetch.hpp"
#include "dpipe/nodes/sampler.hpp"
#include "dpipe/nodes/sharding_filter.hpp"
#include "dpipe/nodes/shuffle.hpp"
#include "dpipe/nodes/take.hpp"

namespace dpipe {

#define DPIPE_INSTANTIATE_PREBUILT_RUN(T) \
  template class Run<T>;                  \
  template class MergeIter<T>;            \
  template class detail::AsyncLane<T>;    \
  template class DispatchIter<T, T>;
DPIPE_FOR_EACH_PREBUILT_TYPE(DPIPE_INSTANTIATE_PREBUILT_RUN)
#undef DPIPE_INSTANTIATE_PREBUILT_RUN

// The kinds whose headers declare DPIPE_DECLARE_PREBUILT_NODE (and batch, for the scalar types).
#define DPIPE_NODE_TEMPLATES(T, Def, Iter) \
  template class Def<T>;                   \
  template class Iter<T>;
DPIPE_FOR_EACH_PREBUILT_TYPE(DPIPE_NODE_TEMPLATES, ShuffleDef, ShuffleIter)
DPIPE_FOR_EACH_PREBUILT_TYPE(DPIPE_NODE_TEMPLATES, ShardingFilterDef, ShardingFilterIter)
DPIPE_FOR_EACH_PREBUILT_TYPE(DPIPE_NODE_TEMPLATES, SamplerDef, SamplerIter)
DPIPE_FOR_EACH_PREBUILT_TYPE(DPIPE_NODE_TEMPLATES, TakeDef, TakeIter)
DPIPE_FOR_EACH_PREBUILT_TYPE(DPIPE_NODE_TEMPLATES, CycleDef, CycleIter)
DPIPE_FOR_EACH_PREBUILT_TYPE(DPIPE_NODE_TEMPLATES, PrefetchDef, PrefetchIter)
DPIPE_FOR_EACH_PREBUILT_SCALAR_TYPE(DPIPE_NODE_TEMPLATES, BatchDef, BatchIter)
#undef DPIPE_NODE_TEMPLATES

}  // namespace dpipe
