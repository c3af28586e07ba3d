#pragma once
/// One tuple per position of its inputs; stops at the shortest input.
/// `zip(a, b, …)`: In: A, B, … → Out: std::tuple<A, B, …>.
/// `zip_all({a, b, …})`: inputs of one type T → Out: std::vector<T> (what the spec format uses; specs zip
/// inputs of several types as rows of values).
/// State: whether an input has ended.
#include <algorithm>
#include <array>
#include <optional>
#include <utility>
#include <string>
#include <tuple>
#include <vector>

#include "dpipe/kit/length.hpp"
#include "dpipe/nodes/concat.hpp"
#include "dpipe/nodes/zip_longest.hpp"
#include "dpipe/kit/rescale.hpp"
#include "dpipe/kit/spec.hpp"

namespace dpipe {

/// A zip's saved state: whether an input has ended.
struct ZipState {
  bool ended = false;
  template <class A>
  void fields(A& a) { a("ended", ended); }
};

struct ZipOptions {
  std::string name{};
};

/// Traced: the provenance of row `i` of a pull, from its inputs' (`traces[j][i]`, moved from): one
/// group per input (batch_provenance), so that recompute splits it again.
template <class Traces>
Provenance zip_provenance(Traces& traces, std::size_t i) {
  std::vector<Provenance> parts;
  parts.reserve(traces.size());
  for (auto& t : traces) parts.push_back(std::move(t[i]));
  return batch_provenance(parts, parts.size(), false);
}

template <class... Ts>
class ZipDef final : public NodeDef<std::tuple<Ts...>> {
 public:
  using Out = std::tuple<Ts...>;
  ZipDef(std::tuple<std::shared_ptr<const NodeDef<Ts>>...> ins, ZipOptions o)
      : NodeDef<Out>("zip", o.name, {}, std::apply([](const auto&... d) {
                       return std::vector<std::shared_ptr<const NodeDefBase>>{d...};
                     }, ins)),
        inputs_(std::move(ins)) {}
  std::unique_ptr<Iter<Out>> instantiate(BuildContext& ctx) const override;
  const auto& typed_inputs() const { return inputs_; }

 private:
  std::tuple<std::shared_ptr<const NodeDef<Ts>>...> inputs_;
};

template <class... Ts>
class ZipIter final : public Hooked<std::tuple<Ts...>> {
 public:
  using Out = std::tuple<Ts...>;
  ZipIter(BuildContext& ctx, const ZipDef<Ts...>& def)
      : Hooked<Out>(ctx, "zip"),
        inputs_(std::apply([&](const auto&... d) { return std::tuple{d->instantiate(ctx)...}; }, def.typed_inputs())) {}

 protected:
  std::size_t pull_chunk(std::vector<Out>& out, std::size_t max) override {
    if (st_.ended) return 0;
    std::size_t n = max;
    const bool traced = this->traced();
    for (auto& t : trace_scratch_) t.clear();
    // Each input is pulled for exactly as many elements as the ones before it gave.
    std::apply([&](auto&... in) {
      std::apply([&](auto&... buf) {
        std::size_t k = 0;
        ((buf.clear(), n = pull_exact(*in, buf, n, traced ? &trace_scratch_[k] : nullptr), ++k), ...);
      }, scratch_);
    }, inputs_);
    if (n < max) st_.ended = true;  // some input ended: the surplus of the others is dropped
    for (std::size_t i = 0; i < n; ++i) {
      out.push_back(std::apply([&](auto&... buf) { return Out{std::move(buf[i])...}; }, scratch_));
      if (traced) this->traces().push_back(zip_provenance(trace_scratch_, i));
    }
    return n;
  }
  void save_state(StateWriter& w) const override { w.write(st_); }
  void restore_state(StateReader& r) override { r.read(st_); }
  std::vector<IterBase*> inputs() const override {
    return std::apply([](const auto&... in) { return std::vector<IterBase*>{in.get()...}; }, inputs_);
  }
  bool carries_provenance() const override { return true; }
  bool holds_no_elements() const override { return true; }
  bool recomputable() const override {
    return std::apply([](const auto&... in) { return (in->recomputable() && ...); }, inputs_);
  }
  /// A row is made again from its inputs' elements, one group of its provenance each.
  Out recompute(const Provenance& p) const override {
    const std::optional<std::vector<Provenance>> parts = batch_elements(p, false);
    if (!parts || parts->size() != sizeof...(Ts))
      throw SnapshotError(this->label() + ": a restore key names no row of this node (" + to_string(p) + ")");
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      return Out{std::get<I>(inputs_)->recompute((*parts)[I])...};
    }(std::index_sequence_for<Ts...>{});
  }

 private:
  std::tuple<std::unique_ptr<Iter<Ts>>...> inputs_;
  std::tuple<std::vector<Ts>...> scratch_;
  std::array<std::vector<Provenance>, sizeof...(Ts)> trace_scratch_;  // traced: beside scratch_
  ZipState st_;
};

template <class... Ts>
std::unique_ptr<Iter<std::tuple<Ts...>>> ZipDef<Ts...>::instantiate(BuildContext& ctx) const {
  return std::make_unique<ZipIter<Ts...>>(ctx, *this);
}

template <class... Ts>
Pipeline<std::tuple<Ts...>> zip(const Pipeline<Ts>&... ps) {
  static_assert(sizeof...(Ts) >= 2, "zip needs at least two inputs");
  return make_pipeline<ZipDef<Ts...>>(std::tuple{ps.def()...}, ZipOptions{});
}

