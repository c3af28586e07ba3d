#pragma once
/// Batches records of similar length together (tf.data's bucket_by_sequence_length), each batch padded
/// as padded_batch pads. In: Value → Out: Value (a padded_batch record).
///
/// An element's length is the length of its 1-D array field `field`. It goes to bucket i, the first with
/// length < boundaries[i] (the last bucket takes the rest). A bucket is emitted as one batch when it holds
/// batch_sizes[i] elements; with `max_tokens` instead, just before adding an element would make the
/// padded batch (elements × the longest) exceed max_tokens (token-budget batching; an element longer
/// than max_tokens is a batch of its own). Without boundaries there is one bucket: plain token-budget
/// batching. At the end of the input the buckets left are emitted in bucket order, unless drop_last.
///
/// State: the elements waiting in the buckets, in the order they arrived (the buckets are made again
/// from them on restore), and the batches made but not taken. Rescale: both are dealt to the new
/// instances, which bucket their share of the waiting elements again.
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "dpipe/fields.hpp"
#include "dpipe/kit/rescale.hpp"
#include "dpipe/kit/spec.hpp"
#include "dpipe/kit/unary.hpp"
#include "dpipe/nodes/padded_batch.hpp"

namespace dpipe {

struct BucketByLengthOptions {
  std::vector<std::int64_t> boundaries{};   // ascending; N boundaries make N + 1 buckets
  std::vector<std::int64_t> batch_sizes{};  // one per bucket (or empty with max_tokens)
  std::int64_t max_tokens = 0;              // > 0: token-budget batches instead of batch_sizes
  std::string field = "tokens";
  std::int64_t pad = 0;
  bool drop_last = false;
  std::string name{};
};

/// A bucket_by_length's saved state. `Elems` is std::vector<Value> in the node, ElementBlobs in its rule.
template <class Elems>
struct BucketState {
  Elems waiting{};  // every bucket's elements, in arrival order
  Elems made{};     // batches made and not taken yet
  bool input_done = false;
  template <class A>
  void fields(A& a) {
    a("waiting", waiting);
    a("made", made);
    a("input_done", input_done);
  }
};

namespace detail {
/// The buckets (nodes/text/bucket_by_length.cpp).
class Buckets {
 public:
  explicit Buckets(const BucketByLengthOptions& o);
  /// Adds an element; "" or why it cannot be bucketed. A batch it completes goes to `made`.
  std::string add(Value element, std::deque<Value>& made);
  /// The input ended: the buckets left are emitted in order (none with drop_last).
  std::string finish(std::deque<Value>& made);
  std::vector<Value> waiting() const;

 private:
  std::string emit(std::size_t b, std::deque<Value>& made);
  const BucketByLengthOptions& o_;
  PaddedBatchOptions pad_;
  struct Entry {
    std::uint64_t seq;
    std::size_t length;
    Value element;
  };
  std::vector<std::vector<Entry>> buckets_;
  std::vector<std::size_t> longest_;
  std::uint64_t seq_ = 0;
};
}  // namespace detail

template <class In>
class BucketByLengthIter final : public UnaryIter<In, Value> {
  static_assert(std::is_same_v<In, Value>, "bucket_by_length reads records (Value)");

 public:
  template <class Def>
  BucketByLengthIter(BuildContext& ctx, const Def& def) : UnaryIter<In, Value>(ctx, def), o_(def.options()), buckets_(o_) {}

