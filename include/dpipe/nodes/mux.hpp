#pragma once
/// One element from each input in turn. `mux` ends as soon as any input is exhausted and drops the
/// round in progress (torch's Multiplexer); `mux_longest` (its own header) goes on with the inputs
/// that remain. In: T, T, … → Out: T. State: the rest of the pulled rounds, and which inputs are live.
#include <algorithm>
#include <string>
#include <vector>

#include "dpipe/nodes/concat.hpp"
#include "dpipe/kit/rescale.hpp"
#include "dpipe/kit/spec.hpp"

namespace dpipe {

/// A mux's saved state (mux_longest's too): the rest of the pulled rounds, and which inputs are live.
/// `Elems` is std::vector<T> in the node, ElementBlobs where only the field names matter.
template <class Elems>
struct MuxState {
  Elems pending{};
  std::vector<std::uint8_t> live{};
  template <class A>
  void fields(A& a) {
    a("pending", pending);
    a("live", live);
  }
};

struct MuxOptions {
  std::string name{};
};

template <Snapshottable T>
class MuxDef final : public NodeDef<T> {
 public:
  /// `longest`: keep going with the remaining inputs (kind "mux_longest").
  MuxDef(std::vector<std::shared_ptr<const NodeDef<T>>> ins, bool longest, MuxOptions o)
      : NodeDef<T>(longest ? "mux_longest" : "mux", o.name, {}, untyped(ins)), inputs_(std::move(ins)),
        longest_(longest) {
    check_other_input(inputs_.size(), longest ? "mux_longest" : "mux", o.name);
  }
  std::unique_ptr<Iter<T>> instantiate(BuildContext& ctx) const override;
  const auto& typed_inputs() const { return inputs_; }
  bool longest() const { return longest_; }

 private:
  std::vector<std::shared_ptr<const NodeDef<T>>> inputs_;
  bool longest_;
};

template <Snapshottable T>
class MuxIter final : public Hooked<T> {
 public:
  MuxIter(BuildContext& ctx, const MuxDef<T>& def)
      : Hooked<T>(ctx, def.kind()), inputs_(instantiate_all(def.typed_inputs(), ctx)), longest_(def.longest()),
        scratch_(inputs_.size()) {
    st_.live.assign(inputs_.size(), 1);
  }

 protected:
  std::size_t pull_chunk(std::vector<T>& out, std::size_t max) override {
    std::size_t n = 0;
    while (n < max) {
      if (next_ < st_.pending.size()) {
        const std::size_t k = std::min(max - n, st_.pending.size() - next_);
        std::move(st_.pending.begin() + std::ptrdiff_t(next_), st_.pending.begin() + std::ptrdiff_t(next_ + k),
                  std::back_inserter(out));
        next_ += k;
        n += k;
        continue;
      }
      st_.pending.clear();
      next_ = 0;
      if (!pull_rounds(std::max<std::size_t>(1, (max - n) / inputs_.size()))) break;
    }
    return n;
  }
  void save_state(StateWriter& w) const override {
    w.write(MuxState<std::vector<T>>{{st_.pending.begin() + std::ptrdiff_t(next_), st_.pending.end()}, st_.live});
  }
  void restore_state(StateReader& r) override {
    r.read(st_);
    next_ = 0;
    if (st_.live.size() != inputs_.size())
      r.fail("live flags for " + std::to_string(st_.live.size()) + " inputs, the node has " +
             std::to_string(inputs_.size()));
  }
  std::vector<IterBase*> inputs() const override { return bases_of(inputs_); }

 private:
  /// Pulls up to `k` rounds into `pending`; false when nothing more will come.
  bool pull_rounds(std::size_t k) {
    if (!longest_) {  // mux: full rounds only; the first exhausted input ends the stream
      if (!st_.live[0]) return false;
      std::size_t rounds = k;
      for (std::size_t j = 0; j < inputs_.size(); ++j) {
        scratch_[j].clear();
        rounds = pull_exact(*inputs_[j], scratch_[j], rounds);
      }
      if (rounds < k) std::fill(st_.live.begin(), st_.live.end(), 0);
      for (std::size_t i = 0; i < rounds; ++i)
        for (auto& buf : scratch_) st_.pending.push_back(std::move(buf[i]));
      return rounds > 0;
    }
    std::vector<std::size_t> got(inputs_.size(), 0);
    bool any = false;
    for (std::size_t j = 0; j < inputs_.size(); ++j) {
      scratch_[j].clear();
      if (!st_.live[j]) continue;
      got[j] = pull_exact(*inputs_[j], scratch_[j], k);
      if (got[j] < k) st_.live[j] = 0;
      any = any || got[j] > 0;
    }
    for (std::size_t i = 0; i < k; ++i)
      for (std::size_t j = 0; j < inputs_.size(); ++j)
        if (i < got[j]) st_.pending.push_back(std::move(scratch_[j][i]));
    return any;
  }

  std::vector<std::unique_ptr<Iter<T>>> inputs_;
  bool longest_;
  std::vector<std::vector<T>> scratch_;
  MuxState<std::vector<T>> st_;
  std::size_t next_ = 0;
};

template <Snapshottable T>
std::unique_ptr<Iter<T>> MuxDef<T>::instantiate(BuildContext& ctx) const {
  return std::make_unique<MuxIter<T>>(ctx, *this);
}

/// `p | mux_with({q, r})`: p, q, r, p, q, r, … until any input ends.
template <class T>
auto mux_with(std::vector<Pipeline<T>> others, MuxOptions o = {}) {
  return make_closure([others = std::move(others), o = std::move(o)](const Pipeline<T>& p) {
    auto defs = defs_of(others);
    defs.insert(defs.begin(), p.def());
    return make_pipeline<MuxDef<T>>(std::move(defs), false, o);
  });
}

template <class T, class... More>
Pipeline<T> mux(const Pipeline<T>& first, const More&... more) {
  return make_pipeline<MuxDef<T>>(defs_of(std::vector<Pipeline<T>>{first, more...}), false, MuxOptions{});
}

struct MuxKind {
  static constexpr std::string_view name = "mux";
  static constexpr std::string_view doc =
      "One element from each input in turn, until any input is exhausted (the round in progress is dropped).";
  static constexpr ParamSchema params[] = {
      {.name = "with", .type = ParamType::pipelines, .doc = "the other inputs (Python: positional)"},
  };
  using State = MuxState<ElementBlobs>;
  static RescaleRule rescale() { return RescaleRule::refused(rescale::kNotDealt); }
  /// `{"op": "mux", "with": [PIPELINE, ...]}`: one element of each input in turn, until one ends.
  template <class Spec>
  static SpecPipeline from_spec(Spec& s) {
    MuxOptions o{.name = s.name()};
    return s.input().apply(
        [&]<class T>(const Pipeline<T>& p) { return p | mux_with(s.template inputs<T>("with"), o); });
  }
};

}  // namespace dpipe
