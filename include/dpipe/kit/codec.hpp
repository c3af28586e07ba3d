#pragma once
/// Byte encoding of elements and state fields. Built-in types (integers, floats, bool, strings,
/// vectors, arrays, pairs, tuples, optionals) use a compact native little-endian encoding that the
/// `dpipe` tool can decode from the type tag alone; any other type with a cereal `serialize` function
/// is encoded with cereal's binary archive and stays an opaque blob to the tool.
#include <array>
#include <bit>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

#include <cereal/archives/binary.hpp>
#include <cereal/types/string.hpp>
#include <cereal/types/vector.hpp>

#include "dpipe/error.hpp"

namespace dpipe {

static_assert(std::endian::native == std::endian::little, "dpipe's byte formats assume a little-endian host");

/// Appends bytes; the one output buffer of every encoder.
class ByteWriter {
 public:
  void raw(const void* p, std::size_t n) {
    const auto* b = static_cast<const char*>(p);
    buf_.append(b, n);
  }
  template <class T>
    requires std::is_arithmetic_v<T>
  void put(T v) {
    raw(&v, sizeof v);
  }
  void str(std::string_view s) {
    put<std::uint64_t>(s.size());
    raw(s.data(), s.size());
  }
  void reserve(std::size_t n) { buf_.reserve(n); }
  std::string& buffer() { return buf_; }
  std::string take() { return std::move(buf_); }
  std::size_t size() const { return buf_.size(); }

 private:
  std::string buf_;
};

/// Reads bytes with every length checked against what remains; failures are SnapshotErrors.
class ByteReader {
 public:
  /// `what` names the bytes in error messages; it is borrowed and must outlive the reader.
  ByteReader(const char* p, std::size_t n, std::string_view what = "snapshot") : p_(p), end_(p + n), what_(what) {}
  explicit ByteReader(std::string_view s, std::string_view what = "snapshot") : ByteReader(s.data(), s.size(), what) {}

  std::size_t remaining() const { return static_cast<std::size_t>(end_ - p_); }
  bool done() const { return p_ == end_; }
  const char* pos() const { return p_; }

  void need(std::size_t n) const {
    if (n > remaining())
      throw SnapshotError(std::string(what_) + " is truncated: " + std::to_string(n) + " bytes needed, " +
                          std::to_string(remaining()) + " left");
  }
  template <class T>
    requires std::is_arithmetic_v<T>
  T get() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, p_, sizeof v);
    p_ += sizeof v;
    return v;
  }
  std::string_view bytes(std::size_t n) {
    need(n);
    std::string_view v(p_, n);
    p_ += n;
    return v;
  }
  std::string_view str() { return bytes(length(1)); }
  /// A count of items each at least `min_item_bytes` long, refused when it cannot fit.
  std::size_t length(std::size_t min_item_bytes) {
    const auto n = get<std::uint64_t>();
    if (min_item_bytes > 0 && n > remaining() / min_item_bytes)
      throw SnapshotError(std::string(what_) + " is corrupt: a length of " + std::to_string(n) +
                          " does not fit in the " + std::to_string(remaining()) + " bytes left");
    return static_cast<std::size_t>(n);
  }
  [[noreturn]] void fail(const std::string& msg) const {
    throw SnapshotError(std::string(what_) + " is corrupt: " + msg);
  }
  std::string_view what() const { return what_; }

 private:
  const char* p_;
  const char* end_;
  std::string_view what_;
};

/// Codec<T> encodes and decodes one value; specialised below. `tag()` names the type for the tool;
/// `kMinBytes` bounds how many items a corrupt count may claim.
template <class T, class Enable = void>
struct Codec;  // undefined: T is not snapshottable

template <class T>
concept Snapshottable = requires(ByteWriter& w, ByteReader& r, const T& v) {
  Codec<T>::encode(w, v);
  { Codec<T>::decode(r) } -> std::same_as<T>;
  { Codec<T>::tag() } -> std::convertible_to<std::string>;
};

