#pragma once
/// Packs documents (records whose `field` holds a 1-D integer array of tokens) into rows of exactly
/// `seq_len` tokens, for training without padding waste. In: Value → Out: Value, a record of
///   tokens       int64[seq_len]  the documents' tokens, then 0 as padding;
///   segment_ids  int64[seq_len]  1, 2, … for the row's segments (pieces of documents), 0 for padding;
///   positions    int64[seq_len]  each token's position in its document (a piece that continues a document
///                                from an earlier row goes on counting), 0 for padding;
///   doc          list            the `doc` field of each segment's document (None where it has none),
///                                present when any of the row's documents has one.
/// A document longer than the room left continues in the next row. Empty documents give no segment.
///
/// mode greedy (streaming): the documents are laid end to end and cut every seq_len tokens; only the last
/// row is padded. mode first_fit: each document (after its whole rows are cut off) goes into the first of
/// up to `buffer` open rows with room for it; when none has room and `buffer` rows are open, the first
/// one is emitted padded. Full rows are emitted at once; at the end of the input every open row is, in order.
///
/// State: the open rows and the rows made but not yet taken. Rescale: both are dealt to the new
/// instances; no token is lost or repeated (a greedy instance dealt several open rows emits all but the
/// last padded).
///
/// Provenance: a row's base elements are its segments, each its document's (one base element) with the
/// segment's token range (SourcePos::begin, end). A traced run saves the open and the made rows as
/// restore keys when the documents' chain can make them again: the row is rebuilt from its documents.
#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "dpipe/fields.hpp"
#include "dpipe/kit/rescale.hpp"
#include "dpipe/kit/restore_keys.hpp"
#include "dpipe/kit/spec.hpp"
#include "dpipe/kit/unary.hpp"

namespace dpipe {

enum class PackMode { greedy, first_fit };

struct PackOptions {
  std::int64_t seq_len = 0;
  std::string field = "tokens";
  PackMode mode = PackMode::greedy;
  std::int64_t buffer = 8;  // first_fit's open rows
  std::string name{};
};

/// A pack's saved state. `Rows` is std::vector<Value> in the node, ElementBlobs in its rescale rule.
template <class Rows>
struct PackState {
  Rows open{};   // rows being filled, each shorter than seq_len (unpadded)
  Rows ready{};  // rows made (seq_len long, padded), not taken yet
  bool input_done = false;
  template <class A>
  void fields(A& a) {
    a("open", open);
    a("ready", ready);
    a("input_done", input_done);
  }
};

namespace detail {
/// The packing itself (nodes/text/pack.cpp): documents in, rows out. Traced, each row keeps its
/// provenance (its segments', see above).
class Packer {
 public:
  Packer(const PackOptions& o, bool traced);
  /// Places one document of provenance `trace` (ignored untraced); a DataError-worthy reason ("" when it
  /// was packed).
  std::string add(const Value& document, const Provenance& trace = {});
  /// The input ended: every open row becomes ready.
  void finish();
  /// Moves up to `max` ready rows to `out` (their provenances to `traces`, traced); how many.
  std::size_t take(std::vector<Value>& out, std::size_t max, std::vector<Provenance>* traces);
  bool has_ready() const { return !ready_.empty(); }

  PackState<std::vector<Value>> state(bool input_done) const;
  /// Traced: the provenances of the open rows and of the ready rows, beside state()'s.
  std::pair<std::vector<Provenance>, std::vector<Provenance>> traces() const;
  /// Restores from a saved (or dealt) state, the rows' provenances beside it (traced; unknown for rows
  /// saved as data); r.fail on rows that break the invariants.
  void restore(PackState<std::vector<Value>> st, const StateReader& r, std::vector<Provenance> open_traces = {},
               std::vector<Provenance> ready_traces = {});
  /// The row of provenance `p` made again from its documents (`document` makes one of a base element's
  /// provenance without the token range), padded to seq_len or as an open row; SnapshotError naming
  /// `who` when `p` is not a row's.
  Value rebuild(const Provenance& p, bool pad, const std::function<Value(const Provenance&)>& document,
                const std::string& who) const;

 private:
  /// A row being filled: its three columns as the bytes of int64 arrays (little-endian), so a made row
  /// becomes a record without copying them.
  struct Row {
    std::string tokens, segment_ids, positions;
    std::size_t len = 0;  // tokens placed
    std::vector<Value> docs;
    bool any_doc = false;
    std::int64_t segments = 0;
    Provenance trace{};  // traced: one base element per segment
  };
  /// The document's tokens as int64 bytes (`scratch` holds them when converted); "" or why they are not.
  std::string tokens_of(const Value& document, const char*& t, std::size_t& n, std::vector<std::int64_t>& scratch) const;
  /// Places `n` tokens (the bytes of n int64s at `t`) as a new segment of `row`, at `position` of its
  /// document, whose provenance is `trace` (traced).
  void place(Row& row, const char* t, std::size_t n, std::int64_t position, const Value* doc, const Provenance& trace) const;
  void emit(Row&& row);  // pads to seq_len and appends to ready_
  Value row_value(Row row, bool pad) const;

  std::size_t seq_len_;
  std::string field_;
  PackMode mode_;
  std::size_t buffer_;
  bool traced_;
  std::deque<Row> open_;
  std::deque<Value> ready_;
  std::deque<Provenance> ready_traces_;  // traced: beside ready_
  std::vector<std::int64_t> tokens_;  // the document being placed, when its array is not int64 already
};
}  // namespace detail

template <class In>
class PackIter final : public UnaryIter<In, Value> {
  static_assert(std::is_same_v<In, Value>, "pack reads records whose token field is an integer array");

