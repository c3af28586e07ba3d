#include "dpipe/crc32c.hpp"

#include <array>
#include <cstring>

namespace dpipe {
namespace {

constexpr std::uint32_t kPoly = 0x82f63b78u;  // reflected Castagnoli polynomial

struct Tables {
  std::array<std::array<std::uint32_t, 256>, 8> t{};
  constexpr Tables() {
    for (std::uint32_t i = 0; i < 256; ++i) {
      std::uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
      t[0][i] = c;
    }
    for (std::uint32_t i = 0; i < 256; ++i)
      for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xff];
  }
};
constexpr Tables kTables;

std::uint32_t crc_software(const unsigned char* p, std::size_t n, std::uint32_t c) {
  const auto& t = kTables.t;
  while (n >= 8) {  // slice-by-8
    std::uint64_t w;
    std::memcpy(&w, p, 8);
    w ^= c;
    c = t[7][w & 0xff] ^ t[6][(w >> 8) & 0xff] ^ t[5][(w >> 16) & 0xff] ^ t[4][(w >> 24) & 0xff] ^
        t[3][(w >> 32) & 0xff] ^ t[2][(w >> 40) & 0xff] ^ t[1][(w >> 48) & 0xff] ^ t[0][w >> 56];
    p += 8;
    n -= 8;
  }
  while (n--) c = (c >> 8) ^ t[0][(c ^ *p++) & 0xff];
  return c;
}

/// a · b mod P, both in the reflected representation (bit 31 is x^0).
constexpr std::uint32_t multiply(std::uint32_t a, std::uint32_t b) {
  std::uint32_t product = 0;
  for (int i = 0; i < 32; ++i, a <<= 1) {
    if (a & 0x80000000u) product ^= b;
    b = (b & 1) ? (b >> 1) ^ kPoly : b >> 1;  // b · x
  }
  return product;
}
/// x^bits mod P: what feeding `bits` zero bits does to a CRC register (a multiplication by it).
constexpr std::uint32_t x_power(std::uint64_t bits) {
  std::uint32_t result = 0x80000000u, square = 0x40000000u;  // 1, x
  for (; bits; bits >>= 1, square = multiply(square, square))
    if (bits & 1) result = multiply(result, square);
  return result;
}

#if defined(__x86_64__)
// The crc32 instruction takes 3 cycles and can start one per cycle: three independent streams over
// three consecutive blocks keep it busy, and the CRC register being linear, crc(A B C) is
// crc(A)·x^|B C| + crc(B)·x^|C| + crc(C) (the two shifts are multiplications by one constant).
constexpr std::size_t kStreamBlock = 4096;
constexpr std::uint32_t kShiftBlock = x_power(8 * kStreamBlock);

__attribute__((target("sse4.2"))) std::uint32_t crc_hardware(const unsigned char* p, std::size_t n, std::uint32_t c) {
  std::uint64_t c64 = c;
  while (n >= 3 * kStreamBlock) {
    std::uint64_t c1 = 0, c2 = 0;
    for (std::size_t i = 0; i < kStreamBlock; i += 8) {
      std::uint64_t w0, w1, w2;
      std::memcpy(&w0, p + i, 8);
      std::memcpy(&w1, p + kStreamBlock + i, 8);
      std::memcpy(&w2, p + 2 * kStreamBlock + i, 8);
      c64 = __builtin_ia32_crc32di(c64, w0);
      c1 = __builtin_ia32_crc32di(c1, w1);
      c2 = __builtin_ia32_crc32di(c2, w2);
    }
    const std::uint32_t ab = multiply(static_cast<std::uint32_t>(c64), kShiftBlock) ^ static_cast<std::uint32_t>(c1);
    c64 = multiply(ab, kShiftBlock) ^ static_cast<std::uint32_t>(c2);
    p += 3 * kStreamBlock;
    n -= 3 * kStreamBlock;
  }
  while (n >= 8) {
    std::uint64_t w;
    std::memcpy(&w, p, 8);
    c64 = __builtin_ia32_crc32di(c64, w);
    p += 8;
    n -= 8;
  }
  c = static_cast<std::uint32_t>(c64);
  while (n--) c = __builtin_ia32_crc32qi(c, *p++);
  return c;
}
const bool kHaveHardware = __builtin_cpu_supports("sse4.2");
#endif

}  // namespace

std::uint32_t crc32c_raw(const void* data, std::size_t n, std::uint32_t crc) {
  const auto* p = static_cast<const unsigned char*>(data);
  std::uint32_t c = ~crc;
#if defined(__x86_64__)
  if (kHaveHardware) return ~crc_hardware(p, n, c);
#endif
  return ~crc_software(p, n, c);
}

}  // namespace dpipe
