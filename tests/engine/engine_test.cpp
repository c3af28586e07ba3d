// The parallel engine: determinism across thread counts and timing, segments (dispatch, merge,
// prefetch, parallel_map), exact snapshots with data in flight, failures and cancellation.
// This suite is also built under ThreadSanitizer, so it depends on the library only.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <memory>
#include <numeric>
#include <optional>
#include <cstdio>
#include <random>
#include <set>
#include <string>
#include <thread>

#include "builtins.hpp"
#include "dpipe/detail/fifo.hpp"
#include "dpipe/dpipe.hpp"
#include "../test_util.hpp"

namespace dpipe {
namespace {

using testing::drain;
using I64 = std::int64_t;

RunOptions layout(int workers, bool inline_workers = false, int rank = 0, int world = 1, std::uint64_t seed = 11) {
  RunOptions o{.seed = seed, .layout = Layout{rank, world, workers}};
  o.inline_workers = inline_workers;
  return o;
}

template <class T>
std::vector<T> collect_with(const Pipeline<T>& p, const RunOptions& o, int threads) {
  Engine e({.threads = threads});
  auto run = e.start(p, o);
  return drain(run);
}

/// Burns a little CPU so workers are busy while the consumer snapshots.
auto busy = [](I64 x) {
  builtins::spin_for(200);
  return x;
};

// ---- the queue of the lanes and the dispatcher ---------------------------------------------------

// Random appends and takes against std::deque: the same elements in the same order, whatever the runs
// and wherever the taken front is dropped; move-only elements are moved, never copied.
TEST(Fifo, KeepsOrderAcrossRandomAppendsAndTakesLikeADeque) {
  std::mt19937_64 rng(7);
  detail::Fifo<std::unique_ptr<I64>> fifo;
  std::deque<I64> reference;
  I64 next = 0;
  std::size_t taken_total = 0;
  for (int step = 0; step < 20000; ++step) {
    if (rng() % 2) {
      std::vector<std::unique_ptr<I64>> chunk;
      for (auto k = rng() % 9; k > 0; --k) {
        reference.push_back(next);
        chunk.push_back(std::make_unique<I64>(next++));
      }
      if (rng() % 2) {
        fifo.append_moved(chunk);
      } else {
        for (auto& x : chunk) fifo.push_back(std::move(x));
      }
    } else {
      std::vector<std::unique_ptr<I64>> out;
      out.push_back(std::make_unique<I64>(-1));  // taken elements go after what `out` holds
      const std::size_t want = rng() % 12;
      const std::size_t n = fifo.take_into(out, want);
      ASSERT_EQ(n, std::min(want, reference.size()));
      ASSERT_EQ(out.size(), n + 1);
      for (std::size_t i = 0; i < n; ++i) {
        ASSERT_EQ(*out[i + 1], reference.front());
        reference.pop_front();
      }
      taken_total += n;
    }
    ASSERT_EQ(fifo.size(), reference.size());
    ASSERT_EQ(fifo.empty(), reference.empty());
  }
  EXPECT_GT(taken_total, 10000u);
  std::vector<I64> queued;
  for (auto it = fifo.begin(); it != fifo.end(); ++it) queued.push_back(**it);
  EXPECT_EQ(queued, std::vector<I64>(reference.begin(), reference.end()));
}

TEST(Fifo, AssignReplacesTheQueueAndCopiesArePushedAsCopies) {
  detail::Fifo<std::string> fifo;
  const std::string kept = "kept";
  fifo.push_back(kept);
  fifo.push_back(std::string("dropped"));
  std::vector<std::string> out;
  ASSERT_EQ(fifo.take_into(out, 1), 1u);
  EXPECT_EQ(kept, "kept");
  fifo.assign({"a", "b", "c"});
  EXPECT_EQ(fifo.size(), 3u);
  EXPECT_EQ(std::vector<std::string>(fifo.begin(), fifo.end()), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(fifo.take_into(out, 10), 3u);
  EXPECT_EQ(out, (std::vector<std::string>{"kept", "a", "b", "c"}));
  EXPECT_TRUE(fifo.empty());
  EXPECT_EQ(fifo.take_into(out, 10), 0u);
}

// ---- determinism -------------------------------------------------------------------------------

TEST(Determinism, SameStreamAtAnyThreadCountAndInline) {
  const std::vector<Pipeline<I64>> pipelines = {
      range(0, 3000) | shuffle({.buffer = 100}) | sharding_filter() | map(busy),
      range(0, 2000) | filter([](I64 x) { return x % 3 != 0; }) | batch({.size = 7}) | unbatch(),
      range(0, 1500) | dispatch() | map(busy) | shuffle({.buffer = 20}) | merge() | batch({.size = 5}) | unbatch(),
      range(0, 1000) | shuffle({.buffer = 50}) | parallel_map(busy, {.max_in_flight = 16}) | prefetch({.depth = 3}),
  };
  for (std::size_t i = 0; i < pipelines.size(); ++i) {
    for (int workers : {1, 2, 4}) {
      SCOPED_TRACE("pipeline " + std::to_string(i) + ", workers " + std::to_string(workers));
      const auto reference = collect_with(pipelines[i], layout(workers, true), 1);
      ASSERT_FALSE(reference.empty());
      for (int threads : {1, 2, 8})
        for (int repeat = 0; repeat < 2; ++repeat)
          EXPECT_EQ(collect_with(pipelines[i], layout(workers), threads), reference) << "threads " << threads;
    }
  }
}

TEST(Merge, IsRoundRobinAndSkipsExhaustedWorkers) {
  // Without sharding, every worker runs the whole pipeline: each element once per worker, in turn.
  EXPECT_EQ(testing::collect(range(0, 3), layout(2)), (std::vector<I64>{0, 0, 1, 1, 2, 2}));
  // With sharding the round-robin restores the source order; worker 0 has one more element.
  auto all = testing::collect(range(0, 10) | sharding_filter(), layout(3));
  EXPECT_EQ(all, (std::vector<I64>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
  // Workers yielding different counts: take(k) acts per worker in the worker segment.
  auto uneven = testing::collect(range(0, 12) | sharding_filter() | filter([](I64 x) { return x < 5 || x % 3 == 0; }),
                                 layout(3));
  EXPECT_EQ(uneven, (std::vector<I64>{0, 1, 2, 3, 4, 6, 9}));
}

TEST(Dispatch, RoundRobinHandsElementIToWorkerIModK) {
  Engine e;
  auto p = range(0, 100) | dispatch() | map([](I64 x) { return x * 10; }) | merge();
  auto run = e.start(p, layout(3));
  auto out = drain(run);
  std::vector<I64> expected;
  for (I64 i = 0; i < 100; ++i) expected.push_back(i * 10);
  EXPECT_EQ(out, expected);  // dealt round-robin and merged round-robin: the source order
}

TEST(Dispatch, PrefixRunsOncePerRankAndTakeActsAfterMerge) {
  auto pulled = std::make_shared<std::atomic<int>>(0);
  auto p = range(0, 40) | map([pulled](I64 x) {
             pulled->fetch_add(1);
             return x;
           }) |
           dispatch() | merge() | take(10);
  auto out = testing::collect(p, layout(4));
  EXPECT_EQ(out, (std::vector<I64>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
  EXPECT_LE(pulled->load(), 40);  // once per rank, not once per worker
}

TEST(Dispatch, APrefixWithParallelMapNeitherDeadlocksNorReorders) {
  // Workers pull the prefix under the dispatcher's lock; the prefix's parallel_map must not run another
  // worker's task on the same thread while it waits.
  auto p = range(0, 6000) | parallel_map(busy, {.max_in_flight = 32}) | dispatch() | map(busy) | merge();
  std::vector<I64> expected(6000);
  std::iota(expected.begin(), expected.end(), 0);
  for (int threads : {1, 2, 4}) EXPECT_EQ(collect_with(p, layout(4), threads), expected) << threads << " threads";
}

TEST(Dispatch, BroadcastSharesOneObjectWithEveryWorker) {
  auto loads = std::make_shared<std::atomic<int>>(0);
  auto seen = std::make_shared<std::mutex>();
  auto addresses = std::make_shared<std::set<const void*>>();
  auto p = range(0, 6) | map([loads](I64 m) {
             loads->fetch_add(1);
             return std::vector<I64>(1000, m);  // a "large" shard
           }) |
           dispatch(broadcast) | map([seen, addresses](const std::shared_ptr<const std::vector<I64>>& s) {
             std::lock_guard lock(*seen);
             addresses->insert(s.get());
             return (*s)[0];
           }) |
           merge();
  auto out = testing::collect(p, layout(3));
  EXPECT_EQ(out, (std::vector<I64>{0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4, 5, 5, 5}));
  EXPECT_EQ(loads->load(), 6);
  EXPECT_LE(addresses->size(), 6u);  // one object per shard, whatever the number of workers
}

// A map that describes itself as the spec's "unshare", over shared elements: the graph a spec broadcast
// had before the spec used broadcast_copies.
struct UnshareShared {
  template <class T>
  T operator()(const std::shared_ptr<const T>& p) const {
    return *p;
  }
  Params describe() const { return {{"fn", "unshare"}}; }
};

TEST(Dispatch, BroadcastCopiesGivesEveryWorkerItsOwnCopyAndTheSharedBroadcastsSnapshots) {
  const auto shards = range(0, 40) | map([](I64 m) { return std::vector<I64>(3, m); });
  auto copies = shards | dispatch(broadcast_copies) | map(DispatchKind::Unshare{}) | merge();
  auto shared = shards | dispatch(broadcast) | map(UnshareShared{}) | merge();
  std::vector<std::vector<I64>> expected;
  for (I64 m = 0; m < 40; ++m)
    for (int w = 0; w < 3; ++w) expected.push_back(std::vector<I64>(3, m));
  EXPECT_EQ(testing::collect(copies, layout(3)), expected);
  EXPECT_EQ(testing::collect(shared, layout(3)), expected);
  // The same graph, and at every point the same bytes: a spec snapshot written while its broadcast was
  // shared resumes with the copying one.
  Engine e({.threads = 2});
  auto a = e.start(copies, layout(3));
  auto b = e.start(shared, layout(3));
  EXPECT_EQ(a.graph().fingerprint(), b.graph().fingerprint());
  for (int step : {0, 5, 31, 77}) {
    while (static_cast<int>(a.delivered()) < step) a.next();
    while (static_cast<int>(b.delivered()) < step) b.next();
    const std::string bytes = b.reproducible_snapshot().to_bytes();
    EXPECT_EQ(a.reproducible_snapshot().to_bytes(), bytes) << "at " << step;
    auto resumed = e.resume(copies, Snapshot::from_bytes(bytes), layout(3));
    EXPECT_EQ(drain(resumed), std::vector<std::vector<I64>>(expected.begin() + step, expected.end())) << "at " << step;
  }
  for (const auto& n : a.graph().nodes())
    if (n.kind == "dispatch") {
      EXPECT_EQ(n.params, (Params{{"mode", "broadcast"}}));
    }
}

TEST(Segments, MisplacedBoundariesAreConfigErrors) {
  auto msg = [](auto make) {
    try {
      auto p = make();
      testing::collect(p, layout(2));
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(msg([] { return range(0, 5) | merge() | merge(); }).find("at most one"), std::string::npos);
  EXPECT_NE(msg([] { return range(0, 5) | merge() | dispatch(); }).find("dispatch"), std::string::npos);
  EXPECT_NE(msg([] { return range(0, 5) | prefetch() | map(busy); }).find("prefetch"), std::string::npos);
  EXPECT_NE(msg([] { return range(0, 5) | dispatch() | cycle({.count = 2}); }).find("cycle"), std::string::npos);
  EXPECT_NE(msg([] { return range(0, 5) | sharding_filter() | dispatch() | merge(); }).find("once per rank"),
            std::string::npos);
  EXPECT_NE(msg([] { return range(0, 5) | merge() | sharding_filter({.level = ShardLevel::worker}); })
                .find("after merge"),
            std::string::npos);
  EXPECT_THROW(prefetch({.depth = 0})(range(0, 3)), ConfigError);
  EXPECT_THROW(parallel_map(busy, {.max_in_flight = 0})(range(0, 3)), ConfigError);
  EXPECT_THROW(Engine({.threads = -1}), ConfigError);
}

TEST(ParallelMap, KeepsTheInputOrder) {
  auto p = range(0, 5000) | parallel_map([](I64 x) { return x * x; }, {.max_in_flight = 33});
  auto out = testing::collect(p, layout(1));
  ASSERT_EQ(out.size(), 5000u);
  for (I64 i = 0; i < 5000; ++i) ASSERT_EQ(out[static_cast<std::size_t>(i)], i * i);
}

TEST(ParallelMap, AWorkerLanePullsAWholeWindowOfSlowElements) {
  // A lane sizes its chunks to ~20 µs of work; for slow elements that is one, but a parallel_map's
  // pull must still get its whole window, or it runs one element at a time.
  std::atomic<int> running{0}, most{0};
  auto slow = [&](I64 x) {
    const int now = ++running;
    for (int seen = most.load(); now > seen && !most.compare_exchange_weak(seen, now);) {
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    --running;
    return x;
  };
  Engine e({.threads = 2});
  auto run = e.start(range(0, 64) | parallel_map(slow, {.max_in_flight = 8}), layout(1));
  std::vector<I64> got;
  while (auto x = run.next()) got.push_back(*x);
  ASSERT_EQ(got.size(), 64u);
  for (std::size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], static_cast<I64>(i));
  EXPECT_GE(most.load(), 2);
}

// ---- snapshots with data in flight -------------------------------------------------------------

/// Sleeps 300 µs: worker chunks slow enough that the lanes capture their chains after each (AsyncLane).
auto sleepy = [](I64 x) {
  std::this_thread::sleep_for(std::chrono::microseconds(300));
  return x;
};

/// A random pipeline of int64 elements over the node kinds, with a random segment structure. `slow`: a
/// shorter one whose worker segment sleeps per element (snapshots then take the lanes' lent captures).
Pipeline<I64> random_pipeline(std::mt19937_64& g, bool& sharded, bool slow = false) {
  auto pick = [&](int n) { return testing::draw(g, n); };
  Pipeline<I64> p = range(0, slow ? 100 + pick(300) : 300 + pick(1500));
  const bool dispatched = pick(2) == 0;
  if (dispatched) {
    if (pick(2)) p = p | shuffle({.buffer = 1 + pick(64)});
    p = p | dispatch();
  }
  sharded = dispatched;
  const int steps = 1 + pick(5);
  for (int i = 0; i < steps; ++i) {
    switch (pick(9)) {
      case 0: p = p | shuffle({.buffer = 1 + pick(80)}); break;
      case 1: p = p | map(busy); break;
      case 2: p = p | filter([m = 2 + pick(4)](I64 x) { return x % m != 0; }); break;
      case 3: p = p | batch({.size = 1 + pick(9), .drop_last = pick(2) == 0}) | unbatch(); break;
      case 4:
        if (!dispatched && !sharded) {  // a second sharding of a sharded stream is refused (ConfigError)
          p = p | sharding_filter();
          sharded = true;
        }
        break;
      case 5: p = p | repeat(1 + pick(3)); break;
      case 6: p = p | flat_map([](I64 x) { return std::vector<I64>(static_cast<std::size_t>(x % 3), x); }); break;
      case 7: p = p | parallel_map(busy, {.max_in_flight = 1 + pick(40)}); break;
      default: p = p | take(50 + pick(800)); break;
    }
  }
  if (slow) p = p | map(sleepy);
  if (pick(2)) p = p | prefetch({.depth = 1 + pick(600)});
  if (dispatched || pick(2)) {
    p = p | merge();
    if (pick(2)) p = p | batch({.size = 1 + pick(6)}) | unbatch();
    if (pick(2)) p = p | shuffle({.buffer = 1 + pick(30)});
  }
  return p;
}

void resume_mid_stream_continues_exactly(int trials, bool slow) {
  testing::property_trials(trials, [&](std::mt19937_64& g) {
    bool sharded = false;
    const auto p = random_pipeline(g, sharded, slow);
    const int workers = 1 + static_cast<int>(g() % 4);
    const int world = 1 + static_cast<int>(g() % 2);
    const int rank = static_cast<int>(g() % static_cast<std::uint64_t>(world));
    const auto o = layout(workers, false, rank, world, g());
    const auto reference = collect_with(p, layout(workers, true, rank, world, o.seed), 1);

    Engine e({.threads = 1 + static_cast<int>(g() % 3)});
    auto run = e.start(p, o);
    const std::size_t at = reference.empty() ? 0 : static_cast<std::size_t>(g() % (reference.size() + 1));
    auto got = drain(run, at);
    const std::string bytes = run.snapshot().to_bytes();  // workers are running ahead right now
    // The snapshot did not disturb the running stream...
    auto continued = drain(run);
    // ...and a fresh run resumed from it yields exactly the same rest.
    auto resumed = e.resume(p, Snapshot::from_bytes(bytes), o);
    auto rest = drain(resumed);
    EXPECT_EQ(rest, continued);
    got.insert(got.end(), rest.begin(), rest.end());
    ASSERT_EQ(got, reference) << "workers " << workers << ", world " << world << ", at " << at;
  });
}

TEST(SnapshotProperty, ResumeMidStreamWithBusyWorkersContinuesExactly) { resume_mid_stream_continues_exactly(60, false); }

// Workers busy with slow chunks lend their chains as of their last chunk: the rest is still exact.
TEST(SnapshotProperty, ResumeMidStreamFromLentWorkerStatesContinuesExactly) { resume_mid_stream_continues_exactly(25, true); }

// Production moved between the consumer's thread and the engine's mid-stream (the Python Loader's
// adaptive mode): the same stream, and snapshots taken in either mode resume to the same rest.
TEST(SnapshotProperty, SwitchingBetweenInlineAndThreadedWorkersKeepsTheStreamAndItsSnapshots) {
  testing::property_trials(30, [&](std::mt19937_64& g) {
    bool sharded = false;
    const auto p = random_pipeline(g, sharded, g() % 3 == 0);
    const int workers = 1 + static_cast<int>(g() % 3);
    const auto o = layout(workers, false, 0, 1, g());
    const auto reference = collect_with(p, layout(workers, true, 0, 1, o.seed), 1);
    Engine e({.threads = 2});
    auto run = e.start(p, o);
    bool on = g() % 2 == 0;
    run.set_inline_workers(on);
    std::vector<I64> got;
    const std::size_t snap_at = reference.empty() ? 0 : static_cast<std::size_t>(g() % (reference.size() + 1));
    std::optional<Snapshot> snap;
    const bool reproducible = g() % 2 == 0;
    for (;;) {
      if (got.size() == snap_at && !snap)
        snap = Snapshot::from_bytes((reproducible ? run.reproducible_snapshot() : run.snapshot()).to_bytes());
      if (g() % 7 == 0) run.set_inline_workers(on = !on);
      auto x = run.next();
      if (!x) break;
      got.push_back(*x);
    }
    ASSERT_EQ(got, reference) << "workers " << workers;
    ASSERT_TRUE(snap.has_value());
    auto resumed = e.resume(p, *snap, o);
    if (g() % 2) resumed.set_inline_workers(true);
    const auto rest = drain(resumed);
    ASSERT_EQ(rest, std::vector<I64>(reference.begin() + std::ptrdiff_t(snap_at), reference.end()));
  });
}

/// A map that blocks at one element until the test opens its gate (a worker caught inside a chunk), and
/// sleeps 1 ms per element before it (slow chunks, which the lanes capture).
struct Gate {
  I64 at = -1;
  std::atomic<bool> open{false}, reached{false};
};
auto gated(std::shared_ptr<Gate> gate) {
  return [gate](I64 x) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (x == gate->at) {
      gate->reached = true;
      while (!gate->open) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return x;
  };
}

TEST(Snapshot, AnExactSnapshotDoesNotWaitForAWorkerInsideAChunk) {
  auto open = std::make_shared<Gate>();
  open->open = true;
  auto gate = std::make_shared<Gate>();
  gate->at = 41;  // worker 1's 21st element, in its sixth batch
  auto make = [](std::shared_ptr<Gate> g) { return range(0, 400) | sharding_filter() | map(gated(g)) | batch({.size = 4}); };
  const auto o = layout(2);
  const auto reference = collect_with(make(open), layout(2, true), 1);

  Engine e({.threads = 2});
  auto run = e.start(make(gate), o);
  auto got = drain(run, 3);
  for (int i = 0; i < 30'000 && !gate->reached; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_TRUE(gate->reached) << "worker 1 never reached element 41";
  // The gate stays shut until the snapshot returns (or for 20 s, so that a waiting snapshot fails the
  // test instead of hanging it).
  std::atomic<bool> snapshot_returned{false}, opened_by_watchdog{false};
  std::thread watchdog([&] {
    for (int i = 0; i < 20'000 && !snapshot_returned; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (!snapshot_returned) opened_by_watchdog = true;
    gate->open = true;
  });
  const Snapshot snap = Snapshot::from_bytes(run.snapshot().to_bytes());
  snapshot_returned = true;
  watchdog.join();
  EXPECT_FALSE(opened_by_watchdog) << "the snapshot waited for the worker inside its chunk";
  // Met full: both workers had batches queued (worker 1 five before its gate, worker 0 more).
  const NodeState* merge = nullptr;
  for (const auto& st : snap.states)
    if (st.kind == "merge") merge = &st;
  ASSERT_NE(merge, nullptr);
  for (const char* field : {"pending_0", "pending_1"}) {
    const auto f = std::find_if(merge->fields.begin(), merge->fields.end(), [&](const Field& x) { return x.name == field; });
    ASSERT_NE(f, merge->fields.end());
    EXPECT_GT(f->elements.size(), 0u) << field;
  }
  const auto continued = drain(run);
  auto resumed = e.resume(make(open), snap, o);
  const auto rest = drain(resumed);
  EXPECT_EQ(rest, continued);
  got.insert(got.end(), rest.begin(), rest.end());
  EXPECT_EQ(got, reference);
}

TEST(Snapshot, RestoringIntoAnotherThreadCountOrInlineGivesTheSameRest) {
  auto p = range(0, 4000) | shuffle({.buffer = 300}) | sharding_filter() | map(busy) | batch({.size = 16});
  const auto o = layout(3);
  Engine four({.threads = 4});
  auto run = four.start(p, o);
  drain(run, 40);
  const auto snap = Snapshot::from_bytes(run.snapshot().to_bytes());
  const auto rest = drain(run);
  Engine one({.threads = 1});
  auto a = one.resume(p, snap, o);
  EXPECT_EQ(drain(a), rest);
  auto inline_o = o;
  inline_o.inline_workers = true;
  auto b = one.resume(p, snap, inline_o);
  EXPECT_EQ(drain(b), rest);
}

TEST(Snapshot, BroadcastBacklogsSurviveARestore) {
  auto p = range(0, 30) | map([](I64 m) { return std::vector<I64>(50, m); }) | dispatch(broadcast) |
           flat_map([](const std::shared_ptr<const std::vector<I64>>& s) {
             std::vector<I64> v;
             for (std::size_t i = 0; i < s->size(); ++i) v.push_back((*s)[i] * 100 + static_cast<I64>(i));
             return v;
           }) |
           sharding_filter({.level = ShardLevel::worker}) | merge();
  const auto o = layout(3);
  const auto full = testing::collect(p, o);
  ASSERT_EQ(full.size(), 30u * 50u);  // every window of every shard exactly once
  for (std::size_t at : {std::size_t{0}, std::size_t{7}, std::size_t{700}, full.size()})
    EXPECT_EQ(testing::stop_and_resume(p, o, at), full) << "at " << at;
}

// ---- failures and cancellation -----------------------------------------------------------------

TEST(Failure, AWorkerExceptionSurfacesAsNodeErrorAfterTheElementsBeforeIt) {
  auto fails = [](I64 x) {
    if (x == 2500) throw std::invalid_argument("bad element 2500");
    return x;
  };
  auto p = range(0, 100'000) | sharding_filter() | map(busy) | map(fails, {.name = "decode"});
  const auto o = layout(4);
  Engine e;
  auto run = e.start(p, o);
  std::vector<I64> got;
  try {
    while (auto x = run.next()) got.push_back(*x);
    FAIL() << "the run ended without the error";
  } catch (const NodeError& err) {
    EXPECT_EQ(err.node_key(), "decode");
    EXPECT_EQ(err.worker(), 2500 % 4);
    EXPECT_NE(std::string(err.what()).find("decode"), std::string::npos);
    try {
      std::rethrow_if_nested(err);
      FAIL() << "no nested exception";
    } catch (const std::invalid_argument& inner) {
      EXPECT_STREQ(inner.what(), "bad element 2500");
    }
  }
  // Everything before the failing element arrived, in order.
  ASSERT_EQ(got.size(), 2500u);
  for (std::size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], static_cast<I64>(i));
  // The run stays failed.
  EXPECT_THROW(run.next(), NodeError);
  EXPECT_THROW(run.snapshot(), SnapshotError);
}

TEST(Failure, ASnapshotTakenBeforeTheFailureStaysValid) {
  auto fails = [](I64 x) {
    if (x == 900) throw std::runtime_error("boom");
    return x;
  };
  auto p = range(0, 5000) | shuffle({.buffer = 64}) | sharding_filter() | map(fails);
  const auto o = layout(2);
  Engine e;
  auto run = e.start(p, o);
  drain(run, 50);
  const std::string bytes = run.snapshot().to_bytes();
  std::vector<I64> first_tail;
  EXPECT_THROW(
      {
        while (auto x = run.next()) first_tail.push_back(*x);
      },
      NodeError);
  auto resumed = e.resume(p, Snapshot::from_bytes(bytes), o);
  std::vector<I64> second_tail;
  EXPECT_THROW(
      {
        while (auto x = resumed.next()) second_tail.push_back(*x);
      },
      NodeError);
  EXPECT_EQ(second_tail, first_tail);
}

TEST(Cancellation, SlowScalarElementsArriveAndCancelAboutOneAtATime) {
  // 20 ms per element: a lane that pulled 256 of them per chunk, or held a waiting consumer until half
  // its queue (8192) was ready, would take 5 s or 160 s here; one element at a time takes ~20 ms.
  const auto t0 = std::chrono::steady_clock::now();
  {
    Engine e({.threads = 1});
    auto run = e.start(range(0, 100'000) | map(builtins::Passthrough::spin(20'000'000)), layout(1));
    ASSERT_EQ(run.next(), std::optional<I64>(0));
    ASSERT_EQ(run.next(), std::optional<I64>(1));
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(s, 4.0);  // a bound against the old behaviour, far above the ~0.1 s it takes
}

TEST(Cancellation, WaitReadyMeansTheNextPullDoesNotWaitForTheWorkers) {
  // 4 ms per element on one worker. Past its first 256 elements the run pulls 256 at a time, and a pull
  // returns what it asks for: wait_ready (what the Python loader waits in, looking for Ctrl-C between
  // slices) must wait for all of them, not for the first chunk, or next() would block ~1 s after it.
  Engine e({.threads = 2});
  auto run = e.start(range(0, 100'000) | map(builtins::Passthrough::spin(4'000'000)), layout(1));
  for (int i = 0; i < 256; ++i) ASSERT_TRUE(run.next().has_value());
  int slices = 0;
  while (!run.wait_ready(std::chrono::milliseconds(10))) ++slices;
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(run.next(), std::optional<I64>(256));
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GT(slices, 10);  // it did wait, in slices: 256 elements take about 1 s to produce
  EXPECT_LT(s, 0.3) << "next() waited " << s << " s after wait_ready said it would not";
}

TEST(Cancellation, DestroyingARunMidStreamJoinsPromptly) {
  auto slow = [](I64 x) {
    builtins::spin_for(200'000);  // far more work than the test waits for
    return x;
  };
  const auto t0 = std::chrono::steady_clock::now();
  {
    Engine e({.threads = 2});
    auto run = e.start(range(0, 1'000'000) | sharding_filter() | map(slow), layout(4));
    ASSERT_TRUE(run.next().has_value());
  }  // cancels: each busy worker finishes the chunk it is on, nothing more
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(s, 30.0);  // a hang would never get here; this only bounds a pathological join
}

TEST(Stats, CountElementsPerNodeAndInstance) {
  auto o = layout(2);
  o.collect_stats = true;
  Engine e;
  auto run = e.start(range(0, 1000) | sharding_filter() | map(busy, {.name = "work"}), o);
  drain(run);
  std::uint64_t work = 0;
  for (const auto& n : run.node_stats())
    if (n.key == "work") {
      work += n.elements;
      EXPECT_GE(n.seconds, n.self_seconds);
    }
  EXPECT_EQ(work, 1000u);
}

}  // namespace
}  // namespace dpipe

// Provenance crosses the workers' lanes with the elements: a traced run on threads, with snapshots taken
// while the workers run (their chunks slow enough to be captured and lent), names every element's source
// position (range's index i is its element i) and delivers the stream an untraced run delivers.
TEST(Provenance, TracedLanesOnThreadsNameEveryElement) {
  const auto slow = [](std::int64_t x) {
    std::this_thread::sleep_for(std::chrono::microseconds(x % 7 == 0 ? 300 : 0));
    return x;
  };
  const auto p = dpipe::range(0, 3000) | dpipe::sharding_filter() | dpipe::map(slow) | dpipe::shuffle({.buffer = 16}) |
                 dpipe::batch({.size = 4});
  for (int workers : {2, 3}) {
    dpipe::RunOptions o{.seed = 3, .layout = dpipe::Layout{0, 1, workers}};
    dpipe::Engine e(dpipe::EngineOptions{.threads = 4});
    auto plain = e.start(p, o);
    std::vector<std::vector<std::int64_t>> want;
    while (auto b = plain.next()) want.push_back(*b);
    o.trace = true;
    auto run = e.start(p, o);
    std::vector<std::vector<std::int64_t>> got;
    while (auto b = run.next()) {
      const dpipe::Provenance& prov = *run.provenance();
      ASSERT_EQ(prov.size(), b->size());
      for (std::size_t i = 0; i < b->size(); ++i) ASSERT_EQ(prov[i].position, static_cast<std::uint64_t>((*b)[i]));
      got.push_back(*b);
      if (got.size() % 97 == 0) (void)run.snapshot();
    }
    EXPECT_EQ(got, want) << workers;
  }
}
