#pragma once
/// Sample provenance: which source positions an element was made from. A traced run (RunOptions::trace,
/// or a node that needs it, such as map_with_rng) carries beside every element the list of base elements
/// it came from, in order: (source node, epoch, position, offsets). A source names its elements by
/// positions that do not depend on the layout (a sampler by the dataset index it drew, a range by its
/// index); flat_map and unbatch add the element's offset within its parent's expansion. map, filter,
/// shuffle, batch, … carry them through (docs/design.md, "Provenance").
#include <cstdint>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include "dpipe/rng.hpp"

namespace dpipe {

/// One base element of an element's provenance.
struct SourcePos {
  /// `source` of a base element whose provenance is unknown: one a snapshot held as data.
  static constexpr std::uint32_t kUnknown = 0xffffffffu;
  std::uint32_t source = 0;  // the source node's index among the graph's keys
  /// How many groups of elements of several base elements each (a batch of packed rows) begin at this
  /// base element: a batch marks where each of its elements starts, so that it can split its
  /// provenance again (0 for a batch of one-base elements, which needs no marks).
  std::uint32_t starts = 0;
  std::uint64_t epoch = 0;               // the source's epoch (a cycle's pass, a sampler's epoch)
  std::uint64_t position = 0;            // the source's own position: layout-independent
  std::vector<std::uint64_t> offsets{};  // within expansions (flat_map, unbatch), outermost first
  /// A piece of the element only (pack: a row's segment of a document): its tokens [begin, end).
  /// begin == end: the whole element.
  std::uint64_t begin = 0, end = 0;

  bool sliced() const { return end > begin; }
  bool operator==(const SourcePos&) const = default;
};

/// The provenance of one element: its base elements in order (one for an element of a source; a
/// batch's are its elements', concatenated).
using Provenance = std::vector<SourcePos>;

/// The provenance of an element a snapshot held: unknown as a whole (however many base elements it has),
/// written as one base element of source kUnknown. Elements made of it (a batch) keep the mark in its
/// place among their other base elements.
inline Provenance unknown_provenance() { return {SourcePos{.source = SourcePos::kUnknown}}; }
inline bool is_unknown_element(const Provenance& p) { return p.size() == 1 && p[0].source == SourcePos::kUnknown; }

inline bool is_known(const Provenance& p) {
  for (const SourcePos& s : p)
    if (s.source == SourcePos::kUnknown) return false;
  return true;
}
/// Whether `p` names an element a restore key can make again: known, and of at least one base element.
inline bool is_keyable(const Provenance& p) { return !p.empty() && is_known(p); }

/// Text for messages: "[(source 3, epoch 0, position 17, offset 2), ...]".
inline std::string to_string(const Provenance& p) {
  std::string out = "[";
  for (std::size_t i = 0; i < p.size(); ++i) {
    const SourcePos& s = p[i];
    if (i) out += ", ";
    if (s.source == SourcePos::kUnknown) {
      out += "unknown";
      continue;
    }
    out += "(source " + std::to_string(s.source) + ", epoch " + std::to_string(s.epoch) + ", position " +
           std::to_string(s.position);
    for (std::size_t k = 0; k < s.offsets.size(); ++k) out += (k ? "." : ", offset ") + std::to_string(s.offsets[k]);
    if (s.sliced()) out += ", tokens " + std::to_string(s.begin) + " to " + std::to_string(s.end);
    out += ")";
  }
  return out + "]";
}

/// `p` without the offset its last expansion added (the input element's provenance), or nullopt when a
/// base element has no offset.
inline std::optional<Provenance> without_last_offset(Provenance p, std::uint64_t& offset) {
  if (p.empty() || p[0].offsets.empty()) return std::nullopt;
  const std::uint64_t last = p[0].offsets.back();
  for (SourcePos& s : p) {
    if (s.offsets.empty() || s.offsets.back() != last) return std::nullopt;
    s.offsets.pop_back();
  }
  offset = last;
  return p;
}

/// The JSON of `dpipe run --provenance`'s "sources": `[[SOURCE, POSITION], ...]`, SOURCE the source's
/// key among `keys` (the graph's); an entry of a later epoch or within an expansion adds `{"epoch": E,
/// "offsets": [...]}`. Unknown: `null` for the whole element, a `null` entry for one of its base elements.
/// Defined in serialize/snapshot_json.cpp.
std::string provenance_json(const Provenance& p, const std::vector<std::string>& keys);

/// Output `j` of an expansion of an element of provenance `p` (flat_map, unbatch): `p` at offset `j`;
/// an unknown provenance stays unknown.
inline Provenance at_offset(Provenance p, std::uint64_t j) {
  if (!is_known(p)) return p;
  for (SourcePos& s : p) s.offsets.push_back(j);
  return p;
}

/// The provenance of a batch of the first `count` of `elements` (batch, padded_batch; moved from): theirs,
/// concatenated. When an element may have several base elements (`one_base` false: packed rows,
/// batches), the first base element of each is marked as the start of a group (SourcePos::starts), so
/// that batch_elements can split it again.
inline Provenance batch_provenance(std::vector<Provenance>& elements, std::size_t count, bool one_base) {
  Provenance out;
  for (std::size_t i = 0; i < count; ++i) {
    Provenance& p = elements[i];
    if (!one_base && !p.empty() && is_known(p)) ++p.front().starts;
    out.insert(out.end(), std::make_move_iterator(p.begin()), std::make_move_iterator(p.end()));
  }
  return out;
}

/// The elements' provenances of a batch of provenance `p` (batch_provenance's inverse), or nullopt when
/// `p` is not of that form.
inline std::optional<std::vector<Provenance>> batch_elements(const Provenance& p, bool one_base) {
  if (one_base) {
    std::vector<Provenance> out;
    for (const SourcePos& s : p) out.push_back(Provenance{s});
    return out;
  }
  if (p.empty() || p[0].starts == 0) return std::nullopt;
  const std::uint32_t mark = p[0].starts;
  std::vector<Provenance> out;
  for (const SourcePos& s : p) {
    if (s.starts > mark) return std::nullopt;
    if (s.starts == mark) {
      out.emplace_back();
      out.back().push_back(s);
      --out.back().back().starts;
    } else {
      out.back().push_back(s);
    }
  }
  return out;
}

/// A 64-bit digest of a provenance whose sources are named by `keys` (the graph's): the same for an
/// element whatever the layout, the worker that made it, or a resume. Seeds map_with_rng's generator.
inline std::uint64_t provenance_digest(const Provenance& p, const std::vector<std::string>& keys) {
  std::uint64_t h = mix64(p.size());
  for (const SourcePos& s : p) {
    h = mix64(h ^ fnv1a(s.source < keys.size() ? keys[s.source] : std::string()));
    h = mix64(h ^ mix64(s.epoch + 0x9e37));
    h = mix64(h ^ s.position);
    for (std::uint64_t o : s.offsets) h = mix64(h ^ mix64(o + 0x7f4a));
    if (s.sliced()) h = mix64(h ^ mix64(s.begin + 0x51ce) ^ mix64(mix64(s.end)));
  }
  return h;
}

}  // namespace dpipe
