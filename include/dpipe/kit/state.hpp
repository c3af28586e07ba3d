#pragma once
/// StateWriter and StateReader: the archives a node's typed state struct visits with one
/// `fields(Archive&)` function, so saving and restoring cannot drift apart:
///
///   struct State {
///     std::uint64_t position = 0;
///     std::vector<T> buffer;
///     template <class A> void fields(A& a) { a("position", position); a("buffer", buffer); }
///   };
///
/// Integers become u64/i64 fields, std::string a string field, Rng a four-word field, and every other
/// Snapshottable value (vectors, optionals) an element list: opaque blobs the tool can still deal out.
/// A state struct templated on its element container (`std::vector<T>` in the node, ElementBlobs in its
/// rescale rule) is read and written by the rule with the node's own field names and order.
#include <concepts>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "dpipe/kit/codec.hpp"
#include "dpipe/error.hpp"
#include "dpipe/rng.hpp"
#include "dpipe/snapshot.hpp"

namespace dpipe {

/// Thrown by a StateReader asked for the values of an element list that a rescale plan has not loaded
/// (ElementBlobs::loaded); the plan loads that field's lists and deals again (SnapshotSet::read_rank).
class ElementsNotLoaded : public SnapshotError {
 public:
  ElementsNotLoaded(const std::string& node_key, const std::string& field_name)
      : SnapshotError("snapshot state of node '" + node_key + "': the elements of field '" + field_name +
                      "' are not loaded"),
        key(node_key),
        field(field_name) {}
  std::string key, field;
};

namespace detail {
template <class T>
constexpr bool is_optional_v = false;
template <class T>
constexpr bool is_optional_v<std::optional<T>> = true;
}  // namespace detail

class StateWriter {
 public:
  /// Writes `out`'s fields from the first on. Fields `out` already holds (a record recycled from an
  /// earlier snapshot, see Run::recycle) are overwritten in place, keeping their storage; those left
  /// over are dropped when the writer goes.
  explicit StateWriter(NodeState& out) : out_(out) {}
  ~StateWriter() { out_.fields.resize(used_); }
  StateWriter(const StateWriter&) = delete;
  StateWriter& operator=(const StateWriter&) = delete;

  /// Writes every field of a state struct (its `fields` visitor only reads when given a writer).
  template <class S>
  void write(const S& state) {
    const_cast<S&>(state).fields(*this);
  }

  template <class T>
  void operator()(std::string_view name, const T& v) {
    Field& f = next_field();
    f.name = name;
    if constexpr (std::is_same_v<T, bool> || (std::is_integral_v<T> && std::is_unsigned_v<T>)) {
      f.type = FieldType::u64;
      f.u = static_cast<std::uint64_t>(v);
    } else if constexpr (std::is_integral_v<T> || std::is_enum_v<T>) {
      f.type = FieldType::i64;
      f.i = static_cast<std::int64_t>(v);
    } else if constexpr (std::is_same_v<T, std::string>) {
      f.type = FieldType::str;
      f.s = v;
    } else if constexpr (std::is_same_v<T, ElementBlobs>) {  // elements kept encoded (rescale rules)
      f.type = FieldType::elements;
      f.elements = v;
    } else if constexpr (std::is_same_v<T, Rng>) {
      f.type = FieldType::elements;
      f.elements.tag = "u64";
      ByteWriter w;
      for (auto word : v.state()) {
        w.buffer().clear();
        w.put<std::uint64_t>(word);
        f.elements.append(w.buffer());
      }
    } else if constexpr (requires(ElementBlobs& b) { v.write_elements(b); }) {  // restore keys (kit/restore_keys.hpp)
      f.type = FieldType::elements;
      v.write_elements(f.elements);
    } else if constexpr (detail::is_vector_v<T> || detail::is_optional_v<T>) {
      using E = typename T::value_type;
      static_assert(Snapshottable<E>,
                    "READ THIS IF YOUR COMPILE BREAKS HERE: a node keeps elements of this type in its "
                    "snapshot state, so the type must be Snapshottable: a built-in type (integers, "
                    "strings, vectors, tuples, optionals) or a type with a cereal serialize() function.");
      f.type = FieldType::elements;
      f.elements.tag = Codec<E>::tag();
      ByteWriter w;
      auto put = [&](const E& e) {
        w.buffer().clear();
        Codec<E>::encode(w, e);
        f.elements.append(w.buffer());
      };
      if constexpr (detail::is_optional_v<T>) {
        if (v) put(*v);
      } else if constexpr (std::is_arithmetic_v<E> && !std::is_same_v<E, bool>) {
        f.elements.data.assign(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(E));
        f.elements.offsets.resize(v.size() + 1);
        for (std::size_t i = 0; i <= v.size(); ++i) f.elements.offsets[i] = i * sizeof(E);
      } else {
        f.elements.offsets.reserve(v.size() + 1);
        for (const auto& e : v) put(e);
      }
    } else {
      static_assert(sizeof(T) == 0, "unsupported state field type: use integers, strings, Rng, vectors or optionals");
    }
  }

