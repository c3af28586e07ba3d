#pragma once
/// Tokenizes the text field of each record with a SentencePiece model (libsentencepiece, in libdpipe) and
/// writes the token ids into another field as a 1-D int64 array, with the model's BOS id before and EOS
/// id after when asked. In: Value (a record) or std::string (plain text) → Out: Value (the record, or a
/// record of the one field `into`). State: how many elements it skipped (on_error = skip).
///
/// The model is loaded once per pipeline and shared by every instance (SentencePiece encodes from
/// several threads at once). The fingerprint holds a digest of the model file's bytes, not its path: a
/// snapshot resumes with the same model at another path, and refuses another model.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dpipe/kit/length.hpp"
#include "dpipe/fields.hpp"
#include "dpipe/kit/on_error.hpp"
#include "dpipe/kit/rescale.hpp"
#include "dpipe/kit/spec.hpp"
#include "dpipe/kit/unary.hpp"

namespace dpipe {

namespace detail {
/// A loaded SentencePiece model (immutable, shared by every instance).
class SentencePieceModel {
 public:
  /// Loads `path`; ConfigError naming `node` and the path when it is missing or not a model.
  static std::shared_ptr<const SentencePieceModel> load(const std::string& path, const std::string& node);
  ~SentencePieceModel();
  /// Appends the ids of `text` to `out`; "" or why it could not be encoded.
  std::string encode(std::string_view text, std::vector<int>& out) const;
  int bos_id() const;
  int eos_id() const;
  int vocab_size() const;
  /// "digest HEX (N bytes)": the fingerprint's identity of the model.
  const std::string& identity() const { return identity_; }

 private:
  SentencePieceModel() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string identity_;
};
}  // namespace detail

struct TokenizeOptions {
  std::string model{};
  std::string field = "text";
  std::string into = "tokens";
  bool bos = false;
  bool eos = false;
  OnDataError on_error = OnDataError::fail;
  std::string name{};
  /// Filled by tokenize() from `model` (a caller need not set it).
  std::shared_ptr<const detail::SentencePieceModel> loaded{};
};

template <class In>
class TokenizeIter final : public UnaryIter<In, Value> {
  static_assert(std::is_same_v<In, Value> || std::is_same_v<In, std::string>,
                "tokenize reads records (Value) or plain text (std::string)");

 public:
  template <class Def>
  TokenizeIter(BuildContext& ctx, const Def& def) : UnaryIter<In, Value>(ctx, def), o_(def.options()) {}

 protected:
  std::size_t pull_chunk(std::vector<Value>& out, std::size_t max) override {
    const ConvertedChunk c = pull_converted(this->input(), in_, out, max, o_.on_error, st_, seen_,
                                            this->traced() ? &this->traces() : nullptr, [&](In& element, Value& v) {
                                              return encode(element, v, ids_, tokens_);
                                            });
    if (c.failure.empty()) return c.delivered;
    try {
      throw std::runtime_error(c.failure);
    } catch (...) {
      return this->fail_after(c.delivered);  // the elements before the bad one are delivered first
    }
  }
  void save_state(StateWriter& w) const override { w.write(st_); }
  void restore_state(StateReader& r) override { r.read(st_); }
  std::uint64_t skipped_elements() const override { return st_.skipped; }
  bool carries_provenance() const override { return true; }
  bool one_base() const override { return this->input().one_base(); }
  bool recomputable() const override { return this->input().recomputable(); }
  /// The same model encodes the same text the same way (its bytes are in the fingerprint).
  Value recompute(const Provenance& p) const override {
    In element = this->input().recompute(p);
    Value v;
    std::vector<int> ids;
    std::vector<std::int64_t> tokens;
    if (std::string why = encode(element, v, ids, tokens); !why.empty())
      throw SnapshotError(this->label() + ": the element of restore key " + to_string(p) + " no longer tokenizes: " + why);
    return v;
  }

