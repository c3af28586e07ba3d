#pragma once
/// A weighted, deterministic interleave of several pipelines (a mixture of corpora): each element comes
/// from input i with probability weights[i] / the sum of the live inputs' weights, drawn by the node's
/// generator. A source whose inputs are exactly the pipelines given. In: T, T, … → Out: T.
///
/// stop: `all_exhausted` (default) goes on with the inputs that remain until every input with a weight
/// above 0 has ended; `first_exhausted` ends when a drawn input has ended; `never` restarts an input
/// that ends, as a new epoch of it (cycle's epochs; an input that yields nothing in a pass is dropped
/// instead of being restarted forever).
///
/// State: the generator, which inputs are live, each input's pass, and every input's own state (the
/// engine saves them below the mix). Rescale: the inputs are dealt by their own rules; the mix's inputs
/// are all live again on the new instances (an ended input ends again at once), and each new instance
/// gets a generator of its own, derived from the old ones. Refused when instances are on different
/// passes of an input (stop = never), whose states then belong to different epochs.
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "dpipe/kit/rescale.hpp"
#include "dpipe/kit/spec.hpp"
#include "dpipe/nodes/concat.hpp"
#include "dpipe/nodes/cycle.hpp"
#include "dpipe/rng.hpp"

namespace dpipe {

enum class MixStop { first_exhausted, all_exhausted, never };

struct MixOptions {
  std::vector<double> weights{};  // one per input, not negative, not all 0
  MixStop stop = MixStop::all_exhausted;
  std::string name{};
};

/// A mix's saved state.
struct MixState {
  Rng rng{};
  std::vector<std::uint8_t> live{};     // per input: not ended (or restarted)
  std::vector<std::uint8_t> yielded{};  // per input: gave an element in its current pass
  std::vector<std::uint64_t> passes{};  // per input: its pass (stop = never), 0 otherwise
  bool ended = false;
  template <class A>
  void fields(A& a) {
    a("rng", rng);
    a("live", live);
    a("yielded", yielded);
    a("passes", passes);
    a("ended", ended);
  }
};

/// The options as the fingerprint writes them; ConfigError when they are invalid for `inputs` inputs.
Params mix_params(const MixOptions& o, std::size_t inputs);

template <Snapshottable T>
class MixDef final : public NodeDef<T> {
 public:
  MixDef(std::vector<std::shared_ptr<const NodeDef<T>>> ins, MixOptions o)
      : NodeDef<T>("mix", o.name, mix_params(o, ins.size()), untyped(ins)), inputs_(std::move(ins)), options_(std::move(o)) {}
  std::unique_ptr<Iter<T>> instantiate(BuildContext& ctx) const override;
  const auto& typed_inputs() const { return inputs_; }
  const MixOptions& options() const { return options_; }

 private:
  std::vector<std::shared_ptr<const NodeDef<T>>> inputs_;
  MixOptions options_;
};

template <Snapshottable T>
class MixIter final : public Hooked<T> {
 public:
  MixIter(BuildContext& ctx, const MixDef<T>& def) : Hooked<T>(ctx, "mix"), def_(def), epoch_(ctx.epoch) {
    st_.rng = ctx.rng(this->key());
    for (const auto& in : def.typed_inputs()) {
      contexts_.push_back(ctx);  // the cursor at this input's first key: where a restart builds it again
      inputs_.push_back(in->instantiate(ctx));
    }
    const std::size_t n = inputs_.size();
    st_.live.assign(n, 1);
    st_.yielded.assign(n, 0);
    st_.passes.assign(n, 0);
  }

 protected:
  std::size_t pull_chunk(std::vector<T>& out, std::size_t max) override {
    const auto& w = def_.options().weights;
    const MixStop stop = def_.options().stop;
    std::size_t n = 0;
    while (n < max && !st_.ended) {
      // Draw among the live inputs with a weight.
      double total = 0;
      for (std::size_t i = 0; i < w.size(); ++i)
        if (st_.live[i]) total += w[i];
      if (total <= 0) {
        st_.ended = true;
        break;
      }
      double u = static_cast<double>(st_.rng() >> 11) * 0x1.0p-53 * total;
      std::size_t pick = w.size();
      for (std::size_t i = 0; i < w.size(); ++i) {
        if (!st_.live[i] || w[i] <= 0) continue;
        pick = i;  // the last live one takes what rounding leaves
        if (u < w[i]) break;
        u -= w[i];
      }
      if (inputs_[pick]->pull(out, 1) == 1) {
        this->pass_traces(*inputs_[pick]);
        st_.yielded[pick] = 1;
        ++n;
        continue;
      }
      if (stop == MixStop::first_exhausted) {
        st_.ended = true;
      } else if (stop == MixStop::never && st_.yielded[pick]) {
        ++st_.passes[pick];
        st_.yielded[pick] = 0;
        rebuild(pick);
      } else {
        st_.live[pick] = 0;  // all_exhausted, or a pass of `never` that gave nothing
      }
    }
    return n;
  }
  void save_state(StateWriter& w) const override { w.write(st_); }
  void restore_state(StateReader& r) override {
    r.read(st_);
    const std::size_t n = inputs_.size();
    if (st_.live.size() != n || st_.yielded.size() != n || st_.passes.size() != n)
      r.fail("flags for " + std::to_string(st_.live.size()) + " inputs, the node has " + std::to_string(n));
    if (def_.options().stop != MixStop::never)
      for (const auto p : st_.passes)
        if (p != 0) r.fail("an input on pass " + std::to_string(p) + ", but only stop = never restarts inputs");
    for (std::size_t i = 0; i < n; ++i)
      if (st_.passes[i] > 0) rebuild(i);  // the engine then restores it
  }
  std::vector<IterBase*> inputs() const override { return bases_of(inputs_); }
  bool carries_provenance() const override { return true; }
  bool holds_no_elements() const override { return true; }
  bool one_base() const override {
    return std::all_of(inputs_.begin(), inputs_.end(), [](const auto& in) { return in->one_base(); });
  }
  bool recomputable() const override {
    return std::all_of(inputs_.begin(), inputs_.end(), [](const auto& in) { return in->recomputable(); });
  }
  /// The element comes from the input whose sources its first base element names.
  T recompute(const Provenance& p) const override {
    if (!p.empty())
      for (std::size_t i = 0; i < inputs_.size(); ++i)
        if (holds_source(*inputs_[i], p[0].source)) return inputs_[i]->recompute(p);
    throw SnapshotError(this->label() + ": a restore key names no element of its inputs (" + to_string(p) + ")");
  }

