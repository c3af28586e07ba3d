// padded_batch: records → one record of padded [B, L] arrays.
#include "dpipe/nodes/padded_batch.hpp"

#include <cstring>

namespace dpipe {

Params PaddedBatchKind::checked_params(const PaddedBatchOptions& o) {
  const std::string node = node_label("padded_batch", o.name);
  if (o.size <= 0) throw ConfigError(node + ": size must be positive, got " + param_text(o.size));
  if (o.length < 0) throw ConfigError(node + ": length must not be negative, got " + param_text(o.length));
  if (o.multiple <= 0) throw ConfigError(node + ": multiple must be positive, got " + param_text(o.multiple));
  // Each row of a batch is padded to these: memory follows them, not the input.
  if (o.length > PaddedBatchKind::kMostItems)
    throw ConfigError(node + ": length must be at most 2^24 items per row, got " + param_text(o.length));
  if (o.multiple > PaddedBatchKind::kMostItems)
    throw ConfigError(node + ": multiple must be at most 2^24 items per row, got " + param_text(o.multiple));
  if (o.length > 0 && o.length % o.multiple != 0)
    throw ConfigError(node + ": length " + param_text(o.length) + " is not a multiple of " + param_text(o.multiple));
  return {{"size", param_text(o.size)}, {"length", param_text(o.length)}, {"multiple", param_text(o.multiple)},
          {"pad", param_text(o.pad)}, {"drop_last", param_text(o.drop_last)}};
}

namespace detail {

namespace {
bool is_vector(const Value& v) {
  if (v.kind != Value::Kind::array) return false;
  const auto& a = v.as_array();
  return a.shape.size() == 1 && a.check().empty();
}

// `pad` as one item of type `dtype` (little-endian; floats as the value).
std::string pad_item(const std::string& dtype, std::int64_t pad) {
  const std::size_t item = ValueArray::item_size(dtype);
  std::string out(item, '\0');
  if (dtype[1] == 'f' && item == 4) {
    const float f = static_cast<float>(pad);
    std::memcpy(out.data(), &f, 4);
  } else if (dtype[1] == 'f' && item == 8) {
    const double d = static_cast<double>(pad);
    std::memcpy(out.data(), &d, 8);
  } else {
    std::memcpy(out.data(), &pad, std::min<std::size_t>(item, 8));  // the low bytes: the value, wrapped
  }
  return out;
}

// Column of one field over the batch: rows of 1-D arrays padded to `len`.
Value pad_rows(const std::vector<const Value*>& cells, std::size_t len, std::int64_t pad) {
  const auto& first = cells.front()->as_array();
  const std::size_t item = ValueArray::item_size(first.dtype);
  const std::string filler = pad_item(first.dtype, pad);
  ValueArray a{.dtype = first.dtype, .shape = {cells.size(), len}, .data = {}};
  a.data.reserve(cells.size() * len * item);
  for (const Value* c : cells) {
    const auto& x = c->as_array();
    a.data += x.data;
    for (std::size_t k = x.shape[0]; k < len; ++k) a.data += filler;
  }
  return Value::array(std::move(a));
}

Value scalars(const std::vector<const Value*>& cells) {
  const Value::Kind kind = cells.front()->kind;
  std::vector<std::int64_t> ints;
  std::vector<double> reals;
  std::string bools;
  for (const Value* c : cells) {
    if (kind == Value::Kind::integer) ints.push_back(std::get<std::int64_t>(c->data));
    else if (kind == Value::Kind::real) reals.push_back(std::get<double>(c->data));
    else bools.push_back(std::get<bool>(c->data) ? 1 : 0);
  }
  const std::uint64_t b = cells.size();
  if (kind == Value::Kind::integer) return numeric_array<std::int64_t>(ints, {b});
  if (kind == Value::Kind::real) return numeric_array<double>(reals, {b});
  return Value::array(ValueArray{.dtype = "|b1", .shape = {b}, .data = bools});
}
}  // namespace

Value pad_batch(std::vector<Value>& elements, const PaddedBatchOptions& o, std::string& why) {
  const std::size_t b = elements.size();
  const bool records = is_record(elements.front());
  if (!records && !is_vector(elements.front()))
    return why = "its elements must be records or 1-D arrays, the first is neither", Value{};
  // The fields of the first element, looked up in every element.
  std::vector<std::string> names;
  if (records) {
    const auto& items = std::get<std::vector<Value>>(elements.front().data);
    for (std::size_t i = 0; i < items.size(); i += 2) names.push_back(std::get<std::string>(items[i].data));
  } else {
    names.push_back("values");
  }
  std::vector<std::vector<const Value*>> cells(names.size(), std::vector<const Value*>(b));
  std::vector<std::int64_t> lengths(b, 0);
  std::size_t longest = 0;
  for (std::size_t e = 0; e < b; ++e) {
    if (records && !is_record(elements[e])) return why = "element " + std::to_string(e) + " of a batch is not a record", Value{};
    if (!records && !is_vector(elements[e])) return why = "element " + std::to_string(e) + " of a batch is not a 1-D array", Value{};
    for (std::size_t f = 0; f < names.size(); ++f) {
      const Value* c = records ? find_field(elements[e], names[f]) : &elements[e];
      if (!c) return why = "element " + std::to_string(e) + " of a batch has no field '" + names[f] + "'", Value{};
      if (e > 0) {
        const Value& first = *cells[f][0];
        if (c->kind != first.kind || (c->kind == Value::Kind::array && (!is_vector(*c) || c->as_array().dtype !=
                                                                                              first.as_array().dtype)))
          return why = "field '" + names[f] + "' of element " + std::to_string(e) + " is not of the first element's type", Value{};
      }
      cells[f][e] = c;
      if (c->kind == Value::Kind::array) {
        if (!is_vector(*c)) return why = "field '" + names[f] + "' is an array of more than one dimension", Value{};
        const std::size_t n = c->as_array().shape[0];
        lengths[e] = std::max<std::int64_t>(lengths[e], static_cast<std::int64_t>(n));
        longest = std::max(longest, n);
      }
    }
  }
  std::size_t len = longest;
  if (o.length > 0) {
    if (longest > static_cast<std::size_t>(o.length))
      return why = "an element holds " + std::to_string(longest) + " items, above length " + std::to_string(o.length), Value{};
    len = static_cast<std::size_t>(o.length);
  }
  const auto m = static_cast<std::size_t>(o.multiple);
  len = (len + m - 1) / m * m;
  Value out = make_record(names.size() + 1);
  for (std::size_t f = 0; f < names.size(); ++f) {
    const Value& first = *cells[f][0];
    if (first.kind == Value::Kind::array) {
      set_field(out, names[f], pad_rows(cells[f], len, o.pad));
    } else if (first.kind == Value::Kind::integer || first.kind == Value::Kind::real || first.kind == Value::Kind::boolean) {
      set_field(out, names[f], scalars(cells[f]));
    } else {
      std::vector<Value> items;
      for (const Value* c : cells[f]) items.push_back(*c);
      set_field(out, names[f], Value::list(std::move(items)));
    }
  }
  set_field(out, "lengths", numeric_array<std::int64_t>(lengths, {b}));
  return out;
}

}  // namespace detail

}  // namespace dpipe
