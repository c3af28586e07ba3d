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

#define DPIPE_INSTANTIATE_PREBUILT(T)    \
  template class Run<T>;                 \
  template class MergeIter<T>;           \
  template class detail::AsyncLane<T>;   \
  template class DispatchIter<T, T>;     \
  template class ShuffleDef<T>;          \
  template class ShuffleIter<T>;         \
  template class ShardingFilterDef<T>;   \
  template class ShardingFilterIter<T>;  \
  template class SamplerDef<T>;          \
  template class SamplerIter<T>;         \
  template class TakeDef<T>;             \
  template class TakeIter<T>;            \
  template class CycleDef<T>;            \
  template class CycleIter<T>;           \
  template class PrefetchDef<T>;         \
  template class PrefetchIter<T>;
DPIPE_FOR_EACH_PREBUILT_TYPE(DPIPE_INSTANTIATE_PREBUILT)
#undef DPIPE_INSTANTIATE_PREBUILT

template class BatchDef<std::int64_t>;
template class BatchIter<std::int64_t>;
template class BatchDef<std::string>;
template class BatchIter<std::string>;
template class BatchDef<Value>;
template class BatchIter<Value>;

}  // namespace dpipe
