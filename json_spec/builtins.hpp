#pragma once
/// The builtin functions of the spec format, usable from C++ too. Each describes its parameters for
/// the graph fingerprint. Integers are 64-bit and wrap on overflow.
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "dpipe/kit/codec.hpp"
#include "dpipe/kit/node.hpp"
#include "dpipe/value.hpp"

namespace dpipe::builtins {

/// map: x → x·mul + add (wrapping).
struct Affine {
  std::int64_t mul = 1, add = 0;
  std::int64_t operator()(std::int64_t x) const {
    return static_cast<std::int64_t>(static_cast<std::uint64_t>(x) * static_cast<std::uint64_t>(mul) +
                                     static_cast<std::uint64_t>(add));
  }
  Params describe() const { return {{"fn", "affine"}, {"mul", std::to_string(mul)}, {"add", std::to_string(add)}}; }
};

/// map with "rng": x → x + a draw from [0, below) of the element's own generator (map_with_rng): a stand-in
/// for a random augmentation, whose draw depends on the sample only.
struct AddRandom {
  std::int64_t below = 1;
  std::int64_t operator()(std::int64_t x, Rng& rng) const {
    return static_cast<std::int64_t>(static_cast<std::uint64_t>(x) + rng.below(static_cast<std::uint64_t>(below)));
  }
  Params describe() const { return {{"fn", "add_random"}, {"below", std::to_string(below)}}; }
};

/// filter: keeps x with x mod `mod` == `eq`, floor modulo as in Python ((-11) mod 4 == 1).
/// demux: x → output x mod `count` (floor modulo).
struct Mod {
  std::int64_t count = 1;
  std::int64_t operator()(std::int64_t x) const {
    std::int64_t r = x % count;
    return r < 0 ? r + count : r;
  }
  Params describe() const { return {{"fn", "mod"}}; }
};

struct ModEq {
  std::int64_t mod = 1, eq = 0;
  bool operator()(std::int64_t x) const {
    std::int64_t r = x % mod;
    if (r < 0) r += mod;
    return r == eq;
  }
  Params describe() const { return {{"fn", "mod_eq"}, {"mod", std::to_string(mod)}, {"eq", std::to_string(eq)}}; }
};

/// map: a batch of equal-length rows of integers (token windows) → one C-contiguous 2-D array value
/// (rows × length) of `dtype`, built where the map runs, so a worker thread does the copy, not the
/// consumer. Narrower types than int64 hold the tokens as they were on disk (uint16 for GPT-2's); a
/// row of another length, or a value the type cannot hold, is an error of the element.
struct Stack {
  std::string dtype = "int64";
  /// The dtypes it makes: int64, int32, uint32, int16, uint16, uint8.
  static bool known(const std::string& dtype);
  Value operator()(std::vector<std::vector<std::int64_t>> rows) const;
  Params describe() const { return {{"fn", "stack"}, {"dtype", dtype}}; }
};

/// Iterations of the spin loop per nanosecond on this machine, measured once on first use.
double spin_iterations_per_ns();
/// Runs `iterations` of dependent integer arithmetic the optimiser cannot remove.
void spin_for(std::uint64_t iterations);

/// map: returns its input, and on the way does one of three things (the spec's map functions identity,
/// spin and throw_at — one type, so a front end compiles the map nodes once per element type for all three):
/// - `Passthrough{}`: nothing;
/// - `Passthrough::spin(ns)`: a fixed amount of arithmetic that takes about `ns` nanoseconds on one core
///   (calibrated at start-up, never a clock wait); models CPU-bound decoding;
/// - `Passthrough::throw_at(index)`, for testing failure handling: throws std::runtime_error on the element
///   at 0-based position `index` of the stream reaching it. Each iterator counts in its own copy (so in
///   each worker), from 0 when it is built or restored; for map only (parallel_map calls it concurrently).
struct Passthrough {
  enum class Does { nothing, spin, throw_at };
  Does does = Does::nothing;
  std::int64_t ns = 0;             // spin: the time asked for
  std::uint64_t iterations = 0;    // spin: ns on this machine
  std::int64_t index = 0;          // throw_at: the position that fails
  mutable std::int64_t seen = 0;   // throw_at: elements seen by this copy

  static Passthrough spin(std::int64_t ns) {
    Passthrough f;
    f.does = Does::spin;
    f.ns = ns;
    f.iterations = static_cast<std::uint64_t>(double(ns) * spin_iterations_per_ns());
    return f;
  }
  static Passthrough throw_at(std::int64_t index) {
    Passthrough f;
    f.does = Does::throw_at;
    f.index = index;
    return f;
  }
  template <class T>
  T operator()(T x) const {
    if (does == Does::spin) spin_for(iterations);
    else if (does == Does::throw_at && seen++ == index) fail_at_index();
    return x;
  }
  Params describe() const {
    switch (does) {
      case Does::spin: return {{"fn", "spin"}, {"ns", std::to_string(ns)}};
      case Does::throw_at: return {{"fn", "throw_at"}, {"index", std::to_string(index)}};
      case Does::nothing: break;
    }
    return {{"fn", "identity"}};
  }

 private:
  [[noreturn]] void fail_at_index() const;
};

/// flat_map: x → `times` copies of x.
struct Replicate {
  std::int64_t times = 1;
  template <class T>
  std::vector<T> operator()(const T& x) const {
    return std::vector<T>(static_cast<std::size_t>(times), x);
  }
  Params describe() const { return {{"fn", "replicate"}, {"times", std::to_string(times)}}; }
};

/// What remains of an Iota expansion: next, next + 1, …, end − 1. A flat_map Expansion (made one at a
/// time; saved as the two integers), so `flat_map range` of 2^62 holds 16 bytes, never its outputs.
struct IotaRest {
  using value_type = std::int64_t;
  std::int64_t next = 0, end = 0;
  bool empty() const { return next >= end; }
  std::int64_t front() const { return next; }
  void pop_front() { ++next; }
};

/// flat_map: a list → its elements (flat_map's function when none is named).
struct Flatten {
  template <class T>
  std::vector<T> operator()(std::vector<T> list) const {  // flat_map hands its input over: moved, not copied
    return list;
  }
  Params describe() const { return {{"fn", "flatten"}}; }
};

/// flat_map: x → 0, 1, …, x−1 (nothing for x ≤ 0), streamed.
struct Iota {
  IotaRest operator()(std::int64_t x) const { return {0, x > 0 ? x : 0}; }
  Params describe() const { return {{"fn", "range"}}; }
};

}  // namespace dpipe::builtins

namespace dpipe {
/// An IotaRest in a snapshot: the pair (next, end), which `snapshot show` decodes.
template <>
struct Codec<builtins::IotaRest> {
  static constexpr std::size_t kMinBytes = 16;
  static void encode(ByteWriter& w, const builtins::IotaRest& v) {
    w.put(v.next);
    w.put(v.end);
  }
  static builtins::IotaRest decode(ByteReader& r) {
    builtins::IotaRest v;
    v.next = r.get<std::int64_t>();
    v.end = r.get<std::int64_t>();
    return v;
  }
  static std::string tag() { return "tup<i64,i64>"; }
};
}  // namespace dpipe
