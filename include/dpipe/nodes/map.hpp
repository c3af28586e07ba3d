#pragma once
/// Applies a pure function to every element. In: T → Out: fn(T). State: none (the function must not
/// keep state between calls; use `generator` for that).
#include <string>
#include <type_traits>

#include "dpipe/pipeline.hpp"
#include "dpipe/kit/rescale.hpp"
#include "dpipe/kit/spec.hpp"

namespace dpipe {

struct MapOptions {
  std::string name{};
};

/// A function object may describe itself for the fingerprint with `Params describe() const`.
template <class Fn>
Params describe_fn(const Fn& fn) {
  if constexpr (requires { { fn.describe() } -> std::convertible_to<Params>; }) return fn.describe();
  else return {};
}

/// A function object may also hold a resource over a chunk of calls (a Python callable holds the GIL):
/// `chunk_scope()` returns a guard a node keeps while it applies the function to the elements of one
/// pulled chunk, never while it pulls from its input (which may wait for other threads).
template <class Fn>
auto chunk_scope(const Fn& fn) {
  if constexpr (requires { fn.chunk_scope(); }) return fn.chunk_scope();
  else return 0;
}

template <class In, class Fn>
using map_result_t = std::decay_t<std::invoke_result_t<const Fn&, In&&>>;

template <class In, class Fn>
class MapDef final : public NodeDef<map_result_t<In, Fn>> {
 public:
  using Out = map_result_t<In, Fn>;
  MapDef(std::shared_ptr<const NodeDef<In>> in, Fn fn, MapOptions o)
      : NodeDef<Out>("map", o.name, describe_fn(fn), {in}), input_(std::move(in)), fn_(std::move(fn)) {}
  std::unique_ptr<Iter<Out>> instantiate(BuildContext& ctx) const override;
  const NodeDef<In>& input() const { return *input_; }
  const Fn& fn() const { return fn_; }

 private:
  std::shared_ptr<const NodeDef<In>> input_;
  Fn fn_;
};

template <class In, class Fn>
class MapIter final : public Stateless<map_result_t<In, Fn>> {
 public:
  using Out = map_result_t<In, Fn>;
  MapIter(BuildContext& ctx, const MapDef<In, Fn>& def)
      : Stateless<Out>(ctx, "map"), input_(def.input().instantiate(ctx)), fn_(def.fn()) {}

 protected:
  std::size_t pull_chunk(std::vector<Out>& out, std::size_t max) override {
    if constexpr (std::is_same_v<In, Out>) {  // transform in place: no second buffer
      const std::size_t before = out.size();
      const std::size_t n = input_->pull(out, max);
      Out* p = out.data() + before;
      std::size_t i = 0;
      [[maybe_unused]] const auto scope = chunk_scope(fn_);
      try {
        for (; i < n; ++i) p[i] = fn_(std::move(p[i]));
      } catch (...) {
        out.resize(before + i);
        return this->fail_after(i);
      }
      return n;
    } else {
      scratch_.clear();
      const std::size_t n = input_->pull(scratch_, max);
      std::size_t i = 0;
      [[maybe_unused]] const auto scope = chunk_scope(fn_);
      try {
        for (; i < n; ++i) out.push_back(fn_(std::move(scratch_[i])));
      } catch (...) {
        return this->fail_after(i);
      }
      return n;
    }
  }
  std::vector<IterBase*> inputs() const override { return {input_.get()}; }
  std::size_t min_useful_pull() const override { return input_->min_useful_pull(); }

 private:
  std::unique_ptr<Iter<In>> input_;
  Fn fn_;  // a copy per worker
  std::vector<In> scratch_;
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

struct MapKind {
  static constexpr std::string_view name = "map";
  static constexpr std::string_view doc =
      "Applies a pure function to every element.";
  static constexpr ParamSchema params[] = {
      {.name = "fn", .type = ParamType::function, .doc = "the function: a builtin function's name, or a Python callable", .positional = true},
  };
  using State = void;
  /// Rescale: a map keeps no state, so every new instance gets the same (empty) record.
  static RescaleRule rescale() { return RescaleRule::replicated(); }
  /// `{"op": "map", "fn": NAME, ...the function's parameters}`: a function the front end provides.
  template <class Spec>
  static SpecPipeline from_spec(Spec& s) {
    MapOptions o{.name = s.name()};
    return s.map_function([&](const auto& p, auto fn) { return p | map(std::move(fn), o); });
  }
};

}  // namespace dpipe
