#pragma once
// Helpers shared by the test suites.
#include <optional>
#include <vector>

#include "dpipe/dpipe.hpp"

namespace dpipe::testing {

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
