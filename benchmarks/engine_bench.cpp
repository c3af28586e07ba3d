// Benchmarks of the parallel engine, each beside a baseline in the same binary:
//   build-release/benchmarks/engine_bench [--benchmark_out=engine.json --benchmark_out_format=json]
// - the canonical pipeline through the engine with one worker, against the single-threaded (inline) Run
//   (separately, and paired: the two run alternately);
// - a CPU-bound map (spin 2 µs per element) on 1 and 2 workers, and the same work on raw oneTBB
//   parallel_pipeline;
// - the consumer-side pause of run.snapshot() with 4 workers × prefetch 8 of 256-element batches, early
//   and late in the stream, against the time to produce one batch;
// - throughput against workers and prefetch depth (plotted by benchmarks/plot_engine.sh).
#include <benchmark/benchmark.h>
#include <oneapi/tbb/global_control.h>
#include <oneapi/tbb/parallel_pipeline.h>
#include <oneapi/tbb/task_arena.h>

#include <chrono>

#include "builtins.hpp"
#include "dpipe/dpipe.hpp"
#include "paired.hpp"
#include "ratio_reporter.hpp"

namespace {

using dpipe::Engine;
using dpipe::Layout;
using dpipe::RunOptions;
using Clock = std::chrono::steady_clock;

constexpr std::int64_t kCanonical = 1 << 22;
constexpr std::int64_t kSpinElements = 40'000;
constexpr std::int64_t kSpinNs = 2'000;

RunOptions options(int workers, bool inline_workers = false) {
  RunOptions o{.seed = 42, .layout = Layout{0, 1, workers}};
  o.inline_workers = inline_workers;
  return o;
}

/// Runs `pipeline` to its end once, touching every element.
template <class P>
void drain(Engine& engine, const P& pipeline, const RunOptions& o) {
  auto run = engine.start(pipeline, o);
  std::uint64_t sink = 0;
  while (auto b = run.next()) {
    if constexpr (requires { b->size(); }) sink += b->size();
    else sink += static_cast<std::uint64_t>(*b);
  }
  benchmark::DoNotOptimize(sink);
}

template <class P>
void consume(benchmark::State& state, Engine& engine, const P& pipeline, const RunOptions& o, std::int64_t items) {
  for (auto _ : state) drain(engine, pipeline, o);
  state.SetItemsProcessed(state.iterations() * items);
}

auto canonical() {
  return dpipe::range(0, kCanonical) | dpipe::shuffle({.buffer = 10'000}) | dpipe::sharding_filter() |
         dpipe::map([](std::int64_t x) { return x * 2; }) | dpipe::batch({.size = 256});
}

void BM_CanonicalInline(benchmark::State& state) {
  Engine engine({.threads = 2});
  consume(state, engine, canonical(), options(1, true), kCanonical);
}
void BM_CanonicalOneWorker(benchmark::State& state) {
  Engine engine({.threads = 1});  // one worker, one engine thread: with two cores, the consumer has the other
  consume(state, engine, canonical(), options(1), kCanonical);
}

/// The same pair run alternately, one pass each per iteration (paired.hpp): its ratio is taken at the
/// same moments of this noisy machine, where the two benchmarks above run seconds apart.
/// One engine serves both (the inline Run uses none of its threads): a second engine's idle threads
/// would spin through the other pass on this 2-core machine.
void BM_CanonicalPaired(benchmark::State& state) {
  Engine engine({.threads = 1});
  const auto p = canonical();
  dpipe::bench::paired(
      state, kCanonical * static_cast<std::int64_t>(sizeof(std::int64_t)),
      [&] { drain(engine, p, options(1)); }, [&] { drain(engine, p, options(1, true)); });
}

// CPU-bound: every instance keeps its share of the positions and spins 2 µs on each element.
auto spin_pipeline(std::int64_t depth) {
  return dpipe::range(0, kSpinElements) | dpipe::sharding_filter() | dpipe::map(dpipe::builtins::Passthrough::spin(kSpinNs)) |
         dpipe::batch({.size = 64}) | dpipe::prefetch({.depth = depth});
}

void BM_SpinWorkers(benchmark::State& state) {
  Engine engine({.threads = 2});
  consume(state, engine, spin_pipeline(8), options(static_cast<int>(state.range(0))), kSpinElements);
}

void BM_SpinPrefetch(benchmark::State& state) {
  Engine engine({.threads = 2});
  consume(state, engine, spin_pipeline(state.range(0)), options(2), kSpinElements);
}

// The same work on raw oneTBB: a serial input stage cuts the range into chunks of 64, a parallel
// stage spins on every element, a serial in-order stage consumes.
void BM_SpinRawTbb(benchmark::State& state) {
  const auto spin = dpipe::builtins::Passthrough::spin(kSpinNs);
  oneapi::tbb::task_arena arena(2, 0);
  for (auto _ : state) {
    std::int64_t next = 0;
    std::uint64_t sink = 0;
    arena.execute([&] {
      oneapi::tbb::parallel_pipeline(
          8,
          oneapi::tbb::make_filter<void, std::vector<std::int64_t>>(
              oneapi::tbb::filter_mode::serial_in_order,
              [&](oneapi::tbb::flow_control& fc) {
                std::vector<std::int64_t> chunk;
                if (next >= kSpinElements) {
                  fc.stop();
                  return chunk;
                }
                for (int i = 0; i < 64 && next < kSpinElements; ++i) chunk.push_back(next++);
                return chunk;
              }) &
              oneapi::tbb::make_filter<std::vector<std::int64_t>, std::vector<std::int64_t>>(
                  oneapi::tbb::filter_mode::parallel,
                  [&](std::vector<std::int64_t> chunk) {
                    for (auto& x : chunk) x = spin(x);
                    return chunk;
                  }) &
              oneapi::tbb::make_filter<std::vector<std::int64_t>, void>(
                  oneapi::tbb::filter_mode::serial_in_order,
                  [&](const std::vector<std::int64_t>& chunk) { sink += chunk.size(); }));
    });
    benchmark::DoNotOptimize(sink);
  }
  state.SetItemsProcessed(state.iterations() * kSpinElements);
}

// Snapshot pause: 4 workers, prefetch 8, batches of 256 elements, 1 µs of work per element.
constexpr std::int64_t kPauseSpinNs = 1'000;
auto pause_pipeline() {
  return dpipe::range(0, 1'000'000'000) | dpipe::shuffle({.buffer = 1'000}) | dpipe::sharding_filter() |
         dpipe::map(dpipe::builtins::Passthrough::spin(kPauseSpinNs)) | dpipe::batch({.size = 256}) | dpipe::prefetch({.depth = 8});
}

void BM_SnapshotPause(benchmark::State& state) {
  const auto position = static_cast<std::size_t>(state.range(0));  // batches delivered before
  Engine engine({.threads = 2});
  auto run = engine.start(pause_pipeline(), options(4));
  for (std::size_t i = 0; i < position; ++i) run.next();
  std::size_t bytes = 0;
  for (auto _ : state) {
    for (int i = 0; i < 4; ++i) run.next();  // the workers are busy refilling their queues
    const auto t0 = Clock::now();
    auto snap = run.snapshot();
    state.SetIterationTime(std::chrono::duration<double>(Clock::now() - t0).count());
    bytes = snap.to_bytes().size();
  }
  state.counters["snapshot_bytes"] = static_cast<double>(bytes);
}

// The pause of run.reproducible_snapshot() on the same pipeline, after 2000 batches, with `range(0)`
// batches delivered between snapshots: the workers' queues are filled to 1.5 depths and one element
// (13 batches per worker here), so the pause is the production the queues lacked.
void BM_ReproduciblePause(benchmark::State& state) {
  const auto between = static_cast<int>(state.range(0));
  Engine engine({.threads = 2});
  auto run = engine.start(pause_pipeline(), options(4));
  for (std::size_t i = 0; i < 2000; ++i) run.next();
  for (auto _ : state) {
    for (int i = 0; i < between; ++i) run.next();
    const auto t0 = Clock::now();
    auto snap = run.reproducible_snapshot();
    state.SetIterationTime(std::chrono::duration<double>(Clock::now() - t0).count());
    benchmark::DoNotOptimize(snap.states.size());
  }
}

// The time to produce one such batch on one core: the unit the pause is compared with.
void BM_OneBatch(benchmark::State& state) {
  Engine engine({.threads = 1});
  auto p = dpipe::range(0, 1'000'000'000) | dpipe::map(dpipe::builtins::Passthrough::spin(kPauseSpinNs)) | dpipe::batch({.size = 256});
  auto run = engine.start(p, options(1, true));
  for (auto _ : state) benchmark::DoNotOptimize(run.next());
}

BENCHMARK(BM_CanonicalInline)->Unit(benchmark::kMillisecond)->Repetitions(5)->UseRealTime();
BENCHMARK(BM_CanonicalOneWorker)->Unit(benchmark::kMillisecond)->Repetitions(5)->UseRealTime();
BENCHMARK(BM_CanonicalPaired)->Unit(benchmark::kMillisecond)->Repetitions(3)->UseManualTime();
BENCHMARK(BM_SpinWorkers)->DenseRange(1, 4)->Unit(benchmark::kMillisecond)->Repetitions(3)->UseRealTime();
BENCHMARK(BM_SpinRawTbb)->Unit(benchmark::kMillisecond)->Repetitions(3)->UseRealTime();
BENCHMARK(BM_SpinPrefetch)->RangeMultiplier(2)->Range(1, 32)->Unit(benchmark::kMillisecond)->Repetitions(3)->UseRealTime();
BENCHMARK(BM_OneBatch)->Unit(benchmark::kMicrosecond)->Repetitions(3);
BENCHMARK(BM_SnapshotPause)->Arg(10)->Arg(2000)->UseManualTime()->Iterations(20)->Unit(benchmark::kMicrosecond)->Repetitions(3);
BENCHMARK(BM_ReproduciblePause)->Arg(4)->Arg(64)->UseManualTime()->Iterations(20)->Unit(benchmark::kMicrosecond)->Repetitions(3);

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  benchmark::AddCustomContext("allocator", DPIPE_BENCH_ALLOCATOR);
  dpipe::bench::RatioReporter reporter({
      {"canonical, 1 worker on the engine / single-threaded Run (paired)", "BM_CanonicalPaired", "", 0.8},
      {"canonical, the same from the two separate benchmarks", "BM_CanonicalOneWorker", "BM_CanonicalInline", 0},
      {"spin 2 us: 2 workers / 1 worker", "BM_SpinWorkers/2", "BM_SpinWorkers/1", 1.8},
      {"spin 2 us: dpipe 2 workers / raw oneTBB parallel_pipeline", "BM_SpinWorkers/2", "BM_SpinRawTbb", 0.9},
      {"snapshot pause late (2000 batches) / early (10)", "BM_SnapshotPause/2000", "BM_SnapshotPause/10", 1.2, true},
      {"snapshot pause early / time to produce one batch", "BM_SnapshotPause/10", "BM_OneBatch", 1.0, true},
      {"snapshot pause late / time to produce one batch", "BM_SnapshotPause/2000", "BM_OneBatch", 1.0, true},
      {"reproducible pause, 4 batches between / one batch", "BM_ReproduciblePause/4", "BM_OneBatch", 0, true},
      {"reproducible pause, 64 batches between / one batch", "BM_ReproduciblePause/64", "BM_OneBatch", 0, true},
      {"reproducible pause, 64 batches between / plain pause", "BM_ReproduciblePause/64", "BM_SnapshotPause/2000", 0, true},
  });
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
}
