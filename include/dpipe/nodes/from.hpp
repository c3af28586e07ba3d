#pragma once
/// Output i >= 1 of a node of several outputs (fork, demux, unzip; kit/split.hpp): its elements, as
/// that node routes them. `output(p, i)` in C++; `{"op": "from", "name": N, "output": i}` in specs
/// (the node named N must be built before it: in the main chain, or in an earlier `with` pipeline).
/// State: none (the node it reads holds its queue).
#include <array>
#include <string>
#include <utility>

#include "dpipe/kit/length.hpp"
#include "dpipe/kit/rescale.hpp"
#include "dpipe/kit/spec.hpp"
#include "dpipe/kit/split.hpp"

namespace dpipe {

template <class T>
class FromDef final : public NodeDef<T> {
 public:
  FromDef(std::shared_ptr<const NodeDef<T>> of, std::size_t output)
      : NodeDef<T>("from", "", {{"output", param_text(output)}}), of_(std::move(of)), output_(output) {
    if (!of_) throw ConfigError("from: the node it reads is missing");
    const std::string label = node_label(of_->kind(), of_->name());
    if (of_->outputs() < 2)
      throw ConfigError("from: " + label + " has one output; fork, demux and unzip have several");
    if (output == 0 || output >= of_->outputs())
      throw ConfigError("from: " + label + " has outputs 1 to " + std::to_string(of_->outputs() - 1) +
                        " to read (output 0 is the node itself), not " + std::to_string(output));
  }
  std::unique_ptr<Iter<T>> instantiate(BuildContext& ctx) const override;
  const NodeDefBase* reads() const override { return of_.get(); }
  std::size_t reads_output() const override { return output_; }

 private:
  std::shared_ptr<const NodeDef<T>> of_;
  std::size_t output_;
};

template <class T>
class FromIter final : public Stateless<T> {
 public:
  FromIter(BuildContext& ctx, const FromDef<T>& def)
      : Stateless<T>(ctx, "from"), shared_(ctx.shared), slot_(detail::split_slot(def.reads(), ctx.worker)),
        output_(def.reads_output()) {
    if (!shared_) throw ConfigError("from: it must run inside a Run");
  }

 protected:
  std::size_t pull_chunk(std::vector<T>& out, std::size_t max) override {
    return core().pull_output(output_, out, max, this->traced() ? &this->traces() : nullptr);
  }
  std::vector<IterBase*> inputs() const override { return {}; }
  /// Provenance: the core's (its state is in the record of the node it reads).
  bool carries_provenance() const override { return true; }
  bool holds_no_elements() const override { return true; }
  bool one_base() const override { return found() && core().one_base(); }
  bool recomputable() const override { return found() && core().recomputable(); }
  T recompute(const Provenance& p) const override { return core().remake(p); }

 private:
  /// The core of the node it reads, which may be built after it (a `zip` lists it first): found when
  /// first needed, once the run's tree is built.
  detail::SplitOutputs<T>& core() const {
    if (!core_) {
      const auto it = shared_->objects.find(slot_);
      if (it == shared_->objects.end())
        throw ConfigError("from: the node it reads was not built on this worker (it is not part of the run)");
      core_ = std::static_pointer_cast<std::weak_ptr<detail::SplitOutputs<T>>>(it->second)->lock();
      if (!core_) throw ConfigError("from: the node it reads is gone (its run is being destroyed)");
    }
    return *core_;
  }
  bool found() const { return core_ || shared_->objects.count(slot_) > 0; }

  detail::RunShared* shared_;
  std::string slot_;
  std::size_t output_;
  mutable std::shared_ptr<detail::SplitOutputs<T>> core_;
};

template <class T>
std::unique_ptr<Iter<T>> FromDef<T>::instantiate(BuildContext& ctx) const {
  return std::make_unique<FromIter<T>>(ctx, *this);
}

/// Output `i` of a fork, demux or unzip `p` (output 0 is `p` itself).
template <class T>
Pipeline<T> output(const Pipeline<T>& p, std::size_t i) {
  if (i == 0) return p;
  return make_pipeline<FromDef<T>>(p.def(), i);
}

/// The outputs of a node of several outputs, output 0 first.
template <class T>
std::vector<Pipeline<T>> outputs_of(const Pipeline<T>& p) {
  std::vector<Pipeline<T>> out;
  for (std::size_t i = 0; i < p.def()->outputs(); ++i) out.push_back(output(p, i));
  return out;
}

/// The N outputs of a node of several outputs as an array, for `auto [a, b] = …`.
template <std::size_t N, class T>
std::array<Pipeline<T>, N> outputs_array(const Pipeline<T>& p) {
  const auto all = outputs_of(p);
  return [&]<std::size_t... I>(std::index_sequence<I...>) { return std::array{all[I]...}; }(std::make_index_sequence<N>{});
}

struct FromKind {
  static constexpr std::string_view name = "from";
  static constexpr bool source = true;  // in specs it starts a pipeline (a branch)
  /// As long as the output it reads (Graph::length asks the node it reads).
  static constexpr LengthFn length = &same_length;
  static constexpr std::string_view doc =
      "Output `output` of the fork, demux or unzip named `name` (built before it in the spec: in the main "
      "chain or an earlier pipeline of `with`); the main chain continues with output 0.";
  static constexpr std::string_view provenance = "the output's elements have the provenance the node it reads gives them";
  static constexpr ParamSchema params[] = {
      {.name = "output", .type = ParamType::integer, .doc = "which output, from 1 (output 0 is the node itself)",
       .positional = true},
  };
  using State = void;
  static RescaleRule rescale() { return RescaleRule::replicated(); }
  /// `{"op": "from", "name": N, "output": i}`: `name` here is the node read, not a name of its own.
  template <class Spec>
  static SpecPipeline from_spec(Spec& s) {
    std::int64_t i = 0;
    s.required("output", i);
    if (s.name().empty()) throw ConfigError("from: name the fork, demux or unzip it reads (\"name\": N)");
    if (i < 1) throw ConfigError("from: output must be 1 or more (the main chain continues with output 0), got " + std::to_string(i));
    return s.read_output(s.name(), static_cast<std::size_t>(i));
  }
};

}  // namespace dpipe
