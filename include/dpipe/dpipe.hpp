#pragma once
/// dpipe: typed dataflow pipelines for ML input, with exact snapshots. Include this for everything.
#include "dpipe/atomic_file.hpp"
#include "dpipe/engine.hpp"
#include "dpipe/error.hpp"
#include "dpipe/graph.hpp"
#include "dpipe/layout.hpp"
#include "dpipe/pipeline.hpp"
#include "dpipe/regular_file.hpp"
#include "dpipe/snapshot.hpp"
#include "dpipe/snapshot_set.hpp"
#include "dpipe/value.hpp"

#include "dpipe/kinds.hpp"  // every node kind
