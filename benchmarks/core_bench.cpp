// Throughput, restore and replay benchmarks of the single-threaded core.
//   build/benchmarks/core_bench [--benchmark_min_time=0.2]
// Baselines live in the same binary: a hand-written loop doing the canonical pipeline's work with
// the same generator, so the ratios hold on a noisy machine.
#include <benchmark/benchmark.h>

#include "builtins.hpp"
#include "dpipe/dpipe.hpp"
#include "json_spec.hpp"
#include "ratio_reporter.hpp"

namespace {

using dpipe::Engine;
using dpipe::Layout;
using dpipe::RunOptions;

constexpr std::int64_t kElements = 1 << 22;
constexpr std::int64_t kBuffer = 10'000;
constexpr std::int64_t kBatch = 256;
// The single-threaded Run: the worker runs in the consumer's thread (engine_bench measures threads).
const RunOptions kOptions{.seed = 42, .layout = Layout{}, .inline_workers = true};

auto canonical(std::int64_t n) {
  return dpipe::range(0, n) | dpipe::shuffle({.buffer = kBuffer}) | dpipe::sharding_filter() |
         dpipe::map([](std::int64_t x) { return x * 2; }) | dpipe::batch({.size = kBatch});
}

// The canonical pipeline's work written by hand: the same buffered shuffle with the same generator,
// the position test of a one-instance sharding filter, x*2, batches of 256 as vectors.
void BM_HandLoop(benchmark::State& state) {
  const std::uint64_t shards = 1, shard_id = 0;
  for (auto _ : state) {
    dpipe::Rng rng = dpipe::Rng::derive(42, "shuffle@3", 0);
    std::vector<std::int64_t> buffer;
    buffer.reserve(kBuffer);
    std::vector<std::int64_t> batch;
    batch.reserve(kBatch);
    std::uint64_t position = 0, sink = 0;
    auto emit = [&](std::int64_t x) {
      if (position++ % shards != shard_id) return;
      batch.push_back(x * 2);
      if (batch.size() == kBatch) {
        sink += static_cast<std::uint64_t>(batch[0]);
        benchmark::DoNotOptimize(batch.data());
        batch = std::vector<std::int64_t>();
        batch.reserve(kBatch);
      }
    };
    for (std::int64_t i = 0; i < kElements; ++i) {
      if (buffer.size() < static_cast<std::size_t>(kBuffer)) {
        buffer.push_back(i);
        continue;
      }
      std::int64_t& slot = buffer[rng.below(kBuffer)];
      emit(slot);
      slot = i;
    }
    while (!buffer.empty()) {
      std::int64_t& slot = buffer[rng.below(buffer.size())];
      emit(slot);
      slot = buffer.back();
      buffer.pop_back();
    }
    if (!batch.empty()) sink += static_cast<std::uint64_t>(batch[0]);
    benchmark::DoNotOptimize(sink);
  }
  state.SetItemsProcessed(state.iterations() * kElements);
}

template <class P>
void consume(benchmark::State& state, const P& pipeline, const RunOptions& options = kOptions) {
  Engine engine;
  for (auto _ : state) {
    auto run = engine.start(pipeline, options);
    std::uint64_t sink = 0;
    while (auto b = run.next()) sink += static_cast<std::uint64_t>((*b)[0]);
    benchmark::DoNotOptimize(sink);
  }
  state.SetItemsProcessed(state.iterations() * kElements);
}

void BM_Pipeline(benchmark::State& state) { consume(state, canonical(kElements)); }

// The same run traced: every element's provenance carried to the consumer (RunOptions::trace).
void BM_TracedPipeline(benchmark::State& state) {
  RunOptions traced = kOptions;
  traced.trace = true;
  consume(state, canonical(kElements), traced);
}

// The same pipeline built from a JSON spec, as `dpipe bench` builds it.
void BM_SpecPipeline(benchmark::State& state) {
  const auto spec = dpipe::parse_spec(R"({"seed": 42, "pipeline": [
      {"op": "range", "stop": 4194304}, {"op": "shuffle", "buffer": 10000}, {"op": "sharding_filter"},
      {"op": "map", "fn": "affine", "mul": 2}, {"op": "batch", "size": 256}]})");
  consume(state, spec.pipeline.get<std::vector<std::int64_t>>());
}

