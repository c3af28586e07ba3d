// The set index: encoding and decoding (see set_index.hpp and docs/snapshot-format.md, "The set index").
#include "set_index.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <unordered_map>

#include "dpipe/codec.hpp"
#include "dpipe/crc32c.hpp"
#include "dpipe/error.hpp"

namespace dpipe::detail {
namespace {

constexpr char kMagic[8] = {'D', 'P', 'I', 'P', 'E', 'S', 'I', 'X'};
constexpr std::uint32_t kVersion = 1;
constexpr std::size_t kHeadBytes = 16;  // magic, version, CRC-32C of everything after the head
// A list whose lengths and bytes (8 per length, as in a rank file) take at most this many is written
// with its values (a generator's four words, a few positions); any other by where it lies.
constexpr std::uint64_t kValueListBytes = 64;
// A list of positions (tag u64: a sampler's skipped positions) is written with its values up to this many
// bytes, so the rule that reads them from every instance finds them here.
constexpr std::uint64_t kPositionListBytes = 4096;

void put_varint(std::string& out, std::uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
void put_text(std::string& out, std::string_view s) {
  put_varint(out, s.size());
  out.append(s);
}
std::uint64_t zigzag(std::int64_t v) { return (static_cast<std::uint64_t>(v) << 1) ^ static_cast<std::uint64_t>(v >> 63); }
std::int64_t unzigzag(std::uint64_t v) { return static_cast<std::int64_t>(v >> 1) ^ -static_cast<std::int64_t>(v & 1); }

std::uint64_t get_varint(ByteReader& r) {
  std::uint64_t v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    const auto byte = r.get<std::uint8_t>();
    if (shift == 63 && byte > 1) break;
    v |= std::uint64_t(byte & 0x7f) << shift;
    if (!(byte & 0x80)) return v;
  }
  r.fail("a number runs past 64 bits");
}
/// A varint that counts items of at least `min_bytes` each in what remains.
std::size_t get_count(ByteReader& r, std::size_t min_bytes) {
  const std::uint64_t n = get_varint(r);
  if (n > r.remaining() / std::max<std::size_t>(min_bytes, 1)) r.fail("a count of " + std::to_string(n) + " does not fit");
  return static_cast<std::size_t>(n);
}
std::string_view get_text(ByteReader& r) { return r.bytes(get_count(r, 1)); }

}  // namespace

void SetIndexWriter::add_rank(const SnapshotPlan& plan, std::uint32_t rank, const std::string& path) {
  if (rank != ranks_) throw SnapshotError("set index: rank " + std::to_string(rank) + " added out of order");
  ++ranks_;
  for_each_located_record(plan, rank, [&](const NodeState& st, const std::vector<StoredList>& lists) {
    auto it = node_of_.find(st.key);
    if (it == node_of_.end()) {
      nodes_.push_back({st.key, st.kind, {}, {}, {}, {}, 0});
      it = node_of_.emplace(st.key, nodes_.size() - 1).first;
    }
    Node& n = nodes_[it->second];
    if (n.kind != st.kind)
      throw SnapshotError("set index: node '" + st.key + "' of rank " + std::to_string(rank) + " is a " + st.kind +
                          ", not a " + n.kind);
    put_varint(n.ranks, rank);
    put_varint(n.instances, st.instance);
    n.modes.push_back(static_cast<char>(st.mode));
    // The node's columns are every field its records have, in their order: a record with fewer fields (a
    // dispatcher's record on a worker that does not own it) leaves the others absent, one with a field
    // not seen before (a deferred failure) adds a column absent from the records before.
    std::size_t at = 0;  // the column the next field is looked for from
    for (const Field& f : st.fields) {
      std::size_t k = at;
      while (k < n.columns.size() && n.columns[k].name != f.name) ++k;
      if (k == n.columns.size()) {
        if (std::any_of(n.columns.begin(), n.columns.begin() + std::ptrdiff_t(at), [&](const Column& c) { return c.name == f.name; }))
          throw SnapshotError("set index: node '" + st.key + "' of rank " + std::to_string(rank) +
                              " has its fields in another order than the records before");
        k = at;
        n.columns.insert(n.columns.begin() + std::ptrdiff_t(k),
                         Column{f.name, f.type, f.type == FieldType::elements ? f.elements.tag : "", {},
                                std::string(static_cast<std::size_t>(n.records), '\0')});
      }
      for (std::size_t skipped = at; skipped < k; ++skipped) n.columns[skipped].present.push_back(0);
      at = k + 1;
      Column& c = n.columns[k];
      if (f.type != c.type || (f.type == FieldType::elements && f.elements.tag != c.tag))
        throw SnapshotError("set index: field '" + f.name + "' of node '" + st.key + "' has another type on rank " +
                            std::to_string(rank) + " than on the ranks before");
      c.present.push_back(1);
      std::string& b = c.bytes;
      switch (f.type) {
        case FieldType::u64: put_varint(b, f.u); break;
        case FieldType::i64: put_varint(b, zigzag(f.i)); break;
        case FieldType::str: put_text(b, f.s); break;
        case FieldType::elements: {
          const ElementBlobs& e = f.elements;
          const std::size_t count = e.size();
          put_varint(b, count);
          const StoredList* l = e.ranges.empty() ? nullptr : &lists.at(e.ranges.front().list);
          // Values here: none, a few bytes, or a list of positions (a sampler's skipped ones) up to 4 KB.
          const bool here = !l || l->bytes <= kValueListBytes || (c.tag == "u64" && l->bytes <= kPositionListBytes);
          if (here) {
            b.push_back(0);
            ElementBlobs stored;
            const ElementBlobs* v = &e;
            if (l && l->loaded) v = l->loaded.get();
            else if (l) v = &(stored = load_stored_list(path, *l));
            for (std::size_t i = 0; i < count; ++i) put_varint(b, v->offsets[i + 1] - v->offsets[i]);
            b.append(v->data);
          } else {
            b.push_back(1);  // where they lie in the rank's file
            put_varint(b, l->offset);
            put_varint(b, l->bytes);
            const std::uint32_t crc = l->crc;
            b.append(reinterpret_cast<const char*>(&crc), sizeof crc);
          }
          break;
        }
      }
    }
    for (std::size_t k = at; k < n.columns.size(); ++k) n.columns[k].present.push_back(0);
    ++n.records;
  });
}

std::string SetIndexWriter::finish() {
  std::string body;
  put_text(body, identity_);
  put_varint(body, ranks_);
  put_varint(body, nodes_.size());
  for (const Node& n : nodes_) {
    std::string head;
    put_text(head, n.key);
    put_text(head, n.kind);
    put_varint(head, n.records);
    put_varint(head, n.columns.size());
    for (const Column& c : n.columns) {
      put_text(head, c.name);
      head.push_back(static_cast<char>(c.type));
      if (c.type == FieldType::elements) put_text(head, c.tag);
    }
    // Per column: 1 when every record has it, else 0 and one byte per record (1 where it has it).
    std::vector<std::string> presence;
    for (const Column& c : n.columns)
      presence.push_back(c.present.find('\0') == std::string::npos ? std::string(1, '\1') : '\0' + c.present);
    std::size_t length = head.size() + n.ranks.size() + n.instances.size() + n.modes.size();
    for (std::size_t k = 0; k < n.columns.size(); ++k) length += presence[k].size() + n.columns[k].bytes.size();
    put_varint(body, length);
    body += head;
    body += n.ranks;
    body += n.instances;
    body += n.modes;
    for (std::size_t k = 0; k < n.columns.size(); ++k) {
      body += presence[k];
      body += n.columns[k].bytes;
    }
  }
  std::string out(kMagic, sizeof kMagic);
  const std::uint32_t version = kVersion, crc = crc32c(body);
  out.append(reinterpret_cast<const char*>(&version), sizeof version);
  out.append(reinterpret_cast<const char*>(&crc), sizeof crc);
  return out + body;
}

std::optional<SetIndex> SetIndex::parse(std::string bytes, std::string_view identity) {
  if (bytes.size() < kHeadBytes || std::memcmp(bytes.data(), kMagic, sizeof kMagic) != 0) return std::nullopt;
  std::uint32_t version = 0, crc = 0;
  std::memcpy(&version, bytes.data() + 8, sizeof version);
  std::memcpy(&crc, bytes.data() + 12, sizeof crc);
  if (version != kVersion || crc32c(std::string_view(bytes).substr(kHeadBytes)) != crc) return std::nullopt;
  SetIndex out;
  try {
    ByteReader r(std::string_view(bytes).substr(kHeadBytes), "set index");
    if (get_text(r) != identity) return std::nullopt;
    const std::uint64_t world = get_varint(r);
    if (world == 0 || world > std::uint64_t(std::numeric_limits<std::int32_t>::max())) return std::nullopt;
    out.world_ = static_cast<std::uint32_t>(world);
    const std::size_t nodes = get_count(r, 1);
    for (std::size_t k = 0; k < nodes; ++k) {
      const std::size_t length = get_count(r, 1);
      const std::size_t begin = kHeadBytes + static_cast<std::size_t>(r.pos() - (bytes.data() + kHeadBytes));
      ByteReader block(r.bytes(length), "set index");
      out.keys_.emplace_back(get_text(block));
      out.blocks_.push_back({begin, begin + length});
    }
    if (!r.done()) return std::nullopt;
  } catch (const SnapshotError&) {
    return std::nullopt;
  }
  out.bytes_ = std::move(bytes);
  return out;
}

std::unique_ptr<IndexNode> SetIndex::node(std::size_t k) const {
  const Block& blk = blocks_.at(k);
  ByteReader r(std::string_view(bytes_).substr(blk.begin, blk.end - blk.begin), "set index");
  auto out = std::make_unique<IndexNode>();
  IndexNode& n = *out;
  n.key_ = get_text(r);
  n.kind_ = get_text(r);
  const std::size_t rows = get_count(r, 3);  // a record takes at least 3 bytes: rank, instance, mode
  n.columns_.resize(get_count(r, 2));
  for (auto& c : n.columns_) {
    c.name = get_text(r);
    const auto type = r.get<std::uint8_t>();
    if (type < 1 || type > 4) r.fail("field '" + c.name + "' of node '" + n.key_ + "' has an unknown type " + std::to_string(type));
    c.type = static_cast<FieldType>(type);
    if (c.type == FieldType::elements) c.tag = get_text(r);
  }
  const auto fail = [&](const std::string& what) { r.fail("node '" + n.key_ + "' " + what); };
  n.rank_.resize(rows);
  n.instance_.resize(rows);
  for (auto& rank : n.rank_) {
    const std::uint64_t v = get_varint(r);
    if (v >= world_) fail("has a record of rank " + std::to_string(v) + " in a set of " + std::to_string(world_));
    rank = static_cast<std::uint32_t>(v);
  }
  bool sorted = true;
  for (std::size_t i = 0; i < rows; ++i) {
    const std::uint64_t v = get_varint(r);
    if (v > std::numeric_limits<std::uint32_t>::max()) fail("has a record of instance " + std::to_string(v));
    n.instance_[i] = static_cast<std::uint32_t>(v);
    sorted = sorted && (i == 0 || n.instance_[i - 1] < n.instance_[i]);
  }
  const std::string_view modes = r.bytes(rows);
  n.mode_.assign(modes.begin(), modes.end());
  for (const auto m : n.mode_)
    if (m < 1 || m > 3) fail("has an unknown state mode " + std::to_string(m));
  for (std::uint32_t ci = 0; ci < n.columns_.size(); ++ci) {
    auto& c = n.columns_[ci];
    const auto field_fail = [&](const std::string& what) { r.fail("field '" + c.name + "' of node '" + n.key_ + "' " + what); };
    const auto all = r.get<std::uint8_t>();
    if (all > 1) field_fail("has a presence flag " + std::to_string(all));
    if (!all) {
      const std::string_view present = r.bytes(rows);
      c.present.assign(present.begin(), present.end());
      for (const auto p : c.present)
        if (p > 1) field_fail("has a presence flag " + std::to_string(p));
      n.partial_ = true;
    }
    const auto here = [&](std::size_t i) { return c.present.empty() || c.present[i]; };
    switch (c.type) {
      case FieldType::u64:
      case FieldType::i64:
        c.u.resize(rows);
        for (std::size_t i = 0; i < rows; ++i)
          if (here(i)) c.u[i] = get_varint(r);
        if (c.type == FieldType::i64)
          for (auto& v : c.u) v = static_cast<std::uint64_t>(unzigzag(v));
        break;
      case FieldType::str:
        c.s.resize(rows);
        for (std::size_t i = 0; i < rows; ++i)
          if (here(i)) c.s[i] = get_text(r);
        break;
      case FieldType::elements:
        c.list.resize(rows);
        for (std::size_t i = 0; i < rows; ++i) {
          if (!here(i)) {
            c.list[i] = static_cast<std::uint32_t>(n.lists_.size());
            n.lists_.push_back({.rank = n.rank_[i]});  // no list: an empty one
            n.list_column_.push_back(ci);
            continue;
          }
          IndexNode::List l{.rank = n.rank_[i]};
          l.count = get_varint(r);
          const auto how = r.get<std::uint8_t>();
          if (how == 0) {
            if (l.count > r.remaining()) field_fail("claims more values than fit");
            const char* begin = r.pos();
            std::uint64_t total = 0;
            for (std::uint64_t e = 0; e < l.count; ++e) {
              const std::uint64_t len = get_varint(r);
              if (len > r.remaining()) field_fail("has a value that runs past the end");
              total += len;
            }
            r.bytes(static_cast<std::size_t>(total));
            l.values_here = true;
            l.values = std::string_view(begin, static_cast<std::size_t>(r.pos() - begin));
          } else if (how == 1) {
            l.offset = get_varint(r);
            l.bytes = get_varint(r);
            l.crc = r.get<std::uint32_t>();
            if (l.count == 0 || l.count > l.bytes / 8 || l.offset > std::numeric_limits<std::uint64_t>::max() - l.bytes)
              field_fail("claims " + std::to_string(l.count) + " elements in " + std::to_string(l.bytes) + " bytes");
          } else {
            field_fail("has a list flag " + std::to_string(how));
          }
          c.list[i] = static_cast<std::uint32_t>(n.lists_.size());
          n.lists_.push_back(std::move(l));
          n.list_column_.push_back(ci);
        }
        break;
    }
  }
  if (!r.done()) fail("has " + std::to_string(r.remaining()) + " unexpected bytes after its records");
  if (!sorted) {
    n.order_.resize(rows);
    for (std::uint32_t i = 0; i < rows; ++i) n.order_[i] = i;
    std::stable_sort(n.order_.begin(), n.order_.end(),
                     [&](std::uint32_t a, std::uint32_t b) { return n.instance_[a] < n.instance_[b]; });
  }
  n.source_.node = &n;
  return out;
}

const FieldSource& IndexNode::fields(std::size_t i) const {
  source_.row = row(i);
  source_.present.clear();
  if (partial_)
    for (std::uint32_t k = 0; k < columns_.size(); ++k)
      if (columns_[k].present.empty() || columns_[k].present[source_.row]) source_.present.push_back(k);
  return source_;
}

std::ptrdiff_t IndexNode::column(std::string_view name) const {
  for (std::size_t k = 0; k < columns_.size(); ++k)
    if (columns_[k].name == name) return std::ptrdiff_t(k);
  return -1;
}

bool IndexNode::has(std::size_t i, std::size_t k) const {
  const Column& c = columns_[k];
  return c.present.empty() || c.present[row(i)];
}

std::uint64_t IndexNode::number(std::size_t i, std::size_t k) const { return has(i, k) ? columns_[k].u[row(i)] : 0; }

std::string_view IndexNode::text(std::size_t i, std::size_t k) const { return has(i, k) ? columns_[k].s[row(i)] : ""; }

std::uint64_t IndexNode::list_size(std::size_t i, std::size_t k) const {
  return has(i, k) ? lists_[columns_[k].list[row(i)]].count : 0;
}

ElementBlobs IndexNode::list(std::size_t i, std::size_t k) const {
  ElementBlobs e;
  e.tag = columns_[k].tag;
  if (!has(i, k)) return e;
  const std::uint32_t id = columns_[k].list[row(i)];
  const List& l = lists_[id];
  if (l.count == 0) return e;
  e.ranges.push_back({id, 0, l.count});
  if (l.values_here || l.loaded) fill_values(id, e);
  return e;
}

const std::string& IndexNode::tag(std::size_t k) const { return columns_[k].tag; }


void IndexNode::fill_values(std::uint64_t id, ElementBlobs& out) const {
  const List& l = lists_[id];
  if (l.loaded) {
    out.offsets = l.loaded->offsets;
    out.data = l.loaded->data;
    return;
  }
  ByteReader r(l.values, "set index");
  out.offsets.resize(static_cast<std::size_t>(l.count) + 1);
  out.offsets[0] = 0;
  std::uint64_t total = 0;
  for (std::uint64_t e = 0; e < l.count; ++e) out.offsets[e + 1] = total += get_varint(r);
  out.data.assign(r.bytes(static_cast<std::size_t>(total)));
}

ElementBlobs IndexNode::values(std::uint64_t id) const {
  ElementBlobs out;
  out.tag = tag_of_list(id);
  fill_values(id, out);
  return out;
}

std::vector<std::uint64_t> IndexNode::lists_to_load(std::string_view name) const {
  std::vector<std::uint64_t> out;
  for (const Column& c : columns_)
    if (c.name == name && c.type == FieldType::elements)
      for (const std::uint32_t id : c.list)
        if (!lists_[id].values_here && !lists_[id].loaded) out.push_back(id);
  return out;
}

const Field& IndexNode::Row::field(std::size_t k) const {
  const Column& c = node->columns_[node->partial_ ? present[k] : k];
  Field& f = scratch;
  f.name = c.name;
  f.type = c.type;
  switch (c.type) {
    case FieldType::u64: f.u = c.u[row]; break;
    case FieldType::i64: f.i = static_cast<std::int64_t>(c.u[row]); break;
    case FieldType::str: f.s = c.s[row]; break;
    case FieldType::elements: {
      ElementBlobs& e = f.elements;
      e.tag = c.tag;
      const std::uint32_t id = c.list[row];
      const List& l = node->lists_[id];
      e.ranges.clear();
      e.offsets.assign(1, 0);
      e.data.clear();
      if (l.count == 0) break;
      e.ranges.push_back({id, 0, l.count});
      if (l.values_here || l.loaded) node->fill_values(id, e);
      break;
    }
  }
  return f;
}

}  // namespace dpipe::detail
