// Snapshot bytes: header, section table, checksummed sections (described in docs/snapshot-format.md).
#include "dpipe/snapshot.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <unordered_map>
#include <unordered_set>
#include <optional>
#include <fstream>
#include <sstream>

#include "dpipe/atomic_file.hpp"
#include "dpipe/kit/codec.hpp"
#include "dpipe/crc32c.hpp"
#include "dpipe/regular_file.hpp"
#include "dpipe/rng.hpp"
#include "json_text.hpp"
#include "snapshot_plan.hpp"

namespace dpipe {
namespace {

constexpr char kMagic[8] = {'D', 'P', 'I', 'P', 'E', 'S', 'N', 'P'};
constexpr std::size_t kHeaderBytes = 32;
constexpr std::size_t kSectionEntryBytes = 24;
constexpr std::uint32_t kMaxSections = 64;
// Sections a reader does not know are skipped, so a section added later keeps older files and
// older readers working: kNodeDetails (each graph node's segment and parameters) came after format
// version 1 shipped.
// kIdentity (format 2) stands first after the table, so a reader finds a file's id and step in its
// first bytes.
// kStateIndex (format 3) follows the node states: the same records with each element list longer than
// kInlineListBytes replaced by where it lies in the file and its checksum, so a rescale can read the
// lists it deals and no others.
enum SectionId : std::uint32_t { kMeta = 1, kStates = 2, kNodeDetails = 3, kIdentity = 4, kStateIndex = 5 };
constexpr std::uint64_t kInlineListBytes = 256;

void put_u32(ByteWriter& w, std::uint32_t v) { w.put(v); }

/// A count, then each (key, value) of `pairs` as two strings (user metadata, node parameters).
template <class Pairs>
void put_string_pairs(ByteWriter& w, const Pairs& pairs) {
  w.put<std::uint64_t>(pairs.size());
  for (const auto& [k, v] : pairs) {
    w.str(k);
    w.str(v);
  }
}
/// Reads what put_string_pairs wrote, handing each pair to `add`.
template <class Add>
void get_string_pairs(ByteReader& r, Add add) {
  const std::size_t n = r.length(16);
  for (std::size_t i = 0; i < n; ++i) {
    std::string k(r.str());
    add(std::move(k), std::string(r.str()));
  }
}

void encode_meta(ByteWriter& w, const SnapshotMeta& m) {
  w.put<std::uint64_t>(m.fingerprint);
  w.put<std::uint64_t>(m.seed);
  w.put<std::uint64_t>(m.epoch);
  w.put<std::int32_t>(m.layout.rank);
  w.put<std::int32_t>(m.layout.world_size);
  w.put<std::int32_t>(m.layout.num_workers);
  w.put<std::uint64_t>(m.elements_delivered);
  w.put<std::uint64_t>(m.graph.size());
  for (const auto& n : m.graph) {
    w.str(n.key);
    w.str(n.kind);
    w.str(n.element_type);
  }
  put_string_pairs(w, m.user_metadata);
}

SnapshotMeta decode_meta(ByteReader& r) {
  SnapshotMeta m;
  m.fingerprint = r.get<std::uint64_t>();
  m.seed = r.get<std::uint64_t>();
  m.epoch = r.get<std::uint64_t>();
  m.layout.rank = r.get<std::int32_t>();
  m.layout.world_size = r.get<std::int32_t>();
  m.layout.num_workers = r.get<std::int32_t>();
  m.elements_delivered = r.get<std::uint64_t>();
  // The layout is checked here, once, so no reader of a snapshot divides by a worker count of 0 or
  // loops over a negative one.
  const Layout& l = m.layout;
  if (!l.possible())
    r.fail("its layout " + l.to_string() + " is impossible (0 <= rank < world_size, 1 to " +
           std::to_string(kMaxWorkers) + " workers)");
  const std::size_t nodes = r.length(24);
  m.graph.reserve(std::min<std::size_t>(nodes, 1024));  // grows with the bytes parsed, not the declared count
  for (std::size_t i = 0; i < nodes; ++i) {
    GraphNodeRecord n;
    n.key = r.str();
    n.kind = r.str();
    n.element_type = r.str();
    m.graph.push_back(std::move(n));
  }
  // Written in key order, each key once: anything else would lose a pair or read as another file's.
  {
    std::unordered_set<std::string_view> keys;
    for (const auto& n : m.graph)
      if (!keys.insert(n.key).second) r.fail("its graph names node '" + n.key.substr(0, 64) + "' twice (keys are unique)");
  }
  get_string_pairs(r, [&](std::string k, std::string v) {
    if (!m.user_metadata.empty() && !(m.user_metadata.rbegin()->first < k))
      r.fail("its user metadata key '" + k.substr(0, 64) + (k.size() > 64 ? "…" : "") + "' " +
             (m.user_metadata.rbegin()->first == k ? "is given twice" : "comes after a greater key (keys are sorted)"));
    m.user_metadata.emplace_hint(m.user_metadata.end(), std::move(k), std::move(v));
  });
  if (!r.done()) r.fail(std::to_string(r.remaining()) + " unexpected bytes after the metadata");
  return m;
}

void encode_identity(ByteWriter& w, const SnapshotMeta& m) {
  w.put<std::uint64_t>(m.id);
  w.put<std::uint8_t>(m.step ? 1 : 0);
  w.put<std::uint64_t>(m.step.value_or(0));
}

void decode_identity(ByteReader& r, std::uint64_t& id, std::optional<std::uint64_t>& step) {
  id = r.get<std::uint64_t>();
  const auto has_step = r.get<std::uint8_t>();
  const auto value = r.get<std::uint64_t>();
  if (has_step > 1) r.fail("its step flag is " + std::to_string(has_step));
  if (!has_step && value != 0) r.fail("its step is " + std::to_string(value) + " without its step flag (0 when there is none)");
  step.reset();
  if (has_step) step = value;
  if (!r.done()) r.fail(std::to_string(r.remaining()) + " unexpected bytes after the identity");
}

void encode_node_details(ByteWriter& w, const SnapshotMeta& m) {
  w.put<std::uint64_t>(m.graph.size());
  for (const auto& n : m.graph) {
    w.str(n.segment);
    put_string_pairs(w, n.params);
  }
}

/// After the metadata: each graph node's segment and parameters, in graph order.
void decode_node_details(ByteReader& r, SnapshotMeta& m) {
  const std::size_t n = r.length(16);
  if (n != m.graph.size())
    r.fail("it describes " + std::to_string(n) + " nodes, the graph has " + std::to_string(m.graph.size()));
  for (auto& node : m.graph) {
    node.segment = std::string(r.str());
    if (node.segment != "prefix" && node.segment != "worker" && node.segment != "suffix")
      r.fail("node '" + node.key + "' has an unknown segment '" + node.segment + "'");
    get_string_pairs(r, [&](std::string k, std::string v) { node.params.emplace_back(std::move(k), std::move(v)); });
  }
  if (!r.done()) r.fail(std::to_string(r.remaining()) + " unexpected bytes after the node details");
}

/// Where an element list's lengths and bytes lie in the file, and their CRC-32C.
struct ListSpan {
  std::uint64_t begin = 0, end = 0;
  std::uint32_t crc = 0;
};
using ListSpans = std::vector<ListSpan>;

/// The node records as the node states and the state index both write them; `list(w, elements)` writes
/// an element list after its type byte.
template <class ListWriter>
void encode_records(ByteWriter& w, const std::vector<NodeState>& states, ListWriter list) {
  w.put<std::uint64_t>(states.size());
  for (const auto& s : states) {
    w.str(s.key);
    w.str(s.kind);
    w.put<std::uint32_t>(s.instance);
    w.put<std::uint8_t>(static_cast<std::uint8_t>(s.mode));
    w.put<std::uint64_t>(s.fields.size());
    for (const auto& f : s.fields) {
      w.str(f.name);
      w.put<std::uint8_t>(static_cast<std::uint8_t>(f.type));
      switch (f.type) {
        case FieldType::u64: w.put(f.u); break;
        case FieldType::i64: w.put(f.i); break;
        case FieldType::str: w.str(f.s); break;
        case FieldType::elements: list(w, f.elements); break;
      }
    }
  }
}

/// `spans` receives each element list's span (the writer's buffer starts at the file's first byte).
void encode_states(ByteWriter& w, const std::vector<NodeState>& states, ListSpans& spans) {
  std::size_t bulk = 0;  // the element bytes dominate: one allocation for them, no regrowth
  for (const auto& s : states)
    for (const auto& f : s.fields)
      if (f.type == FieldType::elements) bulk += f.elements.data.size() + 8 * f.elements.size();
  w.reserve(w.size() + bulk + 256 * states.size());
  encode_records(w, states, [&](ByteWriter& out, const ElementBlobs& e) {
    out.str(e.tag);
    out.put<std::uint64_t>(e.size());
    const std::uint64_t begin = out.size();
    for (std::size_t i = 0; i < e.size(); ++i) out.put<std::uint64_t>(e.offsets[i + 1] - e.offsets[i]);
    out.raw(e.data.data(), e.data.size());
    const std::uint64_t end = out.size();
    spans.push_back({begin, end, crc32c_raw(out.buffer().data() + begin, end - begin)});
  });
}

/// The state index: the node states again, each element list either inline (as in the node states, when
/// its lengths and bytes take at most kInlineListBytes) or stored: its span in the file and the CRC-32C
/// of the bytes there (`spans`, from encode_states). The inline lists are encoded again from the records.
void encode_state_index(ByteWriter& w, const std::vector<NodeState>& states, const ListSpans& spans) {
  std::size_t list = 0;
  encode_records(w, states, [&](ByteWriter& out, const ElementBlobs& e) {
    const ListSpan& span = spans[list++];
    out.str(e.tag);
    out.put<std::uint64_t>(e.size());
    const bool stored = span.end - span.begin > kInlineListBytes;
    out.put<std::uint8_t>(stored ? 1 : 0);
    if (stored) {
      out.put<std::uint64_t>(span.begin);
      out.put<std::uint64_t>(span.end - span.begin);
      out.put<std::uint32_t>(span.crc);
    } else {
      for (std::size_t i = 0; i < e.size(); ++i) out.put<std::uint64_t>(e.offsets[i + 1] - e.offsets[i]);
      out.raw(e.data.data(), e.data.size());
    }
  });
}

/// Element list `e` of `n` elements from its lengths and bytes (as the node states hold them).
void decode_element_list(ByteReader& r, std::size_t n, ElementBlobs& e, const std::string& field) {
  e.offsets.resize(n + 1);
  std::uint64_t total = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const auto len = r.get<std::uint64_t>();
    if (len > r.remaining()) r.fail("an element of field '" + field + "' claims " + std::to_string(len) + " bytes");
    total += len;
    e.offsets[i + 1] = total;
  }
  if (total > r.remaining()) r.fail("the elements of field '" + field + "' run past their end");
  e.data.assign(r.bytes(static_cast<std::size_t>(total)));
}

/// One node record of the node states or the state index, the one reader of a record's layout;
/// `list(r, field, record)` reads an element list after its type byte. `s` may hold an earlier record:
/// its fields are reused, so a pass over many records into one NodeState allocates only when a string or
/// list outgrows the storage it had.
template <class ListReader>
void decode_record(ByteReader& r, NodeState& s, ListReader& list) {
  s.key = r.str();
  s.kind = r.str();
  s.instance = r.get<std::uint32_t>();
  const auto mode = r.get<std::uint8_t>();
  if (mode < 1 || mode > 3) r.fail("node '" + s.key + "' has an unknown state mode " + std::to_string(mode));
  s.mode = static_cast<StateMode>(mode);
  const std::size_t field_count = r.length(17);  // name length, type, and at least 8 bytes of value
  if (s.fields.size() > field_count) s.fields.resize(field_count);
  s.fields.reserve(field_count);
  for (std::size_t fi = 0; fi < field_count; ++fi) {
    Field& f = fi < s.fields.size() ? s.fields[fi] : s.fields.emplace_back();
    f.clear();
    f.name = r.str();
    const auto type = r.get<std::uint8_t>();
    switch (type) {
      case 1: f.type = FieldType::u64; f.u = r.get<std::uint64_t>(); break;
      case 2: f.type = FieldType::i64; f.i = r.get<std::int64_t>(); break;
      case 3: f.type = FieldType::str; f.s = r.str(); break;
      case 4: f.type = FieldType::elements; list(r, f, s); break;
      default: r.fail("field '" + f.name + "' of node '" + s.key + "' has an unknown type " + std::to_string(type));
    }
  }
}

/// The node records of the node states or the state index (see decode_record).
template <class ListReader>
std::vector<NodeState> decode_records(ByteReader& r, std::string_view section, ListReader list) {
  // Counts are bounded by the bytes left over the smallest encoding of an item, and lists are reserved
  // exactly to that count (no doubling growth): a record (96 bytes in memory) takes at least 29 bytes, a
  // field (176 bytes) at least 17, so a section costs at most about 10.4 times its size.
  const std::size_t records = r.length(29);
  std::vector<NodeState> states;
  states.reserve(records);
  for (std::size_t k = 0; k < records; ++k) decode_record(r, states.emplace_back(), list);
  if (!r.done()) r.fail(std::to_string(r.remaining()) + " unexpected bytes after the " + std::string(section));
  return states;
}

std::vector<NodeState> decode_states(ByteReader& r) {
  return decode_records(r, "node states", [](ByteReader& in, Field& f, const NodeState&) {
    f.elements.tag = in.str();
    decode_element_list(in, in.length(8), f.elements, f.name);
  });
}

/// Reads an element list of a state index (after its type byte): an inline list's elements into
/// `f.elements`, a stored list's place in the file into the result, which must lie inside the node-state
/// section [states_begin, states_end).
detail::StoredList read_index_list(ByteReader& in, Field& f, const NodeState& s, std::uint32_t file,
                                   std::uint64_t states_begin, std::uint64_t states_end) {
  auto& e = f.elements;
  e.tag = in.str();
  detail::StoredList l{.file = file, .tag = e.tag};
  l.count = in.get<std::uint64_t>();
  const auto stored = in.get<std::uint8_t>();
  const auto who = [&] { return "field '" + f.name + "' of node '" + s.key + "'"; };  // for errors only
  if (stored > 1) in.fail(who() + " has a list flag " + std::to_string(stored));
  if (stored) {
    l.offset = in.get<std::uint64_t>();
    l.bytes = in.get<std::uint64_t>();
    l.crc = in.get<std::uint32_t>();
    if (l.offset < states_begin || l.offset > states_end || l.bytes > states_end - l.offset || l.count > l.bytes / 8)
      in.fail(who() + " claims " + std::to_string(l.count) + " elements in bytes [" + std::to_string(l.offset) + ", +" +
              std::to_string(l.bytes) + ") outside the node states");
    l.stored = true;
  } else {
    if (l.count > in.remaining() / 8) in.fail(who() + " claims more elements than fit");
    decode_element_list(in, static_cast<std::size_t>(l.count), e, f.name);
  }
  return l;
}

/// Reads an element list of a state index (read_index_list): an inline list is loaded; every list with
/// elements is also given as one range of a new entry of `lists` (file `file`), so the rescale rules deal
/// ranges.
void decode_index_list(ByteReader& in, Field& f, const NodeState& s, std::uint32_t file, std::uint64_t states_begin,
                       std::uint64_t states_end, std::vector<detail::StoredList>& lists) {
  detail::StoredList l = read_index_list(in, f, s, file, states_begin, states_end);
  if (l.count == 0) return;
  if (!l.stored) l.loaded = std::make_unique<ElementBlobs>(f.elements);
  f.elements.ranges.push_back({lists.size(), 0, l.count});
  lists.push_back(std::move(l));
}

/// Where section 2, read from `file` at `offset`, put each element list of `states` (decoded from it), and
/// the CRC-32C of its bytes: the spans encode_states would record, found by walking the encoding's sizes.
ListSpans spans_in_file(const std::vector<NodeState>& states, std::string_view file, std::uint64_t offset) {
  ListSpans spans;
  std::uint64_t at = offset + 8;  // the record count
  for (const auto& st : states) {
    at += 8 + st.key.size() + 8 + st.kind.size() + 4 + 1 + 8;
    for (const auto& f : st.fields) {
      at += 8 + f.name.size() + 1;
      switch (f.type) {
        case FieldType::u64:
        case FieldType::i64: at += 8; break;
        case FieldType::str: at += 8 + f.s.size(); break;
        case FieldType::elements: {
          at += 8 + f.elements.tag.size() + 8;
          const std::uint64_t end = at + 8 * f.elements.size() + f.elements.data.size();
          spans.push_back({at, end, crc32c_raw(file.data() + at, end - at)});
          at = end;
          break;
        }
      }
    }
  }
  return spans;
}

/// Section 5 must say what section 2 says (docs/snapshot-format.md): a reader of the whole file checks it,
/// so no file resumes from one and rescales through the other. It is encoded again from the records
/// section 2 gave and compared byte for byte.
void check_index_matches_states(std::string_view index, std::string_view file, std::uint64_t states_offset,
                                const std::vector<NodeState>& states) {
  ByteWriter again;
  encode_state_index(again, states, spans_in_file(states, file, states_offset));
  if (again.buffer() != index)
    throw SnapshotError("snapshot state index (section 5) does not say what the node states (section 2) say: the "
                        "file was altered after it was written");
}

/// A replay record of format 5 on: count and digest (u64), then digest_steps, u64 elements, one per power
/// of two from 2^16 up to count (a replay is checked at each, so a wrong one refuses early).
template <class Fail>
void check_replay_record(const NodeState& st, const std::string& who, const Fail& fail) {
  const auto is = [&](std::size_t i, std::string_view name, FieldType type) {
    return i < st.fields.size() && st.fields[i].name == name && st.fields[i].type == type;
  };
  if (!is(0, "count", FieldType::u64) || !is(1, "digest", FieldType::u64) || !is(2, "digest_steps", FieldType::elements))
    fail(who + " is a replay record but does not begin with count, digest and digest_steps");
  const ElementBlobs& steps = st.fields[2].elements;
  const std::size_t want = replay_steps_for(st.fields[0].u);
  if (steps.tag != "u64" || steps.size() != want)
    fail(who + " replays " + std::to_string(st.fields[0].u) + " elements with " + std::to_string(steps.size()) + " " +
         steps.tag.substr(0, 16) + " digest steps, not " + std::to_string(want) + " u64");
}

/// What the format states of a rank file's records beyond their encoding (docs/snapshot-format.md,
/// "Which records exist"), checked wherever a whole file is read (show, resume, rescale), so no reader
/// acts on a file that breaks it: the run record first, its `delivered` the metadata's; each record of
/// an instance of this rank, no record stateless with fields, a graph node's records of its kind.
void check_records(const Snapshot& s) {
  const auto fail = [](const std::string& what) { throw SnapshotError("snapshot node states: " + what); };
  if (s.meta.format_version >= 2 && s.meta.id == 0) throw SnapshotError("snapshot identity: its id is 0, which no snapshot has");
  if (s.states.empty()) fail("no run record (the first record is the engine's, key 'run')");
  const NodeState& run = s.states.front();
  if (run.key != "run" || run.kind != "run")
    fail("the first record is '" + run.key.substr(0, 64) + "' (" + run.kind.substr(0, 64) + "), not the run record");
  if (run.instance != static_cast<std::uint32_t>(s.meta.layout.rank) || run.mode != StateMode::hook)
    fail("the run record is of instance " + std::to_string(run.instance) + " by " + to_string(run.mode) + ", not of rank " +
         std::to_string(s.meta.layout.rank) + " by hook");
  const Field* delivered = run.fields.empty() ? nullptr : &run.fields.front();
  if (!delivered || delivered->name != "delivered" || delivered->type != FieldType::u64)
    fail("the run record does not begin with 'delivered' (u64)");
  if (delivered->u != s.meta.elements_delivered)
    fail("the run record says " + std::to_string(delivered->u) + " elements delivered, the metadata " +
         std::to_string(s.meta.elements_delivered));
  if (delivered->u == std::numeric_limits<std::uint64_t>::max())
    fail("it claims 2^64 - 1 elements delivered, which no run reaches");
  std::unordered_map<std::string_view, std::string_view> kinds;
  for (const auto& n : s.meta.graph) kinds.emplace(n.key, n.kind);
  const std::uint64_t workers = static_cast<std::uint64_t>(s.meta.layout.num_workers);
  const std::uint64_t first = static_cast<std::uint64_t>(s.meta.layout.rank) * workers;
  for (std::size_t i = 1; i < s.states.size(); ++i) {
    const NodeState& st = s.states[i];
    const std::string who = "the record of '" + st.key.substr(0, 64) + "' (instance " + std::to_string(st.instance) + ")";
    if (st.key == "run") fail("a second run record");
    if (st.instance < first || st.instance >= first + workers)
      fail(who + " is of no instance of rank " + std::to_string(s.meta.layout.rank) + " (" + std::to_string(first) + " to " +
           std::to_string(first + workers - 1) + ")");
    // A stateless node has no fields of its own, only its input count (format 6 on) and a held failure's
    // three (deferred_failure, …).
    if (st.mode == StateMode::stateless) {
      std::size_t own = 0;
      if (!st.fields.empty() && st.fields.front().name == kInputTakenField) own = 1;
      if (st.fields.size() > own && !st.fields[own].name.starts_with("deferred_"))
        fail(who + " is stateless but has a field '" + st.fields[own].name.substr(0, 64) + "'");
    }
    // The input count, once, after the node's own fields: only a held failure's may follow it.
    for (std::size_t k = 0; k < st.fields.size(); ++k) {
      const Field& f = st.fields[k];
      if (f.name != kInputTakenField) continue;
      if (f.type != FieldType::u64 || s.meta.format_version < 6)
        fail(who + " has a field '" + std::string(kInputTakenField) + "' " +
             (f.type != FieldType::u64 ? "that is not a u64" : "in a file of version " + std::to_string(s.meta.format_version) + " (6 on)"));
      if (k + 1 < st.fields.size() && !st.fields[k + 1].name.starts_with("deferred_"))
        fail(who + " has a field '" + st.fields[k + 1].name.substr(0, 64) + "' after its '" + std::string(kInputTakenField) +
             "', where only a held failure's may follow");
      if (k > 0 && st.fields[k - 1].name.starts_with("deferred_"))
        fail(who + " has its '" + std::string(kInputTakenField) + "' after a held failure's fields, not before them");
    }
    if (const auto k = kinds.find(st.key); k != kinds.end() && k->second != st.kind)
      fail(who + " is a " + st.kind.substr(0, 64) + ", its graph node a " + std::string(k->second));
    if (st.mode == StateMode::replay && s.meta.format_version >= 5) check_replay_record(st, who, fail);
  }
}

}  // namespace

