#pragma once
/// Restore keys. A traced run (RunOptions::trace) knows every element's provenance; a node that holds
/// elements across pulls (shuffle's buffer, a partial batch, the worker queues, the run's own chunk)
/// saves each one whose chain from its sources can make it again (Iter::recomputable) as that provenance
/// and a checksum of its bytes instead of the bytes: about 20 bytes per element, whatever its size.
/// The restore makes it again through the chain (Iter::recompute: a read at a position, the maps on it)
/// and refuses it when its checksum differs (the data changed under the snapshot). An element of unknown
/// provenance (one restored from data) is saved as data in the same list.
///
/// A keyed list is tagged "keys:" + the element type's tag; each entry is 'k' and a key, or 'v' and the
/// element's own encoding. A rescale deals its entries as it deals elements (docs/snapshot-format.md).
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "dpipe/crc32c.hpp"
#include "dpipe/kit/node.hpp"

namespace dpipe {

inline constexpr std::string_view kKeysTagPrefix = "keys:";
inline constexpr char kKeyEntry = 'k', kDataEntry = 'v';

/// LEB128: 7 bits a byte, low first, the high bit set on every byte but the last (a key's numbers are small).
inline void put_varint(ByteWriter& w, std::uint64_t v) {
  while (v >= 0x80) {
    w.put<std::uint8_t>(static_cast<std::uint8_t>(v | 0x80));
    v >>= 7;
  }
  w.put<std::uint8_t>(static_cast<std::uint8_t>(v));
}
inline std::uint64_t get_varint(ByteReader& r) {
  std::uint64_t v = 0;
  for (unsigned shift = 0; shift < 64; shift += 7) {
    const std::uint8_t b = r.get<std::uint8_t>();
    if (shift == 63 && b > 1) break;
    v |= std::uint64_t{b & 0x7fu} << shift;
    if (!(b & 0x80)) return v;
  }
  r.fail("a varint of a restore key runs past 64 bits");
}

/// A key's bytes (varints): the base element count, each base element (source index, epoch, position,
/// offset count, offsets), then the u32 CRC-32C of the element's encoding. A key with a base element
/// that starts a group or is a slice (a batch of packed rows; format version 8 on) is written in the
/// extended form: a 0, the count, and each base element followed by its group starts and a flag, 1
/// with the slice's begin and length after it, else 0.
inline void encode_key(ByteWriter& w, const Provenance& p, std::uint32_t checksum) {
  bool extended = false;
  for (const SourcePos& s : p) extended = extended || s.starts != 0 || s.sliced();
  if (extended) put_varint(w, 0);
  put_varint(w, p.size());
  for (const SourcePos& s : p) {
    put_varint(w, s.source);
    put_varint(w, s.epoch);
    put_varint(w, s.position);
    put_varint(w, s.offsets.size());
    for (std::uint64_t o : s.offsets) put_varint(w, o);
    if (!extended) continue;
    put_varint(w, s.starts);
    put_varint(w, s.sliced() ? 1 : 0);
    if (s.sliced()) {
      put_varint(w, s.begin);
      put_varint(w, s.end - s.begin);
    }
  }
  w.put<std::uint32_t>(checksum);
}
inline Provenance decode_key(ByteReader& r, std::uint32_t& checksum) {
  std::uint64_t n = get_varint(r);
  const bool extended = n == 0;
  if (extended) n = get_varint(r);
  if (n == 0 || n > r.remaining() / 4) r.fail("a restore key of " + std::to_string(n) + " base elements");
  Provenance p(static_cast<std::size_t>(n));
  for (SourcePos& s : p) {
    const std::uint64_t source = get_varint(r);
    if (source >= SourcePos::kUnknown) r.fail("a restore key names source " + std::to_string(source));
    s.source = static_cast<std::uint32_t>(source);
    s.epoch = get_varint(r);
    s.position = get_varint(r);
    const std::uint64_t k = get_varint(r);
    if (k > r.remaining()) r.fail("a restore key of " + std::to_string(k) + " offsets");
    s.offsets.resize(static_cast<std::size_t>(k));
    for (std::uint64_t& o : s.offsets) o = get_varint(r);
    if (!extended) continue;
    const std::uint64_t starts = get_varint(r);
    if (starts > 64) r.fail("a restore key's base element starts " + std::to_string(starts) + " groups");
    s.starts = static_cast<std::uint32_t>(starts);
    const std::uint64_t flag = get_varint(r);
    if (flag > 1) r.fail("a restore key's base element has slice flag " + std::to_string(flag));
    if (flag == 1) {
      s.begin = get_varint(r);
      const std::uint64_t len = get_varint(r);
      if (len == 0 || len > ~s.begin) r.fail("a restore key's slice of " + std::to_string(len) + " tokens");
      s.end = s.begin + len;
    }
  }
  checksum = r.get<std::uint32_t>();
  return p;
}

/// The rest of one expansion or batch restored from keys (flat_map, unbatch): its parent's provenance and
/// the offset of its first element, from the first key; unknown and 0 without one.
inline std::pair<Provenance, std::uint64_t> parent_of_rest(const std::vector<Provenance>& keys) {
  std::uint64_t j = 0;
  if (!keys.empty() && is_keyable(keys.front()))
    if (std::optional<Provenance> parent = without_last_offset(keys.front(), j)) return {std::move(*parent), j};
  return {unknown_provenance(), 0};
}

/// The checksum a key keeps of its element: the CRC-32C of the element's encoding (`scratch` reused).
template <class T>
std::uint32_t element_checksum(const T& x, ByteWriter& scratch) {
  scratch.buffer().clear();
  Codec<T>::encode(scratch, x);
  return crc32c(scratch.buffer());
}

/// Elements [from, end) of `v`, in place: what a node saves of a vector it has partly delivered.
template <class T>
struct TailView {
  const std::vector<T>* v;
  std::size_t from;
  std::size_t size() const { return v->size() - from; }
  decltype(auto) operator[](std::size_t i) const { return (*v)[from + i]; }
};

/// Saving: the elements of `values` (a std::vector<T>, a TailView<T>, or a view with size() and
/// operator[]), each as its
/// key where `keys` knows it, with its checksum from `checksums` when given (a worker lane takes them as
/// it produces), else from its encoding; an element of unknown provenance as data. `values` is read only
/// for the entries that need it.
template <class T, class Values = std::vector<T>>
struct KeysOut {
  const Values* values = nullptr;
  const std::vector<Provenance>* keys = nullptr;           // beside values
  const std::vector<std::uint32_t>* checksums = nullptr;  // beside values, or null

