// The code libdpipe compiles once for the prebuilt element types (dpipe/detail/prebuilt_types.hpp): each
// Run<T> with the merge and worker lanes it builds, the dispatch of T to its workers, and the nodes whose
// only parameter is the element type (each header declares its own `extern template` lines).
#include "dpipe/engine.hpp"
#include "dpipe/kinds.hpp"

namespace dpipe {

#define DPIPE_INSTANTIATE_PREBUILT_RUN(T) \
  template class Run<T>;                  \
  template class MergeIter<T>;            \
  template class detail::AsyncLane<T>;    \
  template class DispatchIter<T, T>;
DPIPE_FOR_EACH_PREBUILT_TYPE(DPIPE_INSTANTIATE_PREBUILT_RUN)
#undef DPIPE_INSTANTIATE_PREBUILT_RUN

// The kinds the kind list marks PREBUILT or PREBUILT_SCALAR (dpipe/kinds.hpp).
#define DPIPE_NODE_TEMPLATES(T, Def, Iter) \
  template class Def<T>;                   \
  template class Iter<T>;
#define DPIPE_NO_PREBUILT_CODE(Name)
#define DPIPE_PREBUILT_CODE(Name) DPIPE_FOR_EACH_PREBUILT_TYPE(DPIPE_NODE_TEMPLATES, Name##Def, Name##Iter)
#define DPIPE_PREBUILT_SCALAR_CODE(Name) DPIPE_FOR_EACH_PREBUILT_SCALAR_TYPE(DPIPE_NODE_TEMPLATES, Name##Def, Name##Iter)
DPIPE_FOR_EACH_KIND(DPIPE_NO_PREBUILT_CODE, DPIPE_PREBUILT_CODE, DPIPE_PREBUILT_SCALAR_CODE)
#undef DPIPE_NO_PREBUILT_CODE
#undef DPIPE_PREBUILT_CODE
#undef DPIPE_PREBUILT_SCALAR_CODE
#undef DPIPE_NODE_TEMPLATES

}  // namespace dpipe