const char* to_string(StateMode m) {
  switch (m) {
    case StateMode::hook: return "hook";
    case StateMode::stateless: return "stateless";
    case StateMode::replay: return "replay";
  }
  return "unknown";
}

const NodeState* Snapshot::find(std::string_view key, std::uint32_t instance) const {
  for (const auto& s : states)
    if (s.key == key && s.instance == instance) return &s;
  return nullptr;
}

std::string Snapshot::to_bytes() const {
  std::string bytes;
  write_bytes(bytes);
  return bytes;
}

void Snapshot::write_bytes(std::string& buffer) const {
  // A replay record read from a file of format 4 or before has no digest steps, which no one can compute
  // without replaying: such a snapshot is not written as today's format (resume it and snapshot the run).
  for (const auto& st : states)
    if (st.mode == StateMode::replay)
      check_replay_record(st, "the record of '" + st.key.substr(0, 64) + "' (instance " + std::to_string(st.instance) + ")",
                          [&](const std::string& what) {
                            throw SnapshotError("snapshot not written: " + what +
                                                (meta.format_version && meta.format_version < 5
                                                     ? " (it was read from a format " + std::to_string(meta.format_version) +
                                                           " file; resume the run and take a new snapshot)"
                                                     : ""));
                          });
  // Node details only when every node has them: a snapshot read from an older file has none, and is
  // written back as it was.
  const bool details = std::all_of(meta.graph.begin(), meta.graph.end(), [](const auto& n) { return !n.segment.empty(); });
  // The small sections first (a reader of the identity, or of a rescale plan, reads the first bytes),
  // the state index last: it names where the node states put each element list.
  std::vector<SectionId> ids = {kIdentity, kMeta};
  if (details) ids.push_back(kNodeDetails);
  ids.push_back(kStates);
  ids.push_back(kStateIndex);
  const auto n = static_cast<std::uint32_t>(ids.size());
  // The sections are encoded in place after room for the header and the table, which are filled in
  // last: one buffer, no copy of a section (a state holds megabytes of buffered elements).
  std::uint64_t begin[5] = {}, size[5] = {};
  ListSpans spans;
  ByteWriter out;
  buffer.clear();
  out.buffer().swap(buffer);  // the caller's capacity is reused
  const std::size_t head = kHeaderBytes + n * kSectionEntryBytes;
  out.buffer().resize(head);
  for (std::uint32_t i = 0; i < n; ++i) {
    begin[i] = out.size();
    switch (ids[i]) {
      case kIdentity: encode_identity(out, meta); break;
      case kMeta: encode_meta(out, meta); break;
      case kStates: encode_states(out, states, spans); break;
      case kNodeDetails: encode_node_details(out, meta); break;
      case kStateIndex: encode_state_index(out, states, spans); break;
    }
    size[i] = out.size() - begin[i];
  }
  out.buffer().swap(buffer);
  ByteWriter table;
  for (std::uint32_t i = 0; i < n; ++i) {
    put_u32(table, ids[i]);
    put_u32(table, crc32c_raw(buffer.data() + begin[i], size[i]));
    table.put<std::uint64_t>(begin[i]);
    table.put<std::uint64_t>(size[i]);
  }
  ByteWriter header;
  header.raw(kMagic, sizeof kMagic);
  put_u32(header, kFormatVersion);
  put_u32(header, n);
  header.put<std::uint64_t>(buffer.size());  // total length
  put_u32(header, crc32c(table.buffer()));
  put_u32(header, crc32c(header.buffer()));  // header checksum over the 28 bytes before it
  std::memcpy(buffer.data(), header.buffer().data(), header.size());
  std::memcpy(buffer.data() + kHeaderBytes, table.buffer().data(), table.size());
}

