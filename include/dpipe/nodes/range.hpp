#pragma once
/// Integers from `start` towards `stop` (exclusive) by `step`. Out: int64_t. State: the next index.
#include <cstdint>
#include <string>

#include "dpipe/kit/length.hpp"
#include "dpipe/pipeline.hpp"
#include "dpipe/kit/rescale.hpp"
#include "dpipe/kit/spec.hpp"

namespace dpipe {

/// A range's saved state: the next index.
struct RangeState {
  std::uint64_t index = 0;
  template <class A>
  void fields(A& a) { a("index", index); }
};

struct RangeOptions {
  std::int64_t step = 1;
  std::string name{};
};

class RangeDef final : public NodeDef<std::int64_t>, public RandomAccess<std::int64_t> {
 public:
  RangeDef(std::int64_t start, std::int64_t stop, RangeOptions o)
      : NodeDef("range", o.name,
                {{"start", param_text(start)}, {"stop", param_text(stop)}, {"step", param_text(o.step)}}),
        start_(start), step_(o.step) {
    if (o.step == 0) throw ConfigError(node_label("range", o.name) + ": step must not be 0");
    const __int128 span = static_cast<__int128>(stop) - start;
    const __int128 n = o.step > 0 ? (span + o.step - 1) / o.step : (span + o.step + 1) / o.step;
    count_ = n > 0 ? static_cast<std::uint64_t>(n) : 0;
  }
  // Declared inline (it is defined below the Iter): a class without a non-inline virtual has its vtable
  // emitted only where an object is made, not in every file that includes this header.
  inline std::unique_ptr<Iter<std::int64_t>> instantiate(BuildContext& ctx) const override;
  std::int64_t start() const { return start_; }
  std::int64_t step() const { return step_; }
  std::uint64_t count() const { return count_; }
  std::uint64_t size() const override { return count_; }
  std::int64_t at(std::uint64_t i) const override {  // wraps like the spec's 64-bit integers
    return static_cast<std::int64_t>(static_cast<std::uint64_t>(start_) + i * static_cast<std::uint64_t>(step_));
  }

 private:
  std::int64_t start_, step_;
  std::uint64_t count_ = 0;
};

class RangeIter final : public Hooked<std::int64_t> {
 public:
  RangeIter(BuildContext& ctx, const RangeDef& def) : Hooked(ctx, "range"), def_(def) {}

 protected:
  std::size_t pull_chunk(std::vector<std::int64_t>& out, std::size_t max) override {
    const std::uint64_t left = def_.count() - st_.index;
    const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(left, max));
    const std::size_t before = out.size();
    out.resize(before + n);
    std::int64_t* p = out.data() + before;
    // Unsigned arithmetic wraps like the spec's 64-bit integers.
    std::uint64_t v = static_cast<std::uint64_t>(def_.start()) + st_.index * static_cast<std::uint64_t>(def_.step());
    for (std::size_t i = 0; i < n; ++i, v += static_cast<std::uint64_t>(def_.step())) p[i] = static_cast<std::int64_t>(v);
    if (this->traced())
      for (std::size_t i = 0; i < n; ++i) this->trace_source(st_.index + i);
    st_.index += n;
    return n;
  }
  void save_state(StateWriter& w) const override { w.write(st_); }
  void restore_state(StateReader& r) override {
    r.read(st_);
    if (st_.index > def_.count()) r.fail("index " + std::to_string(st_.index) + " is past the range's end");
  }
  std::vector<IterBase*> inputs() const override { return {}; }
  bool carries_provenance() const override { return true; }
  bool one_base() const override { return true; }
  bool recomputable() const override { return true; }
  std::int64_t recompute(const Provenance& p) const override { return this->recompute_at(def_, p); }
  bool holds_no_elements() const override { return true; }

 private:
  const RangeDef& def_;
  RangeState st_;
};

inline std::unique_ptr<Iter<std::int64_t>> RangeDef::instantiate(BuildContext& ctx) const {
  return std::make_unique<RangeIter>(ctx, *this);
}

inline Pipeline<std::int64_t> range(std::int64_t start, std::int64_t stop, RangeOptions o = {}) {
  return make_pipeline<RangeDef>(start, stop, std::move(o));
}
inline Pipeline<std::int64_t> range(std::int64_t stop) { return range(0, stop); }

struct RangeKind {
  static constexpr std::string_view name = "range";
  /// Every instance reads all of it.
  static std::optional<std::uint64_t> length(const Params& p, std::span<const std::uint64_t>, const LengthAt&) {
    const auto start = number_param<std::int64_t>(p, "start"), stop = number_param<std::int64_t>(p, "stop"),
               step = number_param<std::int64_t>(p, "step");
    if (!start || !stop || !step || *step == 0) return std::nullopt;
    const bool up = *step > 0;
    if (up ? *stop <= *start : *stop >= *start) return 0;
    const std::uint64_t span = up ? static_cast<std::uint64_t>(*stop) - static_cast<std::uint64_t>(*start)
                                   : static_cast<std::uint64_t>(*start) - static_cast<std::uint64_t>(*stop);
    const std::uint64_t stride = up ? static_cast<std::uint64_t>(*step) : 0 - static_cast<std::uint64_t>(*step);
    return (span - 1) / stride + 1;
  }
  static constexpr std::string_view doc =
      "Integers from `start` towards `stop` (exclusive) by `step`; every instance reads all of it (put a sampler after it to deal them). Python: range(stop) or range(start, stop[, step]).";
  /// Provenance (docs/design.md, "Provenance"; a kind without this line does not carry it).
  static constexpr std::string_view provenance = "names element i by position i; makes it again from its key";
  static constexpr ParamSchema params[] = {
      {.name = "start", .type = ParamType::integer, .doc = "the first integer", .fallback = "0", .positional = true},
      {.name = "stop", .type = ParamType::integer, .doc = "where it stops (exclusive)", .positional = true},
      {.name = "step", .type = ParamType::integer, .doc = "the step (not 0)", .fallback = "1", .positional = true},
  };
  using State = RangeState;
  static constexpr bool source = true;
  /// Rescale: refused when it runs itself (every instance reads all of it); read through a sampler, it
  /// keeps no records and the sampler's positions are dealt.
  static RescaleRule rescale() { return RescaleRule::refused(rescale::kReadInFull); }
  /// `{"op": "range", "start": 0, "stop": N, "step": 1}`
  template <class Spec>
  static SpecPipeline from_spec(Spec& s) {
    std::int64_t start = 0, stop = 0;
    RangeOptions o{.name = s.name()};
    s.param("start", start);
    s.required("stop", stop);
    s.param("step", o.step);
    return range(start, stop, o);
  }
};

}  // namespace dpipe
