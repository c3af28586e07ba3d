#pragma once
/// Every node kind dpipe knows, one line each. The kind registry (rescale rules and state invariants, see
/// dpipe/node_kind.hpp) and the spec front ends' op tables are made from this list; adding a kind is its
/// header, its line here, its tests and its docs (docs/adding-a-node.md).
#include "dpipe/node_kind.hpp"
#include "dpipe/nodes/batch.hpp"
#include "dpipe/nodes/concat.hpp"
#include "dpipe/nodes/cycle.hpp"
#include "dpipe/nodes/dispatch.hpp"
#include "dpipe/nodes/filter.hpp"
#include "dpipe/nodes/flat_map.hpp"
#include "dpipe/nodes/from_vector.hpp"
#include "dpipe/nodes/generator.hpp"
#include "dpipe/nodes/line_blocks.hpp"
#include "dpipe/nodes/lines.hpp"
#include "dpipe/nodes/map.hpp"
#include "dpipe/nodes/merge.hpp"
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
#include "dpipe/nodes/take.hpp"
#include "dpipe/nodes/token_windows.hpp"
#include "dpipe/nodes/unbatch.hpp"
#include "dpipe/nodes/zip.hpp"

namespace dpipe {

using AllKinds = KindList<
    // sources
    RangeKind, FromVectorKind, GeneratorKind, LinesKind, LineBlocksKind, RecordsKind, TokenWindowsKind,
    // one input
    MapKind, ParallelMapKind, FilterKind, FlatMapKind, ShardingFilterKind, ShuffleKind, BatchKind, UnbatchKind,
    TakeKind, RepeatKind, CycleKind, SamplerKind, ReplicateKind,
    // segments
    DispatchKind, MergeKind, PrefetchKind,
    // several inputs
    ConcatKind, MuxKind, MuxLongestKind, ZipKind>;

}  // namespace dpipe