Snapshot Snapshot::from_bytes(std::string_view bytes) {
  if (bytes.size() < kHeaderBytes)
    throw SnapshotError("snapshot is truncated: " + std::to_string(bytes.size()) + " bytes, a header alone is " +
                        std::to_string(kHeaderBytes));
  if (std::memcmp(bytes.data(), kMagic, sizeof kMagic) != 0)
    throw SnapshotError("not a dpipe snapshot: wrong magic bytes at the start");
  ByteReader h(bytes.substr(8, kHeaderBytes - 8), "snapshot header");
  const auto version = h.get<std::uint32_t>();
  if (version > kFormatVersion)
    throw SnapshotError("snapshot format version " + std::to_string(version) +
                        " is newer than this build of dpipe reads (up to " + std::to_string(kFormatVersion) + ")");
  if (version == 0) throw SnapshotError("snapshot format version 0 is invalid");
  const auto count = h.get<std::uint32_t>();
  const auto total = h.get<std::uint64_t>();
  const auto table_crc = h.get<std::uint32_t>();
  const auto header_crc = h.get<std::uint32_t>();
  if (crc32c_raw(bytes.data(), kHeaderBytes - 4) != header_crc)
    throw SnapshotError("snapshot header checksum mismatch: the header is corrupt");
  if (total > bytes.size())
    throw SnapshotError("snapshot is truncated: " + std::to_string(bytes.size()) + " bytes, the header says " +
                        std::to_string(total));
  if (total < bytes.size())
    throw SnapshotError("snapshot has " + std::to_string(bytes.size() - total) + " unexpected bytes at the end");
  if (count > kMaxSections) throw SnapshotError("snapshot header claims " + std::to_string(count) + " sections");
  const std::size_t table_end = kHeaderBytes + count * kSectionEntryBytes;
  if (table_end > bytes.size()) throw SnapshotError("snapshot is truncated inside its section table");
  const auto table = bytes.substr(kHeaderBytes, count * kSectionEntryBytes);
  if (crc32c(table) != table_crc) throw SnapshotError("snapshot section table checksum mismatch");

  Snapshot s;
  s.meta.format_version = version;
  bool have_meta = false, have_states = false, have_identity = false;
  std::optional<std::string_view> index;  // section 5, compared with section 2 once both are read
  std::uint64_t states_offset = 0;
  std::uint64_t id_value = 0;
  std::optional<std::uint64_t> step;
  std::optional<std::string_view> details;  // read after the metadata, wherever it stands
  ByteReader t(table, "snapshot section table");
  for (std::uint32_t i = 0; i < count; ++i) {
    const auto id = t.get<std::uint32_t>();
    const auto crc = t.get<std::uint32_t>();
    const auto off = t.get<std::uint64_t>();
    const auto len = t.get<std::uint64_t>();
    if (off < table_end || off > bytes.size() || len > bytes.size() - off)
      throw SnapshotError("snapshot section " + std::to_string(id) + " lies outside the file");
    const auto body = bytes.substr(off, len);
    if (crc32c(body) != crc) throw SnapshotError("snapshot section " + std::to_string(id) + " checksum mismatch");
    if ((id == kMeta && have_meta) || (id == kStates && have_states))
      throw SnapshotError("snapshot has two " + std::string(id == kMeta ? "metadata" : "node-state") + " sections");
    if (id == kMeta) {
      ByteReader r(body, "snapshot metadata");
      const auto v = s.meta.format_version;
      s.meta = decode_meta(r);
      s.meta.format_version = v;
      have_meta = true;
    } else if (id == kStates) {
      ByteReader r(body, "snapshot node states");
      s.states = decode_states(r);
      have_states = true;
      states_offset = off;
    } else if (id == kStateIndex) {
      if (index) throw SnapshotError("snapshot has two state-index sections");
      index = body;
    } else if (id == kIdentity) {
      if (have_identity) throw SnapshotError("snapshot has two identity sections");
      ByteReader r(body, "snapshot identity");
      decode_identity(r, id_value, step);
      have_identity = true;
    } else if (id == kNodeDetails) {
      if (details) throw SnapshotError("snapshot has two node-detail sections");
      details = body;
    }  // unknown sections of a readable version are skipped
  }
  if (!have_meta || !have_states) throw SnapshotError("snapshot lacks its metadata or node-state section");
  if (version >= 2 && !have_identity) throw SnapshotError("snapshot lacks its identity section");
  s.meta.id = id_value;
  s.meta.step = step;
  if (!have_identity) s.meta.id = detail::snapshot_id(s.meta);  // format 1 has none: the one its content gives
  if (details) {
    ByteReader r(*details, "snapshot node details");
    decode_node_details(r, s.meta);
  }
  if (version >= 3 && !index) throw SnapshotError("snapshot lacks its state index (section 5, from format version 3 on)");
  if (index) check_index_matches_states(*index, bytes, states_offset, s.states);
  check_records(s);
  return s;
}

