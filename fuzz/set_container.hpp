#pragma once
// The input of the snapshot-set target: two bytes that choose the new layout (world size 1 + b0 % 6,
// workers 1 + b1 % 4), then each rank's snapshot file as a u32 little-endian length and its bytes.
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace dpipe_fuzz {

struct SetInput {
  std::uint8_t world = 0, workers = 0;
  std::vector<std::string> ranks;

  int new_world_size() const { return 1 + world % 6; }
  int new_workers() const { return 1 + workers % 4; }

  static bool parse(std::string_view in, SetInput& out) {
    if (in.size() < 2) return false;
    out.world = static_cast<std::uint8_t>(in[0]);
    out.workers = static_cast<std::uint8_t>(in[1]);
    in.remove_prefix(2);
    while (in.size() >= 4 && out.ranks.size() < 16) {
      std::uint32_t n = 0;
      std::memcpy(&n, in.data(), 4);
      in.remove_prefix(4);
      if (n > in.size()) return false;
      out.ranks.emplace_back(in.substr(0, n));
      in.remove_prefix(n);
    }
    return in.empty();
  }
  std::string encode() const {
    std::string out{static_cast<char>(world), static_cast<char>(workers)};
    for (const auto& r : ranks) {
      const auto n = static_cast<std::uint32_t>(r.size());
      out.append(reinterpret_cast<const char*>(&n), 4);
      out += r;
    }
    return out;
  }
};

}  // namespace dpipe_fuzz
