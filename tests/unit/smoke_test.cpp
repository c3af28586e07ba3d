#include <gtest/gtest.h>
#include "dpipe/dpipe.hpp"
using namespace dpipe;
TEST(Smoke, Canonical) {
  auto p = range(0, 1000) | shuffle({.buffer = 100}) | sharding_filter() |
           map([](std::int64_t x) { return x * 2; }) | batch({.size = 16});
  Engine e;
  auto run = e.start(p, {.layout = Layout{}});
  int n = 0;
  while (auto b = run.next()) n += static_cast<int>(b->size());
  EXPECT_EQ(n, 1000);
}
