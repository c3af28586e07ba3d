#pragma once
/// Pipeline<T>: an immutable, cheap-to-copy description of a graph whose output elements are T.
/// Nothing runs until an Engine starts it. Node factories return closures, so pipelines compose
/// left to right like the data flows: `range(0, n) | shuffle({.buffer = 1000}) | batch({.size = 32})`;
/// `c1 | c2` composes two closures into one.
#include <charconv>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>

#include "dpipe/kit/node.hpp"

namespace dpipe {

template <class T>
class Pipeline {
 public:
  using element_type = T;

  explicit Pipeline(std::shared_ptr<const NodeDef<T>> def) : def_(std::move(def)) {
    if (!def_) throw ConfigError("a pipeline needs a node");
  }
  const std::shared_ptr<const NodeDef<T>>& def() const { return def_; }

 private:
  std::shared_ptr<const NodeDef<T>> def_;
};

template <class T>
struct is_pipeline : std::false_type {};
template <class T>
struct is_pipeline<Pipeline<T>> : std::true_type {};

/// A pipeline adaptor: a function from Pipeline<In> to Pipeline<Out>.
template <class F>
struct Closure {
  F fn;
  template <class T>
  auto operator()(const Pipeline<T>& p) const {
    return fn(p);
  }
};

template <class F>
Closure<std::decay_t<F>> make_closure(F&& f) {
  return {std::forward<F>(f)};
}

template <class T, class F>
auto operator|(const Pipeline<T>& p, const Closure<F>& c) {
  return c.fn(p);
}

template <class F, class G>
auto operator|(Closure<F> a, Closure<G> b) {
  return make_closure([a = std::move(a), b = std::move(b)](const auto& p) { return b.fn(a.fn(p)); });
}

/// Builds a Pipeline<T> from a definition type and its constructor arguments.
template <class Def, class... Args>
auto make_pipeline(Args&&... args) {
  using T = typename Def::element_type;
  return Pipeline<T>(std::make_shared<const Def>(std::forward<Args>(args)...));
}

/// Formats a parameter for the fingerprint, snapshots and DOT export. Floating-point values are written in
/// the shortest form that reads back to the same value, so two values that differ in any digit differ here.
template <class V>
std::string param_text(const V& v) {
  if constexpr (std::is_same_v<V, bool>) return v ? "true" : "false";
  else if constexpr (std::is_floating_point_v<V>) {
    char buf[64];
    const auto r = std::to_chars(buf, buf + sizeof buf, v);
    return std::string(buf, r.ptr);
  } else if constexpr (std::is_arithmetic_v<V>) return std::to_string(v);
  else return std::string(v);
}

}  // namespace dpipe
