// Built against an installed dpipe (tests/integration/install_test.sh), with nothing but
//   g++ -Wall -Wextra -Werror main.cpp $(pkg-config --cflags --libs dpipe)
// or through meson (meson.build here). Prints a shuffled, batched stream read by two workers.
#include <cstdio>
#include <string>

#include <dpipe/dpipe.hpp>

int main() {
  auto p = dpipe::range(0, 10) | dpipe::shuffle({.buffer = 4}) | dpipe::sharding_filter() |
           dpipe::map([](std::int64_t x) { return x * 2; }, {.name = "double"}) | dpipe::batch({.size = 4});
  dpipe::Engine engine({.threads = 2});
  // One process (rank 0 of 1) with two workers; without `layout` it comes from RANK/WORLD_SIZE.
  const dpipe::RunOptions options{.seed = 1, .layout = dpipe::Layout{.rank = 0, .world_size = 1, .num_workers = 2}};
  auto run = engine.start(p, options);
  std::size_t total = 0;
  std::string text;
  for (auto&& b : run) {  // the element is the loop's own until the next step
    total += b.size();
    for (auto x : b) text += std::to_string(x) + ' ';
    if (total >= 4) break;  // stop after the first batch: the run is positioned right after it
  }
  const auto bytes = run.snapshot({{"step", "1"}}).to_bytes();
  auto resumed = engine.resume(p, dpipe::Snapshot::from_bytes(bytes), options);
  for (auto&& b : resumed) total += b.size();
  std::printf("external example: %zu elements, first batch %s, snapshot %zu bytes\n", total, text.c_str(),
              bytes.size());
  return total == 10 ? 0 : 1;
}
