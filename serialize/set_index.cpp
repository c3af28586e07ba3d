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

constexpr std::size_t kVaried = ~std::size_t{0};

// How a node's rows map to ranks and instances (the `rows` byte of a node).
enum RowsAre : std::uint8_t {
  kListed = 0,       // a rank column and an instance column
  kInstances = 1,    // row i: instance i, of rank i / K (a node in every worker)
  kRanks = 2,        // row i: rank i, instance i × K (a node once per rank)
  kRankNumbers = 3,  // row i: rank i, instance i (the run's record)
};


}  // namespace

void SetIndexWriter::add_rank(const SnapshotPlan& plan, std::uint32_t rank, const std::string& path) {
  if (rank != ranks_) throw SnapshotError("set index: rank " + std::to_string(rank) + " added out of order");
  ++ranks_;
  for_each_located_record(plan, rank, [&](const NodeState& st, const std::vector<StoredList>& lists) {
    auto it = node_of_.find(st.key);
    if (it == node_of_.end()) {
      nodes_.push_back({st.key, st.kind, {}, {}, {}, {}});
      it = node_of_.emplace(st.key, nodes_.size() - 1).first;
    }
    Node& n = nodes_[it->second];
    if (n.kind != st.kind)
      throw SnapshotError("set index: node '" + st.key + "' of rank " + std::to_string(rank) + " is a " + st.kind +
                          ", not a " + n.kind);
    const std::size_t before = n.ranks.size();  // the records this node had
    n.ranks.push_back(rank);
    n.instances.push_back(st.instance);
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
                                std::string(before, '\0'), 0});
      }
      for (std::size_t skipped = at; skipped < k; ++skipped) n.columns[skipped].present.push_back(0);
      at = k + 1;
      Column& c = n.columns[k];
      if (f.type != c.type || (f.type == FieldType::elements && f.elements.tag != c.tag))
        throw SnapshotError("set index: field '" + f.name + "' of node '" + st.key + "' has another type on rank " +
                            std::to_string(rank) + " than on the ranks before");
      c.present.push_back(1);
      std::string& b = c.bytes;
      const std::size_t value_begin = b.size();
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
      const std::size_t width = b.size() - value_begin;
      c.width = value_begin == 0 ? width : c.width == width ? width : kVaried;
    }
    for (std::size_t k = at; k < n.columns.size(); ++k) n.columns[k].present.push_back(0);
  });
}

