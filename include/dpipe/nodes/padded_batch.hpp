#pragma once
/// Groups `size` records into one record of contiguous arrays, padding variable-length fields (tf.data's
/// padded_batch). In: Value → Out: Value. State: the partial batch (as batch's).
///
/// Every element must have the fields of the first. Each 1-D numeric array field becomes a [B, L] array of
/// its type, padded with `pad`, where L is the longest such array in the batch, or `length` when given
/// (a longer element is an error), rounded up to a multiple of `multiple`. Integer, float and boolean
/// fields become [B] arrays (int64, float64, bool); others a list of B values. `lengths` (int64[B]) holds
/// each element's length (its longest array field). Elements that are 1-D arrays themselves give a
/// record of `values` [B, L] and `lengths`.
#include <cstdint>
#include <string>
#include <vector>

#include "dpipe/kit/length.hpp"
#include "dpipe/fields.hpp"
#include "dpipe/kit/rescale.hpp"
#include "dpipe/kit/restore_keys.hpp"
#include "dpipe/kit/spec.hpp"
#include "dpipe/kit/unary.hpp"
#include "dpipe/nodes/batch.hpp"

namespace dpipe {

struct PaddedBatchOptions {
  std::int64_t size = 1;
  std::int64_t length = 0;    // 0: the longest in the batch
  std::int64_t multiple = 1;  // L rounded up to a multiple of this
  std::int64_t pad = 0;       // the padding value (converted to each array's type)
  bool drop_last = false;
  std::string name{};
};

namespace detail {
/// The elements as one padded record; "" in `why` or the reason they cannot be (nodes/text/padded_batch.cpp).
Value pad_batch(std::vector<Value>& elements, const PaddedBatchOptions& o, std::string& why);
}  // namespace detail

template <class In>
class PaddedBatchIter final : public UnaryIter<In, Value> {
  static_assert(std::is_same_v<In, Value>, "padded_batch reads records or arrays (Value)");

 public:
  template <class Def>
  PaddedBatchIter(BuildContext& ctx, const Def& def) : UnaryIter<In, Value>(ctx, def), o_(def.options()) {}

 protected:
  std::size_t pull_chunk(std::vector<Value>& out, std::size_t max) override {
    const auto size = static_cast<std::size_t>(o_.size);
    const bool traced = this->traced();
    if (traced) partial_traces_.resize(st_.partial.size(), unknown_provenance());  // a restored batch's are unknown
    std::size_t n = 0;
    while (n < max) {
      std::size_t count = 0;  // elements of the batch
      if (st_.partial.size() >= size) {  // a batch (more, after a rescale dealt them here)
        batch_.assign(std::make_move_iterator(st_.partial.begin()), std::make_move_iterator(st_.partial.begin() + std::ptrdiff_t(size)));
        st_.partial.erase(st_.partial.begin(), st_.partial.begin() + std::ptrdiff_t(size));
        count = size;
      } else if (!st_.input_done) {
        if (this->input().pull(st_.partial, size - st_.partial.size()) > 0) {
          if (traced)
            for (Provenance& p : this->input().traces()) partial_traces_.push_back(std::move(p));
          continue;
        }
        st_.input_done = true;
        if (st_.partial.empty() || o_.drop_last) {
          st_.partial.clear();
          partial_traces_.clear();
          break;
        }
        batch_ = std::move(st_.partial);
        st_.partial.clear();
        count = batch_.size();
      } else {
        break;
      }
      Provenance trace;
      if (traced) {
        trace = batch_provenance(partial_traces_, count, this->input().one_base());
        partial_traces_.erase(partial_traces_.begin(), partial_traces_.begin() + std::ptrdiff_t(count));
      }
      std::string why;
      Value v = detail::pad_batch(batch_, o_, why);
      if (!why.empty()) {
        try {
          throw DataError("padded_batch (node '" + this->key() + "'): " + why);
        } catch (...) {
          return this->fail_after(n);
        }
      }
      out.push_back(std::move(v));
      if (traced) this->traces().push_back(std::move(trace));
      ++n;
    }
    return n;
  }
  void save_state(StateWriter& w) const override {
    if (!this->traced() || !this->input().recomputable()) return w.write(st_);
    w.write(BatchState<KeysOut<Value>>{{&st_.partial, &partial_traces_}, st_.input_done});
  }
  void restore_state(StateReader& r) override {
    BatchState<KeysIn<Value>> st{.partial = {.from = &this->input()}};
    r.read(st);
    st_ = {std::move(st.partial.values), st.input_done};
    partial_traces_ = std::move(st.partial.keys);  // a key's provenance; unknown for data
    if (!this->traced()) partial_traces_.clear();
    this->recomputed_ = st.partial.recomputed;
  }
  bool carries_provenance() const override { return true; }
  bool recomputable() const override { return this->input().recomputable(); }
  /// Made again from its elements' keys (batch_elements), padded again.
  Value recompute(const Provenance& p) const override {
    const std::optional<std::vector<Provenance>> elements = batch_elements(p, this->input().one_base());
    if (!elements) throw SnapshotError(this->label() + ": a restore key names no batch of this node (" + to_string(p) + ")");
    std::vector<Value> batch;
    for (const Provenance& e : *elements) batch.push_back(this->input().recompute(e));
    std::string why;
    Value v = detail::pad_batch(batch, o_, why);
    if (!why.empty()) throw SnapshotError(this->label() + ": the batch of restore key " + to_string(p) + " no longer pads: " + why);
    return v;
  }

