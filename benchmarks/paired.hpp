#pragma once
// Paired measurement for a noisy machine: a candidate and its baseline run alternately, one pass
// each per iteration (the order flips every iteration, so neither always finds the caches the other
// left), and the figure is the median over iterations of baseline time / candidate time. A drift of
// the machine's speed over seconds (memory bandwidth here moves by 2× between runs) hits both passes
// of a pair alike, where separate benchmarks compare different moments.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <vector>

namespace dpipe::bench {

/// Times `candidate()` and `baseline()` alternately once per iteration. Reports the candidate's time as
/// the benchmark's (manual time: register with ->UseManualTime()), `bytes` per pass as its throughput,
/// and counters `ratio` (median of baseline / candidate per pair: throughput relative to the baseline),
/// `candidate_ms` and `baseline_ms` (medians).
template <class Candidate, class Baseline>
void paired(benchmark::State& state, std::int64_t bytes, Candidate candidate, Baseline baseline) {
  using Clock = std::chrono::steady_clock;
  auto time = [](auto& pass) {
    const auto t0 = Clock::now();
    pass();
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  std::vector<double> ratios, cand, base;
  bool candidate_first = true;
  for (auto _ : state) {
    double c, b;
    if (candidate_first) {
      c = time(candidate);
      b = time(baseline);
    } else {
      b = time(baseline);
      c = time(candidate);
    }
    candidate_first = !candidate_first;
    state.SetIterationTime(c);
    cand.push_back(c);
    base.push_back(b);
    ratios.push_back(b / c);
  }
  auto median = [](std::vector<double> v) {
    if (v.empty()) return 0.0;
    std::nth_element(v.begin(), v.begin() + std::ptrdiff_t(v.size() / 2), v.end());
    return v[v.size() / 2];
  };
  state.counters["ratio"] = median(ratios);
  state.counters["candidate_ms"] = median(cand) * 1e3;
  state.counters["baseline_ms"] = median(base) * 1e3;
  state.SetBytesProcessed(state.iterations() * bytes);
}

}  // namespace dpipe::bench
