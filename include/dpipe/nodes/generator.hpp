#pragma once
/// Elements from a user callable. Out: T. State: none it can save, so it is restored by replay: rebuilt
/// from the initial RNG state (seed, node key, epoch) and pulled the recorded number of times.
///
/// `factory(const GeneratorContext&)` returns a callable `() -> std::optional<T>` (nullopt ends the
/// stream). Everything random must come from `ctx.rng`, so a rebuilt generator yields the same stream.
#include <optional>
#include <string>
#include <type_traits>

#include "dpipe/nodes/map.hpp"
#include "dpipe/pipeline.hpp"
#include "dpipe/kit/rescale.hpp"
#include "dpipe/kit/spec.hpp"

namespace dpipe {

struct GeneratorContext {
  Rng rng;
  Layout layout;
  int worker = 0;
  int instance = 0;
  std::uint64_t epoch = 0;
};

struct GeneratorOptions {
  std::string name{};
};

template <class Factory>
using generator_fn_t = std::invoke_result_t<const Factory&, const GeneratorContext&>;
template <class Factory>
using generator_value_t = typename std::invoke_result_t<generator_fn_t<Factory>&>::value_type;

template <class Factory>
class GeneratorDef final : public NodeDef<generator_value_t<Factory>> {
 public:
  using T = generator_value_t<Factory>;
  GeneratorDef(Factory f, GeneratorOptions o) : NodeDef<T>("generator", o.name, {}), factory_(std::move(f)) {}
  std::unique_ptr<Iter<T>> instantiate(BuildContext& ctx) const override;
  const Factory& factory() const { return factory_; }

 private:
  Factory factory_;
};

template <class Factory>
class GeneratorIter final : public Replayed<generator_value_t<Factory>> {
 public:
  using T = generator_value_t<Factory>;
  GeneratorIter(BuildContext& ctx, const GeneratorDef<Factory>& def)
      : Replayed<T>(ctx, "generator"),
        fn_(def.factory()(GeneratorContext{ctx.rng(this->key()), ctx.layout, ctx.worker, ctx.instance(), ctx.epoch})) {}

 protected:
  std::size_t pull_chunk(std::vector<T>& out, std::size_t max) override {
    std::size_t n = 0;
    [[maybe_unused]] const auto scope = chunk_scope(fn_);
    while (!done_ && n < max) {
      std::optional<T> v;
      try {
        v = fn_();
      } catch (...) {
        return this->fail_after(n);  // what the function yielded before it threw is delivered first
      }
      if (!v) {
        done_ = true;
        break;
      }
      out.push_back(std::move(*v));
      ++n;
    }
    return n;
  }
  std::vector<IterBase*> inputs() const override { return {}; }

 private:
  generator_fn_t<Factory> fn_;
  bool done_ = false;
};

template <class Factory>
std::unique_ptr<Iter<generator_value_t<Factory>>> GeneratorDef<Factory>::instantiate(BuildContext& ctx) const {
  return std::make_unique<GeneratorIter<Factory>>(ctx, *this);
}

template <class Factory>
auto generator(Factory factory, GeneratorOptions o = {}) {
  return make_pipeline<GeneratorDef<Factory>>(std::move(factory), std::move(o));
}

struct GeneratorKind {
  static constexpr std::string_view name = "generator";
  static constexpr std::string_view doc =
      "Elements from a function with state of its own; restored by replay from its initial random state.";
  static constexpr ParamSchema params[] = {
      {.name = "fn", .type = ParamType::function, .doc = "the factory: a builtin function's name, or a Python callable", .positional = true},
  };
  using State = ReplayRecord;  // restored by replay
  static constexpr bool source = true;
  /// Rescale: refused; a generator is restored by replaying its stream on one instance, which says
  /// nothing about how another layout would split it.
  static RescaleRule rescale() {
    return RescaleRule::refused("a generator is restored by replay on its own instance, so its stream cannot be "
                                "dealt to another layout; read data through sampler() or a file source to rescale");
  }
  /// `{"op": "generator", "fn": NAME, ...the function's parameters}`: a factory the front end provides.
  template <class Spec>
  static SpecPipeline from_spec(Spec& s) {
    GeneratorOptions o{.name = s.name()};
    return s.generator_function([&](auto factory) { return generator(std::move(factory), o); });
  }
};

}  // namespace dpipe
