// Built against an installed dpipe (tests/integration/install_test.sh): prints a shuffled, batched stream.
#include <cstdio>

#include <dpipe/dpipe.hpp>

int main() {
  auto p = dpipe::range(0, 10) | dpipe::shuffle({.buffer = 4}) | dpipe::batch({.size = 4});
  dpipe::Engine engine;
  auto run = engine.start(p, {.seed = 1, .layout = dpipe::Layout{}});
  std::size_t total = 0;
  while (auto b = run.next()) total += b->size();
  const auto bytes = run.snapshot().to_bytes();
  std::printf("external example: %zu elements, snapshot %zu bytes\n", total, bytes.size());
  return total == 10 ? 0 : 1;
}