namespace detail {
template <class T>
constexpr const char* arithmetic_tag() {
  if constexpr (std::is_same_v<T, bool>) return "bool";
  else if constexpr (std::is_floating_point_v<T>) return sizeof(T) == 4 ? "f32" : "f64";
  else if constexpr (std::is_signed_v<T>) {
    if constexpr (sizeof(T) == 1) return "i8";
    else if constexpr (sizeof(T) == 2) return "i16";
    else if constexpr (sizeof(T) == 4) return "i32";
    else return "i64";
  } else {
    if constexpr (sizeof(T) == 1) return "u8";
    else if constexpr (sizeof(T) == 2) return "u16";
    else if constexpr (sizeof(T) == 4) return "u32";
    else return "u64";
  }
}
template <class T>
constexpr bool is_vector_v = false;
template <class T, class A>
constexpr bool is_vector_v<std::vector<T, A>> = true;
template <class T>
constexpr bool is_composite_v = false;
template <class T, std::size_t N>
constexpr bool is_composite_v<std::array<T, N>> = true;
template <class... Ts>
constexpr bool is_composite_v<std::tuple<Ts...>> = true;
template <class A, class B>
constexpr bool is_composite_v<std::pair<A, B>> = true;
template <class T>
constexpr bool is_composite_v<std::optional<T>> = true;
template <class T>
constexpr bool is_composite_v<std::shared_ptr<const T>> = true;
template <class T>
constexpr bool is_native_v =
    std::is_arithmetic_v<T> || std::is_same_v<T, std::string> || is_vector_v<T> || is_composite_v<T>;
}  // namespace detail

template <class T>
  requires std::is_arithmetic_v<T>
struct Codec<T> {
  static constexpr std::size_t kMinBytes = sizeof(T);
  static void encode(ByteWriter& w, T v) { w.put(v); }
  static T decode(ByteReader& r) { return r.get<T>(); }
  static std::string tag() { return detail::arithmetic_tag<T>(); }
};

template <>
struct Codec<std::string> {
  static constexpr std::size_t kMinBytes = 8;
  static void encode(ByteWriter& w, const std::string& v) { w.str(v); }
  static std::string decode(ByteReader& r) { return std::string(r.str()); }
  static std::string tag() { return "str"; }
};

template <Snapshottable T>
struct Codec<std::vector<T>> {
  static constexpr std::size_t kMinBytes = 8;
  static void encode(ByteWriter& w, const std::vector<T>& v) {
    w.put<std::uint64_t>(v.size());
    if constexpr (std::is_arithmetic_v<T> && !std::is_same_v<T, bool>) {
      w.raw(v.data(), v.size() * sizeof(T));
    } else {
      for (const auto& x : v) Codec<T>::encode(w, x);
    }
  }
  static std::vector<T> decode(ByteReader& r) {
    const std::size_t n = r.length(Codec<T>::kMinBytes);
    std::vector<T> v;
    if constexpr (std::is_arithmetic_v<T> && !std::is_same_v<T, bool>) {
      v.resize(n);
      const auto bytes = r.bytes(n * sizeof(T));
      if (n > 0) std::memcpy(v.data(), bytes.data(), bytes.size());  // an empty vector's data() may be null
    } else {
      v.reserve(n);
      for (std::size_t i = 0; i < n; ++i) v.push_back(Codec<T>::decode(r));
    }
    return v;
  }
  static std::string tag() { return "vec<" + Codec<T>::tag() + ">"; }
};

template <Snapshottable T, std::size_t N>
struct Codec<std::array<T, N>> {
  static constexpr std::size_t kMinBytes = N * Codec<T>::kMinBytes > 0 ? N * Codec<T>::kMinBytes : 1;
  static void encode(ByteWriter& w, const std::array<T, N>& v) {
    for (const auto& x : v) Codec<T>::encode(w, x);
  }
  static std::array<T, N> decode(ByteReader& r) {
    std::array<T, N> v;
    for (auto& x : v) x = Codec<T>::decode(r);
    return v;
  }
  static std::string tag() { return "tup<" + join_tags(std::make_index_sequence<N>{}) + ">"; }

 private:
  template <std::size_t... I>
  static std::string join_tags(std::index_sequence<I...>) {
    std::string s;
    ((s += (I ? "," : "") + Codec<T>::tag()), ...);
    return s;
  }
};

