#pragma once
/// Value: a dynamic element — None, bool, int, float, str, bytes, list, tuple, dict and n-dimensional
/// arrays of numbers. A Python callable whose `out` is "value" returns into the pipeline through it: the
/// result is converted once, under the GIL, into this plain C++ tree, so the engine moves it between
/// threads without the GIL and a snapshot saves it with the typed codec below (never pickle: restoring
/// a snapshot runs no code). Kinds of Python object outside this list are refused where they are
/// returned, naming the callable.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "dpipe/kit/codec.hpp"

namespace dpipe {

/// An n-dimensional array of fixed-size numbers: numpy's type string (byte order, kind among b i u f c,
/// item size: "<i8", "<f4", "|u1", "|b1"), the shape, and the items' bytes in C order.
struct ValueArray {
  std::string dtype;
  std::vector<std::uint64_t> shape;
  std::string data;
  bool operator==(const ValueArray&) const = default;

  /// The item size the type string names, or 0 when it is not one an array of numbers can have.
  static std::size_t item_size(const std::string& dtype);
  /// Whether the type string, the shape and the byte count agree; the reason when they do not.
  std::string check() const;
};

/// A ValueArray held behind a pointer and copied deeply, so an array's type string, shape and bytes do not
/// size every Value (48 bytes instead of 104: a batch of 16 scalars or short lists fits the allocator's
/// small-block caches). Moved from, it reads as an empty array (as a moved-from ValueArray would).
class ArrayBox {
 public:
  ArrayBox(ValueArray a) : p_(std::make_unique<ValueArray>(std::move(a))) {}  // NOLINT: a Value is made from its array
  ArrayBox(const ArrayBox& o) : p_(std::make_unique<ValueArray>(o.get())) {}
  ArrayBox(ArrayBox&&) noexcept = default;
  ArrayBox& operator=(const ArrayBox& o) {
    p_ = std::make_unique<ValueArray>(o.get());
    return *this;
  }
  ArrayBox& operator=(ArrayBox&&) noexcept = default;
  bool operator==(const ArrayBox& o) const { return get() == o.get(); }
  const ValueArray& get() const { return p_ ? *p_ : empty(); }
  ValueArray& get() {
    if (!p_) p_ = std::make_unique<ValueArray>();
    return *p_;
  }

 private:
  static const ValueArray& empty() {
    static const ValueArray none{};
    return none;
  }
  std::unique_ptr<ValueArray> p_;
};

struct Value {
  enum class Kind : std::uint8_t { none, boolean, integer, real, string, bytes, list, tuple, dict, array };

  Kind kind = Kind::none;
  /// none: monostate; boolean; integer; real; string (UTF-8) and bytes: std::string; list, tuple and
  /// dict: the items (a dict's keys and values alternate, in insertion order); array (as_array()).
  std::variant<std::monostate, bool, std::int64_t, double, std::string, std::vector<Value>, ArrayBox> data;

  /// The array of a Value of kind array.
  const ValueArray& as_array() const { return std::get<ArrayBox>(data).get(); }
  ValueArray& as_array() { return std::get<ArrayBox>(data).get(); }

  static Value none() { return {}; }
  static Value boolean(bool b) { return {Kind::boolean, b}; }
  static Value integer(std::int64_t i) { return {Kind::integer, i}; }
  static Value real(double d) { return {Kind::real, d}; }
  static Value string(std::string s) { return {Kind::string, std::move(s)}; }
  static Value bytes(std::string s) { return {Kind::bytes, std::move(s)}; }
  static Value list(std::vector<Value> items) { return {Kind::list, std::move(items)}; }
  static Value tuple(std::vector<Value> items) { return {Kind::tuple, std::move(items)}; }
  /// `keys_and_values`: key 0, value 0, key 1, value 1, ...
  static Value dict(std::vector<Value> keys_and_values) { return {Kind::dict, std::move(keys_and_values)}; }
  static Value array(ValueArray a) { return {Kind::array, std::move(a)}; }

  bool operator==(const Value&) const = default;
};

/// Values nest at most this deep (a snapshot nesting deeper is corrupt; a Python result, refused).
inline constexpr int kValueMaxDepth = 64;

/// Appends a value as JSON: numbers, strings, lists for lists and tuples, objects for dicts whose keys
/// are all strings (else a list of [key, value] pairs), {"base64": ...} for bytes, and
/// arrays of little-endian integers, booleans and 4- or 8-byte floats as nested lists of numbers (others as
/// {"dtype", "shape", "base64"}). Non-finite floats are written as strings ("nan", "inf").
void append_value_json(std::string& out, const Value& v);

namespace detail {
void encode_value(ByteWriter& w, const Value& v);
Value decode_value(ByteReader& r, int depth);
}  // namespace detail

/// A kind byte, then the payload; containers as a count and their items. Decoding checks every kind,
/// count, array shape and byte count, and the nesting depth.
template <>
struct Codec<Value> {
  static constexpr std::size_t kMinBytes = 1;
  static void encode(ByteWriter& w, const Value& v) { detail::encode_value(w, v); }
  static Value decode(ByteReader& r) { return detail::decode_value(r, 0); }
  static std::string tag() { return "value"; }
};

}  // namespace dpipe