 private:
  static bool holds_source(const IterBase& node, std::uint32_t source) {
    if (node.node_index() == source) return true;
    for (const IterBase* in : node.inputs())
      if (holds_source(*in, source)) return true;
    return false;
  }
  void rebuild(std::size_t i) {
    BuildContext c = contexts_[i];
    c.epoch = cycle_epoch(epoch_, st_.passes[i]);
    inputs_[i] = def_.typed_inputs()[i]->instantiate(c);
  }

  const MixDef<T>& def_;
  std::uint64_t epoch_;
  std::vector<BuildContext> contexts_;
  std::vector<std::unique_ptr<Iter<T>>> inputs_;
  MixState st_;
};

template <Snapshottable T>
std::unique_ptr<Iter<T>> MixDef<T>::instantiate(BuildContext& ctx) const {
  return std::make_unique<MixIter<T>>(ctx, *this);
}

/// `mix({prose, code}, {.weights = {0.7, 0.3}})`
template <class T>
Pipeline<T> mix(const std::vector<Pipeline<T>>& inputs, MixOptions o = {}) {
  if (o.weights.empty()) o.weights.assign(inputs.size(), 1.0);
  return make_pipeline<MixDef<T>>(defs_of(inputs), std::move(o));
}

namespace rescale {
RescaleRule mix_rule();
}  // namespace rescale

struct MixKind {
  static constexpr std::string_view name = "mix";
  static constexpr std::string_view doc =
      "A weighted, deterministic interleave of several pipelines (a source; stop at the first or last exhausted, or never).";
  static constexpr std::string_view provenance = "passes on the provenance of each element from its input; makes it again through that input";
  static constexpr ParamSchema params[] = {
      {.name = "weights", .type = ParamType::numbers, .doc = "one weight per input, not negative, not all 0 (absent: equal); a resume may change them with the override 'weights'", .fallback = "null", .overridable = true},
      {.name = "stop", .type = ParamType::choice, .doc = "end when a drawn input ends, when all have ended, or never (inputs restart as new epochs)",
       .fallback = "\"all_exhausted\"", .choices = "first_exhausted|all_exhausted|never"},
      {.name = "with", .type = ParamType::pipelines, .doc = "the pipelines mixed (Python: positional)"},
  };
  using State = MixState;
  static constexpr bool source = true;
  static constexpr bool restarts_upstream = true;
  /// Rescale: the inputs by their own rules; live flags reset, a generator per new instance.
  static RescaleRule rescale() { return rescale::mix_rule(); }
  static std::string summary(const NodeState& record, const GraphNodeRecord&) {
    MixState st;
    StateReader r(record);
    r.read(st);
    std::size_t live = 0;
    for (const auto l : st.live) live += l;
    return std::to_string(live) + " of " + std::to_string(st.live.size()) + " inputs live" + (st.ended ? ", ended" : "");
  }
  /// `{"op": "mix", "weights": [0.7, 0.3], "stop": "all_exhausted", "with": [PIPELINE, PIPELINE]}`
  template <class Spec>
  static SpecPipeline from_spec(Spec& s) {
    MixOptions o{.name = s.name()};
    s.param("weights", o.weights);
    s.choice("stop", o.stop, {{"first_exhausted", MixStop::first_exhausted}, {"all_exhausted", MixStop::all_exhausted},
                              {"never", MixStop::never}});
    const std::vector<SpecPipeline> with = s.pipelines("with");
    return with.front().visit([&]<class T>(const Pipeline<T>&) -> SpecPipeline {
      std::vector<Pipeline<T>> typed;
      for (std::size_t i = 0; i < with.size(); ++i) {
        if (!with[i].template holds<T>())
          throw ConfigError("mix: input " + std::to_string(i + 1) + " yields " + with[i].type_name() +
                            "s, the first yields " + with[0].type_name() + "s");
        typed.push_back(with[i].template get<T>());
      }
      if constexpr (Snapshottable<T>) return mix(typed, o);
      else throw ConfigError("mix: its inputs' elements cannot be saved");
    });
  }
};

}  // namespace dpipe