template <Snapshottable... Ts>
struct Codec<std::tuple<Ts...>> {
  static constexpr std::size_t kMinBytes = (std::size_t{0} + ... + Codec<Ts>::kMinBytes) > 0
                                               ? (std::size_t{0} + ... + Codec<Ts>::kMinBytes)
                                               : 1;
  static void encode(ByteWriter& w, const std::tuple<Ts...>& v) {
    std::apply([&](const auto&... x) { (Codec<std::decay_t<decltype(x)>>::encode(w, x), ...); }, v);
  }
  static std::tuple<Ts...> decode(ByteReader& r) {
    // Braced initialisation evaluates left to right, matching the encoding order.
    return std::tuple<Ts...>{Codec<Ts>::decode(r)...};
  }
  static std::string tag() {
    std::string s = "tup<";
    bool first = true;
    ((s += (first ? "" : ","), s += Codec<Ts>::tag(), first = false), ...);
    return s + ">";
  }
};

template <Snapshottable A, Snapshottable B>
struct Codec<std::pair<A, B>> {
  static constexpr std::size_t kMinBytes = Codec<A>::kMinBytes + Codec<B>::kMinBytes;
  static void encode(ByteWriter& w, const std::pair<A, B>& v) {
    Codec<A>::encode(w, v.first);
    Codec<B>::encode(w, v.second);
  }
  static std::pair<A, B> decode(ByteReader& r) {
    A a = Codec<A>::decode(r);
    B b = Codec<B>::decode(r);
    return {std::move(a), std::move(b)};
  }
  static std::string tag() { return "tup<" + Codec<A>::tag() + "," + Codec<B>::tag() + ">"; }
};

template <Snapshottable T>
struct Codec<std::optional<T>> {
  static constexpr std::size_t kMinBytes = 1;
  static void encode(ByteWriter& w, const std::optional<T>& v) {
    w.put<std::uint8_t>(v ? 1 : 0);
    if (v) Codec<T>::encode(w, *v);
  }
  static std::optional<T> decode(ByteReader& r) {
    const auto has = r.get<std::uint8_t>();
    if (has > 1) r.fail("an optional's flag is " + std::to_string(has));
    if (!has) return std::nullopt;
    return Codec<T>::decode(r);
  }
  static std::string tag() { return "opt<" + Codec<T>::tag() + ">"; }
};

/// A shared, immutable element (what `dispatch(broadcast)` hands to every worker) is encoded as the
/// element itself; decoding makes a new one, so sharing is not preserved across a snapshot.
template <Snapshottable T>
struct Codec<std::shared_ptr<const T>> {
  static constexpr std::size_t kMinBytes = Codec<T>::kMinBytes;
  static void encode(ByteWriter& w, const std::shared_ptr<const T>& v) {
    if (!v) throw SnapshotError("a shared element to encode is empty");
    Codec<T>::encode(w, *v);
  }
  static std::shared_ptr<const T> decode(ByteReader& r) { return std::make_shared<const T>(Codec<T>::decode(r)); }
  static std::string tag() { return Codec<T>::tag(); }
};

/// Any other type that cereal can serialise: a length-prefixed cereal binary blob.
template <class T>
concept CerealSerializable =
    !detail::is_native_v<T> && std::is_default_constructible_v<T> &&
    cereal::traits::is_output_serializable<T, cereal::BinaryOutputArchive>::value &&
    cereal::traits::is_input_serializable<T, cereal::BinaryInputArchive>::value;

template <CerealSerializable T>
struct Codec<T> {
  static constexpr std::size_t kMinBytes = 8;
  static void encode(ByteWriter& w, const T& v) {
    std::ostringstream os(std::ios::binary);
    {
      cereal::BinaryOutputArchive ar(os);
      ar(v);
    }
    w.str(os.str());
  }
  static T decode(ByteReader& r) {
    std::istringstream is(std::string(r.str()), std::ios::binary);
    T v{};
    try {
      cereal::BinaryInputArchive ar(is);
      ar(v);
    } catch (const std::exception& e) {
      r.fail(std::string("a cereal-encoded element did not decode: ") + e.what());
    }
    return v;
  }
  static std::string tag() { return std::string("cereal:") + typeid(T).name(); }
};

template <Snapshottable T>
std::string encode_to_string(const T& v) {
  ByteWriter w;
  Codec<T>::encode(w, v);
  return w.take();
}

template <Snapshottable T>
T decode_from_string(std::string_view bytes, std::string_view what = "element") {
  ByteReader r(bytes, what);
  T v = Codec<T>::decode(r);
  if (!r.done()) r.fail(std::to_string(r.remaining()) + " bytes left over after an element");
  return v;
}

}  // namespace dpipe
