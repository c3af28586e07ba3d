#pragma once
/// Groups consecutive elements into vectors of `size`; the last, shorter batch is kept unless
/// `drop_last`. In: T → Out: std::vector<T>. State: the partial batch.
#include <string>

#include "dpipe/kit/length.hpp"
#include "dpipe/detail/prebuilt_types.hpp"
#include "dpipe/pipeline.hpp"
#include "dpipe/kit/rescale.hpp"
#include "dpipe/kit/restore_keys.hpp"
#include "dpipe/kit/spec.hpp"

namespace dpipe {

/// A batch's saved state. `Elems` is std::vector<T> in the node, ElementBlobs in its rescale rule.
template <class Elems>
struct BatchState {
  Elems partial{};  // may hold a batch or more after a rescale: those are emitted first
  bool input_done = false;
  template <class A>
  void fields(A& a) {
    a("partial", partial);
    a("input_done", input_done);
  }
};

struct BatchOptions {
  std::int64_t size = 1;
  bool drop_last = false;
  std::string name{};
};

/// The options' parameters as the fingerprint writes them; throws ConfigError on invalid options (compiled
/// once, not once per element type).
inline Params checked_params(const BatchOptions& o) {
  if (o.size <= 0) throw ConfigError(node_label("batch", o.name) + ": size must be positive, got " + param_text(o.size));
  return {{"size", param_text(o.size)}, {"drop_last", param_text(o.drop_last)}};
}

template <Snapshottable T>
class BatchDef final : public NodeDef<std::vector<T>> {
 public:
  BatchDef(std::shared_ptr<const NodeDef<T>> in, BatchOptions o)
      : NodeDef<std::vector<T>>("batch", o.name, checked_params(o), {in}),
        input_(std::move(in)), size_(static_cast<std::size_t>(o.size)), drop_last_(o.drop_last) {}
  std::unique_ptr<Iter<std::vector<T>>> instantiate(BuildContext& ctx) const override;
  const NodeDef<T>& input() const { return *input_; }
  std::size_t size() const { return size_; }
  bool drop_last() const { return drop_last_; }

 private:
  std::shared_ptr<const NodeDef<T>> input_;
  std::size_t size_ = 0;
  bool drop_last_;
};

template <Snapshottable T>
class BatchIter final : public Hooked<std::vector<T>> {
 public:
  BatchIter(BuildContext& ctx, const BatchDef<T>& def)
      : Hooked<std::vector<T>>(ctx, "batch"), input_(def.input().instantiate(ctx)), def_(def) {}

 protected:
  std::size_t pull_chunk(std::vector<std::vector<T>>& out, std::size_t max) override {
    const std::size_t size = def_.size();
    std::size_t n = 0;
    const bool traced = this->traced();
    if (traced) partial_traces_.resize(st_.partial.size(), unknown_provenance());  // a restored batch's are unknown
    while (n < max && st_.partial.size() >= size) {  // more than a batch, dealt here by a rescale
      out.emplace_back(std::make_move_iterator(st_.partial.begin()),
                       std::make_move_iterator(st_.partial.begin() + std::ptrdiff_t(size)));
      st_.partial.erase(st_.partial.begin(), st_.partial.begin() + std::ptrdiff_t(size));
      if (traced) trace_batch(size);
      ++n;
    }
    while (n < max && !st_.input_done) {
      // Room for a batch, up to 64 Ki elements: a declared size far above the stream allocates nothing
      // it does not fill.
      if (const std::size_t room = std::min<std::size_t>(size, std::size_t{1} << 16); st_.partial.capacity() < room)
        st_.partial.reserve(room);
      // Pull straight into the partial batch: no copy.
      if (input_->pull(st_.partial, size - st_.partial.size()) == 0) {
        st_.input_done = true;
        if (!st_.partial.empty() && !def_.drop_last()) {
          if (traced) trace_batch(st_.partial.size());
          out.push_back(std::move(st_.partial));
          ++n;
        }
        st_.partial = {};
        partial_traces_.clear();
        break;
      }
      if (traced)
        for (Provenance& p : input_->traces()) partial_traces_.push_back(std::move(p));
      if (st_.partial.size() == size) {
        if (traced) trace_batch(size);
        out.push_back(std::move(st_.partial));
        st_.partial = {};
        ++n;
      }
    }
    return n;
  }
  void save_state(StateWriter& w) const override {
    if (!this->traced() || !input_->recomputable()) return w.write(st_);
    w.write(BatchState<KeysOut<T>>{{&st_.partial, &partial_traces_}, st_.input_done});
  }
  void restore_state(StateReader& r) override {
    BatchState<KeysIn<T>> st{.partial = {.from = input_.get()}};
    r.read(st);
    st_ = {std::move(st.partial.values), st.input_done};
    partial_traces_ = std::move(st.partial.keys);  // a key's provenance; unknown for data
    if (!this->traced()) partial_traces_.clear();
    this->recomputed_ = st.partial.recomputed;
  }
  std::vector<IterBase*> inputs() const override { return {input_.get()}; }
  bool carries_provenance() const override { return true; }
  /// A batch is made again from its elements' keys: its provenance is theirs, one base element each, or
  /// (elements of several base elements: packed rows, batches) grouped, each element's start marked.
  bool recomputable() const override { return input_->recomputable(); }
  std::vector<T> recompute(const Provenance& p) const override {
    const std::optional<std::vector<Provenance>> elements = batch_elements(p, input_->one_base());
    if (!elements) throw SnapshotError(this->label() + ": a restore key names no batch of this node (" + to_string(p) + ")");
    std::vector<T> out;
    out.reserve(elements->size());
    for (const Provenance& e : *elements) out.push_back(input_->recompute(e));
    return out;
  }

