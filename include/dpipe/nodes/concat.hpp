#pragma once
/// All of the first input, then all of the next, and so on. In: T, T, … → Out: T.
/// State: which input is current.
#include <string>
#include <vector>

#include "dpipe/kit/length.hpp"
#include "dpipe/pipeline.hpp"
#include "dpipe/kit/rescale.hpp"
#include "dpipe/kit/spec.hpp"

namespace dpipe {

/// A concat's saved state: which input is current.
struct ConcatState {
  std::uint64_t current = 0;
  template <class A>
  void fields(A& a) { a("current", current); }
};

struct ConcatOptions {
  std::string name{};
};

/// Shared by the multi-input nodes: the inputs' definitions, typed and untyped.
template <class T>
std::vector<std::shared_ptr<const NodeDefBase>> untyped(const std::vector<std::shared_ptr<const NodeDef<T>>>& v) {
  return {v.begin(), v.end()};
}

/// Throws the ConfigError of a node that combines inputs (concat, zip, mux) given fewer than two (not a
/// template, so compiled once rather than once per element type).
inline void check_other_input(std::size_t inputs, const char* kind, const std::string& name) {
  if (inputs < 2) throw ConfigError(node_label(kind, name) + ": needs at least one other input");
}
template <class T>
std::vector<std::shared_ptr<const NodeDef<T>>> defs_of(const std::vector<Pipeline<T>>& ps) {
  std::vector<std::shared_ptr<const NodeDef<T>>> v;
  for (const auto& p : ps) v.push_back(p.def());
  return v;
}
template <class T>
std::vector<std::unique_ptr<Iter<T>>> instantiate_all(const std::vector<std::shared_ptr<const NodeDef<T>>>& defs,
                                                      BuildContext& ctx) {
  std::vector<std::unique_ptr<Iter<T>>> v;
  for (const auto& d : defs) v.push_back(d->instantiate(ctx));
  return v;
}
template <class T>
std::vector<IterBase*> bases_of(const std::vector<std::unique_ptr<Iter<T>>>& its) {
  std::vector<IterBase*> v;
  for (const auto& i : its) v.push_back(i.get());
  return v;
}

template <class T>
class ConcatDef final : public NodeDef<T> {
 public:
  ConcatDef(std::vector<std::shared_ptr<const NodeDef<T>>> ins, ConcatOptions o)
      : NodeDef<T>("concat", o.name, {}, untyped(ins)), inputs_(std::move(ins)) {
    check_other_input(inputs_.size(), "concat", o.name);
  }
  std::unique_ptr<Iter<T>> instantiate(BuildContext& ctx) const override;
  const auto& typed_inputs() const { return inputs_; }

 private:
  std::vector<std::shared_ptr<const NodeDef<T>>> inputs_;
};

template <class T>
class ConcatIter final : public Hooked<T> {
 public:
  ConcatIter(BuildContext& ctx, const ConcatDef<T>& def)
      : Hooked<T>(ctx, "concat"), inputs_(instantiate_all(def.typed_inputs(), ctx)) {}

 protected:
  std::size_t pull_chunk(std::vector<T>& out, std::size_t max) override {
    while (st_.current < inputs_.size()) {
      if (const std::size_t n = inputs_[st_.current]->pull(out, max)) return n;
      ++st_.current;
    }
    return 0;
  }
  void save_state(StateWriter& w) const override { w.write(st_); }
  void restore_state(StateReader& r) override {
    r.read(st_);
    if (st_.current > inputs_.size()) r.fail("current input " + std::to_string(st_.current) + " does not exist");
  }
  std::vector<IterBase*> inputs() const override { return bases_of(inputs_); }

 private:
  std::vector<std::unique_ptr<Iter<T>>> inputs_;
  ConcatState st_;
};

template <class T>
std::unique_ptr<Iter<T>> ConcatDef<T>::instantiate(BuildContext& ctx) const {
  return std::make_unique<ConcatIter<T>>(ctx, *this);
}

/// `p | concat_with({q, r})`: p, then q, then r.
template <class T>
auto concat_with(std::vector<Pipeline<T>> others, ConcatOptions o = {}) {
  return make_closure([others = std::move(others), o = std::move(o)](const Pipeline<T>& p) {
    auto defs = defs_of(others);
    defs.insert(defs.begin(), p.def());
    return make_pipeline<ConcatDef<T>>(std::move(defs), o);
  });
}

template <class T, class... More>
Pipeline<T> concat(const Pipeline<T>& first, const More&... more) {
  return make_pipeline<ConcatDef<T>>(defs_of(std::vector<Pipeline<T>>{first, more...}), ConcatOptions{});
}

struct ConcatKind {
  static constexpr std::string_view name = "concat";
  static constexpr LengthFn length = &summed_length;  // every element of every input
  static constexpr std::string_view doc =
      "All of the input, then all of each pipeline of `with`, in order.";
  static constexpr ParamSchema params[] = {
      {.name = "with", .type = ParamType::pipelines, .doc = "the pipelines that follow the input (Python: positional)"},
  };
  using State = ConcatState;
  static RescaleRule rescale() { return RescaleRule::refused(rescale::kNotDealt); }
  /// `{"op": "concat", "with": [PIPELINE, ...]}`: the input, then each pipeline of `with`.
  template <class Spec>
  static SpecPipeline from_spec(Spec& s) {
    ConcatOptions o{.name = s.name()};
    return s.input().apply(
        [&]<class T>(const Pipeline<T>& p) { return p | concat_with(s.template inputs<T>("with"), o); });
  }
};

}  // namespace dpipe
