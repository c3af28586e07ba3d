// The Value codec and its JSON text.
#include "dpipe/value.hpp"

#include <cstring>

#include <charconv>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include "dpipe/detail/text_json.hpp"
#include "dpipe/fields.hpp"
#include "dpipe/kit/spec.hpp"

namespace dpipe {

std::size_t ValueArray::item_size(const std::string& dtype) {
  if (dtype.size() < 3 || dtype.size() > 4) return 0;
  if (dtype[0] != '<' && dtype[0] != '>' && dtype[0] != '|' && dtype[0] != '=') return 0;
  const char kind = dtype[1];
  std::size_t size = 0;
  const auto [end, ec] = std::from_chars(dtype.data() + 2, dtype.data() + dtype.size(), size);
  if (ec != std::errc() || end != dtype.data() + dtype.size()) return 0;
  switch (kind) {
    case 'b': return size == 1 ? size : 0;
    case 'i':
    case 'u': return size == 1 || size == 2 || size == 4 || size == 8 ? size : 0;
    case 'f': return size == 2 || size == 4 || size == 8 ? size : 0;
    case 'c': return size == 8 || size == 16 ? size : 0;
    default: return 0;
  }
}

std::string ValueArray::check() const {
  const std::size_t item = item_size(dtype);
  if (item == 0) return "array type '" + dtype + "' is not one of numbers (kinds b, i, u, f, c)";
  if (shape.size() > 32) return "array of " + std::to_string(shape.size()) + " dimensions (at most 32)";
  std::uint64_t items = 1;
  for (const std::uint64_t d : shape) {
    if (d != 0 && items > std::numeric_limits<std::uint64_t>::max() / d) return "array shape overflows";
    items *= d;
  }
  if (items > std::numeric_limits<std::uint64_t>::max() / item || items * item != data.size())
    return "array of " + std::to_string(items) + " items of " + std::to_string(item) + " bytes holds " +
           std::to_string(data.size()) + " bytes";
  return {};
}

namespace detail {

void encode_value(ByteWriter& w, const Value& v) {
  w.put<std::uint8_t>(static_cast<std::uint8_t>(v.kind));
  switch (v.kind) {
    case Value::Kind::none: break;
    case Value::Kind::boolean: w.put<std::uint8_t>(std::get<bool>(v.data) ? 1 : 0); break;
    case Value::Kind::integer: w.put(std::get<std::int64_t>(v.data)); break;
    case Value::Kind::real: w.put(std::get<double>(v.data)); break;
    case Value::Kind::string:
    case Value::Kind::bytes: w.str(std::get<std::string>(v.data)); break;
    case Value::Kind::list:
    case Value::Kind::tuple:
    case Value::Kind::dict: {
      const auto& items = std::get<std::vector<Value>>(v.data);
      w.put<std::uint64_t>(items.size());
      for (const auto& x : items) encode_value(w, x);
      break;
    }
    case Value::Kind::array: {
      const auto& a = v.as_array();
      w.str(a.dtype);
      w.put<std::uint64_t>(a.shape.size());
      for (const std::uint64_t d : a.shape) w.put(d);
      w.str(a.data);
      break;
    }
  }
}

Value decode_value(ByteReader& r, int depth) {
  if (depth > kValueMaxDepth) r.fail("a value nests deeper than " + std::to_string(kValueMaxDepth) + " levels");
  const auto kind = r.get<std::uint8_t>();
  switch (static_cast<Value::Kind>(kind)) {
    case Value::Kind::none: return Value::none();
    case Value::Kind::boolean: {
      const auto b = r.get<std::uint8_t>();
      if (b > 1) r.fail("a boolean value of " + std::to_string(b));
      return Value::boolean(b == 1);
    }
    case Value::Kind::integer: return Value::integer(r.get<std::int64_t>());
    case Value::Kind::real: return Value::real(r.get<double>());
    case Value::Kind::string: return Value::string(std::string(r.str()));
    case Value::Kind::bytes: return Value::bytes(std::string(r.str()));
    case Value::Kind::list:
    case Value::Kind::tuple:
    case Value::Kind::dict: {
      const std::size_t n = r.length(1);
      if (static_cast<Value::Kind>(kind) == Value::Kind::dict && n % 2 != 0)
        r.fail("a dict value of " + std::to_string(n) + " keys and values (an odd count)");
      std::vector<Value> items;
      items.reserve(n);
      for (std::size_t i = 0; i < n; ++i) items.push_back(decode_value(r, depth + 1));
      return Value{static_cast<Value::Kind>(kind), std::move(items)};
    }
    case Value::Kind::array: {
      ValueArray a;
      a.dtype = std::string(r.str());
      const std::size_t dims = r.length(8);
      for (std::size_t i = 0; i < dims; ++i) a.shape.push_back(r.get<std::uint64_t>());
      a.data = std::string(r.str());
      if (const std::string why = a.check(); !why.empty()) r.fail(why);
      return Value::array(std::move(a));
    }
  }
  r.fail("unknown value kind " + std::to_string(kind));
}

}  // namespace detail

namespace {
void append_number(std::string& out, double d) {
  if (!std::isfinite(d)) {
    out += std::isnan(d) ? "\"nan\"" : (d > 0 ? "\"inf\"" : "\"-inf\"");
    return;
  }
  char buf[32];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, d);  // shortest round trip
  out.append(buf, ec == std::errc() ? end : buf);
}

/// An array of little-endian integers, booleans or floats of 4 or 8 bytes as nested JSON lists of numbers
/// (false for any other array: complex, big-endian or half floats keep the dtype/shape/base64 form).
bool append_array_numbers(std::string& out, const ValueArray& a) {
  if (!a.check().empty() || (a.dtype[0] != '<' && a.dtype[0] != '|' && a.dtype[0] != '=')) return false;
  const char kind = a.dtype[1];
  const std::size_t item = ValueArray::item_size(a.dtype);
  if (kind == 'c' || (kind == 'f' && item == 2)) return false;
  const char* p = a.data.data();
  auto item_json = [&](std::size_t i) {
    const char* q = p + i * item;
    if (kind == 'b') {
      out += *q ? "true" : "false";
    } else if (kind == 'f') {
      if (item == 4) {
        float f;
        std::memcpy(&f, q, 4);
        if (!std::isfinite(f)) return append_number(out, f);
        char buf[32];
        const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, f);  // the float's shortest text
        out.append(buf, ec == std::errc() ? end : buf);
      } else {
        double d;
        std::memcpy(&d, q, 8);
        append_number(out, d);
      }
    } else if (kind == 'i') {
      std::int64_t v = 0;
      switch (item) {
        case 1: { std::int8_t x; std::memcpy(&x, q, 1); v = x; break; }
        case 2: { std::int16_t x; std::memcpy(&x, q, 2); v = x; break; }
        case 4: { std::int32_t x; std::memcpy(&x, q, 4); v = x; break; }
        default: std::memcpy(&v, q, 8);
      }
      out += std::to_string(v);
    } else {
      std::uint64_t v = 0;
      std::memcpy(&v, q, item);  // little-endian: the low bytes first
      out += std::to_string(v);
    }
  };
  // Dimension k of the items from flat index `first` on (C order), recursively (at most 32 deep).
  auto nest = [&](auto& self, std::size_t k, std::uint64_t first) -> void {
    if (k == a.shape.size()) return item_json(static_cast<std::size_t>(first));
    out += '[';
    for (std::uint64_t j = 0; j < a.shape[k]; ++j) {
      if (j) out += ", ";
      self(self, k + 1, first * a.shape[k] + j);
    }
    out += ']';
  };
  nest(nest, 0, 0);
  return true;
}
}  // namespace

