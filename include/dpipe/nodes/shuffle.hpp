#pragma once
/// Buffered shuffle, as torch's: fill the buffer; then for each new input emit a random slot and put
/// the input there; at the end drain the buffer in random order. `enabled = false` (torch's
/// `set_shuffle(False)`) passes the elements on in order and buffers nothing. In: T → Out: T.
/// State: the buffer, the generator, whether the input ended. Reshuffles every epoch. Rescale: the
/// buffered elements of all instances are dealt to the new ones.
#include <string>

#include "dpipe/kit/length.hpp"
#include "dpipe/detail/prebuilt_types.hpp"
#include "dpipe/pipeline.hpp"
#include "dpipe/kit/rescale.hpp"
#include "dpipe/kit/restore_keys.hpp"
#include "dpipe/kit/spec.hpp"

namespace dpipe {

/// A shuffle's saved state. `Elems` is std::vector<T> in the node, ElementBlobs in its rescale rule.
template <class Elems>
struct ShuffleState {
  Elems buffer{};  // may hold more than the buffer size after a rescale: it drains down first
  Rng rng{};
  bool input_done = false;
  template <class A>
  void fields(A& a) {
    a("buffer", buffer);
    a("rng", rng);
    a("input_done", input_done);
  }
};

struct ShuffleOptions {
  std::int64_t buffer = 10'000;
  std::string name{};
  bool enabled = true;
};

/// The options' parameters as the fingerprint writes them; throws ConfigError on invalid options (compiled
/// once, not once per element type).
inline Params checked_params(const ShuffleOptions& o) {
  if (o.buffer <= 0)
    throw ConfigError(node_label("shuffle", o.name) + ": buffer must be positive, got " + param_text(o.buffer));
  Params params{{"buffer", param_text(o.buffer)}};
  if (!o.enabled) params.emplace_back("enabled", "false");  // absent when on: earlier snapshots' fingerprints hold
  return params;
}

template <Snapshottable T>
class ShuffleDef final : public NodeDef<T> {
 public:
  ShuffleDef(std::shared_ptr<const NodeDef<T>> in, ShuffleOptions o)
      : NodeDef<T>("shuffle", o.name, checked_params(o), {in}), input_(std::move(in)),
        buffer_(static_cast<std::size_t>(o.buffer)), enabled_(o.enabled) {}
  std::unique_ptr<Iter<T>> instantiate(BuildContext& ctx) const override;
  const NodeDef<T>& input() const { return *input_; }
  std::size_t buffer() const { return buffer_; }
  bool enabled() const { return enabled_; }

 private:
  std::shared_ptr<const NodeDef<T>> input_;
  std::size_t buffer_ = 0;
  bool enabled_ = true;
};

template <Snapshottable T>
class ShuffleIter final : public Hooked<T> {
 public:
  ShuffleIter(BuildContext& ctx, const ShuffleDef<T>& def)
      : Hooked<T>(ctx, "shuffle"), input_(def.input().instantiate(ctx)), size_(def.buffer()), enabled_(def.enabled()) {
    st_.rng = ctx.rng(this->key());
  }

 protected:
  std::size_t pull_chunk(std::vector<T>& out, std::size_t max) override {
    if (!enabled_) {
      const std::size_t n = input_->pull(out, max);
      this->pass_traces(*input_);
      return n;
    }
    auto& buf = st_.buffer;
    const bool traced = this->traced();
    // Traced: the buffer's provenances beside it; a restored buffer's are unknown.
    if (traced) buf_traces_.resize(buf.size(), unknown_provenance());
    const std::size_t before = out.size();
    while (out.size() - before < max) {
      if (buf.size() > size_) {  // overfull after a rescale dealt it more: drain down to its size first
        take_slot(out, st_.rng.below(buf.size()));
        continue;
      }
      if (!st_.input_done && buf.size() < size_) {  // filling
        if (input_->pull(buf, size_ - buf.size()) == 0) st_.input_done = true;
        if (traced)
          for (Provenance& p : input_->traces()) buf_traces_.push_back(std::move(p));
        continue;
      }
      if (!st_.input_done) {  // steady state: one output per input
        scratch_.clear();
        const std::size_t n = input_->pull(scratch_, max - (out.size() - before));
        if (n == 0) {
          st_.input_done = true;
          continue;
        }
        // A local generator: stores into `out` may alias the state words (int64 vs uint64), which
        // would otherwise force a reload of the state for every element.
        Rng rng = st_.rng;
        T* slots = buf.data();
        const std::size_t size = size_;
        out.reserve(out.size() + n);
        if (traced) {
          std::vector<Provenance>& in = input_->traces();
          for (std::size_t j = 0; j < n; ++j) {
            const std::size_t k = rng.below(size);
            out.push_back(std::move(slots[k]));
            slots[k] = std::move(scratch_[j]);
            this->traces().push_back(std::move(buf_traces_[k]));
            buf_traces_[k] = std::move(in[j]);
          }
        } else {
          for (auto& x : scratch_) {
            T& slot = slots[rng.below(size)];
            out.push_back(std::move(slot));
            slot = std::move(x);
          }
        }
        st_.rng = rng;
        continue;
      }
      if (buf.empty()) break;  // drained
      while (out.size() - before < max && !buf.empty()) take_slot(out, st_.rng.below(buf.size()));
    }
    return out.size() - before;
  }
  bool carries_provenance() const override { return true; }
  bool one_base() const override { return input_->one_base(); }
  bool recomputable() const override { return input_->recomputable(); }
  T recompute(const Provenance& p) const override { return input_->recompute(p); }
  void save_state(StateWriter& w) const override {
    if (!this->traced() || !input_->recomputable()) return w.write(st_);
    w.write(ShuffleState<KeysOut<T>>{{&st_.buffer, &buf_traces_}, st_.rng, st_.input_done});
  }
  // No reserve to the buffer size: a restore holds what the snapshot holds, never a declared capacity.
  void restore_state(StateReader& r) override {
    ShuffleState<KeysIn<T>> st{.buffer = {.from = input_.get()}};
    r.read(st);
    st_ = {std::move(st.buffer.values), st.rng, st.input_done};
    buf_traces_ = std::move(st.buffer.keys);  // a key's provenance; unknown for data
    if (!this->traced()) buf_traces_.clear();
    this->recomputed_ = st.buffer.recomputed;
  }
  std::vector<IterBase*> inputs() const override { return {input_.get()}; }