  void write_elements(ElementBlobs& out) const {
    out.tag = std::string(kKeysTagPrefix) + Codec<T>::tag();
    ByteWriter element, entry;
    for (std::size_t i = 0; i < values->size(); ++i) {
      entry.buffer().clear();
      const Provenance* p = i < keys->size() ? &(*keys)[i] : nullptr;
      if (p && is_keyable(*p)) {
        entry.put<char>(kKeyEntry);
        const bool known = checksums && i < checksums->size();
        encode_key(entry, *p, known ? (*checksums)[i] : element_checksum((*values)[i], element));
      } else {
        element.buffer().clear();
        Codec<T>::encode(element, (*values)[i]);
        entry.put<char>(kDataEntry);
        entry.raw(element.buffer().data(), element.buffer().size());
      }
      out.append(entry.buffer());
    }
  }
};

/// Restoring: a keyed list's elements made again by `from` (or by `make`, for elements a node holds
/// that are not its output: pack's open rows), or a list of data as before keys.
template <class T>
struct KeysIn {
  const Iter<T>* from = nullptr;
  std::function<T(const Provenance&)> make{};  // when set, instead of from->recompute
  std::vector<T> values{};
  std::vector<Provenance> keys{};  // beside values: a key's provenance, unknown for data
  std::uint64_t recomputed = 0;

  T recompute(const Provenance& p, const StateReader& r) const {
    try {
      return make ? make(p) : from->recompute(p);
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      r.fail("making the element of restore key " + to_string(p) + " again failed: " + e.what());
    }
  }

  void read_elements(const ElementBlobs& in, const StateReader& r) {
    values.clear();
    keys.clear();
    const std::string tag = Codec<T>::tag();
    const std::size_t n = in.size();
    if (in.tag == tag) {  // data (a run that was not traced, files before keys)
      for (std::size_t i = 0; i < n; ++i) values.push_back(decode_from_string<T>(in.at(i), "a snapshot element"));
      keys.assign(n, unknown_provenance());
      return;
    }
    if (in.tag != std::string(kKeysTagPrefix) + tag)
      r.fail("a list holds elements of type " + in.tag + ", expected " + tag + " or its restore keys");
    ByteWriter again;
    for (std::size_t i = 0; i < n; ++i) {
      ByteReader entry(in.at(i), "a restore key");
      const char kind = entry.get<char>();
      if (kind == kDataEntry) {
        values.push_back(decode_from_string<T>(in.at(i).substr(1), "a snapshot element"));
        keys.push_back(unknown_provenance());
        continue;
      }
      if (kind != kKeyEntry) r.fail("entry " + std::to_string(i) + " of a keyed list is neither a key nor data");
      std::uint32_t checksum = 0;
      Provenance p = decode_key(entry, checksum);
      if (!entry.done()) r.fail("entry " + std::to_string(i) + " of a keyed list has bytes after its key");
      if (!make && (!from || !from->recomputable()))
        r.fail("the snapshot holds restore keys where this pipeline's chain cannot make the elements again");
      T x = recompute(p, r);
      if (element_checksum(x, again) != checksum)
        r.fail("the element of restore key " + to_string(p) + " came out different from the one saved (checksum "
               "mismatch): the data or a function changed since the snapshot, and the key cannot be resumed");
      values.push_back(std::move(x));
      keys.push_back(std::move(p));
      ++recomputed;
    }
  }
};

}  // namespace dpipe
