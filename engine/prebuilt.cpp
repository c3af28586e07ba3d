// The engine code libdpipe compiles once for the prebuilt element types (dpipe/detail/prebuilt_types.hpp):
// each Run<T> with the merge and worker lanes it builds, and the dispatch of T to its workers.
#include "dpipe/engine.hpp"
#include "dpipe/nodes/dispatch.hpp"

namespace dpipe {

#define DPIPE_INSTANTIATE_PREBUILT(T)     \
  template class Run<T>;                  \
  template class MergeIter<T>;            \
  template class detail::AsyncLane<T>;    \
  template class DispatchIter<T, T>;
DPIPE_FOR_EACH_PREBUILT_TYPE(DPIPE_INSTANTIATE_PREBUILT)
#undef DPIPE_INSTANTIATE_PREBUILT

}  // namespace dpipe
