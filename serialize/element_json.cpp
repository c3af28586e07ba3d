// Decodes natively encoded elements from their type tag alone, for snapshot renderings.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "dpipe/codec.hpp"
#include "dpipe/snapshot.hpp"
#include "dpipe/text_block.hpp"
#include "json_text.hpp"

namespace dpipe {
namespace {

struct TagNode {
  std::string name;  // i64, str, vec, tup, opt, ...
  std::vector<TagNode> args;
};

// Parses "vec<tup<i64,str>>"; false on anything else.
bool parse_tag(std::string_view& s, TagNode& node, int depth) {
  if (depth > 64) return false;
  std::size_t i = 0;
  while (i < s.size() && s[i] != '<' && s[i] != ',' && s[i] != '>') ++i;
  node.name = std::string(s.substr(0, i));
  s.remove_prefix(i);
  if (node.name.empty()) return false;
  if (!s.empty() && s[0] == '<') {
    s.remove_prefix(1);
    while (true) {
      TagNode arg;
      if (!parse_tag(s, arg, depth + 1)) return false;
      node.args.push_back(std::move(arg));
      if (s.empty()) return false;
      if (s[0] == ',') { s.remove_prefix(1); continue; }
      if (s[0] == '>') { s.remove_prefix(1); break; }
      return false;
    }
  }
  return true;
}

template <class N>
void number(ByteReader& r, JsonText& j) {
  j.number(r.get<N>());
}

bool decode(const TagNode& t, ByteReader& r, JsonText& j) {
  const auto& n = t.name;
  if (t.args.empty()) {
    if (n == "i64") number<std::int64_t>(r, j);
    else if (n == "u64") number<std::uint64_t>(r, j);
    else if (n == "i32") number<std::int32_t>(r, j);
    else if (n == "u32") number<std::uint32_t>(r, j);
    else if (n == "i16") number<std::int16_t>(r, j);
    else if (n == "u16") number<std::uint16_t>(r, j);
    else if (n == "i8") j.number(static_cast<int>(r.get<std::int8_t>()));
    else if (n == "u8") j.number(static_cast<unsigned>(r.get<std::uint8_t>()));
    else if (n == "f32") number<float>(r, j);
    else if (n == "f64") number<double>(r, j);
    else if (n == "bool") j.boolean(r.get<std::uint8_t>() != 0);
    else if (n == "str") j.string(r.str());
    else if (n == "text_block") {  // a line_blocks element: the list of its lines
      const TextBlock b = Codec<TextBlock>::decode(r);
      j.begin_array();
      for (std::string_view line : b) j.string(line);
      j.end_array();
    } else return false;
    return true;
  }
  if (n == "vec" && t.args.size() == 1) {
    const std::size_t count = r.length(1);
    j.begin_array();
    for (std::size_t i = 0; i < count; ++i)
      if (!decode(t.args[0], r, j)) return false;
    j.end_array();
    return true;
  }
  if (n == "tup") {
    j.begin_array();
    for (const auto& a : t.args)
      if (!decode(a, r, j)) return false;
    j.end_array();
    return true;
  }
  if (n == "opt" && t.args.size() == 1) {
    const auto has = r.get<std::uint8_t>();
    if (has == 0) { j.raw("null"); return true; }
    return has == 1 && decode(t.args[0], r, j);
  }
  return false;
}

}  // namespace

bool element_to_json(std::string_view tag, std::string_view bytes, std::string& out) {
  TagNode t;
  std::string_view s = tag;
  if (!parse_tag(s, t, 0) || !s.empty()) return false;
  try {
    ByteReader r(bytes, "element");
    JsonText j;
    if (!decode(t, r, j) || !r.done()) return false;
    out = j.take();
    return true;
  } catch (const SnapshotError&) {
    return false;
  }
}

}  // namespace dpipe
