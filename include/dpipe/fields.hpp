#pragma once
/// Structured elements: the records the spec and Python front ends carry between the LLM nodes
/// (parse_json, tokenize, pack, padded_batch) are Value dicts with string keys ("fields"), each field an
/// integer, a float, a string, bytes, a list, or a numeric array (token arrays are 1-D "<i8" arrays).
/// In Python such an element is a dict of numpy arrays and str; `dpipe run` prints it as a JSON object
/// keyed by field name, arrays as (nested) lists of numbers. C++ users keep their own structs.
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dpipe/kit/schema.hpp"
#include "dpipe/value.hpp"

namespace dpipe {

/// Whether `v` is a dict whose keys are all strings.
inline bool is_record(const Value& v) {
  if (v.kind != Value::Kind::dict) return false;
  const auto& items = std::get<std::vector<Value>>(v.data);
  for (std::size_t i = 0; i < items.size(); i += 2)
    if (items[i].kind != Value::Kind::string) return false;
  return true;
}

/// The field `name` of a record, or null (also when `row` is not a dict).
inline const Value* find_field(const Value& row, std::string_view name) {
  if (row.kind != Value::Kind::dict) return nullptr;
  const auto& items = std::get<std::vector<Value>>(row.data);
  for (std::size_t i = 0; i + 1 < items.size(); i += 2)
    if (items[i].kind == Value::Kind::string && std::get<std::string>(items[i].data) == name) return &items[i + 1];
  return nullptr;
}
inline Value* find_field(Value& row, std::string_view name) {
  return const_cast<Value*>(find_field(static_cast<const Value&>(row), name));
}

/// Sets field `name` of the record `row` (replacing it, or appending it after the others).
inline void set_field(Value& row, std::string_view name, Value v) {
  if (Value* f = find_field(row, name)) {
    *f = std::move(v);
    return;
  }
  auto& items = std::get<std::vector<Value>>(row.data);
  items.push_back(Value::string(std::string(name)));
  items.push_back(std::move(v));
}

/// An empty record, with room for `fields` fields.
inline Value make_record(std::size_t fields = 0) {
  std::vector<Value> items;
  items.reserve(2 * fields);
  return Value::dict(std::move(items));
}

/// A numeric array of shape `shape` holding `items` (int64 → "<i8", float → "<f4", double → "<f8").
template <class N>
Value numeric_array(std::span<const N> items, std::vector<std::uint64_t> shape) {
  static_assert(std::is_same_v<N, std::int64_t> || std::is_same_v<N, float> || std::is_same_v<N, double>);
  ValueArray a;
  a.dtype = std::is_same_v<N, std::int64_t> ? "<i8" : (std::is_same_v<N, float> ? "<f4" : "<f8");
  a.shape = std::move(shape);
  a.data.assign(reinterpret_cast<const char*>(items.data()), items.size() * sizeof(N));
  return Value::array(std::move(a));
}
/// A 1-D int64 array.
inline Value int64_array(std::span<const std::int64_t> items) {
  return numeric_array(items, {static_cast<std::uint64_t>(items.size())});
}

/// Reads a 1-D integer array (any signed or unsigned item size, little-endian) or a list of integers
/// into `out` (replacing its contents); false when `v` is neither.
bool read_int64s(const Value& v, std::vector<std::int64_t>& out);

/// The `field` and `into` parameters of map, filter and flat_map (dpipe/field_function.hpp).
inline constexpr ParamSchema kFieldParam = {
    .name = "field", .type = ParamType::text,
    .doc = "records: the field the function reads (absent: the whole element)", .fallback = "null",
    .torch = "input_col"};
inline constexpr ParamSchema kIntoParam = {
    .name = "into", .type = ParamType::text,
    .doc = "records: the field the function's result goes into (absent: `field`)", .fallback = "null",
    .torch = "output_col"};

namespace detail {
/// The field `field` of `record`; std::runtime_error (an error of the element) when `record` is not a
/// record or lacks it.
const Value& record_field(const Value& record, const std::string& field);
inline Value& record_field(Value& record, const std::string& field) {
  return const_cast<Value&>(record_field(std::as_const(record), field));
}
/// std::runtime_error: the field holds `v`, the function takes `wanted` ("an integer").
[[noreturn]] void field_type_error(const std::string& field, const Value& v, const char* wanted);
}  // namespace detail

}  // namespace dpipe
