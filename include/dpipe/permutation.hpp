#pragma once
/// A keyed bijection of [0, n), computed on the fly in O(1) memory: a balanced Feistel network on the
/// smallest even number of bits that covers n, with cycle walking to stay inside [0, n). The same key
/// gives the same permutation everywhere, so a global shuffle order never depends on the layout.
#include <cstdint>

#include "dpipe/rng.hpp"

namespace dpipe {

class KeyedPermutation {
 public:
  KeyedPermutation(std::uint64_t n, std::uint64_t key) : n_(n), key_(key) {
    // 2·half bits cover n; the domain is at most 4n, so cycle walking takes fewer than 4 steps on average.
    while (half_ < 32 && (std::uint64_t{1} << (2 * half_)) < n_) ++half_;
    mask_ = (std::uint64_t{1} << half_) - 1;
  }

  std::uint64_t size() const { return n_; }

  /// The image of i (i < n).
  std::uint64_t operator()(std::uint64_t i) const {
    if (n_ <= 1) return i;
    std::uint64_t x = i;
    do x = encrypt(x);
    while (x >= n_);
    return x;
  }

 private:
  std::uint64_t encrypt(std::uint64_t x) const {
    std::uint64_t left = x >> half_, right = x & mask_;
    for (std::uint64_t round = 0; round < kRounds; ++round) {
      const std::uint64_t f = mix64(right ^ mix64(key_ + round)) & mask_;
      const std::uint64_t next = left ^ f;
      left = right;
      right = next;
    }
    return (left << half_) | right;
  }

  static constexpr std::uint64_t kRounds = 4;
  std::uint64_t n_, key_;
  unsigned half_ = 1;
  std::uint64_t mask_ = 1;
};

}  // namespace dpipe