 public:
  template <class Def>
  PackIter(BuildContext& ctx, const Def& def)
      : UnaryIter<In, Value>(ctx, def), packer_(def.options(), this->traced()) {}

 protected:
  std::size_t pull_chunk(std::vector<Value>& out, std::size_t max) override {
    std::vector<Provenance>* traces = this->traced() ? &this->traces() : nullptr;
    std::size_t n = 0;
    for (;;) {
      n += packer_.take(out, max - n, traces);
      if (n == max || input_done_ || (n > 0 && !packer_.has_ready())) return n;
      docs_.clear();
      if (this->input().pull(docs_, max) == 0) {
        packer_.finish();
        input_done_ = true;
        continue;
      }
      const std::vector<Provenance>& doc_traces = this->input().traces();
      for (std::size_t i = 0; i < docs_.size(); ++i)
        if (std::string why = packer_.add(docs_[i], traces ? doc_traces[i] : Provenance{}); !why.empty()) {
          try {
            throw DataError("pack (node '" + this->key() + "'): " + why);
          } catch (...) {
            return this->fail_after(n);  // the rows made before it are still delivered, on later pulls
          }
        }
    }
  }
  void save_state(StateWriter& w) const override {
    PackState<std::vector<Value>> st = packer_.state(input_done_);
    if (!this->traced() || !recomputable()) return w.write(st);
    const auto [open, ready] = packer_.traces();
    w.write(PackState<KeysOut<Value>>{{&st.open, &open}, {&st.ready, &ready}, input_done_});
  }
  void restore_state(StateReader& r) override {
    PackState<KeysIn<Value>> st{.ready = {.from = this}};
    if (recomputable()) st.open.make = [this](const Provenance& p) { return rebuild(p, false); };
    r.read(st);
    input_done_ = st.input_done;
    this->recomputed_ = st.open.recomputed + st.ready.recomputed;
    PackState<std::vector<Value>> rows{std::move(st.open.values), std::move(st.ready.values), st.input_done};
    if (!this->traced()) packer_.restore(std::move(rows), r);
    else packer_.restore(std::move(rows), r, std::move(st.open.keys), std::move(st.ready.keys));
  }
  bool carries_provenance() const override { return true; }
  /// A row is made again from its segments' documents, each of one base element.
  bool recomputable() const override { return this->input().one_base() && this->input().recomputable(); }
  Value recompute(const Provenance& p) const override { return rebuild(p, true); }

 private:
  Value rebuild(const Provenance& p, bool pad) const {
    return packer_.rebuild(p, pad, [this](const Provenance& doc) -> Value {
      // A document continued from one row to the next is made once.
      if (!last_document_ || last_document_->first != doc) last_document_.emplace(doc, this->input().recompute(doc));
      return last_document_->second;
    }, this->label());
  }

  detail::Packer packer_;
  bool input_done_ = false;
  std::vector<Value> docs_;
  mutable std::optional<std::pair<Provenance, Value>> last_document_;  // rebuild's
};

struct PackKind;
template <class T>
using PackDef = UnaryDef<PackKind, T, Value, PackIter>;

/// `docs | pack({.seq_len = 1024})`
inline auto pack(PackOptions o) { return unary<PackDef>(std::move(o)); }

struct PackKind {
  static constexpr std::string_view name = "pack";
  static constexpr std::string_view doc =
      "Packs token arrays into rows of seq_len tokens with segment ids and positions (greedy or first_fit).";
  static constexpr std::string_view provenance =
      "a row's base elements are its segments: each its document's with the token range; open and made rows are saved as restore keys";
  static constexpr ParamSchema params[] = {
      {.name = "seq_len", .type = ParamType::integer, .doc = "tokens per row, 1 to 2^24", .positional = true},
      {.name = "field", .type = ParamType::text, .doc = "the field holding each document's tokens", .fallback = "\"tokens\""},
      {.name = "mode", .type = ParamType::choice, .doc = "greedy: end to end, cut every seq_len; first_fit: into the first open row with room",
       .fallback = "\"greedy\"", .choices = "greedy|first_fit"},
      {.name = "buffer", .type = ParamType::integer, .doc = "first_fit: rows held open (positive)", .fallback = "8"},
  };
  using Options = PackOptions;
  using State = PackState<ElementBlobs>;
  static Params checked_params(const PackOptions& o);
  /// Rescale: the open rows and the ready rows of every old instance are pooled and dealt.
  static RescaleRule rescale();
  static std::string summary(const NodeState& record, const GraphNodeRecord& node);
  /// `{"op": "pack", "seq_len": L, "field": "tokens", "mode": "greedy" | "first_fit", "buffer": N}`
  template <class Spec>
  static SpecPipeline from_spec(Spec& s) {
    PackOptions o{.name = s.name()};
    s.required("seq_len", o.seq_len);
    s.param("field", o.field);
    s.choice("mode", o.mode, {{"greedy", PackMode::greedy}, {"first_fit", PackMode::first_fit}});
    s.param("buffer", o.buffer);
    if (!s.input().template holds<Value>())
      throw ConfigError("pack reads records (parse_json, tokenize), but its input yields " + s.input().type_name() + "s");
    return s.input().template get<Value>() | pack(o);
  }
};

}  // namespace dpipe
