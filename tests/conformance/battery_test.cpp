// The conformance battery: every node kind, snapshotted at breakpoints {0, 1, 5, middle, end} (and
// twice in a row), restored into a fresh Run through bytes, must continue with exactly the rest of
// the uninterrupted stream — for one, two and three workers. The file sources read files their case
// writes into a temporary directory. tests/integration/battery_cli_test.py runs the same check
// through the tool, one spec per op.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "builtins.hpp"
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

// A case is a type whose make() builds the pipeline under test; kName names it in the test output.
#define DPIPE_CASE(Name, ...)                   \
  struct Name {                                 \
    static constexpr const char* kName = #Name; \
    static auto make() { return __VA_ARGS__; }  \
  }

// A case over data files: its `files` (a fixture of type Files) writes them into a temporary directory
// when the case is made, and removes them when the test is done; make() reads `files.paths`.
#define DPIPE_FILE_CASE(Name, Files, ...)       \
  struct Name {                                 \
    static constexpr const char* kName = #Name; \
    Files files;                                \
    auto make() const { return __VA_ARGS__; }   \
  }

/// Four text files of varied lines (empty ones, "\r\n" ends, lines longer than a small block), one of
/// them empty, each with lines of its own.
struct TextFiles {
  testing::TempDir dir;
  std::vector<std::string> paths;
  TextFiles() {
    std::vector<std::string> unused;
    int f = 0;
    for (std::size_t bytes : {12'000, 0, 7'000, 20'000}) {
      paths.push_back(dir.file("text" + std::to_string(f) + ".txt"));
      testing::write_bytes(paths.back(), testing::varied_text(bytes, unused, -1, 1000 * f++));
    }
  }
};

/// Two TFRecord files, records of 0 to 200 bytes (an empty one among them).
struct RecordFiles {
  testing::TempDir dir;
  std::vector<std::string> paths;
  RecordFiles() {
    for (int f = 0, count = 120; f < 2; ++f, count = 50) {
      std::vector<std::string> recs;
      for (int i = 0; i < count; ++i)
        recs.push_back(i == 7 ? "" : "f" + std::to_string(f) + "r" + std::to_string(i) +
                                         std::string(static_cast<std::size_t>(i * 37 % 200), 'x'));
      paths.push_back(dir.file("part" + std::to_string(f) + ".tfrecord"));
      write_records(paths.back(), recs);
    }
  }
};

/// Three uint16 token files: 55 and 33 windows of 9 tokens (plus a remainder that is dropped) and one
/// too short for a window.
struct TokenFiles {
  testing::TempDir dir;
  std::vector<std::string> paths;
  TokenFiles() {
    int f = 0;
    for (auto [count, first] : {std::pair{500u, 0u}, {301u, 40'000u}, {5u, 9'000u}}) {
      paths.push_back(dir.file("tokens" + std::to_string(f++) + ".bin"));
      testing::write_bytes(paths.back(), testing::counting_tokens(count, first));
    }
  }
};

/// Each element of a broadcast shard, times 3: workers share one object and each takes its part.
auto expand_shared = [](const std::shared_ptr<const std::vector<std::int64_t>>& s) {
  std::vector<std::int64_t> v;
  for (std::int64_t x : *s) v.push_back(x * 3);
  return v;
};
auto shard_of = [](std::int64_t m) {
  std::vector<std::int64_t> v;
  for (std::int64_t i = 0; i < 20; ++i) v.push_back(m * 100 + i);
  return v;
};

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
DPIPE_CASE(Skip, range(0, 100) | skip(37));
DPIPE_CASE(SkipPerWorkerThenBatch, range(0, 300) | sharding_filter() | shuffle({.buffer = 16}) | skip(20) | batch({.size = 7}));
DPIPE_CASE(GeneratorInCycle, random_ints(13) | cycle({.count = 3}));
DPIPE_CASE(Canonical, range(0, 5000) | shuffle({.buffer = 1000}) | sharding_filter() | map(times3) | batch({.size = 32}));
DPIPE_CASE(NestedCombinators,
           mux_longest(range(0, 40) | batch({.size = 3}) | unbatch(), range(500, 520) | repeat(2)) |
               shuffle({.buffer = 9}) | batch({.size = 4}) | take(25));

// sampler: in order and in a global shuffle, over both random-access sources, two epochs.
DPIPE_CASE(SamplerRangeInOrder, range(0, 100) | sampler({.shuffle = SamplerShuffle::none, .epochs = 2}));
DPIPE_CASE(SamplerRangeGlobal, range(0, 100) | sampler({.shuffle = SamplerShuffle::global, .epochs = 2}));
DPIPE_CASE(SamplerVectorInOrder, from_vector(words(40)) | sampler({.shuffle = SamplerShuffle::none, .epochs = 2}));
DPIPE_CASE(SamplerVectorGlobal, from_vector(words(40)) | sampler({.shuffle = SamplerShuffle::global, .epochs = 2}));
DPIPE_CASE(SamplerThenShuffleAndBatch, range(0, 300) | sampler() | shuffle({.buffer = 16}) | batch({.size = 5}));

// dispatch: the prefix once per rank, work per worker after it, merged.
DPIPE_CASE(DispatchRoundRobin,
           range(0, 200) | shuffle({.buffer = 16}) | dispatch() | shuffle({.buffer = 8}) | map(times3) |
               batch({.size = 4}));
DPIPE_CASE(DispatchBroadcast,
           range(0, 12) | map(shard_of) | dispatch(broadcast) | flat_map(expand_shared) |
               sharding_filter({.level = ShardLevel::worker}) | batch({.size = 3}));
DPIPE_CASE(SamplerBeforeDispatch,
           range(0, 150) | sampler({.epochs = 2}) | dispatch() | map(times3) | merge() | batch({.size = 6}));

// merge: an explicit end of the worker segment, with a suffix in the consumer's thread.
DPIPE_CASE(MergeThenBatch, range(0, 300) | sharding_filter() | shuffle({.buffer = 10}) | merge() | batch({.size = 7}));
DPIPE_CASE(MergeThenShuffleAndTake,
           range(0, 300) | sharding_filter() | map(times3) | merge() | shuffle({.buffer = 20}) | take(150));

// prefetch: the depth of the worker queues, before an explicit merge and at the end.
DPIPE_CASE(PrefetchBeforeMerge,
           range(0, 300) | sharding_filter() | batch({.size = 5}) | prefetch({.depth = 2}) | merge() | unbatch());
DPIPE_CASE(PrefetchAtTheEnd, range(0, 300) | sharding_filter() | map(times3) | prefetch({.depth = 3}));
// replicate: every instance reads the source in full, on purpose.
DPIPE_CASE(Replicate, range(0, 40) | replicate() | shuffle({.buffer = 8}) | map(times3));

// parallel_map: alone, in the worker segment, and in a dispatch's prefix.
DPIPE_CASE(ParallelMap, range(0, 400) | parallel_map(times3, {.max_in_flight = 16}));
DPIPE_CASE(ParallelMapThenShuffleAndBatch,
           range(0, 400) | sharding_filter() | parallel_map(times3, {.max_in_flight = 7}) | shuffle({.buffer = 10}) |
               batch({.size = 4}));
DPIPE_CASE(ParallelMapBeforeDispatch,
           range(0, 300) | parallel_map(times3, {.max_in_flight = 5}) | dispatch() | filter(is_odd) | merge());

// File sources: lines and line_blocks through logical shards, records and token_windows alone and sampled.
DPIPE_FILE_CASE(Lines, TextFiles, lines(files.paths, {.logical_shards = 7, .epochs = 2}));
DPIPE_FILE_CASE(LinesInOrderShuffledAndBatched, TextFiles,
                lines(files.paths, {.logical_shards = 5, .shuffle_shards = false}) | shuffle({.buffer = 12}) |
                    batch({.size = 4}));
DPIPE_FILE_CASE(LinesBeforeDispatch, TextFiles,
                lines(files.paths, {.logical_shards = 9}) | dispatch() | batch({.size = 3}) | merge());
DPIPE_FILE_CASE(LineBlocks, TextFiles, line_blocks(files.paths, {.logical_shards = 7, .epochs = 2, .block_bytes = 200}));
DPIPE_FILE_CASE(LineBlocksInOrderShuffled, TextFiles,
                line_blocks(files.paths, {.logical_shards = 4, .shuffle_shards = false, .block_bytes = 1000}) |
                    shuffle({.buffer = 5}));
DPIPE_FILE_CASE(Records, RecordFiles, records(files.paths));
DPIPE_FILE_CASE(RecordsSampled, RecordFiles, records(files.paths) | sampler({.epochs = 2}) | batch({.size = 4}));
DPIPE_FILE_CASE(TokenWindows, TokenFiles, token_windows(files.paths, {.seq_len = 9}));
DPIPE_FILE_CASE(TokenWindowsSampled, TokenFiles,
                token_windows(files.paths, {.seq_len = 9}) | sampler({.shuffle = SamplerShuffle::none}) |
                    shuffle({.buffer = 6}));

template <class Case>
class Battery : public ::testing::Test {};

using Cases = ::testing::Types<
    Range, RangeNegativeStep, FromVector, Generator, ShardingExplicit, ShardingAll, ShardingWorkerThenRank, Shuffle,
    ShuffleBiggerThanInput, Map, MapChangesType, FlatMap, Filter, Batch, BatchDropLast, Unbatch, Concat, Zip, ZipAll,
    Mux, MuxLongest, Cycle, CycleForeverThenTake, Repeat, Take, Skip, SkipPerWorkerThenBatch, GeneratorInCycle, Canonical, NestedCombinators,
    SamplerRangeInOrder, SamplerRangeGlobal, SamplerVectorInOrder, SamplerVectorGlobal, SamplerThenShuffleAndBatch,
    DispatchRoundRobin, DispatchBroadcast, SamplerBeforeDispatch, MergeThenBatch, MergeThenShuffleAndTake,
    PrefetchBeforeMerge, PrefetchAtTheEnd, ParallelMap, ParallelMapThenShuffleAndBatch, ParallelMapBeforeDispatch,
    Lines, LinesInOrderShuffledAndBatched, LinesBeforeDispatch, LineBlocks, LineBlocksInOrderShuffled, Records,
    RecordsSampled, TokenWindows, TokenWindowsSampled>;
class CaseNames {
 public:
  template <class T>
  static std::string GetName(int) {
    return T::kName;
  }
};
TYPED_TEST_SUITE(Battery, Cases, CaseNames);

TYPED_TEST(Battery, ResumeAtEveryBreakpointContinuesTheStream) {
  const TypeParam c;  // owns the case's data files, if any, for the whole test
  const auto p = c.make();
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

// With the worker queues one element deep, the node under test has not finished at the breakpoints
// (a queue of 64 chunks would hold most cases whole): its own state is what the snapshot carries.
TYPED_TEST(Battery, ResumeWithShallowQueuesMeetsTheNodeMidStream) {
  const TypeParam c;
  const auto p = c.make();
  const auto shallow = p | prefetch({.depth = 1});
  try {
    (void)Graph::build(*shallow.def());
  } catch (const ConfigError&) {
    GTEST_SKIP() << "the case sets its own queue depth or merges its workers itself";
  }
  for (int workers : {1, 2}) {
    const auto o = options(workers);
    const auto full = testing::collect(p, o);
    ASSERT_EQ(testing::collect(shallow, o), full);
    for (std::size_t at : {std::size_t{1}, full.size() / 3, full.size() / 2}) {
      SCOPED_TRACE("workers " + std::to_string(workers) + ", breakpoint " + std::to_string(at));
      EXPECT_EQ(testing::stop_and_resume(shallow, o, at), full);
    }
  }
}

TYPED_TEST(Battery, SnapshotDoesNotDisturbTheRunningStream) {
  const TypeParam c;  // owns the case's data files, if any, for the whole test
  const auto p = c.make();
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
  const TypeParam c;  // owns the case's data files, if any, for the whole test
  const auto p = c.make();
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
  const TypeParam c;  // owns the case's data files, if any, for the whole test
  const auto p = c.make();
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
