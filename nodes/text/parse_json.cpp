// parse_json's line parser (simdjson's DOM API) and the rescale rule of a skip count.
#include "dpipe/nodes/parse_json.hpp"

#include <simdjson.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <limits>

namespace dpipe {

namespace {
struct TypeName {
  std::string_view name;
  JsonFieldType type;
};
constexpr TypeName kTypes[] = {
    {"int64", JsonFieldType::int64},   {"float32", JsonFieldType::float32}, {"float64", JsonFieldType::float64},
    {"bool", JsonFieldType::boolean},  {"string", JsonFieldType::string},   {"bytes", JsonFieldType::bytes},
    {"int64[]", JsonFieldType::int64s}, {"float32[]", JsonFieldType::float32s},
};
}  // namespace

JsonField JsonField::parse(std::string name, std::string_view type) {
  JsonField f{.name = std::move(name)};
  if (!type.empty() && type.back() == '?') {
    f.optional = true;
    type.remove_suffix(1);
  }
  for (const auto& t : kTypes)
    if (t.name == type) {
      f.type = t.type;
      return f;
    }
  throw ConfigError("parse_json: field '" + f.name + "' has type '" + std::string(type) +
                    "' (known: int64, float32, float64, bool, string, bytes, int64[], float32[], each with an optional ?)");
}

std::string JsonField::type_text() const {
  for (const auto& t : kTypes)
    if (t.type == type) return std::string(t.name) + (optional ? "?" : "");
  return "?";
}

Params ParseJsonKind::checked_params(const ParseJsonOptions& o) {
  if (o.fields.empty()) throw ConfigError(node_label("parse_json", o.name) + ": fields must name at least one field");
  std::string fields;
  for (std::size_t i = 0; i < o.fields.size(); ++i) {
    for (std::size_t j = 0; j < i; ++j)
      if (o.fields[j].name == o.fields[i].name)
        throw ConfigError(node_label("parse_json", o.name) + ": field '" + o.fields[i].name + "' is named twice");
    fields += (i ? ", " : "") + o.fields[i].name + ": " + o.fields[i].type_text();
  }
  return {{"fields", fields}, {"on_error", on_error_text(o.on_error)}};
}

namespace detail {

struct JsonLineParser::Impl {
  std::vector<JsonField> fields;
  simdjson::dom::parser parser;
  std::vector<std::int64_t> ints;
  std::vector<float> floats;
};

JsonLineParser::JsonLineParser(std::vector<JsonField> fields) : impl_(std::make_unique<Impl>()) {
  impl_->fields = std::move(fields);
}
JsonLineParser::~JsonLineParser() = default;

namespace {
const char* json_type_name(simdjson::dom::element_type t) {
  using simdjson::dom::element_type;
  switch (t) {
    case element_type::ARRAY: return "array";
    case element_type::OBJECT: return "object";
    case element_type::INT64:
    case element_type::UINT64: return "integer";
    case element_type::DOUBLE: return "number";
    case element_type::STRING: return "string";
    case element_type::BOOL: return "bool";
    case element_type::NULL_VALUE: return "null";
  }
  return "?";
}

// A JSON number as int64 when it is an integer that fits.
bool as_int64(simdjson::dom::element e, std::int64_t& out) {
  return e.type() == simdjson::dom::element_type::INT64 && !e.get_int64().get(out);
}
bool as_double(simdjson::dom::element e, double& out) {
  const auto t = e.type();
  if (t != simdjson::dom::element_type::INT64 && t != simdjson::dom::element_type::UINT64 &&
      t != simdjson::dom::element_type::DOUBLE)
    return false;
  return !e.get_double().get(out);
}
}  // namespace

std::string JsonLineParser::parse(std::string_view line, Value& out, std::size_t readable_after) {
  using simdjson::dom::element_type;
  Impl& m = *impl_;
  simdjson::dom::element doc;
  // simdjson reads up to SIMDJSON_PADDING bytes past the end: in place when they are there, else a copy.
  const bool in_place = readable_after >= simdjson::SIMDJSON_PADDING;
  if (const auto err = m.parser.parse(line.data(), line.size(), !in_place).get(doc); err)
    return std::string("not JSON (") + simdjson::error_message(err) + ")";
  simdjson::dom::object obj;
  if (doc.get_object().get(obj)) return std::string("a JSON ") + json_type_name(doc.type()) + ", not an object";
  out = make_record(m.fields.size());
  auto& items = std::get<std::vector<Value>>(out.data);
  // The fields are named once each (checked when the node is built): appended, not looked up.
  auto put = [&](const std::string& name, Value v) {
    items.push_back(Value::string(name));
    items.push_back(std::move(v));
  };
  for (const JsonField& f : m.fields) {
    simdjson::dom::element e;
    if (obj.at_key(f.name).get(e) || e.type() == element_type::NULL_VALUE) {
      if (!f.optional) return "field '" + f.name + "' is " + (obj.at_key(f.name).error() ? "missing" : "null");
      put(f.name, Value::none());
      continue;
    }
    auto wrong = [&] {
      return "field '" + f.name + "': expected " + f.type_text() + ", got " + json_type_name(e.type());
    };
    switch (f.type) {
      case JsonFieldType::int64: {
        std::int64_t i = 0;
        if (!as_int64(e, i)) return wrong();
        put(f.name, Value::integer(i));
        break;
      }
      case JsonFieldType::float32:
      case JsonFieldType::float64: {
        double d = 0;
        if (!as_double(e, d)) return wrong();
        put(f.name, Value::real(f.type == JsonFieldType::float32 ? static_cast<double>(static_cast<float>(d)) : d));
        break;
      }
      case JsonFieldType::boolean: {
        bool b = false;
        if (e.get_bool().get(b)) return wrong();
        put(f.name, Value::boolean(b));
        break;
      }
      case JsonFieldType::string:
      case JsonFieldType::bytes: {
        std::string_view s;
        if (e.get_string().get(s)) return wrong();
        put(f.name, f.type == JsonFieldType::string ? Value::string(std::string(s)) : Value::bytes(std::string(s)));
        break;
      }
      case JsonFieldType::int64s: {
        simdjson::dom::array a;
        if (e.get_array().get(a)) return wrong();
        m.ints.clear();
        for (simdjson::dom::element x : a) {
          std::int64_t i = 0;
          if (!as_int64(x, i))
            return "field '" + f.name + "': expected int64[], found an item of type " + json_type_name(x.type());
          m.ints.push_back(i);
        }
        put(f.name, int64_array(m.ints));
        break;
      }
      case JsonFieldType::float32s: {
        simdjson::dom::array a;
        if (e.get_array().get(a)) return wrong();
        m.floats.clear();
        for (simdjson::dom::element x : a) {
          double d = 0;
          if (!as_double(x, d))
            return "field '" + f.name + "': expected float32[], found an item of type " + json_type_name(x.type());
          m.floats.push_back(static_cast<float>(d));
        }
        put(f.name, numeric_array<float>(m.floats, {static_cast<std::uint64_t>(m.floats.size())}));
        break;
      }
    }
  }
  return {};
}

}  // namespace detail

namespace {
/// The sum of the old records' skip counts (field `skipped`), refused when it overflows.
std::uint64_t total_skipped(const RescaleInput& in) {
  const auto counts = in.numbers(&SkipCountState::skipped);
  std::uint64_t total = 0;
  for (std::size_t i = 0; i < counts.size(); ++i) {
    if (counts[i] > std::numeric_limits<std::uint64_t>::max() - total) in.refuse("the skip counts overflow");
    total += counts[i];
  }
  return total;
}
}  // namespace

RescaleRule ParseJsonKind::rescale() {
  return RescaleRule::dealt([](const RescaleInput& in) {
    using S = ParseJsonState<ElementBlobs>;
    const bool blocks = in.has_field("rest");
    in.check_fields<S>(S{.reads_blocks = blocks});
    const std::uint64_t total = total_skipped(in);
    std::optional<rescale::DealtParts> rest;
    if (blocks) rest = in.deal_fields({"rest"});
    return in.write_slots([&](std::size_t j) {
      return S{.skipped = j == 0 ? total : 0, .rest = rest ? (*rest)[j] : ElementBlobs{}, .reads_blocks = blocks};
    });
  });
}

std::string ParseJsonKind::summary(const NodeState& record, const GraphNodeRecord&) {
  const bool blocks = std::any_of(record.fields.begin(), record.fields.end(), [](const Field& f) { return f.name == "rest"; });
  ParseJsonState<ElementBlobs> st{.reads_blocks = blocks};
  StateReader r(record);
  r.read(st);
  return std::to_string(st.skipped) + " bad lines skipped" +
         (st.reads_blocks ? ", " + std::to_string(st.rest.size()) + " lines of a block not parsed yet" : "");
}

namespace rescale {
RescaleRule summed_skip_count() {
  return RescaleRule::dealt([](const RescaleInput& in) {
    in.check_fields<SkipCountState>();
    const std::uint64_t total = total_skipped(in);
    return in.write_slots([&](std::size_t j) { return SkipCountState{.skipped = j == 0 ? total : 0}; });
  });
}
}  // namespace rescale

}  // namespace dpipe
