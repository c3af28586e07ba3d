#pragma once
/// Each element with its index, counted from `start` on each instance (torch's enumerate). In: T → Out:
/// std::tuple<std::int64_t, T> in C++; in specs rows [index, element]: a batch of integers for integers,
/// else a batch of values. State: the next index. Rescale: refused (an index counts one instance's stream).
#include <string>
#include <tuple>
#include <vector>

#include "dpipe/kit/length.hpp"
#include "dpipe/kit/rescale.hpp"
#include "dpipe/kit/spec.hpp"
#include "dpipe/value.hpp"

namespace dpipe {

struct EnumerateState {
  std::int64_t next = 0;
  template <class A>
  void fields(A& a) { a("next", next); }
};

struct EnumerateOptions {
  std::int64_t start = 0;
  std::string name{};
};

/// The rows of C++'s enumerate: (index, element).
struct IndexTuple {
  template <class T>
  std::tuple<std::int64_t, T> operator()(std::int64_t i, T&& x) const { return {i, std::forward<T>(x)}; }
};
/// The rows of specs' enumerate: [index, element] of one type.
struct IndexRow {
  std::vector<std::int64_t> operator()(std::int64_t i, std::int64_t x) const { return {i, x}; }
  template <class T>
  std::vector<Value> operator()(std::int64_t i, T&& x) const { return {Value::integer(i), spec_value(std::forward<T>(x))}; }
};

template <class T, class Row>
using enumerated_t = std::decay_t<std::invoke_result_t<const Row&, std::int64_t, T&&>>;

template <class T, class Row>
class EnumerateDef final : public NodeDef<enumerated_t<T, Row>> {
 public:
  using Out = enumerated_t<T, Row>;
  EnumerateDef(std::shared_ptr<const NodeDef<T>> in, EnumerateOptions o)
      : NodeDef<Out>("enumerate", o.name, {{"start", param_text(o.start)}}, {in}), input_(std::move(in)), start_(o.start) {}
  std::unique_ptr<Iter<Out>> instantiate(BuildContext& ctx) const override;
  const NodeDef<T>& input() const { return *input_; }
  std::int64_t start() const { return start_; }

 private:
  std::shared_ptr<const NodeDef<T>> input_;
  std::int64_t start_;
};

template <class T, class Row>
class EnumerateIter final : public Hooked<enumerated_t<T, Row>> {
 public:
  using Out = enumerated_t<T, Row>;
  EnumerateIter(BuildContext& ctx, const EnumerateDef<T, Row>& def) : Hooked<Out>(ctx, "enumerate"), input_(def.input().instantiate(ctx)) {
    st_.next = def.start();
  }

 protected:
  std::size_t pull_chunk(std::vector<Out>& out, std::size_t max) override {
    scratch_.clear();
    const std::size_t n = input_->pull(scratch_, max);
    for (auto& x : scratch_) {
      out.push_back(Row{}(st_.next, std::move(x)));
      st_.next = static_cast<std::int64_t>(static_cast<std::uint64_t>(st_.next) + 1);  // wraps, as C++20 defines it
    }
    return n;
  }
  void save_state(StateWriter& w) const override { w.write(st_); }
  void restore_state(StateReader& r) override { r.read(st_); }
  std::vector<IterBase*> inputs() const override { return {input_.get()}; }

 private:
  std::unique_ptr<Iter<T>> input_;
  std::vector<T> scratch_;
  EnumerateState st_;
};

template <class T, class Row>
std::unique_ptr<Iter<enumerated_t<T, Row>>> EnumerateDef<T, Row>::instantiate(BuildContext& ctx) const {
  return std::make_unique<EnumerateIter<T, Row>>(ctx, *this);
}

/// `p | enumerate()`: (index, element) tuples.
inline auto enumerate(EnumerateOptions o = {}) {
  return make_closure([o = std::move(o)](const auto& p) {
    using T = typename std::decay_t<decltype(p)>::element_type;
    return make_pipeline<EnumerateDef<T, IndexTuple>>(p.def(), o);
  });
}

struct EnumerateKind {
  static constexpr std::string_view name = "enumerate";
  static constexpr LengthFn length = &same_length;
  static constexpr std::string_view doc =
      "Rows [index, element], the index counted from `start` on each instance (torch's enumerate).";
  static constexpr ParamSchema params[] = {
      {.name = "start", .type = ParamType::integer, .doc = "the first index (torch's starting_index)", .fallback = "0",
       .positional = true},
  };
  using State = EnumerateState;
  static RescaleRule rescale() { return RescaleRule::refused(rescale::kNotDealt); }
  /// `{"op": "enumerate", "start": 0}`
  template <class Spec>
  static SpecPipeline from_spec(Spec& s) {
    EnumerateOptions o{.name = s.name()};
    s.param("start", o.start);
    return s.input().apply([&]<class T>(const Pipeline<T>& p) requires is_spec_element_v<enumerated_t<T, IndexRow>> {
      return make_pipeline<EnumerateDef<T, IndexRow>>(p.def(), o);
    });
  }
};

}  // namespace dpipe