template <class T>
class ZipAllDef final : public NodeDef<std::vector<T>> {
 public:
  ZipAllDef(std::vector<std::shared_ptr<const NodeDef<T>>> ins, ZipOptions o)
      : NodeDef<std::vector<T>>("zip", o.name, {}, untyped(ins)), inputs_(std::move(ins)) {
    check_other_input(inputs_.size(), "zip", o.name);
  }
  std::unique_ptr<Iter<std::vector<T>>> instantiate(BuildContext& ctx) const override;
  const auto& typed_inputs() const { return inputs_; }

 private:
  std::vector<std::shared_ptr<const NodeDef<T>>> inputs_;
};

template <class T>
class ZipAllIter final : public Hooked<std::vector<T>> {
 public:
  ZipAllIter(BuildContext& ctx, const ZipAllDef<T>& def)
      : Hooked<std::vector<T>>(ctx, "zip"), inputs_(instantiate_all(def.typed_inputs(), ctx)), scratch_(inputs_.size()) {}

 protected:
  std::size_t pull_chunk(std::vector<std::vector<T>>& out, std::size_t max) override {
    if (st_.ended) return 0;
    std::size_t n = max;
    const bool traced = this->traced();
    for (std::size_t j = 0; j < inputs_.size(); ++j) {
      scratch_[j].clear();
      trace_scratch_[j].clear();
      n = pull_exact(*inputs_[j], scratch_[j], n, traced ? &trace_scratch_[j] : nullptr);
    }
    if (n < max) st_.ended = true;
    for (std::size_t i = 0; i < n; ++i) {
      std::vector<T> row;
      row.reserve(inputs_.size());
      for (auto& buf : scratch_) row.push_back(std::move(buf[i]));
      out.push_back(std::move(row));
      if (traced) this->traces().push_back(zip_provenance(trace_scratch_, i));
    }
    return n;
  }
  void save_state(StateWriter& w) const override { w.write(st_); }
  void restore_state(StateReader& r) override { r.read(st_); }
  std::vector<IterBase*> inputs() const override { return bases_of(inputs_); }
  bool carries_provenance() const override { return true; }
  bool holds_no_elements() const override { return true; }
  bool recomputable() const override {
    return std::all_of(inputs_.begin(), inputs_.end(), [](const auto& in) { return in->recomputable(); });
  }
  /// A row is made again from its inputs' elements, one group of its provenance each.
  std::vector<T> recompute(const Provenance& p) const override {
    const std::optional<std::vector<Provenance>> parts = batch_elements(p, false);
    if (!parts || parts->size() != inputs_.size())
      throw SnapshotError(this->label() + ": a restore key names no row of this node (" + to_string(p) + ")");
    std::vector<T> row;
    for (std::size_t j = 0; j < inputs_.size(); ++j) row.push_back(inputs_[j]->recompute((*parts)[j]));
    return row;
  }

 private:
  std::vector<std::unique_ptr<Iter<T>>> inputs_;
  std::vector<std::vector<T>> scratch_;
  std::vector<std::vector<Provenance>> trace_scratch_ = std::vector<std::vector<Provenance>>(inputs_.size());
  ZipState st_;
};

template <class T>
std::unique_ptr<Iter<std::vector<T>>> ZipAllDef<T>::instantiate(BuildContext& ctx) const {
  return std::make_unique<ZipAllIter<T>>(ctx, *this);
}

template <class T>
Pipeline<std::vector<T>> zip_all(const std::vector<Pipeline<T>>& ps, ZipOptions o = {}) {
  return make_pipeline<ZipAllDef<T>>(defs_of(ps), std::move(o));
}

struct ZipKind {
  static constexpr std::string_view name = "zip";
  /// As long as its shortest input.
  static std::optional<std::uint64_t> length(const Params&, std::span<const std::uint64_t> in, const LengthAt&) {
    if (in.empty()) return std::nullopt;
    return *std::min_element(in.begin(), in.end());
  }
  static constexpr std::string_view doc =
      "Rows of one element from the input and one from each pipeline of `with`, until any input ends.";
  static constexpr std::string_view provenance = "a row's groups are its inputs' elements', in order; made again from each input";
  static constexpr ParamSchema params[] = {
      {.name = "with", .type = ParamType::pipelines, .doc = "the other inputs (Python: positional)"},
  };
  using State = ZipState;
  static RescaleRule rescale() { return RescaleRule::refused(rescale::kNotDealt); }
  /// `{"op": "zip", "with": [PIPELINE, ...]}`: tuples (as lists) of one element of each input; inputs of
  /// several element types give rows of values.
  template <class Spec>
  static SpecPipeline from_spec(Spec& s) {
    ZipOptions o{.name = s.name()};
    const std::vector<SpecPipeline> others = s.pipelines("with");
    const bool one_type = std::all_of(others.begin(), others.end(), [&](const SpecPipeline& q) {
      return q.visit([&]<class U>(const Pipeline<U>&) { return s.input().template holds<U>(); });
    });
    const bool deep = s.input().visit([]<class T>(const Pipeline<T>&) { return !is_spec_element_v<std::vector<T>>; });
    if (one_type && !deep)
      return s.input().apply([&]<class T>(const Pipeline<T>& p) requires is_spec_element_v<std::vector<T>> {
        std::vector<Pipeline<T>> all{p};
        for (const auto& q : others) all.push_back(q.template get<T>());
        return zip_all(all, o);
      });
    std::vector<Pipeline<Value>> all{spec_values(s.input())};
    for (const auto& q : others) all.push_back(spec_values(q));
    return zip_all(all, o);
  }
};

}  // namespace dpipe
