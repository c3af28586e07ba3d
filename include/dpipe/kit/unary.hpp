#pragma once
/// The scaffold of a one-input kind whose configuration is one options struct, so that its header tells
/// its story (state, pull, rule, schema) and little else:
///
///   struct SkipOptions { std::int64_t count = 0; std::string name{}; };
///   template <class T> class SkipIter;                                  // : UnaryIter<T>
///   template <class T> using SkipDef = UnaryDef<SkipKind, T, T, SkipIter>;
///   inline auto skip(std::int64_t count, SkipOptions o = {}) { o.count = count; return unary<SkipDef>(o); }
///   struct SkipKind { name, doc, params, using Options = SkipOptions; static Params checked_params(const
///                     SkipOptions&); using State; rescale(); from_spec(); };
///
/// UnaryDef holds the input and the options, writes the fingerprint's parameters with the kind's own
/// checked_params (which throws ConfigError on invalid options) and builds the kind's iterator;
/// UnaryIter builds the input's iterator and reports it as its input.
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "dpipe/kit/node.hpp"
#include "dpipe/pipeline.hpp"

namespace dpipe {

template <class Kind, class In, class Out, template <class> class IterOf>
class UnaryDef final : public NodeDef<Out> {
 public:
  using Options = typename Kind::Options;
  UnaryDef(std::shared_ptr<const NodeDef<In>> in, Options o)
      : NodeDef<Out>(std::string(Kind::name), o.name, Kind::checked_params(o), {in}), input_(std::move(in)),
        options_(std::move(o)) {}
  std::unique_ptr<Iter<Out>> instantiate(BuildContext& ctx) const override {
    return std::make_unique<IterOf<In>>(ctx, *this);
  }
  const NodeDef<In>& input() const { return *input_; }
  const Options& options() const { return options_; }

 private:
  std::shared_ptr<const NodeDef<In>> input_;
  Options options_;
};

/// The iterator base of a one-input kind with saved state (StateMode::hook).
template <class In, class Out = In>
class UnaryIter : public Hooked<Out> {
 protected:
  template <class Def>
  UnaryIter(BuildContext& ctx, const Def& def) : Hooked<Out>(ctx, def.kind()), input_(def.input().instantiate(ctx)) {}
  std::vector<IterBase*> inputs() const override { return {input_.get()}; }
  Iter<In>& input() { return *input_; }
  const Iter<In>& input() const { return *input_; }

 private:
  std::unique_ptr<Iter<In>> input_;
};

/// `p | kind(options)`: the closure a one-input kind's factory returns; DefOf<T> is its definition for
/// the element type T of the pipeline it is applied to.
template <template <class> class DefOf, class Options>
auto unary(Options o) {
  return make_closure([o = std::move(o)](const auto& p) {
    using T = typename std::decay_t<decltype(p)>::element_type;
    return make_pipeline<DefOf<T>>(p.def(), o);
  });
}

}  // namespace dpipe
