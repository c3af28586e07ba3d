#include "builtins.hpp"

#include <chrono>
#include <cstring>
#include <limits>
#include <type_traits>

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

void Passthrough::fail_at_index() const {
  throw std::runtime_error("throw_at: failing on element " + std::to_string(index) + " as asked");
}

namespace {
/// Copies a row into an array of N, checking that every value fits.
template <class N>
void narrow_into(char* out, const std::vector<std::int64_t>& row) {
  for (const std::int64_t x : row) {
    if constexpr (!std::is_same_v<N, std::int64_t>)
      if (x < static_cast<std::int64_t>(std::numeric_limits<N>::min()) || x > static_cast<std::int64_t>(std::numeric_limits<N>::max()))
        throw std::range_error("stack: " + std::to_string(x) + " does not fit the array's type");
    const N v = static_cast<N>(x);
    std::memcpy(out, &v, sizeof v);
    out += sizeof v;
  }
}
struct StackType {
  const char* name;
  const char* numpy;  // the array's type string
  std::size_t bytes;
  void (*fill)(char*, const std::vector<std::int64_t>&);
};
constexpr StackType kStackTypes[] = {
    {"int64", "<i8", 8, &narrow_into<std::int64_t>},   {"int32", "<i4", 4, &narrow_into<std::int32_t>},
    {"uint32", "<u4", 4, &narrow_into<std::uint32_t>}, {"int16", "<i2", 2, &narrow_into<std::int16_t>},
    {"uint16", "<u2", 2, &narrow_into<std::uint16_t>}, {"uint8", "|u1", 1, &narrow_into<std::uint8_t>}};
const StackType* stack_type(const std::string& dtype) {
  for (const auto& t : kStackTypes)
    if (dtype == t.name) return &t;
  return nullptr;
}
}  // namespace

bool Stack::known(const std::string& dtype) { return stack_type(dtype) != nullptr; }

Value Stack::operator()(std::vector<std::vector<std::int64_t>> rows) const {
  const StackType* t = stack_type(dtype);
  if (!t) throw std::invalid_argument("stack: unknown dtype '" + dtype + "'");
  const std::size_t width = rows.empty() ? 0 : rows.front().size();
  ValueArray a{t->numpy, {rows.size(), width}, std::string(rows.size() * width * t->bytes, '\0')};
  char* out = a.data.data();
  for (const auto& row : rows) {
    if (row.size() != width)
      throw std::length_error("stack: rows of " + std::to_string(width) + " and " + std::to_string(row.size()) + " elements");
    t->fill(out, row);
    out += width * t->bytes;
  }
  return Value::array(std::move(a));
}

}  // namespace dpipe::builtins
