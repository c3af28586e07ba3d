#pragma once
/// Applies a pure function to every element. In: T → Out: fn(T). State: none (the function must not
/// keep state between calls; use `generator` for that); with on_error = skip, how many elements it
/// dropped because the function threw on them (kit/on_error.hpp).
#include <string>
#include <type_traits>

#include "dpipe/kit/length.hpp"
#include "dpipe/fields.hpp"
#include "dpipe/pipeline.hpp"
#include "dpipe/kit/on_error.hpp"
#include "dpipe/kit/rescale.hpp"
#include "dpipe/kit/spec.hpp"

namespace dpipe {

struct MapOptions {
  /// An element the function throws on: fail the run (after the elements before it), or skip it.
  OnDataError on_error = OnDataError::fail;
  std::string name{};
};

/// map_with_rng's function: `fn(x, rng)`, called with an Rng seeded by (the run's seed and epoch, the map's
/// key, the element's provenance), so that a random augmentation gives the same result for a sample
/// whatever the layout, the worker, a rescale or a resume. The map traces its input (provenance.hpp).
template <class Fn>
struct SeededFn {
  Fn fn;
};
template <class Fn>
inline constexpr bool is_seeded_fn_v = false;
template <class Fn>
inline constexpr bool is_seeded_fn_v<SeededFn<Fn>> = true;

/// A function object may describe itself for the fingerprint with `Params describe() const`.
template <class Fn>
Params describe_fn(const Fn& fn) {
  if constexpr (is_seeded_fn_v<Fn>) {
    Params p = describe_fn(fn.fn);
    p.push_back({"rng", "true"});
    return p;
  } else if constexpr (requires { { fn.describe() } -> std::convertible_to<Params>; }) return fn.describe();
  else return {};
}

/// The fingerprint parameters of a node running `fn` under `policy` (skip is named; fail, the default, is not,
/// so fingerprints of earlier pipelines stay as they were).
template <class Fn>
Params describe_fn(const Fn& fn, OnDataError policy) {
  Params p = describe_fn(fn);
  if (policy == OnDataError::skip) p.push_back({"on_error", "skip"});
  return p;
}

/// A function object may also hold a resource over a chunk of calls (a Python callable holds the GIL):
/// `chunk_scope()` returns a guard a node keeps while it applies the function to the elements of one
/// pulled chunk, never while it pulls from its input (which may wait for other threads).
template <class Fn>
auto chunk_scope(const Fn& fn) {
  if constexpr (is_seeded_fn_v<Fn>) return chunk_scope(fn.fn);
  else if constexpr (requires { fn.chunk_scope(); }) return fn.chunk_scope();
  else return 0;
}

namespace detail {
template <class In, class Fn>
struct map_result {
  using type = std::decay_t<std::invoke_result_t<const Fn&, In&&>>;
};
template <class In, class Fn>
struct map_result<In, SeededFn<Fn>> {
  using type = std::decay_t<std::invoke_result_t<const Fn&, In&&, Rng&>>;
};
}  // namespace detail
template <class In, class Fn>
using map_result_t = typename detail::map_result<In, Fn>::type;

namespace detail {
/// A map with a per-sample generator: the seed of its node, from the run's seed and epoch and its key.
inline std::uint64_t sample_seed_key(std::uint64_t run_seed, const std::string& key, std::uint64_t epoch) {
  return derive_seed(run_seed, key, epoch, 0x3a9d);
}
/// The seed of one element's generator: the node's and the element's provenance (sources named by `keys`).
inline std::uint64_t sample_seed(std::uint64_t node_key, const Provenance& p, const std::vector<std::string>* keys,
                                 const std::string& label) {
  static const std::vector<std::string> kNoKeys;
  if (!is_known(p)) throw Error("internal: " + label + " was given an element of unknown provenance");
  return mix64(node_key ^ provenance_digest(p, keys ? *keys : kNoKeys));
}
/// A map with a per-sample generator refuses a node upstream whose snapshots would hold elements as data:
/// it would resume them with no provenance, and their draws would differ from the uninterrupted run's. A
/// node that holds elements is accepted when its chain is recomputable: the map traces its input, so that
/// node's snapshots hold restore keys, which give the elements their provenance back (kit/restore_keys.hpp).
inline void refuse_elements_held_upstream(const std::string& label, const IterBase& node) {
  if (!node.carries_provenance())
    throw ConfigError(label + ": a map with a per-sample generator (rng) needs its input's provenance, and " +
                      node.label() + " does not carry provenance yet (docs/design.md, \"Provenance\")");
  if (!node.holds_no_elements() && !node.recomputable())
    throw ConfigError(label + ": a map with a per-sample generator (rng) must come before " + node.label() +
                      ", whose snapshots hold elements as data, without their provenance (its input cannot make "
                      "them again from restore keys): their draws would change on a resume. Place it right after the "
                      "source, sampler, filters and maps");
  for (const IterBase* in : node.inputs()) refuse_elements_held_upstream(label, *in);
}
}  // namespace detail

/// Builds `def`'s iterator with provenance traced when `traced` (a node that needs its input's).
template <class Def>
auto instantiate_traced(const Def& def, BuildContext& ctx, bool traced) {
  const bool was = ctx.trace;
  ctx.trace = was || traced;
  auto it = def.instantiate(ctx);
  ctx.trace = was;
  return it;
}

template <class In, class Fn>
class MapDef final : public NodeDef<map_result_t<In, Fn>> {
 public:
  using Out = map_result_t<In, Fn>;
  MapDef(std::shared_ptr<const NodeDef<In>> in, Fn fn, MapOptions o)
      : NodeDef<Out>("map", o.name, describe_fn(fn, o.on_error), {in}), input_(std::move(in)), fn_(std::move(fn)),
        on_error_(o.on_error) {}
  std::unique_ptr<Iter<Out>> instantiate(BuildContext& ctx) const override;
  const NodeDef<In>& input() const { return *input_; }
  const Fn& fn() const { return fn_; }
  OnDataError on_error() const { return on_error_; }

