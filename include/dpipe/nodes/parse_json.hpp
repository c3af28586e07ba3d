#pragma once
/// Parses each line of JSON text holding one object into a structured element (a record,
/// dpipe/fields.hpp) of the fields named, each converted to its declared type (simdjson, in libdpipe).
/// In: std::string (a line), TextBlock (`line_blocks`: many lines, parsed in place) or
/// std::vector<std::string> (a batch of lines, as specs give `line_blocks`) → Out: Value, one per line.
/// State: how many lines it skipped (on_error = skip); reading blocks, also the lines of the current
/// block not parsed yet.
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
#include "dpipe/text_block.hpp"

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
  /// is bad ("field 'doc': expected int64, got string"). When `readable_after` bytes after the line may
  /// be read (the rest of a block), the line is parsed where it is, without a copy.
  std::string parse(std::string_view line, Value& out, std::size_t readable_after = 0);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};
}  // namespace detail

/// parse_json's saved state. `Elems` is std::vector<std::string> in the node.
template <class Elems>
struct ParseJsonState {
  std::uint64_t skipped = 0;
  Elems rest{};               // reading blocks: the lines of the current block not parsed yet
  bool reads_blocks = false;  // not saved: whether `rest` is a field (a parse_json of lines has none)
  template <class A>
  void fields(A& a) {
    a("skipped", skipped);
    if (reads_blocks) a("rest", rest);
  }
};

template <class In>
class ParseJsonIter final : public UnaryIter<In, Value> {
  static constexpr bool kBlocks = std::is_same_v<In, TextBlock> || std::is_same_v<In, std::vector<std::string>>;
  static_assert(kBlocks || std::is_same_v<In, std::string>,
                "parse_json reads lines of JSON text: strings, text blocks (line_blocks) or batches of strings");

 public:
  template <class Def>
  ParseJsonIter(BuildContext& ctx, const Def& def)
      : UnaryIter<In, Value>(ctx, def), parser_(def.options().fields), on_error_(def.options().on_error) {}

 protected:
  std::size_t pull_chunk(std::vector<Value>& out, std::size_t max) override {
    std::string failure;
    std::size_t delivered = 0;
    if constexpr (kBlocks) {
      delivered = pull_from_blocks(out, max, failure);
    } else {
      ConvertedChunk c = pull_converted(this->input(), pending_, out, max, on_error_, st_, seen_,
                                        this->traced() ? &this->traces() : nullptr,
                                        [&](const std::string& line, Value& v) { return parser_.parse(line, v); });
      delivered = c.delivered;
      failure = std::move(c.failure);
    }
    if (failure.empty()) return delivered;
    try {
      throw std::runtime_error(failure);
    } catch (...) {
      return this->fail_after(delivered);  // the lines before the bad one are delivered first
    }
  }
  void save_state(StateWriter& w) const override {
    ParseJsonState<std::vector<std::string>> st{.skipped = st_.skipped, .reads_blocks = kBlocks};
    if constexpr (kBlocks)
      for (std::size_t i = next_; i < block_.size(); ++i) st.rest.emplace_back(block_[i]);
    w.write(st);
  }
  void restore_state(StateReader& r) override {
    ParseJsonState<std::vector<std::string>> st{.reads_blocks = kBlocks};
    r.read(st);
    st_.skipped = st.skipped;
    if constexpr (std::is_same_v<In, TextBlock>) {
      for (const auto& line : st.rest)
        if (line.find('\n') != std::string::npos) r.fail("field 'rest' holds a line with a newline");
      block_ = TextBlock(st.rest);
      next_ = 0;
    } else if constexpr (kBlocks) {  // a batch of strings: any string, newlines included
      block_ = std::move(st.rest);
      next_ = 0;
    }
  }
  std::uint64_t skipped_elements() const override { return st_.skipped; }
  /// Provenance: a line's record has the line's; carried for lines only (blocks hold many lines each).
  bool carries_provenance() const override { return !kBlocks; }
  bool one_base() const override { return this->input().one_base(); }
  bool recomputable() const override { return !kBlocks && this->input().recomputable(); }
  Value recompute(const Provenance& p) const override {
    if constexpr (kBlocks) {
      return Iter<Value>::recompute(p);
    } else {
      Value v;
      if (std::string why = parser_.parse(this->input().recompute(p), v); !why.empty())
        throw SnapshotError(this->label() + ": the line of restore key " + to_string(p) + " no longer parses: " + why);
      return v;
    }
  }