 private:
  Field& next_field() {
    if (used_ < out_.fields.size()) {
      Field& f = out_.fields[used_++];
      f.clear();
      return f;
    }
    ++used_;
    return out_.fields.emplace_back();
  }

  NodeState& out_;
  std::size_t used_ = 0;
};

/// Where a StateReader takes the fields of a record that is not a NodeState (a record of the columns of
/// a set index, see OldColumns): field k, valid until the next call.
class FieldSource {
 public:
  virtual std::size_t field_count() const = 0;
  virtual const Field& field(std::size_t k) const = 0;

 protected:
  ~FieldSource() = default;
};

class StateReader {
 public:
  explicit StateReader(const NodeState& in) : key_(in.key), instance_(in.instance), in_(&in), count_(in.fields.size()) {}
  /// Reads record `instance` of node `key` from `source` (which outlives the reader).
  StateReader(const std::string& key, std::uint32_t instance, const FieldSource& source)
      : key_(key), instance_(instance), source_(&source), count_(source.field_count()) {}

  template <class S>
  void read(S& state) {
    state.fields(*this);
  }

  template <class T>
  void operator()(std::string_view name, T& v) {
    const Field& f = next(name);
    if constexpr (std::is_same_v<T, bool> || (std::is_integral_v<T> && std::is_unsigned_v<T>)) {
      expect(f, FieldType::u64);
      if constexpr (std::is_same_v<T, bool>) {
        if (f.u > 1) fail("field '" + f.name + "' should be 0 or 1, found " + std::to_string(f.u));
      } else if constexpr (sizeof(T) < 8) {
        if (f.u > std::numeric_limits<T>::max()) fail("field '" + f.name + "' is out of range");
      }
      v = static_cast<T>(f.u);
    } else if constexpr (std::is_integral_v<T> || std::is_enum_v<T>) {
      expect(f, FieldType::i64);
      v = static_cast<T>(f.i);
    } else if constexpr (std::is_same_v<T, std::string>) {
      expect(f, FieldType::str);
      v = f.s;
    } else if constexpr (std::is_same_v<T, ElementBlobs>) {
      expect(f, FieldType::elements);
      v = f.elements;
    } else if constexpr (std::is_same_v<T, Rng>) {
      expect(f, FieldType::elements);
      require_loaded(f);
      if (f.elements.tag != "u64" || f.elements.size() != 4) fail("field '" + f.name + "' is not a generator state");
      Rng::State s;
      for (std::size_t i = 0; i < 4; ++i) s[i] = decode_from_string<std::uint64_t>(f.elements.at(i), what());
      // xoshiro's all-zero state is a fixed point: it draws 0 forever, and a bounded draw would never end.
      if ((s[0] | s[1] | s[2] | s[3]) == 0) fail("field '" + f.name + "' is an all-zero generator state, which cannot draw");
      v.set_state(s);
    } else if constexpr (requires(const ElementBlobs& b) { v.read_elements(b, *this); }) {  // restore keys
      expect(f, FieldType::elements);
      require_loaded(f);
      v.read_elements(f.elements, *this);
    } else if constexpr (detail::is_vector_v<T> || detail::is_optional_v<T>) {
      using E = typename T::value_type;
      expect(f, FieldType::elements);
      require_loaded(f);
      if (f.elements.tag != Codec<E>::tag())
        fail("field '" + f.name + "' holds elements of type " + f.elements.tag + ", expected " + Codec<E>::tag());
      const std::size_t n = f.elements.size();
      const std::string who = what();
      if constexpr (detail::is_optional_v<T>) {
        if (n > 1) fail("field '" + f.name + "' holds " + std::to_string(n) + " values, expected at most 1");
        v.reset();
        if (n == 1) v = decode_from_string<E>(f.elements.at(0), who);
      } else if constexpr (std::is_arithmetic_v<E> && !std::is_same_v<E, bool>) {
        // Fixed-size elements: one length check, then a straight copy.
        if (f.elements.data.size() != n * sizeof(E))
          fail("field '" + f.name + "' holds " + std::to_string(f.elements.data.size()) + " bytes for " +
               std::to_string(n) + " elements of " + std::to_string(sizeof(E)) + " bytes");
        for (std::size_t i = 0; i < n; ++i)
          if (f.elements.offsets[i + 1] - f.elements.offsets[i] != sizeof(E))
            fail("field '" + f.name + "' has an element of the wrong size");
        v.resize(n);
        if (n) std::memcpy(v.data(), f.elements.data.data(), n * sizeof(E));
      } else {
        v.clear();
        v.reserve(n);
        for (std::size_t i = 0; i < n; ++i) v.push_back(decode_from_string<E>(f.elements.at(i), who));
      }
    } else {
      static_assert(sizeof(T) == 0, "unsupported state field type");
    }
  }

