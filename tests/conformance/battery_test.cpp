// The conformance battery: every node kind, snapshotted at breakpoints {0, 1, 5, middle, end} (and
// twice in a row), restored into a fresh Run through bytes, must continue with exactly the rest of
// the uninterrupted stream — for one, two and three workers.
#include <gtest/gtest.h>

#include <string>

#include "dpipe/builtins.hpp"
#include "dpipe/dpipe.hpp"
#include "../test_util.hpp"

namespace dpipe {
namespace {

using testing::drain;
using testing::options;

auto times3 = [](std::int64_t x) { return x * 3; };
auto is_odd = [](std::int64_t x) { return x % 2 != 0; };

std::vector<std::string> words(int n) {
  std::vector<std::string> v;
  for (int i = 0; i < n; ++i) v.push_back("w" + std::to_string(i * i));
  return v;
}

auto random_ints(std::int64_t count) {
  return generator([count](const GeneratorContext& ctx) {
    return [rng = ctx.rng, i = std::int64_t{0}, count]() mutable -> std::optional<std::int64_t> {
      if (i++ >= count) return std::nullopt;
      return static_cast<std::int64_t>(rng.below(1000));
    };
  });
}

#define DPIPE_CASE(Name, ...)                  \
  struct Name {                                \
    static auto make() { return __VA_ARGS__; } \
  }

DPIPE_CASE(Range, range(0, 100));
DPIPE_CASE(RangeNegativeStep, range(100, 0, {.step = -3}));
DPIPE_CASE(FromVector, from_vector(words(40)));
DPIPE_CASE(Generator, random_ints(60));
DPIPE_CASE(ShardingExplicit, range(0, 100) | sharding_filter({.num_shards = 3, .shard_id = 1}));
DPIPE_CASE(ShardingAll, range(0, 200) | sharding_filter());
DPIPE_CASE(ShardingWorkerThenRank,
           range(0, 150) | sharding_filter({.level = ShardLevel::worker}) | sharding_filter({.level = ShardLevel::rank}));
DPIPE_CASE(Shuffle, range(0, 500) | shuffle({.buffer = 64}));
DPIPE_CASE(ShuffleBiggerThanInput, range(0, 20) | shuffle({.buffer = 64}));
DPIPE_CASE(Map, range(0, 90) | map(times3));
DPIPE_CASE(MapChangesType, range(0, 50) | map([](std::int64_t x) { return std::to_string(x); }));
DPIPE_CASE(FlatMap, range(0, 30) | flat_map(builtins::Iota{}));
DPIPE_CASE(Filter, range(0, 120) | filter(is_odd));
DPIPE_CASE(Batch, range(0, 103) | batch({.size = 10}));
DPIPE_CASE(BatchDropLast, range(0, 103) | batch({.size = 10, .drop_last = true}));
DPIPE_CASE(Unbatch, range(0, 100) | batch({.size = 7}) | unbatch());
DPIPE_CASE(Concat, concat(range(0, 30), range(100, 140) | shuffle({.buffer = 8})));
DPIPE_CASE(Zip, zip(range(0, 50), from_vector(words(35))));
DPIPE_CASE(ZipAll, zip_all(std::vector{range(0, 50), range(100, 170), range(7, 47)}));
DPIPE_CASE(Mux, mux(range(0, 50), range(100, 130)));
DPIPE_CASE(MuxLongest, mux_longest(range(0, 50), range(100, 130), range(200, 207)));
DPIPE_CASE(Cycle, range(0, 10) | shuffle({.buffer = 4}) | cycle({.count = 4}));
DPIPE_CASE(CycleForeverThenTake, range(0, 7) | cycle() | take(40));
DPIPE_CASE(Repeat, range(0, 30) | repeat(3));
DPIPE_CASE(Take, range(0, 100) | take(37));
DPIPE_CASE(GeneratorInCycle, random_ints(13) | cycle({.count = 3}));
DPIPE_CASE(Canonical, range(0, 5000) | shuffle({.buffer = 1000}) | sharding_filter() | map(times3) | batch({.size = 32}));
DPIPE_CASE(NestedCombinators,
           mux_longest(range(0, 40) | batch({.size = 3}) | unbatch(), range(500, 520) | repeat(2)) |
               shuffle({.buffer = 9}) | batch({.size = 4}) | take(25));

template <class Case>
class Battery : public ::testing::Test {};

using Cases = ::testing::Types<Range, RangeNegativeStep, FromVector, Generator, ShardingExplicit, ShardingAll,
                               ShardingWorkerThenRank, Shuffle, ShuffleBiggerThanInput, Map, MapChangesType, FlatMap,
                               Filter, Batch, BatchDropLast, Unbatch, Concat, Zip, ZipAll, Mux, MuxLongest, Cycle,
                               CycleForeverThenTake, Repeat, Take, GeneratorInCycle, Canonical, NestedCombinators>;
class CaseNames {
 public:
  template <class T>
  static std::string GetName(int i) {
    static const char* names[] = {"Range", "RangeNegativeStep", "FromVector", "Generator", "ShardingExplicit",
                                  "ShardingAll", "ShardingWorkerThenRank", "Shuffle", "ShuffleBiggerThanInput", "Map",
                                  "MapChangesType", "FlatMap", "Filter", "Batch", "BatchDropLast", "Unbatch", "Concat",
                                  "Zip", "ZipAll", "Mux", "MuxLongest", "Cycle", "CycleForeverThenTake", "Repeat",
                                  "Take", "GeneratorInCycle", "Canonical", "NestedCombinators"};
    return names[i];
  }
};
TYPED_TEST_SUITE(Battery, Cases, CaseNames);

TYPED_TEST(Battery, ResumeAtEveryBreakpointContinuesTheStream) {
  const auto p = TypeParam::make();
  for (int workers : {1, 2, 3}) {
    const auto o = options(workers);
    const auto full = testing::collect(p, o);
    ASSERT_FALSE(full.empty());
    for (std::size_t at : {std::size_t{0}, std::size_t{1}, std::size_t{5}, full.size() / 2, full.size()}) {
      SCOPED_TRACE("workers " + std::to_string(workers) + ", breakpoint " + std::to_string(at));
      EXPECT_EQ(testing::stop_and_resume(p, o, at), full);
    }
  }
}

TYPED_TEST(Battery, SnapshotDoesNotDisturbTheRunningStream) {
  const auto p = TypeParam::make();
  const auto o = options(2);
  const auto full = testing::collect(p, o);
  Engine e;
  auto run = e.start(p, o);
  auto got = drain(run, full.size() / 3);
  (void)run.snapshot();
  auto rest = drain(run);
  got.insert(got.end(), rest.begin(), rest.end());
  EXPECT_EQ(got, full);
}

TYPED_TEST(Battery, ChainedRestoresContinueTheStream) {
  const auto p = TypeParam::make();
  const auto o = options(1);
  const auto full = testing::collect(p, o);
  Engine e;
  auto run = e.start(p, o);
  auto got = drain(run, 3);
  auto second = e.resume(p, Snapshot::from_bytes(run.snapshot().to_bytes()), o);
  auto more = drain(second, full.size() / 2);
  got.insert(got.end(), more.begin(), more.end());
  auto third = e.resume(p, Snapshot::from_bytes(second.snapshot().to_bytes()), o);
  auto rest = drain(third);
  got.insert(got.end(), rest.begin(), rest.end());
  EXPECT_EQ(got, full);
}

TYPED_TEST(Battery, SameSeedSameStreamAndSnapshotsAreIdentical) {
  const auto p = TypeParam::make();
  // Inline workers: with threads, the stream is the same but how much of it waits in the worker
  // queues at the snapshot depends on timing.
  auto o = options(2);
  o.inline_workers = true;
  EXPECT_EQ(testing::collect(p, o), testing::collect(p, o));
  Engine e;
  auto a = e.start(p, o);
  auto b = e.start(p, o);
  drain(a, 4);
  drain(b, 4);
  EXPECT_EQ(a.snapshot().to_bytes(), b.snapshot().to_bytes());
}

}  // namespace
}  // namespace dpipe
