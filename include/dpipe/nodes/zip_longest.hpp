#pragma once
/// One row per position of its inputs until every input ended, `fill` standing for the inputs that ended
/// (torchdata's zip_longest). `zip_longest_all({a, b, …}, fill)`: inputs of one type T → Out:
/// std::vector<T>. In specs the rows are batches of values (any input types), `fill` null (None) unless
/// given. State: which inputs ended. Rescale: refused.
#include <algorithm>
#include <string>
#include <vector>

#include "dpipe/kit/length.hpp"
#include "dpipe/kit/rescale.hpp"
#include "dpipe/kit/spec.hpp"
#include "dpipe/nodes/concat.hpp"
#include "dpipe/nodes/map.hpp"

namespace dpipe {

struct ZipLongestState {
  std::vector<std::int64_t> ended{};  // 1 for each input that ended
  template <class A>
  void fields(A& a) { a("ended", ended); }
};

struct ZipLongestOptions {
  std::string name{};
};

template <class T>
class ZipLongestDef final : public NodeDef<std::vector<T>> {
 public:
  ZipLongestDef(std::vector<std::shared_ptr<const NodeDef<T>>> ins, T fill, const ZipLongestOptions& o, Params params)
      : NodeDef<std::vector<T>>("zip_longest", o.name, std::move(params), untyped(ins)), inputs_(std::move(ins)),
        fill_(std::move(fill)) {
    check_other_input(inputs_.size(), "zip_longest", o.name);
  }
  std::unique_ptr<Iter<std::vector<T>>> instantiate(BuildContext& ctx) const override;
  const auto& typed_inputs() const { return inputs_; }
  const T& fill() const { return fill_; }

 private:
  std::vector<std::shared_ptr<const NodeDef<T>>> inputs_;
  T fill_;
};

template <class T>
class ZipLongestIter final : public Hooked<std::vector<T>> {
 public:
  ZipLongestIter(BuildContext& ctx, const ZipLongestDef<T>& def)
      : Hooked<std::vector<T>>(ctx, "zip_longest"), inputs_(instantiate_all(def.typed_inputs(), ctx)),
        scratch_(inputs_.size()), fill_(def.fill()) {
    st_.ended.assign(inputs_.size(), 0);
  }

 protected:
  std::size_t pull_chunk(std::vector<std::vector<T>>& out, std::size_t max) override {
    std::size_t rows = 0;
    for (std::size_t j = 0; j < inputs_.size(); ++j) {
      scratch_[j].clear();
      if (st_.ended[j]) continue;
      const std::size_t got = pull_exact(*inputs_[j], scratch_[j], max);
      if (got < max) st_.ended[j] = 1;
      rows = std::max(rows, got);
    }
    for (std::size_t i = 0; i < rows; ++i) {
      std::vector<T> row;
      row.reserve(inputs_.size());
      for (auto& buf : scratch_) row.push_back(i < buf.size() ? std::move(buf[i]) : fill_);
      out.push_back(std::move(row));
    }
    return rows;
  }
  void save_state(StateWriter& w) const override { w.write(st_); }
  void restore_state(StateReader& r) override {
    r.read(st_);
    if (st_.ended.size() != inputs_.size())
      r.fail("it records " + std::to_string(st_.ended.size()) + " inputs, the node has " + std::to_string(inputs_.size()));
  }
  std::vector<IterBase*> inputs() const override { return bases_of(inputs_); }

 private:
  std::vector<std::unique_ptr<Iter<T>>> inputs_;
  std::vector<std::vector<T>> scratch_;
  T fill_;
  ZipLongestState st_;
};

template <class T>
std::unique_ptr<Iter<std::vector<T>>> ZipLongestDef<T>::instantiate(BuildContext& ctx) const {
  return std::make_unique<ZipLongestIter<T>>(ctx, *this);
}

/// Rows of one element of each input until all ended, `fill` for the ended ones.
template <class T>
Pipeline<std::vector<T>> zip_longest_all(const std::vector<Pipeline<T>>& ps, T fill = T{}, const ZipLongestOptions& o = {}) {
  Params params;
  if constexpr (is_spec_element_v<T>) {
    std::string text;
    append_element_json(text, fill);
    params.push_back({"fill", text});
  }
  return make_pipeline<ZipLongestDef<T>>(defs_of(ps), std::move(fill), o, std::move(params));
}

/// A spec pipeline's elements as values (zip of inputs of several types, zip_longest).
inline Pipeline<Value> spec_values(const SpecPipeline& p) {
  return p.visit([](const auto& q) -> Pipeline<Value> {
    using T = typename std::decay_t<decltype(q)>::element_type;
    if constexpr (std::is_same_v<T, Value>) return q;
    else return q | map([](T x) { return spec_value(std::move(x)); }, MapOptions{});
  });
}

struct ZipLongestKind {
  static constexpr std::string_view name = "zip_longest";
  /// As long as its longest input.
  static std::optional<std::uint64_t> length(const Params&, std::span<const std::uint64_t> in, const LengthAt&) {
    if (in.empty()) return std::nullopt;
    return *std::max_element(in.begin(), in.end());
  }
  static constexpr std::string_view doc =
      "Rows of one element from the input and one from each pipeline of `with` until every input ended, `fill` "
      "for the ended ones (torchdata's zip_longest); the rows are values, so the inputs may yield different types.";
  static constexpr ParamSchema params[] = {
      {.name = "with", .type = ParamType::pipelines, .doc = "the other inputs (Python: positional)"},
      {.name = "fill", .type = ParamType::integer, .doc = "what stands for an ended input: an integer, or null (None)",
       .fallback = "null"},
  };
  using State = ZipLongestState;
  static RescaleRule rescale() { return RescaleRule::refused(rescale::kNotDealt); }
  /// `{"op": "zip_longest", "with": [PIPELINE, ...], "fill": null}`
  template <class Spec>
  static SpecPipeline from_spec(Spec& s) {
    const ZipLongestOptions o{.name = s.name()};
    std::optional<std::int64_t> fill;
    s.param("fill", fill);
    std::vector<Pipeline<Value>> all{spec_values(s.input())};
    for (const auto& q : s.pipelines("with")) all.push_back(spec_values(q));
    return zip_longest_all(all, fill ? Value::integer(*fill) : Value::none(), o);
  }
};

}  // namespace dpipe
