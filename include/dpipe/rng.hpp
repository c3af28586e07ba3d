#pragma once
/// The random generator every random node uses: xoshiro256** with a 256-bit state that is saved and
/// restored exactly. Streams derive from (pipeline seed, node key, epoch), so every instance of a node
/// draws the same numbers and a run never depends on thread timing.
#include <array>
#include <cstdint>
#include <string_view>

namespace dpipe {

/// splitmix64 finaliser: a good 64-bit mixer, also used to expand seeds.
constexpr std::uint64_t mix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

/// FNV-1a over bytes; stable across platforms, used for node keys and fingerprints.
constexpr std::uint64_t fnv1a(std::string_view s, std::uint64_t h = 0xcbf29ce484222325ULL) {
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return h;
}

/// The salts of the random streams a node derives (one per use, so two uses in one node never share a
/// stream): its Rng, a sampler's permutation key, the line sources' shard-order key.
inline constexpr std::uint64_t kGeneratorSalt = 0x51ed27b3ULL, kSamplerSalt = 0x5a3d1e, kLineShardsSalt = 0x11e5;

/// The one seed derivation of every random node: a 64-bit key from (pipeline seed, node key, epoch) and the
/// use's salt: every instance of a node derives the same key.
constexpr std::uint64_t derive_seed(std::uint64_t seed, std::string_view key, std::uint64_t epoch, std::uint64_t salt) {
  return mix64(seed ^ mix64(fnv1a(key) ^ mix64(epoch + salt)));
}

class Rng {
 public:
  using result_type = std::uint64_t;
  using State = std::array<std::uint64_t, 4>;

  Rng() : Rng(0) {}
  explicit Rng(std::uint64_t seed) {
    std::uint64_t x = seed;
    for (auto& w : s_) {
      x = mix64(x);
      w = x;
    }
  }
  /// The stream of node `key` in `epoch` of a pipeline seeded with `seed`.
  static Rng derive(std::uint64_t seed, std::string_view key, std::uint64_t epoch) {
    return Rng(derive_seed(seed, key, epoch, kGeneratorSalt));
  }

  static constexpr result_type min() { return 0; }
  static constexpr result_type max() { return ~result_type{0}; }

  result_type operator()() {
    const std::uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const std::uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }

  /// Uniform integer in [0, n), n > 0, without bias (Lemire's multiply-and-reject).
  std::uint64_t below(std::uint64_t n) {
    unsigned __int128 m = static_cast<unsigned __int128>((*this)()) * n;
    auto low = static_cast<std::uint64_t>(m);
    if (low < n) {
      const std::uint64_t threshold = (0 - n) % n;
      while (low < threshold) {
        m = static_cast<unsigned __int128>((*this)()) * n;
        low = static_cast<std::uint64_t>(m);
      }
    }
    return static_cast<std::uint64_t>(m >> 64);
  }

  const State& state() const { return s_; }
  void set_state(const State& s) { s_ = s; }
  friend bool operator==(const Rng&, const Rng&) = default;

 private:
  static constexpr std::uint64_t rotl(std::uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  State s_{};
};

}  // namespace dpipe