 private:
  /// Up to `max` records from the lines of the current block, then of the blocks after it (pulled one at
  /// a time); a bad line under `fail` stops the chunk with `failure` set.
  std::size_t pull_from_blocks(std::vector<Value>& out, std::size_t max, std::string& failure) {
    std::size_t n = 0;
    while (n < max) {
      if (next_ == block_.size()) {
        pending_.clear();
        if (this->input().pull(pending_, 1) == 0) break;
        block_ = std::move(pending_[0]);
        next_ = 0;
        continue;
      }
      const std::size_t i = next_++;
      ++seen_;
      Value v;
      std::string why;
      if constexpr (std::is_same_v<In, TextBlock>) {
        // A line's bytes are followed by the rest of the block's text: parsed in place when that is enough.
        const std::size_t stop = block_.ends()[i];
        why = parser_.parse(block_[i], v, block_.text().size() - stop);
      } else {
        why = parser_.parse(block_[i], v);
      }
      if (why.empty()) {
        out.push_back(std::move(v));
        ++n;
      } else if (on_error_ == OnDataError::skip) {
        ++st_.skipped;
      } else {
        failure = "line " + std::to_string(seen_) + " read by this instance in this run: " + why +
                  " (on_error = skip drops such lines)";
        break;
      }
    }
    return n;
  }

  mutable detail::JsonLineParser parser_;  // recompute's too: a restore never runs beside a pull
  OnDataError on_error_;
  SkipCountState st_;
  std::uint64_t seen_ = 0;   // lines this iterator read since it was built (for messages)
  std::vector<In> pending_;  // what one pull of the input gave
  In block_{};               // reading blocks: the current one, parsed up to next_
  std::size_t next_ = 0;
};

struct ParseJsonKind;
template <class T>
using ParseJsonDef = UnaryDef<ParseJsonKind, T, Value, ParseJsonIter>;

inline auto parse_json(ParseJsonOptions o) { return unary<ParseJsonDef>(std::move(o)); }

struct ParseJsonKind {
  static constexpr std::string_view name = "parse_json";
  static constexpr std::string_view doc =
      "Parses lines of JSON objects into records of the named fields, each converted to its type.";
  static constexpr std::string_view provenance = "a record has its line's (after lines; not after line_blocks); parses the line again";
  static constexpr ParamSchema params[] = {
      {.name = "fields", .type = ParamType::fields,
       .doc = "field name → type: int64, float32, float64, bool, string, bytes, int64[], float32[] (a trailing ? "
              "makes it optional)",
       .positional = true},
      kOnErrorParam,
  };
  using Options = ParseJsonOptions;
  using State = ParseJsonState<ElementBlobs>;
  /// The state's fields as a parse_json of blocks has them (one of lines has `skipped` only).
  static State state_prototype() { return {.reads_blocks = true}; }
  static Params checked_params(const ParseJsonOptions& o);
  /// Rescale: the skip count goes to the first new instance; the unparsed lines of blocks are pooled and
  /// dealt (rescale::deal), as a shuffle's buffer.
  static RescaleRule rescale();
  /// `snapshot show`: lines skipped, and lines of a block not parsed yet.
  static std::string summary(const NodeState& record, const GraphNodeRecord&);
  /// `{"op": "parse_json", "fields": {"doc": "int64", "text": "string"}, "on_error": "fail" | "skip"}`, after
  /// `lines` or `line_blocks` (whose blocks specs give as lists of lines).
  template <class Spec>
  static SpecPipeline from_spec(Spec& s) {
    ParseJsonOptions o{.name = s.name()};
    std::vector<std::pair<std::string, std::string>> fields;
    s.required("fields", fields);
    for (auto& [field, type] : fields) o.fields.push_back(JsonField::parse(field, type));
    s.choice("on_error", o.on_error, {{"fail", OnDataError::fail}, {"skip", OnDataError::skip}});
    if (s.input().template holds<std::vector<std::string>>())
      return s.input().template get<std::vector<std::string>>() | parse_json(o);
    if (!s.input().template holds<std::string>())
      throw ConfigError("parse_json reads lines of text (lines, line_blocks), but its input yields " + s.input().type_name() + "s");
    return s.input().template get<std::string>() | parse_json(o);
  }
};

}  // namespace dpipe
