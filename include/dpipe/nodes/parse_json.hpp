#pragma once
/// Parses each element, a line of JSON text holding one object, into a structured element (a record,
/// dpipe/fields.hpp) of the fields named, each converted to its declared type (simdjson, in libdpipe).
/// In: std::string → Out: Value. State: how many lines it skipped (on_error = skip).
///
/// Field types: int64, float32, float64, bool, string, bytes, int64[], float32[]; a trailing "?" makes a
/// field optional (absent or null: None). A line that is not a JSON object, lacks a required field, or
/// holds a value of another type is bad: the run fails naming the node, the line's position in this
/// instance's input and the field (`on_error = fail`), or the line is skipped and counted (`skip`).
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dpipe/fields.hpp"
#include "dpipe/kit/on_error.hpp"
#include "dpipe/kit/rescale.hpp"
#include "dpipe/kit/spec.hpp"
#include "dpipe/kit/unary.hpp"

namespace dpipe {

enum class JsonFieldType { int64, float32, float64, boolean, string, bytes, int64s, float32s };

struct JsonField {
  std::string name;
  JsonFieldType type = JsonFieldType::string;
  bool optional = false;
  /// "int64", "int64[]", "string?", …; ConfigError on an unknown name.
  static JsonField parse(std::string name, std::string_view type);
  std::string type_text() const;
};

struct ParseJsonOptions {
  std::vector<JsonField> fields{};
  OnDataError on_error = OnDataError::fail;
  std::string name{};
};

namespace detail {
/// One simdjson parser with its buffers (one per iterator: parsers are not shared between threads).
class JsonLineParser {
 public:
  explicit JsonLineParser(std::vector<JsonField> fields);
  ~JsonLineParser();
  JsonLineParser(const JsonLineParser&) = delete;
  JsonLineParser& operator=(const JsonLineParser&) = delete;
  /// Parses `line` into `out` (a record of the fields, in the order declared); returns "" or why the line
  /// is bad ("field 'doc': expected int64, got string").
  std::string parse(std::string_view line, Value& out);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};
}  // namespace detail

template <class In>
class ParseJsonIter final : public UnaryIter<In, Value> {
  static_assert(std::is_same_v<In, std::string>, "parse_json reads strings (lines of JSON text)");

 public:
  template <class Def>
  ParseJsonIter(BuildContext& ctx, const Def& def)
      : UnaryIter<In, Value>(ctx, def), parser_(def.options().fields), on_error_(def.options().on_error) {}

 protected:
  std::size_t pull_chunk(std::vector<Value>& out, std::size_t max) override {
    const ConvertedChunk c = pull_converted(this->input(), lines_, out, max, on_error_, st_, seen_,
                                            [&](const std::string& line, Value& v) { return parser_.parse(line, v); });
    if (c.failure.empty()) return c.delivered;
    try {
      throw std::runtime_error(c.failure);
    } catch (...) {
      return this->fail_after(c.delivered);  // the lines before the bad one are delivered first
    }
  }
  void save_state(StateWriter& w) const override { w.write(st_); }
  void restore_state(StateReader& r) override { r.read(st_); }
  std::uint64_t skipped_elements() const override { return st_.skipped; }

 private:
  detail::JsonLineParser parser_;
  OnDataError on_error_;
  SkipCountState st_;
  std::uint64_t seen_ = 0;  // lines this iterator read since it was built (for messages)
  std::vector<In> lines_;
};

struct ParseJsonKind;
template <class T>
using ParseJsonDef = UnaryDef<ParseJsonKind, T, Value, ParseJsonIter>;

inline auto parse_json(ParseJsonOptions o) { return unary<ParseJsonDef>(std::move(o)); }

struct ParseJsonKind {
  static constexpr std::string_view name = "parse_json";
  static constexpr std::string_view doc =
      "Parses lines of JSON objects into records of the named fields, each converted to its type.";
  static constexpr ParamSchema params[] = {
      {.name = "fields", .type = ParamType::fields,
       .doc = "field name → type: int64, float32, float64, bool, string, bytes, int64[], float32[] (a trailing ? "
              "makes it optional)",
       .positional = true},
      kOnErrorParam,
  };
  using Options = ParseJsonOptions;
  using State = SkipCountState;
  static Params checked_params(const ParseJsonOptions& o);
  /// Rescale: nothing but the skip count, which goes to the first new instance.
  static RescaleRule rescale() { return rescale::summed_skip_count(); }
  /// `snapshot show`: lines skipped.
  static std::string summary(const NodeState& record, const GraphNodeRecord&) { return skip_count_summary(record, "lines"); }
  /// `{"op": "parse_json", "fields": {"doc": "int64", "text": "string"}, "on_error": "fail" | "skip"}`
  template <class Spec>
  static SpecPipeline from_spec(Spec& s) {
    ParseJsonOptions o{.name = s.name()};
    std::vector<std::pair<std::string, std::string>> fields;
    s.required("fields", fields);
    for (auto& [field, type] : fields) o.fields.push_back(JsonField::parse(field, type));
    s.choice("on_error", o.on_error, {{"fail", OnDataError::fail}, {"skip", OnDataError::skip}});
    if (!s.input().template holds<std::string>())
      throw ConfigError("parse_json reads lines of text, but its input yields " + s.input().type_name() + "s");
    return s.input().template get<std::string>() | parse_json(o);
  }
};

}  // namespace dpipe