void Snapshot::write_file(const std::string& path) const { write_file_atomically(path, to_bytes()); }

namespace {

/// A snapshot file read in parts: its header and section table (verified) from its first bytes, then
/// sections one at a time, each verified against its checksum.
class SnapshotFileParts {
 public:
  struct Entry {
    std::uint32_t id = 0, crc = 0;
    std::uint64_t offset = 0, length = 0;
  };

  explicit SnapshotFileParts(const std::string& path) : path_(path), file_(path, FileRole::snapshot) {
    // The first bytes hold the header, the table and, in files dpipe writes, the small sections after it.
    head_ = read(0, std::min<std::uint64_t>(file_.size(), kHeadBytes));
    if (head_.size() >= kHeaderBytes) {  // a table longer than the first read is read whole
      std::uint32_t count = 0;
      std::memcpy(&count, head_.data() + 12, sizeof count);
      const std::uint64_t table_end = kHeaderBytes + std::uint64_t{std::min(count, kMaxSections)} * kSectionEntryBytes;
      if (table_end > head_.size() && table_end <= file_.size()) head_ = read(0, table_end);
    }
    if (head_.size() < kHeaderBytes || std::memcmp(head_.data(), kMagic, sizeof kMagic) != 0)
      throw fail("not a dpipe snapshot (no header)");
    if (crc32c_raw(head_.data(), kHeaderBytes - 4) !=
        ByteReader(std::string_view(head_).substr(kHeaderBytes - 4, 4), "header").get<std::uint32_t>())
      throw fail("snapshot header checksum mismatch: the header is corrupt");
    ByteReader h(std::string_view(head_).substr(8, kHeaderBytes - 8), "snapshot header");
    version_ = h.get<std::uint32_t>();
    if (version_ == 0 || version_ > Snapshot::kFormatVersion)
      throw fail("snapshot format version " + std::to_string(version_) + " is not one this build of dpipe reads (1 to " +
                 std::to_string(Snapshot::kFormatVersion) + ")");
    const auto count = h.get<std::uint32_t>();
    const auto total = h.get<std::uint64_t>();
    const auto table_crc = h.get<std::uint32_t>();
    if (total != file_.size())
      throw fail("snapshot is " + std::to_string(file_.size()) + " bytes, its header says " + std::to_string(total));
    // The whole table was read when the file holds it, so a table that does not fit is a truncated file.
    const std::size_t table_end = kHeaderBytes + static_cast<std::size_t>(count) * kSectionEntryBytes;
    if (count > kMaxSections || table_end > head_.size()) throw fail("snapshot is truncated inside its section table");
    const auto table = std::string_view(head_).substr(kHeaderBytes, table_end - kHeaderBytes);
    if (crc32c(table) != table_crc) throw fail("snapshot section table checksum mismatch");
    ByteReader t(table, "snapshot section table");
    for (std::uint32_t i = 0; i < count; ++i) {
      Entry e;
      e.id = t.get<std::uint32_t>();
      e.crc = t.get<std::uint32_t>();
      e.offset = t.get<std::uint64_t>();
      e.length = t.get<std::uint64_t>();
      if (e.offset < table_end || e.offset > total || e.length > total - e.offset)
        throw fail("snapshot section " + std::to_string(e.id) + " lies outside the file");
      entries_.push_back(e);
    }
  }