/// A run of `p` that has delivered `position / kBatch` batches.
template <class P>
auto run_to(Engine& engine, const P& p, std::size_t position) {
  auto run = engine.start(p, kOptions);
  for (std::size_t i = 0; i < position / kBatch; ++i) run.next();
  return run;
}

// Restore at a position: bytes → checks → hooks → ready to yield. Must not depend on the position.
void BM_Restore(benchmark::State& state) {
  const auto position = static_cast<std::size_t>(state.range(0));  // input elements consumed
  const auto p = canonical(20'000'000);
  Engine engine;
  auto run = run_to(engine, p, position);
  const std::string bytes = run.snapshot().to_bytes();
  for (auto _ : state) {
    auto resumed = engine.resume(p, dpipe::Snapshot::from_bytes(bytes), kOptions);
    benchmark::DoNotOptimize(resumed.delivered());
  }
  state.counters["snapshot_bytes"] = static_cast<double>(bytes.size());
}

// Capture: run.snapshot() and encoding to bytes, at a position.
void BM_Capture(benchmark::State& state) {
  const auto position = static_cast<std::size_t>(state.range(0));
  const auto p = canonical(20'000'000);
  Engine engine;
  auto run = run_to(engine, p, position);
  for (auto _ : state) benchmark::DoNotOptimize(run.snapshot().to_bytes());
}

// Replay fallback: a generator source restored by re-running it; cost per replayed element.
auto generated(std::int64_t n) {
  return dpipe::generator([n](const dpipe::GeneratorContext& ctx) {
           return [rng = ctx.rng, n, i = std::int64_t{0}]() mutable -> std::optional<std::int64_t> {
             if (i++ >= n) return std::nullopt;
             return static_cast<std::int64_t>(rng() >> 1);
           };
         }) |
         dpipe::shuffle({.buffer = kBuffer}) | dpipe::batch({.size = kBatch});
}

void BM_ReplayRestore(benchmark::State& state) {
  const auto position = static_cast<std::size_t>(state.range(0));
  const auto p = generated(20'000'000);
  Engine engine;
  auto run = run_to(engine, p, position);
  const std::string bytes = run.snapshot().to_bytes();
  std::uint64_t replayed = 0;
  for (auto _ : state) {
    auto resumed = engine.resume(p, dpipe::Snapshot::from_bytes(bytes), kOptions);
    replayed = resumed.restore_report().replayed_elements();
  }
  state.counters["replayed"] = static_cast<double>(replayed);
  state.counters["ns_per_replayed"] = benchmark::Counter(static_cast<double>(replayed) * state.iterations(),
                                                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

BENCHMARK(BM_HandLoop)->Unit(benchmark::kMillisecond)->Repetitions(5)->UseRealTime();
BENCHMARK(BM_Pipeline)->Unit(benchmark::kMillisecond)->Repetitions(5)->UseRealTime();
BENCHMARK(BM_SpecPipeline)->Unit(benchmark::kMillisecond)->Repetitions(5)->UseRealTime();
BENCHMARK(BM_TracedPipeline)->Unit(benchmark::kMillisecond)->Repetitions(3)->UseRealTime();
BENCHMARK(BM_Restore)->Arg(10'000)->Arg(100'000)->Arg(1'000'000)->Arg(10'000'000)->Unit(benchmark::kMicrosecond)->Repetitions(5);
BENCHMARK(BM_Capture)->Arg(10'000)->Arg(10'000'000)->Unit(benchmark::kMicrosecond)->Repetitions(3);
BENCHMARK(BM_ReplayRestore)->Arg(100'000)->Arg(1'000'000)->Unit(benchmark::kMillisecond)->Repetitions(3);

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  benchmark::AddCustomContext("allocator", DPIPE_BENCH_ALLOCATOR);
  dpipe::bench::RatioReporter reporter({
      {"canonical pipeline / hand-written loop", "BM_Pipeline", "BM_HandLoop", 0.8},
      {"spec-built pipeline / C++ pipeline", "BM_SpecPipeline", "BM_Pipeline", 0.9},
      {"restore time at 10^7 / at 10^4", "BM_Restore/10000000", "BM_Restore/10000", 1.2, true},
      {"restore time at 10^6 / at 10^4", "BM_Restore/1000000", "BM_Restore/10000", 1.2, true},
      {"restore time at 10^5 / at 10^4", "BM_Restore/100000", "BM_Restore/10000", 1.2, true},
      {"capture time at 10^7 / at 10^4", "BM_Capture/10000000", "BM_Capture/10000", 1.2, true},
  });
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
}