std::string SetIndexWriter::finish() {
  std::string body;
  put_text(body, identity_);
  put_varint(body, ranks_);
  put_varint(body, workers_);
  put_varint(body, nodes_.size());
  const std::uint64_t k_workers = workers_;
  for (const Node& n : nodes_) {
    std::string b;
    put_text(b, n.key);
    put_text(b, n.kind);
    const std::size_t rows = n.ranks.size();
    put_varint(b, rows);
    const auto all_rows = [&](auto is) {
      for (std::size_t i = 0; i < rows; ++i)
        if (!is(i)) return false;
      return true;
    };
    if (all_rows([&](std::size_t i) { return n.instances[i] == i && n.ranks[i] == i / k_workers; })) {
      b.push_back(static_cast<char>(kInstances));
    } else if (all_rows([&](std::size_t i) { return n.ranks[i] == i && n.instances[i] == i * k_workers; })) {
      b.push_back(static_cast<char>(kRanks));
    } else if (all_rows([&](std::size_t i) { return n.ranks[i] == i && n.instances[i] == i; })) {
      b.push_back(static_cast<char>(kRankNumbers));
    } else {
      b.push_back(static_cast<char>(kListed));
      for (const auto r : n.ranks) put_varint(b, r);
      for (const auto i : n.instances) put_varint(b, i);
    }
    if (!n.modes.empty() && n.modes.find_first_not_of(n.modes.front()) == std::string::npos) {
      b.push_back(n.modes.front());
    } else {
      b.push_back(0);
      b += n.modes;
    }
    put_varint(b, n.columns.size());
    for (const Column& c : n.columns) {
      put_text(b, c.name);
      b.push_back(static_cast<char>(c.type));
      if (c.type == FieldType::elements) put_text(b, c.tag);
      if (c.present.find('\0') == std::string::npos) {
        b.push_back(1);
      } else {
        b.push_back(0);
        b += c.present;
      }
      put_varint(b, c.width == kVaried ? 0 : c.width);
      put_varint(b, c.bytes.size());
      b += c.bytes;
    }
    put_varint(body, b.size());
    body += b;
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
    const std::uint64_t world = get_varint(r), workers = get_varint(r);
    constexpr auto kMaxInt = std::uint64_t(std::numeric_limits<std::int32_t>::max());
    if (world == 0 || world > kMaxInt || workers == 0 || workers > kMaxInt) return std::nullopt;
    out.world_ = static_cast<std::uint32_t>(world);
    out.workers_ = static_cast<std::uint32_t>(workers);
    const std::size_t nodes = get_count(r, 1);
    for (std::size_t k = 0; k < nodes; ++k) {
      const std::size_t length = get_count(r, 1);
      const std::size_t begin = kHeadBytes + static_cast<std::size_t>(r.pos() - (bytes.data() + kHeadBytes));
      ByteReader block(r.bytes(length), "set index");
      out.keys_.emplace_back(get_text(block));
      out.blocks_.push_back({begin, begin + length});
    }
    if (!r.done()) return std::nullopt;
    std::vector<std::string_view> keys(out.keys_.begin(), out.keys_.end());
    std::sort(keys.begin(), keys.end());
    if (std::adjacent_find(keys.begin(), keys.end()) != keys.end()) return std::nullopt;  // a node twice
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
  const auto fail = [&](const std::string& what) { r.fail("node '" + n.key_ + "' " + what); };
  const std::uint64_t row_count = get_varint(r);
  if (row_count > std::uint64_t(world_) * workers_) fail("has more rows than the set has instances");
  n.rows_ = static_cast<std::size_t>(row_count);
  n.workers_ = workers_;
  n.rows_are_ = r.get<std::uint8_t>();
  const std::uint64_t rows = n.rows_;
  switch (n.rows_are_) {
    case kInstances: break;
    case kRanks:
    case kRankNumbers:
      if (rows > world_) fail("has more rows than ranks");
      break;
    case kListed:
      if (rows > r.remaining() / 2) fail("has more rows than fit");
      n.rank_.resize(n.rows_);
      n.instance_.resize(n.rows_);
      for (auto& rank : n.rank_) {
        const std::uint64_t v = get_varint(r);
        if (v >= world_) fail("has a record of rank " + std::to_string(v) + " in a set of " + std::to_string(world_));
        rank = static_cast<std::uint32_t>(v);
      }
      for (auto& instance : n.instance_) {
        const std::uint64_t v = get_varint(r);
        if (v > std::numeric_limits<std::uint32_t>::max()) fail("has a record of instance " + std::to_string(v));
        instance = static_cast<std::uint32_t>(v);
      }
      break;
    default: fail("has rows of layout " + std::to_string(n.rows_are_));
  }
  n.one_mode_ = r.get<std::uint8_t>();
  if (n.one_mode_ == 0) {
    n.modes_ = r.bytes(n.rows_);
    for (const char m : n.modes_)
      if (m < 1 || m > 3) fail("has an unknown state mode " + std::to_string(int(m)));
  } else if (n.one_mode_ > 3) {
    fail("has an unknown state mode " + std::to_string(n.one_mode_));
  }
  n.columns_.resize(get_count(r, 4));
  for (auto& c : n.columns_) {
    c.name = get_text(r);
    const auto type = r.get<std::uint8_t>();
    if (type < 1 || type > 4) fail("has a field '" + c.name + "' of unknown type " + std::to_string(type));
    c.type = static_cast<FieldType>(type);
    if (c.type == FieldType::elements) c.tag = get_text(r);
    const auto all = r.get<std::uint8_t>();
    if (all > 1) fail("has a presence flag " + std::to_string(all) + " for field '" + c.name + "'");
    std::size_t present = n.rows_;
    if (!all) {
      const std::string_view flags = r.bytes(n.rows_);
      c.present.assign(flags.begin(), flags.end());
      present = 0;
      for (const auto p : c.present) {
        if (p > 1) fail("has a presence flag " + std::to_string(p) + " for field '" + c.name + "'");
        present += p;
      }
    }
    c.width = get_count(r, 0);
    c.bytes = r.bytes(get_count(r, 1));
    // Every value takes a byte at least: the rows a column claims are bounded by its bytes.
    if (c.width ? c.bytes.size() / c.width != present || c.bytes.size() % c.width : present > c.bytes.size())
      fail("has " + std::to_string(c.bytes.size()) + " bytes for " + std::to_string(present) + " values of field '" +
           c.name + "'" + (c.width ? " of " + std::to_string(c.width) + " bytes" : ""));
  }
  if (!r.done()) fail("has " + std::to_string(r.remaining()) + " unexpected bytes after its fields");
  if (n.rows_are_ == kListed) {
    bool sorted = true;
    for (std::size_t i = 1; i < n.rows_; ++i) sorted = sorted && n.instance_[i - 1] < n.instance_[i];
    if (!sorted) {
      n.order_.resize(n.rows_);
      for (std::uint32_t i = 0; i < n.rows_; ++i) n.order_[i] = i;
      std::stable_sort(n.order_.begin(), n.order_.end(),
                       [&](std::uint32_t a, std::uint32_t b) { return n.instance_[a] < n.instance_[b]; });
    }
  }
  n.source_.node = &n;
  return out;
}

std::uint32_t IndexNode::rank_of(std::size_t r) const {
  switch (rows_are_) {
    case kInstances: return static_cast<std::uint32_t>(r / workers_);
    case kListed: return rank_[r];
    default: return static_cast<std::uint32_t>(r);
  }
}

std::uint32_t IndexNode::instance(std::size_t i) const {
  const std::size_t r = row(i);
  switch (rows_are_) {
    case kRanks: return static_cast<std::uint32_t>(r * workers_);
    case kListed: return instance_[r];
    default: return static_cast<std::uint32_t>(r);
  }
}

StateMode IndexNode::mode(std::size_t i) const {
  return static_cast<StateMode>(one_mode_ ? one_mode_ : static_cast<std::uint8_t>(modes_[row(i)]));
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

void IndexNode::scan(std::size_t k) const {
  const Column& c = columns_[k];
  if (c.scanned) return;
  if (!c.present.empty()) {
    c.nth.resize(rows_);
    std::uint32_t n = 0;
    for (std::size_t r = 0; r < rows_; ++r) {
      c.nth[r] = n;
      n += c.present[r];
    }
  }
  if (!c.width) {
    ByteReader in(c.bytes, "set index");
    const std::size_t values = c.present.empty() ? rows_ : c.nth.empty() ? 0 : c.nth.back() + c.present.back();
    c.at.resize(values);
    for (auto& a : c.at) {
      a = static_cast<std::uint32_t>(in.pos() - c.bytes.data());
      if (c.type == FieldType::elements) read_list(in, k);
      else if (c.type == FieldType::str) get_text(in);
      else get_varint(in);
    }
    if (!in.done()) in.fail("field '" + c.name + "' of node '" + key_ + "' has bytes after its values");
  }
  c.scanned = true;
}

ByteReader IndexNode::value(std::size_t k, std::size_t r) const {
  const Column& c = columns_[k];
  if (!c.scanned && (!c.width || !c.present.empty())) scan(k);
  const std::size_t nth = c.present.empty() ? r : c.nth[r];
  const std::size_t at = c.width ? nth * c.width : c.at[nth];
  return ByteReader(c.bytes.substr(at), "set index");
}

std::uint64_t IndexNode::number(std::size_t i, std::size_t k) const {
  const std::size_t r = row(i);
  if (!has(i, k)) return 0;
  ByteReader in = value(k, r);
  const std::uint64_t v = get_varint(in);
  return columns_[k].type == FieldType::i64 ? static_cast<std::uint64_t>(unzigzag(v)) : v;
}

std::string_view IndexNode::text(std::size_t i, std::size_t k) const {
  if (!has(i, k)) return {};
  ByteReader in = value(k, row(i));
  return get_text(in);
}

IndexNode::ListValue IndexNode::list_value(std::size_t k, std::size_t r) const {
  ByteReader in = value(k, r);
  return read_list(in, k);
}

IndexNode::ListValue IndexNode::read_list(ByteReader& in, std::size_t k) const {
  ListValue l;
  l.count = get_varint(in);
  const auto how = in.get<std::uint8_t>();
  const auto fail = [&](const std::string& what) {
    in.fail("field '" + columns_[k].name + "' of node '" + key_ + "' " + what);
  };
  if (how == 0) {
    if (l.count > in.remaining()) fail("claims more values than fit");
    const char* begin = in.pos();
    std::uint64_t total = 0;
    for (std::uint64_t e = 0; e < l.count; ++e) {
      const std::uint64_t len = get_varint(in);
      if (len > in.remaining()) fail("has a value that runs past the end");
      total += len;
    }
    in.bytes(static_cast<std::size_t>(total));
    l.values_here = true;
    l.values = std::string_view(begin, static_cast<std::size_t>(in.pos() - begin));
  } else if (how == 1) {
    l.offset = get_varint(in);
    l.bytes = get_varint(in);
    l.crc = in.get<std::uint32_t>();
    if (l.count == 0 || l.count > l.bytes / 8 || l.offset > std::numeric_limits<std::uint64_t>::max() - l.bytes)
      fail("claims " + std::to_string(l.count) + " elements in " + std::to_string(l.bytes) + " bytes");
  } else {
    fail("has a list flag " + std::to_string(how));
  }
  return l;
}

std::uint64_t IndexNode::list_size(std::size_t i, std::size_t k) const {
  return has(i, k) ? list_value(k, row(i)).count : 0;  // checked as a list read is
}

void IndexNode::fill_values(const ListValue& l, std::uint64_t id, ElementBlobs& out) const {
  if (const auto it = loaded_.find(id); it != loaded_.end()) {
    out.offsets = it->second->offsets;
    out.data = it->second->data;
    return;
  }
  ByteReader r(l.values, "set index");
  out.offsets.resize(static_cast<std::size_t>(l.count) + 1);
  out.offsets[0] = 0;
  std::uint64_t total = 0;
  for (std::uint64_t e = 0; e < l.count; ++e) out.offsets[e + 1] = total += get_varint(r);
  out.data.assign(r.bytes(static_cast<std::size_t>(total)));
}

ElementBlobs IndexNode::list(std::size_t i, std::size_t k) const {
  ElementBlobs e;
  if (has(i, k)) fill_list(k, row(i), e);
  else e.tag = columns_[k].tag;
  return e;
}

void IndexNode::fill_list(std::size_t k, std::size_t r, ElementBlobs& e) const {
  e.tag = columns_[k].tag;
  e.ranges.clear();
  e.offsets.clear();
  e.data.clear();
  const ListValue l = list_value(k, r);
  if (l.count == 0) return;
  const std::uint64_t id = list_id(k, r);
  e.ranges.push_back({id, 0, l.count});
  if (l.values_here || loaded_.count(id)) fill_values(l, id, e);
}

StoredList IndexNode::where(std::uint64_t id) const {
  const std::size_t k = static_cast<std::size_t>(id / rows_), r = static_cast<std::size_t>(id % rows_);
  const ListValue l = list_value(k, r);
  StoredList out{.file = rank_of(r), .tag = columns_[k].tag, .count = l.count};
  if (l.values_here || loaded_.count(id)) {
    ElementBlobs values;
    values.tag = out.tag;
    fill_values(l, id, values);
    out.loaded = std::make_unique<ElementBlobs>(std::move(values));
  } else {
    out.stored = true;
    out.offset = l.offset;
    out.bytes = l.bytes;
    out.crc = l.crc;
  }
  return out;
}

std::vector<std::uint64_t> IndexNode::lists_to_load(std::string_view name) const {
  std::vector<std::uint64_t> out;
  const std::ptrdiff_t k = column(name);
  if (k < 0 || columns_[std::size_t(k)].type != FieldType::elements) return out;
  for (std::size_t i = 0; i < rows_; ++i) {
    if (!has(i, std::size_t(k))) continue;
    const std::size_t r = row(i);
    const std::uint64_t id = list_id(std::size_t(k), r);
    if (loaded_.count(id)) continue;
    const ListValue l = list_value(std::size_t(k), r);
    if (l.count && !l.values_here) out.push_back(id);
  }
  return out;
}

const FieldSource& IndexNode::fields(std::size_t i) const {
  source_.row = row(i);
  source_.present.clear();
  for (std::uint32_t k = 0; k < columns_.size(); ++k)
    if (columns_[k].present.empty() || columns_[k].present[source_.row]) source_.present.push_back(k);
  return source_;
}

const Field& IndexNode::Row::field(std::size_t index) const {
  const std::size_t k = present[index];
  const Column& c = node->columns_[k];
  Field& f = scratch;
  f.clear();  // nothing of the field read before (its storage kept)
  f.name = c.name;
  f.type = c.type;
  switch (c.type) {
    case FieldType::u64: {
      ByteReader in = node->value(k, row);
      f.u = get_varint(in);
      break;
    }
    case FieldType::i64: {
      ByteReader in = node->value(k, row);
      f.i = unzigzag(get_varint(in));
      break;
    }
    case FieldType::str: {
      ByteReader in = node->value(k, row);
      f.s = get_text(in);
      break;
    }
    case FieldType::elements: node->fill_list(k, row, f.elements); break;
  }
  return f;
}

}  // namespace dpipe::detail