 private:
  std::shared_ptr<const NodeDef<In>> input_;
  Fn fn_;
  OnDataError on_error_;
};

template <class In, class Fn>
class MapIter final : public HookedIf<map_result_t<In, Fn>> {
 public:
  using Out = map_result_t<In, Fn>;
  MapIter(BuildContext& ctx, const MapDef<In, Fn>& def)
      : HookedIf<Out>(def.on_error() == OnDataError::skip, ctx, "map"),
        input_(instantiate_traced(def.input(), ctx, kSeeded)), fn_(def.fn()), skips_(def.on_error() == OnDataError::skip),
        seed_key_(detail::sample_seed_key(ctx.seed, this->key(), ctx.epoch)), keys_(ctx.keys) {
    if constexpr (kSeeded) detail::refuse_elements_held_upstream(this->label(), *input_);
  }

 protected:
  std::size_t pull_chunk(std::vector<Out>& out, std::size_t max) override {
    if (skips_) return pull_skipping(out, max);
    if constexpr (std::is_same_v<In, Out>) {  // transform in place: no second buffer
      const std::size_t before = out.size();
      const std::size_t n = input_->pull(out, max);
      Out* p = out.data() + before;
      std::size_t i = 0;
      [[maybe_unused]] const auto scope = chunk_scope(fn_);
      try {
        for (; i < n; ++i) p[i] = call(std::move(p[i]), i);
      } catch (...) {
        out.resize(before + i);
        this->pass_traces(*input_, i);
        return this->fail_after(i);
      }
      this->pass_traces(*input_, n);
      return n;
    } else {
      scratch_.clear();
      const std::size_t n = input_->pull(scratch_, max);
      std::size_t i = 0;
      [[maybe_unused]] const auto scope = chunk_scope(fn_);
      try {
        for (; i < n; ++i) out.push_back(call(std::move(scratch_[i]), i));
      } catch (...) {
        this->pass_traces(*input_, i);
        return this->fail_after(i);
      }
      this->pass_traces(*input_, n);
      return n;
    }
  }
  bool carries_provenance() const override { return true; }
  bool holds_no_elements() const override { return true; }
  bool one_base() const override { return input_->one_base(); }
  bool recomputable() const override { return input_->recomputable(); }
  Out recompute(const Provenance& p) const override {
    [[maybe_unused]] const auto scope = chunk_scope(fn_);
    if constexpr (kSeeded) {
      Rng rng(detail::sample_seed(seed_key_, p, keys_, this->label()));
      return fn_.fn(input_->recompute(p), rng);
    } else {
      return fn_(input_->recompute(p));
    }
  }
  void save_state(StateWriter& w) const override {
    if (skips_) w.write(skipped_);
  }
  void restore_state(StateReader& r) override {
    if (skips_) r.read(skipped_);
  }
  std::uint64_t skipped_elements() const override { return skipped_.skipped; }
  std::vector<IterBase*> inputs() const override { return {input_.get()}; }
  std::size_t min_useful_pull() const override { return input_->min_useful_pull(); }

 private:
  static constexpr bool kInPlace = std::is_same_v<In, Out>;
  static constexpr bool kSeeded = is_seeded_fn_v<Fn>;

  /// The function on the `i`-th element of the input's last pull (map_with_rng: with its seed).
  Out call(In&& x, std::size_t i) {
    if constexpr (kSeeded) {
      Rng rng(detail::sample_seed(seed_key_, input_->traces()[i], keys_, this->label()));
      return fn_.fn(std::move(x), rng);
    } else {
      (void)i;
      return fn_(std::move(x));
    }
  }