  std::uint32_t version() const { return version_; }
  /// The entry of section `id`, or null; two of them are refused.
  const Entry* find(std::uint32_t id) const {
    const Entry* found = nullptr;
    for (const auto& e : entries_)
      if (e.id == id) {
        if (found) throw fail("snapshot has two sections " + std::to_string(id));
        found = &e;
      }
    return found;
  }
  /// Section `e`'s bytes, verified.
  std::string section(const Entry& e) const {
    std::string body = e.offset + e.length <= head_.size() ? head_.substr(e.offset, e.length) : read(e.offset, e.length);
    if (crc32c(body) != e.crc) throw fail("snapshot section " + std::to_string(e.id) + " checksum mismatch");
    return body;
  }
  /// Bytes [offset, offset + length) of the file.
  std::string read(std::uint64_t offset, std::uint64_t length) const { return detail::read_at(file_, path_, offset, length); }
  SnapshotError fail(const std::string& why) const { return SnapshotError("'" + path_ + "': " + why); }

 private:
  static constexpr std::uint64_t kHeadBytes = 1024;
  std::string path_;
  RegularFile file_;
  std::string head_;
  std::uint32_t version_ = 0;
  std::vector<Entry> entries_;
};

}  // namespace

SnapshotIdentity Snapshot::read_identity(const std::string& path) {
  const SnapshotFileParts file(path);
  SnapshotIdentity out{.format_version = file.version()};
  if (out.format_version < 2) return out;  // no identity before format 2
  const auto* e = file.find(kIdentity);
  if (!e) throw file.fail("snapshot lacks its identity section");
  const std::string body = file.section(*e);
  ByteReader r(body, "snapshot identity");
  decode_identity(r, out.id, out.step);
  return out;
}

