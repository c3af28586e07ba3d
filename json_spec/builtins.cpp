#include "builtins.hpp"

#include <chrono>

namespace dpipe::builtins {

void spin_for(std::uint64_t iterations) {
  std::uint64_t v = 0x9e3779b97f4a7c15ULL;
  for (std::uint64_t i = 0; i < iterations; ++i) {
    v = v * 6364136223846793005ULL + 1442695040888963407ULL;
    asm volatile("" : "+r"(v));  // keeps every iteration
  }
}

double spin_iterations_per_ns() {
  static const double rate = [] {
    // Best of a few short runs: the least disturbed one is the machine's real rate.
    double best = 0;
    for (int round = 0; round < 5; ++round) {
      constexpr std::uint64_t n = 2'000'000;
      const auto t0 = std::chrono::steady_clock::now();
      spin_for(n);
      const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
      if (ns > 0) best = std::max(best, double(n) / ns);
    }
    return best > 0 ? best : 1.0;
  }();
  return rate;
}

}  // namespace dpipe::builtins