 private:
  /// Traced: the batch of the first `count` partial elements has their provenances (batch_provenance).
  void trace_batch(std::size_t count) {
    Provenance p = batch_provenance(partial_traces_, count, input_->one_base());
    partial_traces_.erase(partial_traces_.begin(), partial_traces_.begin() + std::ptrdiff_t(count));
    this->traces().push_back(std::move(p));
  }

  std::unique_ptr<Iter<T>> input_;
  const BatchDef<T>& def_;
  BatchState<std::vector<T>> st_;
  std::vector<Provenance> partial_traces_;  // traced: beside st_.partial
};

template <Snapshottable T>
std::unique_ptr<Iter<std::vector<T>>> BatchDef<T>::instantiate(BuildContext& ctx) const {
  return std::make_unique<BatchIter<T>>(ctx, *this);
}

inline auto batch(BatchOptions o) {
  return make_closure([o = std::move(o)](const auto& p) {
    using T = typename std::decay_t<decltype(p)>::element_type;
    return make_pipeline<BatchDef<T>>(p.def(), o);
  });
}

struct BatchKind {
  static constexpr std::string_view name = "batch";
  static constexpr LengthFn length = &batched_length;
  static constexpr std::string_view doc =
      "Groups consecutive elements into batches of `size`; the last, shorter batch is kept unless `drop_last`.";
  /// Provenance (docs/design.md, "Provenance"; a kind without this line does not carry it).
  static constexpr std::string_view provenance = "concatenates its elements' (marking where each starts when they have several base elements); a batch is made again from them";
  static constexpr ParamSchema params[] = {
      {.name = "size", .type = ParamType::integer, .doc = "elements per batch (positive)", .positional = true,
       .torch = "batch_size"},
      {.name = "drop_last", .type = ParamType::boolean, .doc = "drop the last batch when it is short", .fallback = "false"},
  };
  using State = BatchState<ElementBlobs>;
  /// `snapshot show`: the partial batch.
  static std::string summary(const NodeState& record, const GraphNodeRecord& node) {
    BatchState<ElementBlobs> st;
    StateReader r(record);
    r.read(st);
    return std::to_string(st.partial.size()) + " of " + std::string(param_of(node, "size")) +
           " elements of the next batch" + (st.input_done ? ", its input ended" : "");
  }

  /// Rescale: the partial batches of every old instance are pooled and dealt (rescale::deal) to the new ones,
  /// and each looks at its input again (a batch flushes its partial batch only when its input ends).
  static RescaleRule rescale() {
    return RescaleRule::dealt([](const RescaleInput& in) {
      using S = BatchState<ElementBlobs>;
      in.check_fields<S>();
      const auto dealt = in.deal(&S::partial);
      return in.write_slots([&](std::size_t j) { return S{.partial = dealt[j], .input_done = false}; });
    });
  }

  /// `{"op": "batch", "size": N, "drop_last": false}`
  template <class Spec>
  static SpecPipeline from_spec(Spec& s) {
    BatchOptions o{.name = s.name()};
    s.required("size", o.size);
    s.param("drop_last", o.drop_last);
    return s.input().apply(
        [&]<class T>(const Pipeline<T>& p) requires is_spec_element_v<std::vector<T>> { return p | batch(o); },
        "batches of batches of batches are deeper than specs go");
  }
};

// Batches of the prebuilt scalar types (dpipe/detail/prebuilt_types.hpp) are compiled once, in libdpipe.
DPIPE_FOR_EACH_PREBUILT_SCALAR_TYPE(DPIPE_EXTERN_NODE_TEMPLATES, BatchDef, BatchIter)

}  // namespace dpipe
