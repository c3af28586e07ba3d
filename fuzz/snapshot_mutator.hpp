#pragma once
// Mutations of a decoded snapshot, re-encoded with the library's own encoder, so every section and the
// header carry valid checksums and a mutation reaches the checks behind them: the section decoders, the
// resume's record lookup and each node's restore. Used by the snapshot targets' LLVMFuzzerCustomMutator.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "dpipe/crc32c.hpp"
#include "dpipe/snapshot.hpp"
#include "fuzz_common.hpp"

// libFuzzer's own byte mutator (the replay program, which never mutates, defines a stand-in).
extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);

namespace dpipe_fuzz {

/// Mutates `s` in place with libFuzzer's byte mutator, letting it grow by up to `grow` bytes.
inline void mutate_string(std::string& s, std::size_t grow = 16) {
  const std::size_t n = s.size();
  s.resize(n + grow);
  const std::size_t m = LLVMFuzzerMutate(reinterpret_cast<uint8_t*>(s.data()), n, n + grow);
  s.resize(std::min(m, n + grow));
}

inline std::uint64_t interesting_u64(Rand& r, std::uint64_t old) {
  static constexpr std::uint64_t kValues[] = {0,
                                             1,
                                             2,
                                             3,
                                             4,
                                             7,
                                             8,
                                             63,
                                             64,
                                             255,
                                             256,
                                             1000,
                                             65535,
                                             65536,
                                             0x7fffffffull,
                                             0x80000000ull,
                                             0xffffffffull,
                                             0x100000000ull,
                                             1ull << 40,
                                             1ull << 53,
                                             1ull << 62,
                                             0x7fffffffffffffffull,
                                             0x8000000000000000ull,
                                             0x8000000000000001ull,
                                             0xfffffffffffffffeull,
                                             0xffffffffffffffffull};
  switch (r.below(6)) {
    case 0: return old + 1;
    case 1: return old - 1;
    case 2: return old + 1 + r.below(16);
    case 3: return old ^ (1ull << r.below(64));
    case 4: return r.next();
    default: return kValues[r.below(sizeof kValues / sizeof kValues[0])];
  }
}

inline int interesting_int(Rand& r, int old) {
  static constexpr int kValues[] = {0, 1, 2, 3, 4, 5, 8, -1, -2, 1 << 16, 0x7fffffff, -0x7fffffff - 1};
  switch (r.below(3)) {
    case 0: return static_cast<int>(static_cast<std::uint32_t>(old) + 1u);  // wraps, as the field would
    case 1: return static_cast<int>(static_cast<std::uint32_t>(old) - 1u);
    default: return kValues[r.below(sizeof kValues / sizeof kValues[0])];
  }
}

inline void mutate_elements(dpipe::ElementBlobs& e, Rand& r, const dpipe::Snapshot& s) {
  const std::size_t n = e.size();
  std::vector<std::string> items;
  for (std::size_t i = 0; i < n; ++i) items.emplace_back(e.at(i));
  switch (r.below(9)) {
    case 0:  // one blob's bytes
      if (n) mutate_string(items[r.below(n)]);
      break;
    case 1:  // one 8-byte value (positions, counts, generator state words)
      if (n) {
        std::string& b = items[r.below(n)];
        std::uint64_t v = 0;
        std::memcpy(&v, b.data(), std::min<std::size_t>(8, b.size()));
        v = interesting_u64(r, v);
        if (b.size() < 8) b.resize(8);
        std::memcpy(b.data(), &v, 8);
      }
      break;
    case 2:  // drop one
      if (n) items.erase(items.begin() + std::ptrdiff_t(r.below(n)));
      break;
    case 3:  // repeat one
      if (n) {
        const std::size_t i = r.below(n);
        const std::size_t k = 1 + r.below(r.one_in(4) ? 600 : 3);
        items.insert(items.begin() + std::ptrdiff_t(i), k, items[i]);
      }
      break;
    case 4: items.clear(); break;
    case 5:  // swap two
      if (n > 1) std::swap(items[r.below(n)], items[r.below(n)]);
      break;
    case 6: {  // another tag
      static const char* kTags[] = {"i64", "u64", "str", "vec<i64>", "vec<str>", "tup<i64,i64>", "text_block",
                                    "opt<i64>", "vec<vec<i64>>", "u8", "", "cereal:x"};
      e.tag = kTags[r.below(sizeof kTags / sizeof kTags[0])];
      break;
    }
    case 7: {  // the elements of another field of the snapshot
      std::vector<const dpipe::ElementBlobs*> all;
      for (const auto& st : s.states)
        for (const auto& f : st.fields)
          if (f.type == dpipe::FieldType::elements) all.push_back(&f.elements);
      if (!all.empty()) {
        e = *all[r.below(all.size())];
        return;
      }
      break;
    }
    default:  // a new zero or all-ones element
      items.push_back(std::string(r.one_in(2) ? 8 : 1 + r.below(24), r.one_in(2) ? '\0' : '\xff'));
      break;
  }
  e.offsets.assign(1, 0);
  e.data.clear();
  for (const auto& b : items) e.append(b);
}

inline void mutate_field(dpipe::Field& f, Rand& r, const dpipe::Snapshot& s) {
  if (r.one_in(12)) {  // another type, the value kept where it fits
    const auto t = static_cast<dpipe::FieldType>(1 + r.below(4));
    if (t == dpipe::FieldType::u64 && f.type == dpipe::FieldType::i64) f.u = static_cast<std::uint64_t>(f.i);
    if (t == dpipe::FieldType::i64 && f.type == dpipe::FieldType::u64) f.i = static_cast<std::int64_t>(f.u);
    f.type = t;
    return;
  }
  if (r.one_in(16)) {
    mutate_string(f.name, 4);
    return;
  }
  switch (f.type) {
    case dpipe::FieldType::u64: f.u = interesting_u64(r, f.u); break;
    case dpipe::FieldType::i64: f.i = static_cast<std::int64_t>(interesting_u64(r, static_cast<std::uint64_t>(f.i))); break;
    case dpipe::FieldType::str: mutate_string(f.s); break;
    case dpipe::FieldType::elements: mutate_elements(f.elements, r, s); break;
  }
}

inline void mutate_record(dpipe::Snapshot& s, Rand& r) {
  if (s.states.empty()) return;
  const std::size_t i = r.below(s.states.size());
  auto& st = s.states[i];
  switch (r.below(12)) {
    case 0: s.states.erase(s.states.begin() + std::ptrdiff_t(i)); return;
    case 1: s.states.push_back(s.states[i]); return;
    case 2: st.instance = static_cast<std::uint32_t>(interesting_u64(r, st.instance)); return;
    case 3: st.mode = static_cast<dpipe::StateMode>(1 + r.below(3)); return;
    case 4: st.key = s.states[r.below(s.states.size())].key; return;
    case 5: st.kind = s.states[r.below(s.states.size())].kind; return;
    case 6:  // drop a field
      if (!st.fields.empty()) st.fields.erase(st.fields.begin() + std::ptrdiff_t(r.below(st.fields.size())));
      return;
    case 7:  // repeat a field
      if (!st.fields.empty()) st.fields.push_back(st.fields[r.below(st.fields.size())]);
      return;
    case 8:  // swap two fields
      if (st.fields.size() > 1) std::swap(st.fields[r.below(st.fields.size())], st.fields[r.below(st.fields.size())]);
      return;
    default:
      if (!st.fields.empty()) mutate_field(st.fields[r.below(st.fields.size())], r, s);
      return;
  }
}

inline void mutate_meta(dpipe::Snapshot& s, Rand& r) {
  auto& m = s.meta;
  switch (r.below(10)) {
    case 0: m.layout.rank = interesting_int(r, m.layout.rank); break;
    case 1: m.layout.world_size = interesting_int(r, m.layout.world_size); break;
    case 2: m.layout.num_workers = interesting_int(r, m.layout.num_workers); break;
    case 3: m.elements_delivered = interesting_u64(r, m.elements_delivered); break;
    case 4: m.epoch = interesting_u64(r, m.epoch); break;
    case 5: m.seed = interesting_u64(r, m.seed); break;
    case 6:
      if (r.one_in(4)) m.fingerprint = interesting_u64(r, m.fingerprint);
      break;
    case 7:  // a graph node's parameter text or segment
      if (!m.graph.empty()) {
        auto& g = m.graph[r.below(m.graph.size())];
        if (!g.params.empty() && r.one_in(2)) mutate_string(g.params[r.below(g.params.size())].second, 8);
        else if (r.one_in(2)) g.segment = r.one_in(2) ? "" : (r.one_in(2) ? "worker" : "prefix");
        else mutate_string(g.element_type, 4);
      }
      break;
    case 8:  // a graph node dropped or repeated
      if (!m.graph.empty()) {
        const std::size_t i = r.below(m.graph.size());
        if (r.one_in(2)) m.graph.erase(m.graph.begin() + std::ptrdiff_t(i));
        else m.graph.push_back(m.graph[i]);
      }
      break;
    default: {
      std::string v = m.user_metadata.empty() ? std::string() : m.user_metadata.begin()->second;
      mutate_string(v);
      m.user_metadata["k"] = v;
      break;
    }
  }
}

/// The sections of a file as the header's table lists them: (id, body). False if the table is unusable.
inline bool split_sections(std::string_view bytes, std::vector<std::pair<std::uint32_t, std::string>>& out) {
  if (bytes.size() < 32) return false;
  std::uint32_t count = 0;
  std::memcpy(&count, bytes.data() + 12, 4);
  if (count > 64 || 32 + std::uint64_t(count) * 24 > bytes.size()) return false;
  for (std::uint32_t i = 0; i < count; ++i) {
    const char* e = bytes.data() + 32 + 24 * i;
    std::uint32_t id = 0;
    std::uint64_t off = 0, len = 0;
    std::memcpy(&id, e, 4);
    std::memcpy(&off, e + 8, 8);
    std::memcpy(&len, e + 16, 8);
    if (off > bytes.size() || len > bytes.size() - off) return false;
    out.emplace_back(id, std::string(bytes.substr(off, len)));
  }
  return true;
}

/// A file from sections, with the header, table and section checksums the format asks for.
inline std::string assemble_sections(const std::vector<std::pair<std::uint32_t, std::string>>& sections) {
  auto put32 = [](std::string& s, std::size_t at, std::uint32_t v) { std::memcpy(s.data() + at, &v, 4); };
  auto put64 = [](std::string& s, std::size_t at, std::uint64_t v) { std::memcpy(s.data() + at, &v, 8); };
  const std::size_t table_end = 32 + 24 * sections.size();
  std::string out(table_end, '\0');
  std::memcpy(out.data(), "DPIPESNP", 8);
  put32(out, 8, dpipe::Snapshot::kFormatVersion);
  put32(out, 12, static_cast<std::uint32_t>(sections.size()));
  for (std::size_t i = 0; i < sections.size(); ++i) {
    const auto& [id, body] = sections[i];
    const std::size_t e = 32 + 24 * i;
    put32(out, e, id);
    put32(out, e + 4, dpipe::crc32c(body));
    put64(out, e + 8, out.size());
    put64(out, e + 16, body.size());
    out += body;
  }
  put64(out, 16, out.size());
  put32(out, 24, dpipe::crc32c(std::string_view(out).substr(32, table_end - 32)));
  put32(out, 28, dpipe::crc32c(std::string_view(out).substr(0, 28)));
  return out;
}

/// Byte-level mutation inside one section (or of the section list), checksums recomputed: reaches the
/// section decoders' bounds and count checks with well-framed files.
inline bool mutate_sections(std::string& bytes, Rand& r) {
  std::vector<std::pair<std::uint32_t, std::string>> sections;
  if (!split_sections(bytes, sections) || sections.empty()) return false;
  const std::size_t i = r.below(sections.size());
  switch (r.below(8)) {
    case 0: sections.erase(sections.begin() + std::ptrdiff_t(i)); break;
    case 1: sections.push_back(sections[i]); break;
    case 2: sections[i].first = static_cast<std::uint32_t>(r.below(6)); break;
    default: mutate_string(sections[i].second, 64); break;
  }
  bytes = assemble_sections(sections);
  return true;
}

/// One to three structural mutations of a decoded snapshot.
inline void mutate_snapshot(dpipe::Snapshot& s, Rand& r) {
  const int k = 1 + static_cast<int>(r.below(3));
  for (int j = 0; j < k; ++j) {
    if (r.one_in(5)) mutate_meta(s, r);
    else mutate_record(s, r);
  }
}

/// The custom mutation of snapshot bytes: decoded, mutated, re-encoded (or mutated inside a section with
/// checksums fixed); bytes that do not decode get libFuzzer's plain mutation. Returns the new size.
inline std::size_t mutate_snapshot_bytes(uint8_t* data, std::size_t size, std::size_t max_size, unsigned seed) {
  Rand r{seed};
  std::string bytes(reinterpret_cast<const char*>(data), size);
  std::string out;
  try {
    if (r.one_in(6)) {
      if (!mutate_sections(bytes, r)) return LLVMFuzzerMutate(data, size, max_size);
      out = std::move(bytes);
    } else {
      auto s = dpipe::Snapshot::from_bytes(bytes);
      mutate_snapshot(s, r);
      out = s.to_bytes();
    }
  } catch (const dpipe::Error&) {
    return LLVMFuzzerMutate(data, size, max_size);
  }
  if (out.size() > max_size) return LLVMFuzzerMutate(data, size, max_size);
  std::memcpy(data, out.data(), out.size());
  return out.size();
}

}  // namespace dpipe_fuzz
