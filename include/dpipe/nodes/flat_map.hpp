#pragma once
/// Replaces each element by the elements of the range fn returns (a vector, say), in order.
/// In: T → Out: the range's value type. State: the outputs of the current input not yet yielded.
#include <iterator>
#include <ranges>
#include <string>

#include "dpipe/nodes/map.hpp"
#include "dpipe/rescale.hpp"

namespace dpipe {

/// A flat_map's saved state: the outputs of the current input not yet yielded. `Elems` is std::vector<Out>
/// in the node, ElementBlobs in its rescale rule.
template <class Elems>
struct FlatMapState {
  Elems pending{};
  template <class A>
  void fields(A& a) {
    a("pending", pending);
  }
};

struct FlatMapOptions {
  std::string name{};
};

template <class In, class Fn>
using flat_map_result_t = std::ranges::range_value_t<map_result_t<In, Fn>>;

template <class In, class Fn>
class FlatMapDef final : public NodeDef<flat_map_result_t<In, Fn>> {
 public:
  using Out = flat_map_result_t<In, Fn>;
  FlatMapDef(std::shared_ptr<const NodeDef<In>> in, Fn fn, FlatMapOptions o)
      : NodeDef<Out>("flat_map", o.name, describe_fn(fn), {in}), input_(std::move(in)), fn_(std::move(fn)) {}
  std::unique_ptr<Iter<Out>> instantiate(BuildContext& ctx) const override;
  const NodeDef<In>& input() const { return *input_; }
  const Fn& fn() const { return fn_; }

 private:
  std::shared_ptr<const NodeDef<In>> input_;
  Fn fn_;
};

template <class In, class Fn>
class FlatMapIter final : public Hooked<flat_map_result_t<In, Fn>> {
 public:
  using Out = flat_map_result_t<In, Fn>;
  FlatMapIter(BuildContext& ctx, const FlatMapDef<In, Fn>& def)
      : Hooked<Out>(ctx, "flat_map"), input_(def.input().instantiate(ctx)), fn_(def.fn()) {}

 protected:
  std::size_t pull_chunk(std::vector<Out>& out, std::size_t max) override {
    std::size_t n = 0;
    while (n < max) {
      if (next_ < pending_.size()) {
        const std::size_t k = std::min(max - n, pending_.size() - next_);
        std::move(pending_.begin() + std::ptrdiff_t(next_), pending_.begin() + std::ptrdiff_t(next_ + k),
                  std::back_inserter(out));
        next_ += k;
        n += k;
        continue;
      }
      scratch_.clear();
      if (input_->pull(scratch_, 1) == 0) break;
      pending_.clear();
      next_ = 0;
      try {
        for (auto&& y : fn_(std::move(scratch_[0]))) pending_.push_back(std::forward<decltype(y)>(y));
      } catch (...) {
        pending_.clear();
        return this->fail_after(n);
      }
    }
    return n;
  }
  void save_state(StateWriter& w) const override {
    w.write(FlatMapState<std::vector<Out>>{{pending_.begin() + std::ptrdiff_t(next_), pending_.end()}});
  }
  void restore_state(StateReader& r) override {
    FlatMapState<std::vector<Out>> st;
    r.read(st);
    pending_ = std::move(st.pending);
    next_ = 0;
  }
  std::vector<IterBase*> inputs() const override { return {input_.get()}; }

 private:
  std::unique_ptr<Iter<In>> input_;
  Fn fn_;
  std::vector<Out> pending_;
  std::size_t next_ = 0;
  std::vector<In> scratch_;
};

template <class In, class Fn>
std::unique_ptr<Iter<flat_map_result_t<In, Fn>>> FlatMapDef<In, Fn>::instantiate(BuildContext& ctx) const {
  return std::make_unique<FlatMapIter<In, Fn>>(ctx, *this);
}

template <class Fn>
auto flat_map(Fn fn, FlatMapOptions o = {}) {
  return make_closure([fn = std::move(fn), o = std::move(o)](const auto& p) {
    using In = typename std::decay_t<decltype(p)>::element_type;
    return make_pipeline<FlatMapDef<In, Fn>>(p.def(), fn, o);
  });
}

struct FlatMapKind {
  static constexpr std::string_view name = "flat_map";

  /// Rescale: the pending outputs of every old instance are pooled and dealt round-robin to the new ones.
  static RescaleRule rescale() {
    return RescaleRule::dealt([](const RescaleInput& in) {
      using S = FlatMapState<ElementBlobs>;
      const auto old = in.read<S>();
      const auto dealt = rescale::deal(rescale::lists(old, &S::pending), in.new_slots());
      std::vector<S> out(dealt.size());
      for (std::size_t j = 0; j < out.size(); ++j) out[j].pending = dealt[j];
      return in.write(out);
    });
  }

  /// `{"op": "flat_map", "fn": NAME, ...the function's parameters}`: a function the front end provides.
  template <class Spec>
  static SpecPipeline from_spec(Spec& s) {
    FlatMapOptions o{.name = s.name()};
    return s.flat_map_function([&](const auto& p, auto fn) { return p | flat_map(std::move(fn), o); });
  }
};

}  // namespace dpipe
