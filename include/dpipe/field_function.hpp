#pragma once
/// Functions of one field of a record (dpipe/fields.hpp), for map, filter and flat_map: `field` names the
/// field the function reads, `into` the field its result goes into (default: the same), as torch's
/// input_col / output_col.
///
///   records | map(field_map<std::int64_t>(affine, "doc", "doc2")) | filter(field_filter<std::int64_t>(odd, "doc"))
///
/// The field's value is converted to the function's argument `Arg` (std::int64_t from an integer,
/// std::string from a string or bytes, or the Value itself) and the result back to a Value (an integer,
/// a float, a bool, a string, a token array, or a Value). A flat_map's result becomes one copy of the
/// record per output, the output in `into`. An element that is not a record, lacks the field or holds
/// another type is an error of that element (on_error = skip drops it).
#include <concepts>
#include <cstdint>
#include <exception>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "dpipe/fields.hpp"
#include "dpipe/nodes/flat_map.hpp"
#include "dpipe/nodes/map.hpp"

namespace dpipe {

namespace detail {
/// The field's value as the function's argument: moved from when `v` is an rvalue (map into the same field).
template <class Arg, class V>
Arg field_argument(V&& v, const std::string& field) {
  if constexpr (std::is_same_v<Arg, Value>) {
    return std::forward<V>(v);
  } else if constexpr (std::is_same_v<Arg, std::int64_t>) {
    if (v.kind != Value::Kind::integer) field_type_error(field, v, "an integer");
    return std::get<std::int64_t>(v.data);
  } else if constexpr (std::is_same_v<Arg, std::string>) {
    if (v.kind != Value::Kind::string && v.kind != Value::Kind::bytes) field_type_error(field, v, "a string or bytes");
    return std::get<std::string>(std::forward<V>(v).data);
  } else {
    static_assert(sizeof(Arg) == 0, "a field function takes std::int64_t, std::string or dpipe::Value");
  }
}

/// fn(the field): the field moved from when the result replaces it.
template <class Arg, class Fn>
decltype(auto) call_on_field(const Fn& fn, Value& f, const std::string& field, bool replaced) {
  return replaced ? fn(field_argument<Arg>(std::move(f), field)) : fn(field_argument<Arg>(std::as_const(f), field));
}

template <class R>
Value field_value(R&& r) {
  using T = std::decay_t<R>;
  if constexpr (std::is_same_v<T, Value>) return std::forward<R>(r);
  else if constexpr (std::is_same_v<T, bool>) return Value::boolean(r);
  else if constexpr (std::is_integral_v<T>) return Value::integer(static_cast<std::int64_t>(r));
  else if constexpr (std::is_floating_point_v<T>) return Value::real(static_cast<double>(r));
  else if constexpr (std::is_same_v<T, std::string>) return Value::string(std::forward<R>(r));
  else if constexpr (std::is_same_v<T, std::vector<std::int64_t>>) return int64_array(std::span<const std::int64_t>(r));
  else static_assert(sizeof(T) == 0, "a field function returns a number, a bool, a string, a token array or a Value");
}

template <class Fn>
Params describe_field_fn(const Fn& fn, const std::string& field, const std::string& into) {
  Params p = describe_fn(fn);
  p.push_back({"field", field});
  p.push_back({"into", into});
  return p;
}
}  // namespace detail

/// map: record → record with `into` = fn(record[field]).
template <class Arg, class Fn>
struct FieldMap {
  Fn fn;
  std::string field, into;
  Value operator()(Value record) const {
    Value& f = detail::record_field(record, field);
    set_field(record, into, detail::field_value(detail::call_on_field<Arg>(fn, f, field, into == field)));
    return record;
  }
  bool skips(const std::exception& e) const { return skippable(fn, e); }
  Params describe() const { return detail::describe_field_fn(fn, field, into); }
};

/// filter: keeps a record when fn(record[field]) holds.
template <class Arg, class Fn>
struct FieldFilter {
  Fn fn;
  std::string field;
  bool operator()(const Value& record) const {
    return static_cast<bool>(fn(detail::field_argument<Arg>(detail::record_field(record, field), field)));
  }
  bool skips(const std::exception& e) const { return skippable(fn, e); }
  Params describe() const {
    Params p = describe_fn(fn);
    p.push_back({"field", field});
    return p;
  }
};

/// A field flat_map's streamed expansion: the record, the field its outputs go into, and what remains of
/// the function's own Expansion (builtins::Iota's). Made one output at a time, saved as those three, so
/// `range` on a field of 2^40 holds one record, never its outputs.
template <class Rest>
struct FieldExpansion {
  using value_type = Value;
  Value record;
  std::string into;
  Rest rest;
  bool empty() const { return rest.empty(); }
  Value front() const {
    Value out = record;
    set_field(out, into, detail::field_value(rest.front()));
    return out;
  }
  void pop_front() { rest.pop_front(); }
};

template <class Rest>
struct Codec<FieldExpansion<Rest>> {
  static constexpr std::size_t kMinBytes = Codec<Value>::kMinBytes + Codec<std::string>::kMinBytes + Codec<Rest>::kMinBytes;
  static void encode(ByteWriter& w, const FieldExpansion<Rest>& v) {
    Codec<Value>::encode(w, v.record);
    Codec<std::string>::encode(w, v.into);
    Codec<Rest>::encode(w, v.rest);
  }
  static FieldExpansion<Rest> decode(ByteReader& r) {
    FieldExpansion<Rest> v;
    v.record = Codec<Value>::decode(r);
    v.into = Codec<std::string>::decode(r);
    v.rest = Codec<Rest>::decode(r);
    return v;
  }
  static std::string tag() { return "tup<value,str," + Codec<Rest>::tag() + ">"; }
};

/// flat_map: record → one copy of it per output of fn(record[field]), the output in `into`. A result that
/// is an Expansion stays one (FieldExpansion: streamed and saved as a remainder); any other is collected.
template <class Arg, class Fn>
struct FieldFlatMap {
  Fn fn;
  std::string field, into;
  auto operator()(Value record) const {
    Value& f = detail::record_field(record, field);
    auto result = detail::call_on_field<Arg>(fn, f, field, into == field);
    using Result = decltype(result);
    if constexpr (Expansion<Result>) {
      return FieldExpansion<Result>{std::move(record), into, std::move(result)};
    } else {
      std::vector<Value> out;
      for (auto&& y : result) {
        Value copy = record;
        set_field(copy, into, detail::field_value(std::forward<decltype(y)>(y)));
        out.push_back(std::move(copy));
      }
      return out;
    }
  }
  bool skips(const std::exception& e) const { return skippable(fn, e); }
  Params describe() const { return detail::describe_field_fn(fn, field, into); }
};

template <class Arg, class Fn>
FieldMap<Arg, Fn> field_map(Fn fn, std::string field, std::string into = {}) {
  if (into.empty()) into = field;
  return {std::move(fn), std::move(field), std::move(into)};
}
template <class Arg, class Fn>
FieldFilter<Arg, Fn> field_filter(Fn fn, std::string field) {
  return {std::move(fn), std::move(field)};
}
template <class Arg, class Fn>
FieldFlatMap<Arg, Fn> field_flat_map(Fn fn, std::string field, std::string into = {}) {
  if (into.empty()) into = field;
  return {std::move(fn), std::move(field), std::move(into)};
}

}  // namespace dpipe