  /// on_error = skip: an element the function throws on is dropped and counted; a chunk of such elements
  /// only is dropped whole and the input pulled again (0 stays the end of the stream).
  std::size_t pull_skipping(std::vector<Out>& out, std::size_t max) {
    for (;;) {
      const std::size_t before = out.size();
      std::size_t n;
      In* p;
      if constexpr (kInPlace) {
        n = input_->pull(out, max);
        p = out.data() + before;
      } else {
        scratch_.clear();
        n = input_->pull(scratch_, max);
        p = scratch_.data();
      }
      if (n == 0) return 0;
      std::size_t kept = 0;
      Provenance* traces = this->traced() ? input_->traces().data() : nullptr;  // compacted alike
      [[maybe_unused]] const auto scope = chunk_scope(fn_);
      for (std::size_t i = 0; i < n; ++i) {
        try {
          if constexpr (kInPlace) p[kept] = call(std::move(p[i]), i);  // slot `kept` is done with
          else out.push_back(call(std::move(p[i]), i));
          if (traces && kept != i) traces[kept] = std::move(traces[i]);
          ++kept;
        } catch (...) {
          if (!skip_current_exception(fn_, true, skipped_)) {
            out.resize(before + kept);  // the results before the failing element are delivered first
            this->pass_traces(*input_, kept);
            return this->fail_after(kept);
          }
        }
      }
      if constexpr (kInPlace) out.resize(before + kept);
      this->pass_traces(*input_, kept);
      if (kept > 0) return kept;
    }
  }

  std::unique_ptr<Iter<In>> input_;
  Fn fn_;  // a copy per worker
  bool skips_;
  SkipCountState skipped_;
  std::vector<In> scratch_;
  std::uint64_t seed_key_;                   // map_with_rng: (run seed and epoch, this node's key)
  const std::vector<std::string>* keys_;     // the graph's: how provenance names sources
};

template <class In, class Fn>
std::unique_ptr<Iter<map_result_t<In, Fn>>> MapDef<In, Fn>::instantiate(BuildContext& ctx) const {
  return std::make_unique<MapIter<In, Fn>>(ctx, *this);
}

template <class Fn>
auto map(Fn fn, MapOptions o = {}) {
  return make_closure([fn = std::move(fn), o = std::move(o)](const auto& p) {
    using In = typename std::decay_t<decltype(p)>::element_type;
    return make_pipeline<MapDef<In, Fn>>(p.def(), fn, o);
  });
}

/// `map_with_rng(fn)`: `fn(x, rng)` with an Rng seeded by (the run's seed and epoch, this node's key, the
/// element's provenance): a sample's draw does not depend on the layout, the worker, a rescale or a
/// resume. Every node upstream must carry provenance and hold no elements in its snapshots (a source,
/// sampler, filters, maps: docs/design.md, "Provenance"). `fn` may describe itself (describe_fn).
template <class Fn>
auto map_with_rng(Fn fn, MapOptions o = {}) {
  return map(SeededFn<Fn>{std::move(fn)}, std::move(o));
}

struct MapKind {
  static constexpr std::string_view name = "map";
  static constexpr LengthFn length = &same_length_unless_skipping;
  static constexpr std::string_view doc =
      "Applies a pure function to every element.";
  /// Provenance (docs/design.md, "Provenance"; a kind without this line does not carry it).
  static constexpr std::string_view provenance = "passes its input's on; makes an element again by calling the function again (with rng: the same draw)";
  static constexpr ParamSchema params[] = {
      {.name = "fn", .type = ParamType::function, .doc = "the function: a builtin function's name, or a Python callable", .positional = true},
      kFieldParam,
      kIntoParam,
      kOnErrorFunctionParam,
      {.name = "rng", .type = ParamType::boolean,
       .doc = "call the function with each element's own generator, seeded by its provenance (map_with_rng; the builtin add_random)",
       .fallback = "false"},
  };
  /// Only with on_error = skip (otherwise the node is stateless).
  using State = SkipCountState;
  /// Rescale: a stateless map's (empty) record is replicated; a skipping map's counts are summed.
  static RescaleRule rescale() { return rescale::summed_skip_count(); }
  /// `snapshot show`: elements skipped.
  static std::string summary(const NodeState& record, const GraphNodeRecord&) { return skip_count_summary(record, "elements"); }
  /// `{"op": "map", "fn": NAME, ...the function's parameters, "field": F, "into": G, "on_error": "skip"}`: a
  /// function the front end provides.
  template <class Spec>
  static SpecPipeline from_spec(Spec& s) {
    MapOptions o{.name = s.name()};
    s.choice("on_error", o.on_error, {{"fail", OnDataError::fail}, {"skip", OnDataError::skip}});
    return s.template map_function<true>([&](const auto& p, auto fn) { return p | map(std::move(fn), o); }, o.on_error);
  }
};

}  // namespace dpipe