bool read_int64s(const Value& v, std::vector<std::int64_t>& out) {
  out.clear();
  if (v.kind == Value::Kind::list || v.kind == Value::Kind::tuple) {
    const auto& items = std::get<std::vector<Value>>(v.data);
    out.reserve(items.size());
    for (const Value& x : items) {
      if (x.kind != Value::Kind::integer) return false;
      out.push_back(std::get<std::int64_t>(x.data));
    }
    return true;
  }
  if (v.kind != Value::Kind::array) return false;
  const auto& a = v.as_array();
  if (a.shape.size() != 1 || a.dtype.size() < 3 || (a.dtype[0] != '<' && a.dtype[0] != '|' && a.dtype[0] != '=') ||
      (a.dtype[1] != 'i' && a.dtype[1] != 'u'))
    return false;
  const std::size_t item = ValueArray::item_size(a.dtype);
  if (item == 0 || a.data.size() != a.shape[0] * item) return false;
  const std::size_t n = a.data.size() / item;
  out.resize(n);
  const char* p = a.data.data();
  if (a.dtype[1] == 'i' && item == 8) {
    std::memcpy(out.data(), p, n * 8);
    return true;
  }
  for (std::size_t i = 0; i < n; ++i) {
    const char* q = p + i * item;
    if (a.dtype[1] == 'u') {
      std::uint64_t x = 0;
      std::memcpy(&x, q, item);
      if (item == 8 && x > static_cast<std::uint64_t>(INT64_MAX)) return false;
      out[i] = static_cast<std::int64_t>(x);
    } else if (item == 1) { std::int8_t x; std::memcpy(&x, q, 1); out[i] = x; }
    else if (item == 2) { std::int16_t x; std::memcpy(&x, q, 2); out[i] = x; }
    else { std::int32_t x; std::memcpy(&x, q, 4); out[i] = x; }
  }
  return true;
}

