// Snapshot renderings for people (`dpipe snapshot show`), built as nlohmann ordered_json: elements are
// decoded from their type tag alone.
#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "dpipe/kit/codec.hpp"
#include "dpipe/detail/text_json.hpp"
#include "dpipe/snapshot.hpp"
#include "dpipe/kit/node_kind.hpp"
#include "dpipe/kit/restore_keys.hpp"
#include "dpipe/text_block.hpp"
#include "snapshot_json.hpp"
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

using Json = nlohmann::ordered_json;

bool decode(const TagNode& t, ByteReader& r, Json& j) {
  const auto& n = t.name;
  if (t.args.empty()) {
    if (n == "i64") j = r.get<std::int64_t>();
    else if (n == "u64") j = r.get<std::uint64_t>();
    else if (n == "i32") j = r.get<std::int32_t>();
    else if (n == "u32") j = r.get<std::uint32_t>();
    else if (n == "i16") j = r.get<std::int16_t>();
    else if (n == "u16") j = r.get<std::uint16_t>();
    else if (n == "i8") j = static_cast<int>(r.get<std::int8_t>());
    else if (n == "u8") j = static_cast<unsigned>(r.get<std::uint8_t>());
    else if (n == "f32") j = r.get<float>();
    else if (n == "f64") j = r.get<double>();
    else if (n == "bool") j = r.get<std::uint8_t>() != 0;
    else if (n == "str") j = detail::json_text<Json>(r.str());
    else if (n == "text_block") {  // a line_blocks element: the list of its lines
      const TextBlock b = Codec<TextBlock>::decode(r);
      j = Json::array();
      for (std::string_view line : b) j.push_back(detail::json_text<Json>(line));
    } else return false;
    return true;
  }
  if ((n == "vec" && t.args.size() == 1) || n == "tup") {
    const std::size_t count = n == "vec" ? r.length(1) : t.args.size();
    j = Json::array();
    for (std::size_t i = 0; i < count; ++i) {
      Json item;
      if (!decode(n == "vec" ? t.args[0] : t.args[i], r, item)) return false;
      j.push_back(std::move(item));
    }
    return true;
  }
  if (n == "opt" && t.args.size() == 1) {
    const auto has = r.get<std::uint8_t>();
    if (has == 0) { j = nullptr; return true; }
    return has == 1 && decode(t.args[0], r, j);
  }
  return false;
}

}  // namespace

bool element_to_ordered_json(std::string_view tag, std::string_view bytes, nlohmann::ordered_json& out) {
  TagNode t;
  std::string_view s = tag;
  if (!parse_tag(s, t, 0) || !s.empty()) return false;
  try {
    ByteReader r(bytes, "element");
    Json j;
    if (!decode(t, r, j) || !r.done()) return false;
    out = std::move(j);
    return true;
  } catch (const SnapshotError&) {
    return false;
  }
}

bool element_to_json(std::string_view tag, std::string_view bytes, std::string& out) {
  Json j;
  if (!element_to_ordered_json(tag, bytes, j)) return false;
  out = dump_json(j);
  return true;
}

namespace {
nlohmann::ordered_json provenance_to_ordered_json(const Provenance& p, const std::vector<std::string>& keys) {
  using Json = nlohmann::ordered_json;
  if (is_unknown_element(p)) return nullptr;
  Json out = Json::array();
  for (const SourcePos& s : p) {
    if (s.source == SourcePos::kUnknown) {
      out.push_back(nullptr);
      continue;
    }
    Json entry = {detail::json_text<Json>(s.source < keys.size() ? keys[s.source] : std::string("?")), s.position};
    if (s.epoch != 0 || !s.offsets.empty() || s.sliced()) {
      Json extra = Json::object();
      if (s.epoch != 0) extra["epoch"] = s.epoch;
      if (!s.offsets.empty()) extra["offsets"] = s.offsets;
      if (s.sliced()) extra["tokens"] = Json::array({s.begin, s.end});
      entry.push_back(std::move(extra));
    }
    out.push_back(std::move(entry));
  }
  return out;
}

/// An entry of a keyed list (kit/restore_keys.hpp): {"key": sources, "crc32c": N} or {"data": element};
/// false when it is neither.
bool key_entry_to_json(std::string_view element_tag, std::string_view entry, const std::vector<std::string>& keys,
                       nlohmann::ordered_json& out) {
  if (entry.empty()) return false;
  if (entry[0] == kDataEntry) {
    nlohmann::ordered_json v;
    if (!element_to_ordered_json(element_tag, entry.substr(1), v)) return false;
    out = {{"data", std::move(v)}};
    return true;
  }
  if (entry[0] != kKeyEntry) return false;
  try {
    ByteReader r(entry.substr(1), "a restore key");
    std::uint32_t checksum = 0;
    const Provenance p = decode_key(r, checksum);
    if (!r.done()) return false;
    out = {{"key", provenance_to_ordered_json(p, keys)}, {"crc32c", checksum}};
    return true;
  } catch (const SnapshotError&) {
    return false;
  }
}
}  // namespace

std::string provenance_json(const Provenance& p, const std::vector<std::string>& keys) {
  return dump_json(provenance_to_ordered_json(p, keys));
}

