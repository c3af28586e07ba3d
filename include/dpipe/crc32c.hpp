#pragma once
/// CRC-32C (Castagnoli), the checksum of snapshot files and of TFRecord framing.
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace dpipe {

/// CRC-32C of `n` bytes, continuing from `crc` (0 for a fresh checksum). Uses the SSE4.2 instruction
/// when the processor has it.
std::uint32_t crc32c_raw(const void* data, std::size_t n, std::uint32_t crc = 0);
inline std::uint32_t crc32c(std::string_view s, std::uint32_t crc = 0) { return crc32c_raw(s.data(), s.size(), crc); }

}  // namespace dpipe