  /// Whether fields remain to be read.
  bool has_more() const { return pos_ < count_; }
  /// Whether the next field to read is called `name` (an optional field, absent from older files).
  bool next_is(std::string_view name) const { return pos_ < count_ && field_at(pos_).name == name; }
  /// Throws unless every field was read.
  void finish() const {
    if (pos_ != count_)
      fail(std::to_string(count_ - pos_) + " unexpected fields after '" + (pos_ ? field_at(pos_ - 1).name : std::string("<start>")) +
           "'");
  }

  [[noreturn]] void fail(const std::string& msg) const {
    throw SnapshotError("snapshot state of node '" + key_ + "' (instance " + std::to_string(instance_) + "): " + msg);
  }

 private:
  std::string what() const { return "state of node '" + key_ + "'"; }
  const Field& next(std::string_view name) {
    if (pos_ >= count_) fail("field '" + std::string(name) + "' is missing");
    const Field& f = field_at(pos_);
    ++pos_;
    if (f.name != name) fail("expected field '" + std::string(name) + "', found '" + f.name + "'");
    return f;
  }
  const Field& field_at(std::size_t k) const { return in_ ? in_->fields[k] : source_->field(k); }
  void require_loaded(const Field& f) const {
    if (!f.elements.loaded()) throw ElementsNotLoaded(key_, f.name);
  }
  void expect(const Field& f, FieldType t) const {
    if (f.type != t)
      fail("field '" + f.name + "' has type " + std::to_string(static_cast<int>(f.type)) + ", expected " +
           std::to_string(static_cast<int>(t)));
  }

  const std::string& key_;
  std::uint32_t instance_;
  const NodeState* in_ = nullptr;
  const FieldSource* source_ = nullptr;
  std::size_t count_;
  std::size_t pos_ = 0;
};

}  // namespace dpipe