namespace {

/// The metadata, id and step of a file read in parts (sections 1 and 4; a file of format 1 has no 4).
SnapshotMeta meta_in(const SnapshotFileParts& file) {
  const auto* meta = file.find(kMeta);
  if (!meta) throw file.fail("snapshot lacks its metadata section");
  const std::string body = file.section(*meta);
  ByteReader r(body, "snapshot metadata");
  SnapshotMeta out = decode_meta(r);
  out.format_version = file.version();
  if (const auto* identity = file.find(kIdentity)) {
    const std::string id = file.section(*identity);
    ByteReader ir(id, "snapshot identity");
    decode_identity(ir, out.id, out.step);
  }
  return out;
}

}  // namespace

SnapshotMeta Snapshot::read_meta(const std::string& path) { return meta_in(SnapshotFileParts(path)); }

namespace detail {

std::uint64_t snapshot_id(const SnapshotMeta& m) {
  std::uint64_t h = mix64(m.fingerprint ^ mix64(m.seed ^ mix64(m.epoch)));
  for (const std::uint64_t x : {std::uint64_t(m.layout.rank), std::uint64_t(m.layout.world_size),
                                std::uint64_t(m.layout.num_workers), m.elements_delivered,
                                m.step ? *m.step + 1 : 0})
    h = mix64(h ^ x);
  return h | 1;  // never 0, which stands for "no id" (files of format 1)
}

std::string read_at(const RegularFile& file, const std::string& path, std::uint64_t offset, std::uint64_t length) {
  // Never sized by a length the file cannot hold (a damaged index must not make this allocate).
  if (offset > file.size() || length > file.size() - offset)
    throw SnapshotError("'" + path + "': bytes [" + std::to_string(offset) + ", +" + std::to_string(length) +
                        ") lie past the end of the file (" + std::to_string(file.size()) + " bytes)");
  std::string bytes(static_cast<std::size_t>(length), '\0');
  std::size_t got = 0;
  while (got < bytes.size()) {
    const ssize_t k = ::pread(file.fd(), bytes.data() + got, bytes.size() - got, static_cast<off_t>(offset + got));
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0)
      throw SnapshotError("'" + path + "': cannot read it: " + (k < 0 ? std::strerror(errno) : "it shrank"));
    got += static_cast<std::size_t>(k);
  }
  return bytes;
}