 private:
  // Encodes one element into `result` (`ids`, `tokens`: scratch); "" or why it is bad.
  std::string encode(In& element, Value& result, std::vector<int>& ids, std::vector<std::int64_t>& tokens) const {
    std::string_view text;
    if constexpr (std::is_same_v<In, std::string>) {
      text = element;
      result = make_record(1);
    } else {
      const Value* f = find_field(element, o_.field);
      if (!f) return is_record(element) ? "it has no field '" + o_.field + "'" : "it is not a record";
      if (f->kind != Value::Kind::string && f->kind != Value::Kind::bytes)
        return "field '" + o_.field + "' is not a string";
      text = std::get<std::string>(f->data);
      result = std::move(element);  // the text is read before the record is written below
    }
    ids.clear();
    if (o_.bos) ids.push_back(o_.loaded->bos_id());
    if (std::string why = o_.loaded->encode(text, ids); !why.empty()) return why;
    if (o_.eos) ids.push_back(o_.loaded->eos_id());
    tokens.assign(ids.begin(), ids.end());
    set_field(result, o_.into, int64_array(tokens));
    return {};
  }

  const TokenizeOptions& o_;
  SkipCountState st_;
  std::uint64_t seen_ = 0;
  std::vector<In> in_;
  std::vector<int> ids_;
  std::vector<std::int64_t> tokens_;
};

struct TokenizeKind;
template <class T>
using TokenizeDef = UnaryDef<TokenizeKind, T, Value, TokenizeIter>;

/// `p | tokenize({.model = "m.model", .field = "text", .into = "tokens", .bos = true, .eos = true})`
inline auto tokenize(TokenizeOptions o) {
  if (!o.loaded) o.loaded = detail::SentencePieceModel::load(o.model, node_label("tokenize", o.name));
  return unary<TokenizeDef>(std::move(o));
}

struct TokenizeKind {
  static constexpr std::string_view name = "tokenize";
  static constexpr LengthFn length = &same_length_unless_skipping;
  static constexpr std::string_view doc =
      "Tokenizes a text field with a SentencePiece model into an int64 array field (BOS/EOS optional).";
  static constexpr std::string_view provenance = "passes its input's on; tokenizes again with the same model";
  static constexpr ParamSchema params[] = {
      {.name = "model", .type = ParamType::text, .doc = "the SentencePiece model file (its bytes are fingerprinted, not its path)",
       .positional = true},
      {.name = "field", .type = ParamType::text, .doc = "the field holding the text (records)", .fallback = "\"text\""},
      {.name = "into", .type = ParamType::text, .doc = "the field the tokens go into", .fallback = "\"tokens\""},
      {.name = "bos", .type = ParamType::boolean, .doc = "put the model's BOS id first", .fallback = "false"},
      {.name = "eos", .type = ParamType::boolean, .doc = "put the model's EOS id last", .fallback = "false"},
      kOnErrorParam,
  };
  using Options = TokenizeOptions;
  using State = SkipCountState;
  static Params checked_params(const TokenizeOptions& o);
  /// Rescale: nothing but the skip count, which goes to the first new instance.
  static RescaleRule rescale() { return rescale::summed_skip_count(); }
  static std::string summary(const NodeState& record, const GraphNodeRecord&) { return skip_count_summary(record, "elements"); }
  /// `{"op": "tokenize", "model": PATH, "field": "text", "into": "tokens", "bos": true, "eos": true}`
  template <class Spec>
  static SpecPipeline from_spec(Spec& s) {
    TokenizeOptions o{.name = s.name()};
    s.required("model", o.model);
    s.param("field", o.field);
    s.param("into", o.into);
    s.param("bos", o.bos);
    s.param("eos", o.eos);
    s.choice("on_error", o.on_error, {{"fail", OnDataError::fail}, {"skip", OnDataError::skip}});
    if (s.input().template holds<std::string>()) return s.input().template get<std::string>() | tokenize(o);
    if (s.input().template holds<Value>()) return s.input().template get<Value>() | tokenize(o);
    throw ConfigError("tokenize reads records or lines of text, but its input yields " + s.input().type_name() + "s");
  }
};

}  // namespace dpipe
