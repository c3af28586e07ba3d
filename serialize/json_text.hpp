#pragma once
// Hex renderings for JSON. The element lines the tool writes (the hot path) go through one fast writer,
// SpecElement<T>::append_json (dpipe/kit/spec.hpp); everything else (snapshot renderings, the tool's stats and
// summaries) is built as nlohmann::ordered_json.
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

namespace dpipe {

inline std::string hex64(std::uint64_t v) {
  char buf[19];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

inline std::string hex_bytes(std::string_view b) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  s.reserve(b.size() * 2);
  for (unsigned char c : b) {
    s += digits[c >> 4];
    s += digits[c & 15];
  }
  return s;
}

}  // namespace dpipe