std::optional<SnapshotPlan> read_snapshot_plan(const std::string& path) {
  const SnapshotFileParts parts(path);
  const auto* index = parts.find(kStateIndex);
  if (!index) return std::nullopt;  // before format 3: the caller reads the whole set
  const auto* meta = parts.find(kMeta);
  const auto* states = parts.find(kStates);
  const auto* identity = parts.find(kIdentity);
  if (!meta || !states || !identity) throw parts.fail("snapshot lacks its metadata, node-state or identity section");
  try {
    SnapshotPlan plan;
    plan.meta = meta_in(parts);
    if (const auto* details = parts.find(kNodeDetails)) {
      const std::string body = parts.section(*details);
      ByteReader r(body, "snapshot node details");
      decode_node_details(r, plan.meta);
    }
    plan.index = parts.section(*index);
    plan.states_begin = states->offset;
    plan.states_end = states->offset + states->length;
    plan.index_begin = index->offset;
    // Where each record starts: one pass through the records, read into one reused NodeState and its
    // inline lists into its fields (bounded and checked as a decode is), nothing kept but the keys.
    ByteReader r(plan.index, "snapshot state index");
    const std::size_t records = r.length(29);
    plan.records.reserve(records);
    NodeState scratch;
    auto pass_list = [&](ByteReader& in, Field& f, const NodeState& st) {
      read_index_list(in, f, st, 0, plan.states_begin, plan.states_end);
    };
    for (std::size_t k = 0; k < records; ++k) {
      const auto offset = static_cast<std::size_t>(r.pos() - plan.index.data());
      decode_record(r, scratch, pass_list);
      plan.records.push_back({scratch.key, offset});
    }
    if (!r.done()) r.fail(std::to_string(r.remaining()) + " unexpected bytes after the state index");
    return plan;
  } catch (const SnapshotError& e) {
    throw parts.fail(e.what());
  }
}