 private:
  const PaddedBatchOptions& o_;
  BatchState<std::vector<Value>> st_;
  std::vector<Provenance> partial_traces_;  // traced: beside st_.partial
  std::vector<Value> batch_;
};

struct PaddedBatchKind;
template <class T>
using PaddedBatchDef = UnaryDef<PaddedBatchKind, T, Value, PaddedBatchIter>;

/// `rows | padded_batch({.size = 8, .multiple = 64})`
inline auto padded_batch(PaddedBatchOptions o) { return unary<PaddedBatchDef>(std::move(o)); }

struct PaddedBatchKind {
  static constexpr std::string_view name = "padded_batch";
  static constexpr LengthFn length = &batched_length;
  static constexpr std::string_view doc =
      "Groups records into one record of [B, L] arrays padded to the longest (or a fixed length), plus lengths.";
  static constexpr std::string_view provenance = "as batch: its elements', concatenated; made again from them and padded again";
  static constexpr ParamSchema params[] = {
      {.name = "size", .type = ParamType::integer, .doc = "elements per batch (positive)", .positional = true},
      {.name = "length", .type = ParamType::integer, .doc = "pad every array to this length, at most 2^24 (0: the longest in the batch)", .fallback = "0"},
      {.name = "multiple", .type = ParamType::integer, .doc = "round the padded length up to a multiple of this, 1 to 2^24", .fallback = "1"},
      {.name = "pad", .type = ParamType::integer, .doc = "the padding value", .fallback = "0"},
      {.name = "drop_last", .type = ParamType::boolean, .doc = "drop the last batch when it is short", .fallback = "false"},
  };
  using Options = PaddedBatchOptions;
  using State = BatchState<ElementBlobs>;
  static Params checked_params(const PaddedBatchOptions& o);
  /// The most a row may be padded to, `length` and `multiple` included.
  static constexpr std::int64_t kMostItems = std::int64_t{1} << 24;
  /// Rescale: batch's rule (the partial batches are pooled and dealt).
  static RescaleRule rescale() { return BatchKind::rescale(); }
  static std::string summary(const NodeState& record, const GraphNodeRecord& node) { return BatchKind::summary(record, node); }
  /// `{"op": "padded_batch", "size": B, "length": 0, "multiple": 1, "pad": 0, "drop_last": false}`
  template <class Spec>
  static SpecPipeline from_spec(Spec& s) {
    PaddedBatchOptions o{.name = s.name()};
    s.required("size", o.size);
    s.param("length", o.length);
    s.param("multiple", o.multiple);
    s.param("pad", o.pad);
    s.param("drop_last", o.drop_last);
    if (!s.input().template holds<Value>())
      throw ConfigError("padded_batch reads records or arrays, but its input yields " + s.input().type_name() + "s");
    return s.input().template get<Value>() | padded_batch(o);
  }
};

}  // namespace dpipe
