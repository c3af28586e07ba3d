#pragma once
/// Pipelines from specs: `{"seed": S, "pipeline": [{"op": KIND, ...params}, ...]}`. A front end (the
/// JSON one in json_spec/, later Python) reads each node's parameters and hands them to the kind's own
/// spec builder, `XKind::from_spec`, in the kind's header: the builder fills the kind's option struct
/// and calls the same factory a C++ user calls, so every check exists once, in the node. The result is
/// the typed Pipeline<T> a C++ user would write: no interpreter over dynamic values on the hot path.
///
/// The element types a spec pipeline can carry form an open list, SpecElementTypes: adding one is a
/// line there and a SpecElement specialisation (its name and how it is written as JSON).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "dpipe/detail/text_json.hpp"
#include "dpipe/pipeline.hpp"
#include "dpipe/kit/schema.hpp"
#include "dpipe/value.hpp"

namespace dpipe {

template <class... T>
struct TypeList {};

using SpecInt = std::int64_t;
using SpecStr = std::string;

/// The element types of spec pipelines, each once.
using SpecElementTypes = TypeList<SpecInt, SpecStr, std::vector<SpecInt>, std::vector<SpecStr>,
                                  std::vector<std::vector<SpecInt>>, std::vector<std::vector<SpecStr>>, Value,
                                  std::vector<Value>>;

namespace detail {
template <class T, class List>
struct type_index;
template <class T, class... Ts>
struct type_index<T, TypeList<Ts...>> {
  static constexpr std::size_t value = [] {
    std::size_t i = 0;
    const bool found = ((std::is_same_v<T, Ts> ? true : (++i, false)) || ...);
    return found ? i : sizeof...(Ts);
  }();
};
template <class List>
struct type_count;
template <class... Ts>
struct type_count<TypeList<Ts...>> {
  static constexpr std::size_t value = sizeof...(Ts);
};
}  // namespace detail

/// Whether specs carry elements of type T.
template <class T>
inline constexpr bool is_spec_element_v =
    detail::type_index<T, SpecElementTypes>::value < detail::type_count<SpecElementTypes>::value;

/// How a spec element type is named in messages ("integer", "batch of string") and written as JSON.
template <class T>
struct SpecElement;
template <>
struct SpecElement<SpecInt> {
  static std::string name() { return "integer"; }
  static void append_json(std::string& out, SpecInt v) { out += std::to_string(v); }
};
template <>
struct SpecElement<SpecStr> {
  static std::string name() { return "string"; }
  /// Valid UTF-8: a JSON string, quotes, backslashes and control characters escaped, other bytes as
  /// they are. Any other bytes: `{"base64": "..."}` (detail/text_json.hpp), so the line stays JSON and
  /// the bytes are kept exactly.
  static void append_json(std::string& out, const SpecStr& v) {
    if (!detail::is_utf8(v)) {
      out += "{\"base64\": \"";
      detail::append_base64(out, v);
      out += "\"}";
      return;
    }
    out += '"';
    for (const char ch : v) {
      const auto c = static_cast<unsigned char>(ch);
      if (c == '"' || c == '\\') {
        out += '\\';
        out += ch;
      } else if (c == '\n') {
        out += "\\n";
      } else if (c == '\r') {
        out += "\\r";
      } else if (c == '\t') {
        out += "\\t";
      } else if (c < 0x20) {
        static constexpr char kHex[] = "0123456789abcdef";
        out += "\\u00";
        out += kHex[c >> 4];
        out += kHex[c & 15];
      } else {
        out += ch;
      }
    }
    out += '"';
  }
};
/// What a Python callable returns with `out: "value"` (value.hpp).
template <>
struct SpecElement<Value> {
  static std::string name() { return "value"; }
  static void append_json(std::string& out, const Value& v) { append_value_json(out, v); }
};
template <class T>
struct SpecElement<std::vector<T>> {
  static std::string name() { return "batch of " + SpecElement<T>::name(); }
  static void append_json(std::string& out, const std::vector<T>& v) {
    out += '[';
    for (std::size_t i = 0; i < v.size(); ++i) {
      if (i) out += ", ";
      SpecElement<T>::append_json(out, v[i]);
    }
    out += ']';
  }
};

/// Appends one element as JSON (numbers, strings, arrays for batches and tuples).
template <class T>
void append_element_json(std::string& out, const T& v) {
  SpecElement<T>::append_json(out, v);
}

/// An element of a spec type as a Value: integers, strings, lists of them; values as they are (rows of
/// inputs of several types: zip, zip_longest, enumerate).
inline Value spec_value(SpecInt x) { return Value::integer(x); }
inline Value spec_value(SpecStr x) { return Value::string(std::move(x)); }
inline Value spec_value(Value x) { return x; }
template <class T>
Value spec_value(std::vector<T> xs) {
  std::vector<Value> items;
  items.reserve(xs.size());
  for (auto& x : xs) items.push_back(spec_value(std::move(x)));
  return Value::list(std::move(items));
}

/// A Pipeline<T> of one of the spec element types, its type known at run time.
class SpecPipeline {
 public:
  template <class T>
    requires is_spec_element_v<T>
  SpecPipeline(Pipeline<T> p)  // NOLINT: implicit, like a variant's
      : def_(p.def()), index_(detail::type_index<T, SpecElementTypes>::value) {}

