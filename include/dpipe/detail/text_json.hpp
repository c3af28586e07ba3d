#pragma once
/// How dpipe writes text as JSON whatever its bytes (docs/files.md, "Text in JSON output"): text that is
/// valid UTF-8 is a JSON string; any other text is the object `{"base64": "<its bytes in base64>"}`
/// (RFC 4648 alphabet, with padding). Lossless, and unambiguous wherever text is otherwise a string. An
/// object whose keys are not all valid UTF-8 is written as a list of `[key, value]` pairs instead, each
/// key written as text is. Header-only; templated on the JSON type, so no JSON library is included here.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_set>
#include <utility>
#include <vector>

namespace dpipe::detail {

/// Whether `s` is well-formed UTF-8 (RFC 3629: no overlong forms, no surrogates, nothing above U+10FFFF).
inline bool is_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const std::size_t n = s.size();
  std::size_t i = 0;
  while (i < n) {
    const unsigned c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    std::size_t len;
    unsigned lo = 0x80, hi = 0xbf;  // the range of the second byte
    if (c >= 0xc2 && c <= 0xdf) len = 2;
    else if (c == 0xe0) len = 3, lo = 0xa0;
    else if ((c >= 0xe1 && c <= 0xec) || c == 0xee || c == 0xef) len = 3;
    else if (c == 0xed) len = 3, hi = 0x9f;  // U+D800..U+DFFF are surrogates
    else if (c == 0xf0) len = 4, lo = 0x90;
    else if (c >= 0xf1 && c <= 0xf3) len = 4;
    else if (c == 0xf4) len = 4, hi = 0x8f;
    else return false;
    if (n - i < len || p[i + 1] < lo || p[i + 1] > hi) return false;
    for (std::size_t k = 2; k < len; ++k)
      if ((p[i + k] & 0xc0) != 0x80) return false;
    i += len;
  }
  return true;
}

/// `bytes` in base64 (RFC 4648, standard alphabet, padded), appended to `out`.
inline void append_base64(std::string& out, std::string_view bytes) {
  static constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  out.reserve(out.size() + (bytes.size() + 2) / 3 * 4);
  for (std::size_t i = 0; i < bytes.size(); i += 3) {
    const std::uint32_t b0 = static_cast<unsigned char>(bytes[i]);
    const std::uint32_t b1 = i + 1 < bytes.size() ? static_cast<unsigned char>(bytes[i + 1]) : 0;
    const std::uint32_t b2 = i + 2 < bytes.size() ? static_cast<unsigned char>(bytes[i + 2]) : 0;
    const std::uint32_t v = (b0 << 16) | (b1 << 8) | b2;
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += i + 1 < bytes.size() ? kAlphabet[(v >> 6) & 63] : '=';
    out += i + 2 < bytes.size() ? kAlphabet[v & 63] : '=';
  }
}

inline std::string base64(std::string_view bytes) {
  std::string out;
  append_base64(out, bytes);
  return out;
}

/// Text as a JSON value of type `Json` (nlohmann's): a string when it is UTF-8, else {"base64": ...}.
template <class Json>
Json json_text(std::string_view s) {
  if (is_utf8(s)) return Json(std::string(s));
  Json j = Json::object();
  j["base64"] = base64(s);
  return j;
}

/// Named values as a JSON object; as a list of [key, value] pairs when a key is not UTF-8 or is given twice
/// (a crafted snapshot's fields: an object would keep one of them). Linear in the entries: an ordered
/// object's own insertion looks each key up among those before it.
template <class Json>
Json json_object(std::vector<std::pair<std::string, Json>> entries) {
  bool keys_ok = true;
  {
    std::unordered_set<std::string_view> seen;
    seen.reserve(entries.size());
    for (const auto& e : entries) keys_ok = keys_ok && is_utf8(e.first) && seen.insert(e.first).second;
  }
  Json j = keys_ok ? Json::object() : Json::array();
  if (keys_ok) {
    auto& object = j.template get_ref<typename Json::object_t&>();
    if constexpr (requires { typename Json::object_t::Container; }) {  // ordered_json: a vector of pairs
      auto& pairs = static_cast<typename Json::object_t::Container&>(object);
      pairs.reserve(entries.size());
      for (auto& [k, v] : entries) pairs.emplace_back(std::move(k), std::move(v));
    } else {
      for (auto& [k, v] : entries) object.emplace(std::move(k), std::move(v));
    }
    return j;
  }
  for (auto& [k, v] : entries) j.push_back(Json::array({json_text<Json>(k), std::move(v)}));
  return j;
}

}  // namespace dpipe::detail
