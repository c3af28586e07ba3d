// The runs libdpipe compiles once (DPIPE_FOR_EACH_PREBUILT_RUN_TYPE, dpipe/engine.hpp): each Run<T> with
// the merge and worker lanes it builds.
#include "dpipe/engine.hpp"

namespace dpipe {

#define DPIPE_INSTANTIATE_PREBUILT_RUN(T) \
  template class Run<T>;                  \
  template class MergeIter<T>;            \
  template class detail::AsyncLane<T>;
DPIPE_FOR_EACH_PREBUILT_RUN_TYPE(DPIPE_INSTANTIATE_PREBUILT_RUN)
#undef DPIPE_INSTANTIATE_PREBUILT_RUN

}  // namespace dpipe