std::string Snapshot::to_json() const {
  // Text from the file is written as detail::json_text says (UTF-8 as strings, other bytes as
  // {"base64": ...}), so the rendering is valid JSON and keeps every byte.
  using Json = nlohmann::ordered_json;
  const auto text = [](std::string_view s) { return detail::json_text<Json>(s); };
  Json graph = Json::array();
  for (const auto& n : meta.graph) {
    Json node = {{"key", text(n.key)}, {"kind", text(n.kind)}, {"element_type", text(n.element_type)}};
    if (!n.segment.empty()) node["segment"] = text(n.segment);
    if (!n.params.empty()) {
      std::vector<std::pair<std::string, Json>> params;
      for (const auto& [k, v] : n.params) params.emplace_back(k, text(v));
      node["params"] = detail::json_object<Json>(std::move(params));
    }
    graph.push_back(std::move(node));
  }
  std::vector<std::string> graph_keys;  // a restore key's source index is its place in the graph
  for (const auto& n : meta.graph) graph_keys.push_back(n.key);
  Json rendered_states = Json::array();
  for (const auto& s : states) {
    std::vector<std::pair<std::string, Json>> fields;
    for (const auto& f : s.fields) {
      switch (f.type) {
        case FieldType::u64: fields.emplace_back(f.name, f.u); break;
        case FieldType::i64: fields.emplace_back(f.name, f.i); break;
        case FieldType::str: fields.emplace_back(f.name, text(f.s)); break;
        case FieldType::elements: {
          Json values = Json::array();
          // A native tag's blobs must decode as it says (a resume decodes them so); other tags are a
          // user type's cereal bytes, shown in hex, and so are `value`s this rendering does not spell out
          // (arrays of some dtypes).
          // A keyed list's entries are keys (named by the graph's keys) or data (restore_keys.hpp).
          TagNode native;
          const bool keyed = f.elements.tag.starts_with(kKeysTagPrefix);
          const std::string element_tag = keyed ? f.elements.tag.substr(kKeysTagPrefix.size()) : f.elements.tag;
          std::string_view tag = f.elements.tag;
          const bool is_native = !keyed && parse_tag(tag, native, 0) && tag.empty() &&
                                 f.elements.tag.find("value") == std::string::npos;
          for (std::size_t i = 0; i < f.elements.size(); ++i) {
            Json v;
            if (keyed ? key_entry_to_json(element_tag, f.elements.at(i), graph_keys, v)
                      : element_to_ordered_json(f.elements.tag, f.elements.at(i), v)) {
            } else if (is_native) {
              throw SnapshotError("snapshot node '" + s.key.substr(0, 64) + "' (instance " + std::to_string(s.instance) +
                                  "), field '" + f.name.substr(0, 64) + "': element " + std::to_string(i) + " (" +
                                  std::to_string(f.elements.at(i).size()) + " bytes) is no valid " + f.elements.tag);
            } else {
              v = "0x" + hex_bytes(f.elements.at(i));
            }
            values.push_back(std::move(v));
          }
          fields.emplace_back(f.name, Json{{"type", text(f.elements.tag)},
                                           {"count", f.elements.size()},
                                           {"bytes", f.elements.data.size()},
                                           {"values", std::move(values)}});
          break;
        }
      }
    }
    Json record = {{"key", text(s.key)}, {"kind", text(s.kind)}, {"instance", s.instance}, {"mode", to_string(s.mode)}};
    // A kind may say in words what its record means (XKind::summary); a record it cannot read says why. A
    // stateless record (a map without a skip policy) has nothing to say.
    if (const KindInfo* kind = find_kind(s.kind); kind && kind->summary && s.mode != StateMode::stateless) {
      const auto node = std::find_if(meta.graph.begin(), meta.graph.end(), [&](const auto& n) { return n.key == s.key; });
      try {
        record["summary"] = text(kind->summary(s, node != meta.graph.end() ? *node : GraphNodeRecord{}));
      } catch (const SnapshotError& e) {
        record["summary"] = text(std::string("unreadable: ") + e.what());
      }
    }
    record["fields"] = detail::json_object<Json>(std::move(fields));
    rendered_states.push_back(std::move(record));
  }
  std::vector<std::pair<std::string, Json>> user;
  for (const auto& [k, v] : meta.user_metadata) user.emplace_back(k, text(v));
  const Json j = {{"format_version", meta.format_version ? meta.format_version : kFormatVersion},
                  {"id", hex64(meta.id)},
                  {"step", meta.step ? Json(*meta.step) : Json(nullptr)},
                  {"fingerprint", hex64(meta.fingerprint)},
                  {"seed", meta.seed},
                  {"epoch", meta.epoch},
                  {"layout",
                   {{"rank", meta.layout.rank}, {"world_size", meta.layout.world_size}, {"num_workers", meta.layout.num_workers}}},
                  {"elements_delivered", meta.elements_delivered},
                  {"user_metadata", detail::json_object<Json>(std::move(user))},
                  {"graph", std::move(graph)},
                  {"states", std::move(rendered_states)}};
  return dump_json(j);
}

}  // namespace dpipe
