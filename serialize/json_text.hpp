#pragma once
// A small streaming JSON writer for snapshot renderings and the tool's output; commas are automatic.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

namespace dpipe {

inline void append_json_string(std::string& out, std::string_view s) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

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

class JsonText {
 public:
  JsonText& begin_object() { value_start(); out_ += '{'; first_.push_back(true); return *this; }
  JsonText& end_object() { out_ += '}'; first_.pop_back(); return *this; }
  JsonText& begin_array() { value_start(); out_ += '['; first_.push_back(true); return *this; }
  JsonText& end_array() { out_ += ']'; first_.pop_back(); return *this; }
  JsonText& key(std::string_view k) {
    comma();
    append_json_string(out_, k);
    out_ += ':';
    after_key_ = true;
    return *this;
  }
  JsonText& string(std::string_view s) { value_start(); append_json_string(out_, s); return *this; }
  template <class N>
  JsonText& number(N v) {
    value_start();
    if constexpr (std::is_floating_point_v<N>) {
      if (!std::isfinite(v)) { out_ += "null"; return *this; }
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.17g", static_cast<double>(v));
      out_ += buf;
    } else {
      out_ += std::to_string(v);
    }
    return *this;
  }
  JsonText& boolean(bool b) { value_start(); out_ += b ? "true" : "false"; return *this; }
  JsonText& raw(std::string_view json) { value_start(); out_ += json; return *this; }
  std::string take() { return std::move(out_); }

 private:
  void comma() {
    if (!first_.empty()) {
      if (!first_.back()) out_ += ',';
      first_.back() = false;
    }
  }
  void value_start() {
    if (after_key_) after_key_ = false;
    else comma();
  }
  std::string out_;
  std::vector<bool> first_;
  bool after_key_ = false;
};

}  // namespace dpipe