NodeState decode_plan_record(const SnapshotPlan& plan, std::size_t offset, std::uint32_t file,
                             std::vector<StoredList>& lists) {
  ByteReader r(std::string_view(plan.index).substr(offset), "snapshot state index");
  NodeState s;
  auto list = [&](ByteReader& in, Field& f, const NodeState& st) {
    decode_index_list(in, f, st, file, plan.states_begin, plan.states_end, lists);
  };
  decode_record(r, s, list);
  return s;
}

void for_each_located_record(const SnapshotPlan& plan, std::uint32_t file,
                             const std::function<void(const NodeState&, const std::vector<StoredList>&)>& each) {
  ByteReader r(plan.index, "snapshot state index");
  const std::size_t records = r.length(29);
  NodeState scratch;
  std::vector<StoredList> lists;
  auto located = [&](ByteReader& in, Field& f, const NodeState& st) {
    // An inline list's lengths and bytes follow its flag byte, laid out as a stored list's are.
    const char* flag = nullptr;
    auto& e = f.elements;
    {
      ByteReader peek = in;  // the tag, the count and the flag, to find where an inline list begins
      peek.str();
      peek.get<std::uint64_t>();
      flag = peek.pos();
    }
    StoredList l = read_index_list(in, f, st, file, plan.states_begin, plan.states_end);
    if (l.count == 0) return;
    if (!l.stored) {
      const char* begin = flag + 1;
      l.offset = plan.index_begin + static_cast<std::uint64_t>(begin - plan.index.data());
      l.bytes = static_cast<std::uint64_t>(in.pos() - begin);
      l.crc = crc32c_raw(begin, static_cast<std::size_t>(l.bytes));
      l.stored = true;
      l.loaded = std::make_unique<ElementBlobs>(e);
    }
    e.ranges.assign(1, {lists.size(), 0, l.count});
    lists.push_back(std::move(l));
  };
  for (std::size_t k = 0; k < records; ++k) {
    lists.clear();
    decode_record(r, scratch, located);
    each(scratch, lists);
  }
  if (!r.done()) r.fail(std::to_string(r.remaining()) + " unexpected bytes after the state index");
}

ElementBlobs load_stored_list(const std::string& path, const StoredList& list) {
  // The list's own bytes only: its checksum (from the verified state index) covers all that is used, so
  // the header is not read and checked again for each list.
  const RegularFile file(path, FileRole::snapshot);
  const std::string bytes = read_at(file, path, list.offset, list.bytes);
  const auto fail = [&](const std::string& why) { return SnapshotError("'" + path + "': " + why); };
  if (crc32c(bytes) != list.crc)
    throw fail("an element list at bytes [" + std::to_string(list.offset) + ", +" + std::to_string(list.bytes) +
               ") does not match its checksum in the state index");
  ElementBlobs e;
  e.tag = list.tag;
  try {
    ByteReader r(bytes, "an element list");
    decode_element_list(r, static_cast<std::size_t>(list.count), e, "list");
    if (!r.done()) r.fail(std::to_string(r.remaining()) + " unexpected bytes after its elements");
  } catch (const SnapshotError& err) {
    throw fail(err.what());
  }
  return e;
}

}  // namespace detail

void ElementBlobs::append_from(const ElementBlobs& src, std::size_t begin, std::size_t end) {
  if (begin >= end) return;
  if (src.ranges.empty()) {
    if (!ranges.empty()) throw SnapshotError("cannot rescale: a plan's elements and loaded elements dealt into one list");
    if (offsets.empty()) offsets.push_back(0);
    const std::uint64_t shift = data.size() - src.offsets[begin];
    data.append(src.data, src.offsets[begin], src.offsets[end] - src.offsets[begin]);
    for (std::size_t i = begin + 1; i <= end; ++i) offsets.push_back(src.offsets[i] + shift);
    return;
  }
  if (ranges.empty() && size() > 0)
    throw SnapshotError("cannot rescale: a plan's elements and loaded elements dealt into one list");
  offsets.clear();  // a loaded copy would no longer match the ranges
  data.clear();
  std::size_t skip = begin, want = end - begin;
  for (const auto& r : src.ranges) {
    const std::size_t n = static_cast<std::size_t>(r.end - r.begin);
    if (skip >= n) {
      skip -= n;
      continue;
    }
    const std::size_t take = std::min(n - skip, want);
    const ElementRange piece{r.list, r.begin + skip, r.begin + skip + take};
    if (!ranges.empty() && ranges.back().list == piece.list && ranges.back().end == piece.begin) ranges.back().end = piece.end;
    else ranges.push_back(piece);
    want -= take;
    skip = 0;
    if (want == 0) break;
  }
}

Snapshot Snapshot::read_file(const std::string& path) {
  // A regular file only, read up to its size (FileError for a FIFO or a device: nothing blocks).
  const std::string bytes = read_regular_file(path, FileRole::snapshot);
  try {
    return from_bytes(bytes);
  } catch (const SnapshotError& e) {
    throw SnapshotError("'" + path + "': " + e.what());
  }
}

}  // namespace dpipe
