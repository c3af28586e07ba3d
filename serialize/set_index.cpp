// The set index: encoding and decoding (see set_index.hpp and docs/snapshot-format.md, "The set index").
#include "set_index.hpp"

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

std::uint32_t SetIndexWriter::name_of(Node& n, std::string_view name) {
  for (std::size_t i = 0; i < n.names.size(); ++i)
    if (n.names[i] == name) return static_cast<std::uint32_t>(i);
  n.names.emplace_back(name);
  return static_cast<std::uint32_t>(n.names.size() - 1);
}

void SetIndexWriter::add_rank(const SnapshotPlan& plan, std::uint32_t rank) {
  if (rank != ranks_) throw SnapshotError("set index: rank " + std::to_string(rank) + " added out of order");
  ++ranks_;
  for_each_located_record(plan, rank, [&](const NodeState& st, const std::vector<StoredList>& lists) {
    auto it = node_of_.find(st.key);
    if (it == node_of_.end()) {
      nodes_.push_back({st.key, st.kind, {}, {}, 0});
      it = node_of_.emplace(st.key, nodes_.size() - 1).first;
    }
    Node& n = nodes_[it->second];
    if (n.kind != st.kind)
      throw SnapshotError("set index: node '" + st.key + "' is a " + n.kind + " on one rank and a " + st.kind + " on rank " +
                          std::to_string(rank));
    std::string& b = n.block;
    put_varint(b, rank);
    put_varint(b, st.instance);
    b.push_back(static_cast<char>(st.mode));
    put_varint(b, st.fields.size());
    for (const Field& f : st.fields) {
      put_varint(b, name_of(n, f.name));
      b.push_back(static_cast<char>(f.type));
      switch (f.type) {
        case FieldType::u64: put_varint(b, f.u); break;
        case FieldType::i64: put_varint(b, zigzag(f.i)); break;
        case FieldType::str: put_text(b, f.s); break;
        case FieldType::elements: {
          const ElementBlobs& e = f.elements;
          put_varint(b, name_of(n, e.tag));
          const std::size_t count = e.size();
          put_varint(b, count);
          const StoredList* l = e.ranges.empty() ? nullptr : &lists.at(e.ranges.front().list);
          if (!l || (l->bytes <= kValueListBytes && l->loaded)) {
            b.push_back(0);  // the values: lengths, then bytes
            const ElementBlobs& v = l ? *l->loaded : e;
            for (std::size_t i = 0; i < count; ++i) put_varint(b, v.offsets[i + 1] - v.offsets[i]);
            b.append(v.data);
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
    put_varint(head, n.names.size());
    for (const auto& name : n.names) put_text(head, name);
    put_varint(head, n.records);
    put_varint(body, head.size() + n.block.size());
    body += head;
    body += n.block;
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
    if (world == 0 || world > std::numeric_limits<std::int32_t>::max()) return std::nullopt;
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

std::vector<NodeState> SetIndex::records(std::size_t k, std::vector<StoredList>& lists) const {
  const Block& blk = blocks_.at(k);
  ByteReader r(std::string_view(bytes_).substr(blk.begin, blk.end - blk.begin), "set index");
  const std::string key(get_text(r)), kind(get_text(r));
  std::vector<std::string> names(get_count(r, 1));
  for (auto& name : names) name = get_text(r);
  const auto name = [&](ByteReader& in) -> const std::string& {
    const std::uint64_t i = get_varint(in);
    if (i >= names.size()) in.fail("node '" + key + "' names string " + std::to_string(i) + " of " + std::to_string(names.size()));
    return names[static_cast<std::size_t>(i)];
  };
  std::vector<NodeState> out(get_count(r, 4));  // a record takes at least 4 bytes
  for (NodeState& s : out) {
    s.key = key;
    s.kind = kind;
    const std::uint64_t rank = get_varint(r), instance = get_varint(r);
    if (rank >= world_ || instance > std::numeric_limits<std::uint32_t>::max())
      r.fail("node '" + key + "' has a record of rank " + std::to_string(rank) + ", instance " + std::to_string(instance));
    s.instance = static_cast<std::uint32_t>(instance);
    const auto mode = r.get<std::uint8_t>();
    if (mode < 1 || mode > 3) r.fail("node '" + key + "' has an unknown state mode " + std::to_string(mode));
    s.mode = static_cast<StateMode>(mode);
    s.fields.resize(get_count(r, 3));  // a field takes at least 3 bytes
    for (Field& f : s.fields) {
      f.name = name(r);
      const auto type = r.get<std::uint8_t>();
      switch (type) {
        case 1: f.type = FieldType::u64; f.u = get_varint(r); break;
        case 2: f.type = FieldType::i64; f.i = unzigzag(get_varint(r)); break;
        case 3: f.type = FieldType::str; f.s = get_text(r); break;
        case 4: {
          f.type = FieldType::elements;
          ElementBlobs& e = f.elements;
          e.tag = name(r);
          StoredList l{.file = static_cast<std::uint32_t>(rank), .tag = e.tag};
          l.count = get_varint(r);
          const auto how = r.get<std::uint8_t>();
          if (how == 0) {
            if (l.count > r.remaining()) r.fail("field '" + f.name + "' of node '" + key + "' claims more values than fit");
            e.offsets.resize(static_cast<std::size_t>(l.count) + 1);
            std::uint64_t total = 0;
            for (std::size_t i = 0; i < l.count; ++i) {
              const std::uint64_t len = get_varint(r);
              if (len > r.remaining()) r.fail("a value of field '" + f.name + "' of node '" + key + "' runs past the end");
              total += len;
              e.offsets[i + 1] = total;
            }
            e.data.assign(r.bytes(static_cast<std::size_t>(total)));
            if (l.count == 0) break;
            l.loaded = std::make_unique<ElementBlobs>(e);
          } else if (how == 1) {
            l.stored = true;
            l.offset = get_varint(r);
            l.bytes = get_varint(r);
            l.crc = r.get<std::uint32_t>();
            if (l.count == 0 || l.count > l.bytes / 8 || l.offset > std::numeric_limits<std::uint64_t>::max() - l.bytes)
              r.fail("field '" + f.name + "' of node '" + key + "' claims " + std::to_string(l.count) + " elements in " +
                     std::to_string(l.bytes) + " bytes");
          } else {
            r.fail("field '" + f.name + "' of node '" + key + "' has a list flag " + std::to_string(how));
          }
          e.ranges.push_back({lists.size(), 0, l.count});
          lists.push_back(std::move(l));
          break;
        }
        default: r.fail("field '" + f.name + "' of node '" + key + "' has an unknown type " + std::to_string(type));
      }
    }
  }
  if (!r.done()) r.fail(std::to_string(r.remaining()) + " unexpected bytes after the records of node '" + key + "'");
  return out;
}

}  // namespace dpipe::detail