void append_value_json(std::string& out, const Value& v) {
  switch (v.kind) {
    case Value::Kind::none: out += "null"; return;
    case Value::Kind::boolean: out += std::get<bool>(v.data) ? "true" : "false"; return;
    case Value::Kind::integer: out += std::to_string(std::get<std::int64_t>(v.data)); return;
    case Value::Kind::real: append_number(out, std::get<double>(v.data)); return;
    case Value::Kind::string: SpecElement<SpecStr>::append_json(out, std::get<std::string>(v.data)); return;
    case Value::Kind::bytes:
      out += "{\"base64\": \"";
      detail::append_base64(out, std::get<std::string>(v.data));
      out += "\"}";
      return;
    case Value::Kind::list:
    case Value::Kind::tuple: {
      const auto& items = std::get<std::vector<Value>>(v.data);
      out += '[';
      for (std::size_t i = 0; i < items.size(); ++i) {
        if (i) out += ", ";
        append_value_json(out, items[i]);
      }
      out += ']';
      return;
    }
    case Value::Kind::dict: {
      const auto& items = std::get<std::vector<Value>>(v.data);
      bool string_keys = true;
      for (std::size_t i = 0; i < items.size(); i += 2) string_keys = string_keys && items[i].kind == Value::Kind::string;
      out += string_keys ? '{' : '[';
      for (std::size_t i = 0; i + 1 < items.size(); i += 2) {
        if (i) out += ", ";
        if (!string_keys) out += '[';
        append_value_json(out, items[i]);
        out += string_keys ? ": " : ", ";
        append_value_json(out, items[i + 1]);
        if (!string_keys) out += ']';
      }
      out += string_keys ? '}' : ']';
      return;
    }
    case Value::Kind::array: {
      const auto& a = v.as_array();
      if (append_array_numbers(out, a)) return;
      out += "{\"dtype\": ";
      SpecElement<SpecStr>::append_json(out, a.dtype);
      out += ", \"shape\": [";
      for (std::size_t i = 0; i < a.shape.size(); ++i) {
        if (i) out += ", ";
        out += std::to_string(a.shape[i]);
      }
      out += "], \"base64\": \"";
      detail::append_base64(out, a.data);
      out += "\"}";
      return;
    }
  }
}

}  // namespace dpipe

namespace dpipe::detail {

namespace {
const char* kind_text(const Value& v) {
  switch (v.kind) {
    case Value::Kind::none: return "None";
    case Value::Kind::boolean: return "a bool";
    case Value::Kind::integer: return "an integer";
    case Value::Kind::real: return "a float";
    case Value::Kind::string: return "a string";
    case Value::Kind::bytes: return "bytes";
    case Value::Kind::list: return "a list";
    case Value::Kind::tuple: return "a tuple";
    case Value::Kind::dict: return "a dict";
    case Value::Kind::array: return "an array";
  }
  return "a value";
}
}  // namespace

const Value& record_field(const Value& record, const std::string& field) {
  if (!is_record(record))
    throw std::runtime_error(std::string("field '") + field + "': the element is " + kind_text(record) +
                             ", not a record (a dict with string keys)");
  const Value* f = find_field(record, field);
  if (!f) throw std::runtime_error("the record has no field '" + field + "'");
  return *f;
}

void field_type_error(const std::string& field, const Value& v, const char* wanted) {
  throw std::runtime_error("field '" + field + "' holds " + kind_text(v) + ", the function takes " + wanted);
}

}  // namespace dpipe::detail
