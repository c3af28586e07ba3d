#pragma once
// Helpers shared by the test suites.
#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "dpipe/dpipe.hpp"

namespace dpipe::testing {

/// Runs `trial(g)` `trials` times, each with a generator seeded from this machine's entropy plus the
/// trial number. A failure names its seed (rerun with it to reproduce); the first fatal one ends the test.
template <class Trial>
void property_trials(int trials, Trial trial) {
  const std::uint64_t base = std::random_device{}();
  for (int t = 0; t < trials; ++t) {
    const std::uint64_t seed = base + static_cast<std::uint64_t>(t);
    SCOPED_TRACE("property seed " + std::to_string(seed) + " (rerun with this seed to reproduce)");
    std::mt19937_64 g(seed);
    trial(g);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

/// An integer in [0, n) drawn from `g`.
inline int draw(std::mt19937_64& g, int n) { return static_cast<int>(g() % static_cast<std::uint64_t>(n)); }

inline RunOptions options(int workers = 1, std::uint64_t seed = 7, int rank = 0, int world = 1) {
  return RunOptions{.seed = seed, .epoch = 0, .layout = Layout{rank, world, workers}};
}

template <class T>
std::vector<T> drain(Run<T>& run, std::optional<std::size_t> limit = std::nullopt) {
  std::vector<T> out;
  while (!limit || out.size() < *limit) {
    auto x = run.next();
    if (!x) break;
    out.push_back(std::move(*x));
  }
  return out;
}

template <class T>
std::vector<T> collect(const Pipeline<T>& p, const RunOptions& o) {
  Engine e;
  auto run = e.start(p, o);
  return drain(run);
}

/// Runs `p` to `at` elements, snapshots through bytes, resumes in a fresh Run; returns prefix + rest.
template <class T>
std::vector<T> stop_and_resume(const Pipeline<T>& p, const RunOptions& o, std::size_t at) {
  Engine e;
  auto run = e.start(p, o);
  auto out = drain(run, at);
  const std::string bytes = run.snapshot({{"step", std::to_string(at)}}).to_bytes();
  auto resumed = e.resume(p, Snapshot::from_bytes(bytes), o);
  auto rest = drain(resumed);
  out.insert(out.end(), rest.begin(), rest.end());
  return out;
}

}  // namespace dpipe::testing