 protected:
  std::size_t pull_chunk(std::vector<Value>& out, std::size_t max) override {
    std::size_t n = 0;
    for (;;) {
      for (; n < max && !made_.empty(); ++n) {
        out.push_back(std::move(made_.front()));
        made_.pop_front();
      }
      if (n == max || input_done_ || (n > 0 && made_.empty())) return n;
      in_.clear();
      std::string why;
      if (this->input().pull(in_, max) == 0) {
        input_done_ = true;
        why = buckets_.finish(made_);
      }
      for (std::size_t i = 0; i < in_.size() && why.empty(); ++i) why = buckets_.add(std::move(in_[i]), made_);
      if (!why.empty()) {
        try {
          throw DataError("bucket_by_length (node '" + this->key() + "'): " + why);
        } catch (...) {
          return this->fail_after(n);
        }
      }
    }
  }
  void save_state(StateWriter& w) const override {
    w.write(BucketState<std::vector<Value>>{
        .waiting = buckets_.waiting(), .made = {made_.begin(), made_.end()}, .input_done = input_done_});
  }
  void restore_state(StateReader& r) override {
    BucketState<std::vector<Value>> st;
    r.read(st);
    made_.assign(std::make_move_iterator(st.made.begin()), std::make_move_iterator(st.made.end()));
    for (auto& v : st.waiting)
      if (std::string why = buckets_.add(std::move(v), made_); !why.empty()) r.fail("a waiting element: " + why);
    input_done_ = st.input_done;
    if (input_done_)
      if (std::string why = buckets_.finish(made_); !why.empty()) r.fail(why);
  }

 private:
  const BucketByLengthOptions& o_;
  detail::Buckets buckets_;
  std::deque<Value> made_;
  bool input_done_ = false;
  std::vector<Value> in_;
};

struct BucketByLengthKind;
template <class T>
using BucketByLengthDef = UnaryDef<BucketByLengthKind, T, Value, BucketByLengthIter>;

/// `docs | bucket_by_length({.boundaries = {128, 512}, .batch_sizes = {64, 16, 4}})`, or `{.max_tokens = 8192}`
inline auto bucket_by_length(BucketByLengthOptions o) { return unary<BucketByLengthDef>(std::move(o)); }

struct BucketByLengthKind {
  static constexpr std::string_view name = "bucket_by_length";
  static constexpr std::string_view doc =
      "Batches records of similar length (buckets by boundaries), each batch padded; batch sizes per bucket or a token budget.";
  static constexpr ParamSchema params[] = {
      {.name = "boundaries", .type = ParamType::integers, .doc = "ascending lengths: bucket i takes lengths below boundaries[i]", .fallback = "[]"},
      {.name = "batch_sizes", .type = ParamType::integers, .doc = "elements per batch, one per bucket (len(boundaries) + 1)", .fallback = "[]"},
      {.name = "max_tokens", .type = ParamType::integer, .doc = "instead of batch_sizes: at most this many padded tokens per batch", .fallback = "0"},
      {.name = "field", .type = ParamType::text, .doc = "the array field whose length counts", .fallback = "\"tokens\""},
      {.name = "pad", .type = ParamType::integer, .doc = "the padding value", .fallback = "0"},
      {.name = "drop_last", .type = ParamType::boolean, .doc = "drop the buckets left at the end of the input", .fallback = "false"},
  };
  using Options = BucketByLengthOptions;
  using State = BucketState<ElementBlobs>;
  static Params checked_params(const BucketByLengthOptions& o);
  /// Rescale: the waiting elements are pooled and dealt; each new instance buckets its share again.
  static RescaleRule rescale();
  static std::string summary(const NodeState& record, const GraphNodeRecord&) {
    BucketState<ElementBlobs> st;
    StateReader r(record);
    r.read(st);
    return std::to_string(st.waiting.size()) + " elements waiting in buckets, " + std::to_string(st.made.size()) +
           " batches made and not taken" + (st.input_done ? ", its input ended" : "");
  }
  /// `{"op": "bucket_by_length", "boundaries": [128, 512], "batch_sizes": [64, 16, 4]}` or `"max_tokens": N`
  template <class Spec>
  static SpecPipeline from_spec(Spec& s) {
    BucketByLengthOptions o{.name = s.name()};
    s.param("boundaries", o.boundaries);
    s.param("batch_sizes", o.batch_sizes);
    s.param("max_tokens", o.max_tokens);
    s.param("field", o.field);
    s.param("pad", o.pad);
    s.param("drop_last", o.drop_last);
    if (!s.input().template holds<Value>())
      throw ConfigError("bucket_by_length reads records, but its input yields " + s.input().type_name() + "s");
    return s.input().template get<Value>() | bucket_by_length(o);
  }
};

}  // namespace dpipe
