// Branches against reading the source once per branch, paired in one run (paired.hpp):
//   fork(2) → zip of the two outputs / zip of two reads of the same source (no fork);
//   demux to 4 outputs → mux / 4 reads of the source, each through sharding_filter(4, i) → mux.
// The source is `range | map(work)`: `work` spins the given nanoseconds per element (0: a plain range),
// what reading and decoding a sample costs. One worker, in the consumer's thread.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdint>

#include "dpipe/dpipe.hpp"
#include "paired.hpp"

namespace {

using dpipe::bench::paired;

constexpr std::int64_t kElements = 1'000'000;

/// x, after about `ns` nanoseconds of arithmetic on it (kept by DoNotOptimize).
struct Work {
  std::int64_t ns = 0;
  std::int64_t operator()(std::int64_t x) const {
    std::uint64_t h = static_cast<std::uint64_t>(x);
    for (std::int64_t i = 0; i < ns / 2; ++i) h = dpipe::mix64(h);  // about 2 ns a round here
    benchmark::DoNotOptimize(h);
    return x;
  }
};

dpipe::Pipeline<std::int64_t> source(std::int64_t ns) { return dpipe::range(0, kElements) | dpipe::map(Work{ns}); }

dpipe::RunOptions one_worker() { return {.seed = 1, .layout = dpipe::Layout{0, 1, 1}, .inline_workers = true}; }

template <class T>
std::uint64_t drain(dpipe::Engine& e, const dpipe::Pipeline<T>& p) {
  auto run = e.start(p, one_worker());
  std::uint64_t n = 0;
  while (auto x = run.next()) n += 1;
  return n;
}

/// fork(2) → zip / zip of the source read twice.
void BM_ForkZipVsReadingTwice(benchmark::State& state) {
  const std::int64_t ns = state.range(0);
  auto [a, b] = source(ns) | dpipe::fork<2>();
  const auto forked = dpipe::zip(a, b);
  const auto twice = dpipe::zip(source(ns), source(ns));
  dpipe::Engine e({.threads = 1});
  paired(
      state, kElements * 8, [&] { benchmark::DoNotOptimize(drain(e, forked)); },
      [&] { benchmark::DoNotOptimize(drain(e, twice)); });
}

/// demux to 4 → mux / the source read 4 times, each read keeping one residue → mux.
void BM_DemuxMuxVsShardingFilters(benchmark::State& state) {
  const std::int64_t ns = state.range(0);
  auto [a, b, c, d] = source(ns) | dpipe::demux<4>([](std::int64_t x) { return x % 4; });
  const auto demuxed = dpipe::mux(a, b, c, d);
  auto part = [&](std::int64_t i) { return source(ns) | dpipe::sharding_filter({.num_shards = 4, .shard_id = i}); };
  const auto filtered = dpipe::mux(part(0), part(1), part(2), part(3));
  dpipe::Engine e({.threads = 1});
  paired(
      state, kElements * 8, [&] { benchmark::DoNotOptimize(drain(e, demuxed)); },
      [&] { benchmark::DoNotOptimize(drain(e, filtered)); });
}

BENCHMARK(BM_ForkZipVsReadingTwice)->Arg(0)->Arg(50)->Unit(benchmark::kMillisecond)->UseManualTime()->Iterations(9);
BENCHMARK(BM_DemuxMuxVsShardingFilters)->Arg(0)->Arg(50)->Unit(benchmark::kMillisecond)->UseManualTime()->Iterations(9);

}  // namespace

BENCHMARK_MAIN();