 private:
  std::unique_ptr<Iter<T>> input_;
  std::size_t size_;
  bool enabled_;
  /// Moves buffer slot `k` to `out` and the last slot into its place (with its provenance, traced).
  void take_slot(std::vector<T>& out, std::size_t k) {
    auto& buf = st_.buffer;
    out.push_back(std::move(buf[k]));
    if (k + 1 != buf.size()) buf[k] = std::move(buf.back());
    buf.pop_back();
    if (this->traced()) {
      this->traces().push_back(std::move(buf_traces_[k]));
      if (k + 1 != buf_traces_.size()) buf_traces_[k] = std::move(buf_traces_.back());
      buf_traces_.pop_back();
    }
  }

  ShuffleState<std::vector<T>> st_;
  std::vector<T> scratch_;
  std::vector<Provenance> buf_traces_;  // traced: beside st_.buffer
};

template <Snapshottable T>
std::unique_ptr<Iter<T>> ShuffleDef<T>::instantiate(BuildContext& ctx) const {
  return std::make_unique<ShuffleIter<T>>(ctx, *this);
}

inline auto shuffle(ShuffleOptions o = {}) {
  return make_closure([o = std::move(o)](const auto& p) {
    using T = typename std::decay_t<decltype(p)>::element_type;
    return make_pipeline<ShuffleDef<T>>(p.def(), o);
  });
}

struct ShuffleKind {
  static constexpr std::string_view name = "shuffle";
  static constexpr LengthFn length = &same_length;
  static constexpr std::string_view doc =
      "A buffer of `buffer` elements; each output is a random element of the buffer, replaced by the next input.";
  /// Provenance (docs/design.md, "Provenance"; a kind without this line does not carry it).
  static constexpr std::string_view provenance = "moves it with its buffer's slots; its buffer is saved as restore keys when its input makes elements again";
  static constexpr ParamSchema params[] = {
      {.name = "buffer", .type = ParamType::integer, .doc = "elements held (positive)", .fallback = "10000", .positional = true,
       .torch = "buffer_size"},
      {.name = "enabled", .type = ParamType::boolean,
       .doc = "false: the elements pass in order, nothing buffered (torch's set_shuffle(False))", .fallback = "true"},
  };
  using State = ShuffleState<ElementBlobs>;
  /// `snapshot show`: how full the buffer is.
  static std::string summary(const NodeState& record, const GraphNodeRecord& node) {
    ShuffleState<ElementBlobs> st;
    StateReader r(record);
    r.read(st);
    return std::to_string(st.buffer.size()) + " of " + std::string(param_of(node, "buffer")) + " buffered" +
           (st.input_done ? ", its input ended" : "");
  }

  /// Rescale: the buffered elements of every old instance are pooled and dealt (rescale::deal) to the new
  /// ones. A new instance keeps the generator of the old one it takes the place of (slot j of the old
  /// records, cyclically); one beyond the old count gets that generator mixed with its slot, so no two
  /// draw the same stream. The input-ended flag stays set only when every old instance had seen its input
  /// end (their sampler slices are then empty too); otherwise each looks at its input again.
  static RescaleRule rescale() {
    return RescaleRule::dealt([](const RescaleInput& in) {
      using S = ShuffleState<ElementBlobs>;
      in.check_fields<S>();
      const auto dealt = in.deal(&S::buffer);
      const auto done = in.numbers(&S::input_done);
      const bool all_done = done.min() != 0;
      return in.write_slots([&](std::size_t j) {
        S s;
        s.buffer = dealt[j];
        s.input_done = all_done;
        Rng::State words = in.read_one<S>(j % in.old_slots()).rng.state();
        if (j >= in.old_slots())
          for (std::size_t w = 0; w < words.size(); ++w) words[w] ^= mix64(j * 4 + w + 1);
        s.rng.set_state(words);
        return s;
      });
    });
  }

  /// `{"op": "shuffle", "buffer": N, "enabled": true}`
  template <class Spec>
  static SpecPipeline from_spec(Spec& s) {
    ShuffleOptions o{.name = s.name()};
    s.param("buffer", o.buffer);
    s.param("enabled", o.enabled);
    return s.input().apply([&](const auto& p) { return p | shuffle(o); });
  }
};

// Compiled once, in libdpipe, for the prebuilt element types (dpipe/detail/prebuilt_types.hpp).
DPIPE_DECLARE_PREBUILT_NODE(ShuffleDef, ShuffleIter)

}  // namespace dpipe
