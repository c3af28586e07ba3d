// The demo: build the canonical pipeline, run it, snapshot to disk mid-way, resume in a fresh Run,
// show the resumed stream continues exactly, print throughput. Generated data; nothing downloaded.
//   quickstart [ELEMENTS] [SNAPSHOT_PATH]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "dpipe/dpipe.hpp"

int main(int argc, char** argv) {
  using Clock = std::chrono::steady_clock;
  const std::int64_t n = argc > 1 ? std::atoll(argv[1]) : 10'000'000;
  const std::string path = argc > 2 ? argv[2] : "quickstart.snapshot";

  // range → shuffle → sharding_filter → map → batch, as a C++ user writes it.
  auto pipeline = dpipe::range(0, n) | dpipe::shuffle({.buffer = 10'000}) | dpipe::sharding_filter() |
                  dpipe::map([](std::int64_t x) { return x * 2; }) | dpipe::batch({.size = 256});
  const dpipe::RunOptions options{.seed = 42, .layout = dpipe::Layout{}};
  dpipe::Engine engine;

  // 1. The uninterrupted run, timed.
  auto t0 = Clock::now();
  auto reference = engine.start(pipeline, options);
  std::uint64_t batches = 0, elements = 0, checksum = 0;
  for (auto&& b : reference) {  // a Run is a range; `reference.next()` gives one element at a time
    ++batches;
    elements += b.size();
    for (auto x : b) checksum = checksum * 31 + static_cast<std::uint64_t>(x);
  }
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  std::printf("uninterrupted: %llu batches, %llu elements in %.3f s = %.1f M elements/s\n",
              (unsigned long long)batches, (unsigned long long)elements, secs, elements / secs / 1e6);

  // 2. Stop half-way, snapshot to disk (atomically), resume in a fresh Run from the file.
  auto first = engine.start(pipeline, options);
  std::uint64_t resumed_checksum = 0;
  for (std::uint64_t i = 0; i < batches / 2; ++i) {
    const auto b = first.next();
    for (auto x : *b) resumed_checksum = resumed_checksum * 31 + static_cast<std::uint64_t>(x);
  }
  t0 = Clock::now();
  first.snapshot({{"trainer_step", std::to_string(batches / 2)}}).write_file(path);
  const double save_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();

  t0 = Clock::now();
  auto resumed = engine.resume(pipeline, dpipe::Snapshot::read_file(path), options);
  const double restore_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  std::uint64_t resumed_batches = batches / 2;
  for (auto&& b : resumed) {
    ++resumed_batches;
    for (auto x : b) resumed_checksum = resumed_checksum * 31 + static_cast<std::uint64_t>(x);
  }
  std::printf("snapshot at batch %llu: written in %.2f ms, restored in %.3f ms (%llu elements replayed)\n",
              (unsigned long long)(batches / 2), save_ms, restore_ms,
              (unsigned long long)resumed.restore_report().replayed_elements());
  const bool same = resumed_batches == batches && resumed_checksum == checksum;
  std::printf("resumed stream %s the uninterrupted one (checksum %016llx vs %016llx)\n",
              same ? "matches" : "DIFFERS FROM", (unsigned long long)resumed_checksum, (unsigned long long)checksum);
  std::remove(path.c_str());
  return same ? 0 : 1;
}
