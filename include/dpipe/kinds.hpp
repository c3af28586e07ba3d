#pragma once
/// Every node kind dpipe knows: its header, included here, and its name in the list below. The kind
/// registry (dpipe/kit/node_kind.hpp), the spec front end's op table, `dpipe ops`, the Python node functions,
/// docs/ops.md and libdpipe's prebuilt node code are all made from this list; adding a kind is its header,
/// its two lines here, its tests and its docs (docs/adding-a-node.md).
#include "dpipe/kit/node_kind.hpp"
#include "dpipe/nodes/batch.hpp"
#include "dpipe/nodes/bucket_by_length.hpp"
#include "dpipe/nodes/concat.hpp"
#include "dpipe/nodes/cycle.hpp"
#include "dpipe/nodes/demux.hpp"
#include "dpipe/nodes/dispatch.hpp"
#include "dpipe/nodes/enumerate.hpp"
#include "dpipe/nodes/filter.hpp"
#include "dpipe/nodes/flat_map.hpp"
#include "dpipe/nodes/fork.hpp"
#include "dpipe/nodes/from.hpp"
#include "dpipe/nodes/from_vector.hpp"
#include "dpipe/nodes/generator.hpp"
#include "dpipe/nodes/line_blocks.hpp"
#include "dpipe/nodes/lines.hpp"
#include "dpipe/nodes/map.hpp"
#include "dpipe/nodes/merge.hpp"
#include "dpipe/nodes/mix.hpp"
#include "dpipe/nodes/pack.hpp"
#include "dpipe/nodes/padded_batch.hpp"
#include "dpipe/nodes/parse_json.hpp"
#include "dpipe/nodes/mux.hpp"
#include "dpipe/nodes/mux_longest.hpp"
#include "dpipe/nodes/parallel_map.hpp"
#include "dpipe/nodes/prefetch.hpp"
#include "dpipe/nodes/range.hpp"
#include "dpipe/nodes/records.hpp"
#include "dpipe/nodes/repeat.hpp"
#include "dpipe/nodes/replicate.hpp"
#include "dpipe/nodes/sampler.hpp"
#include "dpipe/nodes/sharding_filter.hpp"
#include "dpipe/nodes/shuffle.hpp"
#include "dpipe/nodes/skip.hpp"
#include "dpipe/nodes/take.hpp"
#include "dpipe/nodes/token_windows.hpp"
#include "dpipe/nodes/tokenize.hpp"
#include "dpipe/nodes/unbatch.hpp"
#include "dpipe/nodes/unzip.hpp"
#include "dpipe/nodes/zip.hpp"
#include "dpipe/nodes/zip_longest.hpp"

/// The kind list, in registry order: KIND(Name) names NameKind. PREBUILT(Name) is a kind whose NameDef<T>
/// and NameIter<T> libdpipe compiles once for every prebuilt element type (its header declares them
/// `extern` with DPIPE_DECLARE_PREBUILT_NODE; engine/prebuilt.cpp instantiates them from this list);
/// PREBUILT_SCALAR(Name) the same for the scalar prebuilt types.
#define DPIPE_FOR_EACH_KIND(KIND, PREBUILT, PREBUILT_SCALAR)                                                       \
  /* sources */                                                                                                \
  KIND(Range) KIND(FromVector) KIND(Generator) KIND(Lines) KIND(LineBlocks) KIND(Records) KIND(TokenWindows)      \
  /* one input */                                                                                              \
  KIND(Map) KIND(ParallelMap) KIND(Filter) KIND(FlatMap) PREBUILT(ShardingFilter) PREBUILT(Shuffle)               \
  PREBUILT_SCALAR(Batch) KIND(Unbatch) PREBUILT(Take) KIND(Skip) KIND(Repeat) PREBUILT(Cycle) PREBUILT(Sampler) KIND(Replicate) KIND(Enumerate) \
  /* records: text to tokens to rows */                                                                          \
  KIND(ParseJson) KIND(Tokenize) KIND(Pack) KIND(PaddedBatch) KIND(BucketByLength)                                                   \
  /* segments */                                                                                               \
  KIND(Dispatch) KIND(Merge) PREBUILT(Prefetch)                                                                 \
  /* several inputs */                                                                                         \
  KIND(Concat) KIND(Mux) KIND(MuxLongest) KIND(Zip) KIND(ZipLongest) KIND(Mix)                                                   \
  /* several outputs, and the branches that read them */                                                     \
  KIND(Fork) KIND(Demux) KIND(Unzip) KIND(From)

namespace dpipe {

namespace detail {
template <class List>
struct drop_first;
template <class First, class... K>
struct drop_first<KindList<First, K...>> {
  using type = KindList<K...>;
};
}  // namespace detail

#define DPIPE_KIND_TYPE_(Name) , Name##Kind
using AllKinds = detail::drop_first<KindList<void DPIPE_FOR_EACH_KIND(DPIPE_KIND_TYPE_, DPIPE_KIND_TYPE_, DPIPE_KIND_TYPE_)>>::type;
#undef DPIPE_KIND_TYPE_

}  // namespace dpipe