  /// "integer", "batch of string", …
  std::string type_name() const;
  template <class T>
  bool holds() const {
    return index_ == detail::type_index<T, SpecElementTypes>::value;
  }
  /// The typed pipeline; a ConfigError when it holds another type.
  template <class T>
  Pipeline<T> get() const {
    if (!holds<T>()) refuse_type(SpecElement<T>::name());
    return typed<T>();
  }
  const NodeDefBase& def() const { return *def_; }

  /// Calls f(const Pipeline<T>&) with this pipeline's element type T and returns its result.
  template <class F>
  decltype(auto) visit(F&& f) const {
    return visit_in(std::forward<F>(f), SpecElementTypes{});
  }

  /// Applies an adaptor: f(const Pipeline<T>&) returns a Pipeline<U>, which becomes the result. `f` may be a
  /// constrained generic lambda; an element type it does not take is a ConfigError saying `takes` ("unbatch
  /// takes batches") and what the input yields, as is a result whose type specs cannot carry.
  template <class F>
  SpecPipeline apply(F&& f, std::string_view takes = "this node does not take such elements") const {
    return apply_in(f, takes, SpecElementTypes{});
  }

 private:
  template <class F, class T0, class... Ts>
  decltype(auto) visit_in(F&& f, TypeList<T0, Ts...>) const {
    using R = decltype(f(std::declval<const Pipeline<T0>&>()));
    R (*const table[])(F&, const std::shared_ptr<const NodeDefBase>&) = {
        +[](F& g, const std::shared_ptr<const NodeDefBase>& d) -> R {
          return g(Pipeline<T0>(std::static_pointer_cast<const NodeDef<T0>>(d)));
        },
        +[](F& g, const std::shared_ptr<const NodeDefBase>& d) -> R {
          return g(Pipeline<Ts>(std::static_pointer_cast<const NodeDef<Ts>>(d)));
        }...};
    return table[index_](f, def_);
  }
  template <class F, class... Ts>
  SpecPipeline apply_in(F& f, std::string_view what, TypeList<Ts...>) const {
    SpecPipeline (*const table[])(F&, const SpecPipeline&, std::string_view) = {
        +[](F& g, const SpecPipeline& self, std::string_view w) -> SpecPipeline {
          if constexpr (std::is_invocable_v<F&, const Pipeline<Ts>&>) {
            auto out = g(self.typed<Ts>());
            using U = typename decltype(out)::element_type;
            if constexpr (is_spec_element_v<U>) return SpecPipeline(std::move(out));
            else self.refuse_input(w, true);
          } else {
            self.refuse_input(w, false);
          }
        }...};
    return table[index_](f, *this, what);
  }

  // The pipeline as the type it holds (the caller knows it does).
  template <class T>
  Pipeline<T> typed() const {
    return Pipeline<T>(std::static_pointer_cast<const NodeDef<T>>(def_));
  }
  // The errors of get() and apply(), out of their per-type code.
  [[noreturn]] void refuse_type(const std::string& expected) const {
    throw ConfigError("expected a pipeline of " + expected + "s, got one of " + type_name() + "s");
  }
  [[noreturn]] void refuse_input(std::string_view takes, bool result) const {
    throw ConfigError(std::string(takes) + ", but its input yields " + type_name() + "s" +
                      (result ? " and the result would be a type specs do not carry" : ""));
  }

  std::shared_ptr<const NodeDefBase> def_;
  std::size_t index_;
};

inline std::string SpecPipeline::type_name() const {
  return visit([]<class T>(const Pipeline<T>&) { return SpecElement<T>::name(); });
}

}  // namespace dpipe
