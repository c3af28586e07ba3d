// The set index: encoding and decoding (see set_index.hpp and docs/snapshot-format.md, "The set index").
#include "set_index.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <unordered_map>

#include "dpipe/kit/codec.hpp"
#include "dpipe/crc32c.hpp"
#include "dpipe/error.hpp"

namespace dpipe::detail {
namespace {

constexpr char kMagic[8] = {'D', 'P', 'I', 'P', 'E', 'S', 'I', 'X'};
constexpr std::uint32_t kVersion = 3;
constexpr std::size_t kHeadBytes = 20;  // magic, version, the directory's length and CRC-32C
// A directory longer than this is not read (a damaged length must not size an allocation).
constexpr std::uint64_t kMaxDirectory = std::uint64_t{1} << 30;
// The values of a column stored one by one are cut into chunks of this many, each with its CRC-32C, so a
// reader of a few rows reads a few chunks.
constexpr std::uint64_t kPerChunk = 256;
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
void put_u32(std::string& out, std::uint32_t v) { out.append(reinterpret_cast<const char*>(&v), sizeof v); }

void put_part(std::string& directory, std::string& data, std::string_view bytes) {
  put_varint(directory, data.size());
  put_varint(directory, bytes.size());
  put_u32(directory, crc32c(bytes));
  data += bytes;
}
IndexNode::Part get_part(ByteReader& r) {
  IndexNode::Part p;
  p.offset = get_varint(r);
  p.length = get_varint(r);
  p.crc = r.get<std::uint32_t>();
  return p;
}

// How an element list is stored (its first byte).
enum ListHow : std::uint8_t {
  kValuesHere = 0,  // varint count, the elements' lengths (varints), then their bytes
  kPlace = 1,       // varint offset, varint length, u32 CRC-32C: where it lies in its rank's file
  kNoElements = 2,  // nothing follows
};

/// Passes over a list value, checking it as it goes; returns how it is stored.
template <class Fail>
std::uint8_t skip_list(ByteReader& in, const Fail& fail) {
  const auto how = in.get<std::uint8_t>();
  if (how == kValuesHere) {
    const std::uint64_t count = get_varint(in);
    if (count > in.remaining()) fail("claims more values than fit");
    std::uint64_t total = 0;
    for (std::uint64_t e = 0; e < count; ++e) {
      const std::uint64_t length = get_varint(in);
      if (length > in.remaining() - std::min<std::uint64_t>(total, in.remaining())) fail("has a value that runs past the end");
      total += length;
    }
    if (total > in.remaining()) fail("has values that run past the end");
    in.bytes(static_cast<std::size_t>(total));
  } else if (how == kPlace) {
    get_varint(in);
    get_varint(in);
    in.get<std::uint32_t>();
  } else if (how != kNoElements) {
    fail("has a list flag " + std::to_string(how));
  }
  return how;
}

// How a node's rows map to ranks and instances (the `rows` byte of a node).
enum RowsAre : std::uint8_t {
  kListed = 0,       // a rank column and an instance column
  kInstances = 1,    // row i: instance i, of rank i / K (a node in every worker)
  kRanks = 2,        // row i: rank i, instance i × K (a node once per rank)
  kRankNumbers = 3,  // row i: rank i, instance i (the run's record)
};


}  // namespace

void SetIndexWriter::Sequence::add_number(std::uint64_t v) {
  const std::uint64_t n = ends.size();
  if (n == 0) first = v;
  else if (n == 1) step = v - first;
  else if (progression && v != first + n * step) progression = false;
  least = std::min(least, v);
  greatest = std::max(greatest, v);
  put_varint(bytes, v);
  close_value();
}

bool SetIndexWriter::Sequence::all_same() const {
  if (ends.empty()) return true;
  const std::string_view all(bytes), one = all.substr(0, ends[0]);
  for (std::size_t n = 1; n < ends.size(); ++n)
    if (all.substr(ends[n - 1], ends[n] - ends[n - 1]) != one) return false;
  return true;
}

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
      if (f.name == kInputTakenField) continue;  // a rescale drops it (rescale_driver.cpp)
      std::size_t k = at;
      while (k < n.columns.size() && n.columns[k].name != f.name) ++k;
      if (k == n.columns.size()) {
        if (std::any_of(n.columns.begin(), n.columns.begin() + std::ptrdiff_t(at), [&](const Column& c) { return c.name == f.name; }))
          throw SnapshotError("set index: node '" + st.key + "' of rank " + std::to_string(rank) +
                              " has its fields in another order than the records before");
        k = at;
        n.columns.insert(n.columns.begin() + std::ptrdiff_t(k),
                         Column{f.name, f.type, f.type == FieldType::elements ? f.elements.tag : "",
                                std::string(before, '\0'), {}, {}});
      }
      for (std::size_t skipped = at; skipped < k; ++skipped) n.columns[skipped].present.push_back(0);
      at = k + 1;
      Column& c = n.columns[k];
      if (f.type != c.type || (f.type == FieldType::elements && f.elements.tag != c.tag))
        throw SnapshotError("set index: field '" + f.name + "' of node '" + st.key + "' has another type on rank " +
                            std::to_string(rank) + " than on the ranks before");
      c.present.push_back(1);
      switch (f.type) {
        case FieldType::u64: c.values.add_number(f.u); break;
        case FieldType::i64: c.values.add_number(static_cast<std::uint64_t>(f.i)); break;
        case FieldType::str:
          put_text(c.values.bytes, f.s);
          c.values.close_value();
          break;
        case FieldType::elements: {
          const ElementBlobs& e = f.elements;
          const std::size_t count = e.size();
          c.values.add_number(count);
          std::string& b = c.lists.bytes;
          const StoredList* l = e.ranges.empty() ? nullptr : &lists.at(e.ranges.front().list);
          if (count == 0) {
            b.push_back(2);  // no elements
          } else if (!l || l->bytes <= kValueListBytes || (c.tag == "u64" && l->bytes <= kPositionListBytes)) {
            // Values here: a few bytes, or a list of positions (a sampler's skipped ones) up to 4 KB.
            b.push_back(0);
            put_varint(b, count);
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
            put_u32(b, l->crc);
          }
          c.lists.close_value();
          break;
        }
      }
    }
    for (std::size_t k = at; k < n.columns.size(); ++k) n.columns[k].present.push_back(0);
  });
}

namespace {

/// A sequence's entry in the directory, its chunks (if stored one by one) appended to `data`.
void put_sequence(std::string& dir, std::string& data, const SetIndexWriter::Sequence& s, bool numbers) {
  if (s.all_same()) {
    dir.push_back(static_cast<char>(IndexNode::Sequence::same));
    put_text(dir, std::string_view(s.bytes).substr(0, s.ends.empty() ? 0 : s.ends[0]));
  } else if (numbers && s.progression) {
    dir.push_back(static_cast<char>(IndexNode::Sequence::progression));
    put_varint(dir, s.first);
    put_varint(dir, s.step);
  } else {
    dir.push_back(static_cast<char>(IndexNode::Sequence::chunked));
    put_varint(dir, kPerChunk);
    put_varint(dir, data.size());
    const std::size_t chunks = (s.ends.size() + kPerChunk - 1) / kPerChunk;
    put_varint(dir, chunks);
    for (std::size_t c = 0; c < chunks; ++c) {
      const std::size_t begin = c ? s.ends[c * kPerChunk - 1] : 0;
      const std::size_t end = s.ends[std::min(s.ends.size(), (c + 1) * kPerChunk) - 1];
      const std::string_view bytes = std::string_view(s.bytes).substr(begin, end - begin);
      put_varint(dir, bytes.size());
      put_u32(dir, crc32c(bytes));
      data += bytes;
    }
    if (numbers) {  // the bounds, so a rule reading a few rows knows the column's least and greatest
      put_varint(dir, s.least);
      put_varint(dir, s.greatest);
    }
  }
}

std::string varints(const std::vector<std::uint32_t>& values) {
  std::string out;
  for (const auto v : values) put_varint(out, v);
  return out;
}

}  // namespace

std::string SetIndexWriter::finish() {
  std::string dir, data;
  put_text(dir, identity_);
  put_varint(dir, ranks_);
  put_varint(dir, workers_);
  put_varint(dir, nodes_.size());
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
      put_part(b, data, varints(n.ranks));
      put_part(b, data, varints(n.instances));
    }
    if (!n.modes.empty() && n.modes.find_first_not_of(n.modes.front()) == std::string::npos) {
      b.push_back(n.modes.front());
    } else {
      b.push_back(0);
      put_part(b, data, n.modes);
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
        put_part(b, data, c.present);
      }
      put_sequence(b, data, c.values, c.type != FieldType::str);
      if (c.type == FieldType::elements) put_sequence(b, data, c.lists, false);
    }
    put_varint(dir, b.size());
    dir += b;
  }
  if (dir.size() > kMaxDirectory) throw SnapshotError("set index: a directory of " + std::to_string(dir.size()) + " bytes");
  std::string out(kMagic, sizeof kMagic);
  put_u32(out, kVersion);
  put_u32(out, static_cast<std::uint32_t>(dir.size()));
  put_u32(out, crc32c(dir));
  return out + dir + data;
}

std::optional<SetIndex> SetIndex::open(const std::string& path, std::string_view identity) {
  SetIndex out;
  try {
    out.file_ = std::make_shared<const RegularFile>(path, FileRole::snapshot);  // no device opened, no FIFO waited on
    if (out.file_->size() < kHeadBytes) return std::nullopt;
    const std::string head = read_at(*out.file_, path, 0, kHeadBytes);
    if (std::memcmp(head.data(), kMagic, sizeof kMagic) != 0) return std::nullopt;
    std::uint32_t version = 0, length = 0, crc = 0;
    std::memcpy(&version, head.data() + 8, sizeof version);
    std::memcpy(&length, head.data() + 12, sizeof length);
    std::memcpy(&crc, head.data() + 16, sizeof crc);
    if (version != kVersion || length > kMaxDirectory || length > out.file_->size() - kHeadBytes) return std::nullopt;
    out.directory_ = read_at(*out.file_, path, kHeadBytes, length);
    if (crc32c(out.directory_) != crc) return std::nullopt;
    out.data_begin_ = kHeadBytes + length;
    ByteReader r(out.directory_, "set index");
    if (get_text(r) != identity) return std::nullopt;
    const std::uint64_t world = get_varint(r), workers = get_varint(r);
    constexpr auto kMaxInt = std::uint64_t(std::numeric_limits<std::int32_t>::max());
    if (world == 0 || world > kMaxInt || workers == 0 || workers > kMaxInt) return std::nullopt;
    out.world_ = static_cast<std::uint32_t>(world);
    out.workers_ = static_cast<std::uint32_t>(workers);
    const std::size_t nodes = get_count(r, 1);
    for (std::size_t k = 0; k < nodes; ++k) {
      const std::size_t length = get_count(r, 1);
      const auto begin = static_cast<std::size_t>(r.pos() - out.directory_.data());
      ByteReader block(r.bytes(length), "set index");
      out.keys_.emplace_back(get_text(block));
      out.blocks_.push_back({begin, begin + length});
    }
    if (!r.done()) return std::nullopt;
    std::vector<std::string_view> keys(out.keys_.begin(), out.keys_.end());
    std::sort(keys.begin(), keys.end());
    if (std::adjacent_find(keys.begin(), keys.end()) != keys.end()) return std::nullopt;  // a node twice
  } catch (const Error&) {
    return std::nullopt;
  }
  return out;
}

std::string SetIndex::read(const IndexNode::Part& part) const {
  const std::uint64_t size = file_->size() - data_begin_;
  if (part.offset > size || part.length > size - part.offset)
    throw SetIndexDamaged("its part at [" + std::to_string(part.offset) + ", +" + std::to_string(part.length) +
                          ") lies past its end");
  std::string bytes;
  try {
    bytes = read_at(*file_, file_->path(), data_begin_ + part.offset, part.length);
  } catch (const SnapshotError& e) {
    throw SetIndexDamaged(e.what());
  }
  if (crc32c(bytes) != part.crc)
    throw SetIndexDamaged("its part at [" + std::to_string(part.offset) + ", +" + std::to_string(part.length) +
                          ") does not match its checksum");
  return bytes;
}

namespace {

/// A sequence's entry in the directory, for `values` values.
template <class Fail>
IndexNode::Sequence get_sequence(ByteReader& r, std::size_t values, bool numbers, const Fail& fail) {
  IndexNode::Sequence s;
  const auto form = r.get<std::uint8_t>();
  switch (form) {
    case IndexNode::Sequence::same: s.value = get_text(r); break;
    case IndexNode::Sequence::progression:
      s.first = get_varint(r);
      s.step = get_varint(r);
      break;
    case IndexNode::Sequence::chunked: {
      s.per_chunk = get_varint(r);
      s.offset = get_varint(r);
      if (s.per_chunk == 0) fail("has chunks of no values");
      const std::uint64_t chunks = values / s.per_chunk + (values % s.per_chunk != 0);
      if (get_varint(r) != chunks) fail("has another number of chunks than its " + std::to_string(values) + " values fill");
      if (chunks > r.remaining() / 5) fail("has more chunks than fit");
      s.chunks.resize(static_cast<std::size_t>(chunks));
      std::uint64_t at = s.offset;
      for (auto& c : s.chunks) {
        c.offset = at;
        c.length = get_varint(r);
        c.crc = r.get<std::uint32_t>();
        if (c.length > std::numeric_limits<std::uint64_t>::max() - at) fail("has a chunk past any file's end");
        at += c.length;
      }
      s.cache.resize(s.chunks.size());
      if (numbers) {
        s.least = get_varint(r);
        s.greatest = get_varint(r);
        if (s.least > s.greatest) fail("states a least value above its greatest");
        s.bounded = true;
      }
      break;
    }
    default: fail("has values of an unknown form " + std::to_string(form));
  }
  s.form = static_cast<IndexNode::Sequence::Form>(form);
  return s;
}

}  // namespace

std::unique_ptr<IndexNode> SetIndex::node(std::size_t k) const {
  const Block& blk = blocks_.at(k);
  ByteReader r(std::string_view(directory_).substr(blk.begin, blk.end - blk.begin), "set index");
  auto out = std::make_unique<IndexNode>();
  IndexNode& n = *out;
  n.index_ = this;
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
    case kListed: {
      const std::string ranks = n.read(get_part(r)), instances = n.read(get_part(r));
      ByteReader rank_in(ranks, "set index"), instance_in(instances, "set index");
      if (rows > ranks.size() || rows > instances.size()) fail("has more rows than its ranks and instances");
      n.rank_.resize(n.rows_);
      n.instance_.resize(n.rows_);
      for (auto& rank : n.rank_) {
        const std::uint64_t v = get_varint(rank_in);
        if (v >= world_) fail("has a record of rank " + std::to_string(v) + " in a set of " + std::to_string(world_));
        rank = static_cast<std::uint32_t>(v);
      }
      for (auto& instance : n.instance_) {
        const std::uint64_t v = get_varint(instance_in);
        if (v > std::numeric_limits<std::uint32_t>::max()) fail("has a record of instance " + std::to_string(v));
        instance = static_cast<std::uint32_t>(v);
      }
      if (!rank_in.done() || !instance_in.done()) fail("has bytes after its ranks and instances");
      break;
    }
    default: fail("has rows of layout " + std::to_string(n.rows_are_));
  }
  n.one_mode_ = r.get<std::uint8_t>();
  if (n.one_mode_ == 0) {
    n.modes_ = n.read(get_part(r));
    if (n.modes_.size() != n.rows_) fail("has " + std::to_string(n.modes_.size()) + " modes for " + std::to_string(n.rows_) + " rows");
    for (const char m : n.modes_)
      if (m < 1 || m > 3) fail("has an unknown state mode " + std::to_string(int(m)));
  } else if (n.one_mode_ > 3) {
    fail("has an unknown state mode " + std::to_string(n.one_mode_));
  }
  n.columns_.resize(get_count(r, 4));
  for (auto& c : n.columns_) {
    c.name = get_text(r);
    const auto column_fail = [&](const std::string& what) { fail("field '" + c.name + "' " + what); };
    const auto type = r.get<std::uint8_t>();
    if (type < 1 || type > 4) fail("has a field '" + c.name + "' of unknown type " + std::to_string(type));
    c.type = static_cast<FieldType>(type);
    if (c.type == FieldType::elements) c.tag = get_text(r);
    const auto all = r.get<std::uint8_t>();
    if (all > 1) column_fail("has a presence flag " + std::to_string(all));
    c.values = n.rows_;
    if (!all) {
      const std::string flags = n.read(get_part(r));
      if (flags.size() != n.rows_) column_fail("has " + std::to_string(flags.size()) + " presence flags for " + std::to_string(n.rows_) + " rows");
      c.present.assign(flags.begin(), flags.end());
      c.nth.resize(n.rows_);
      c.values = 0;
      for (std::size_t i = 0; i < n.rows_; ++i) {
        if (c.present[i] > 1) column_fail("has a presence flag " + std::to_string(c.present[i]));
        c.nth[i] = static_cast<std::uint32_t>(c.values);
        c.values += c.present[i];
      }
    }
    c.numbers = get_sequence(r, c.values, c.type != FieldType::str, column_fail);
    if (c.type == FieldType::str && c.numbers.form == IndexNode::Sequence::progression) column_fail("has texts as a progression");
    if (c.type != FieldType::str && c.numbers.form == IndexNode::Sequence::same && c.values) {
      ByteReader one(c.numbers.value, "set index");  // the one number, read once: a progression of step 0
      c.numbers.first = get_varint(one);
      if (!one.done()) column_fail("has bytes after its one value");
      c.numbers.form = IndexNode::Sequence::progression;
    }
    if (c.type == FieldType::str && c.numbers.form == IndexNode::Sequence::same && c.values) {
      ByteReader one(c.numbers.value, "set index");  // the one text, whole
      get_text(one);
      if (!one.done()) column_fail("has bytes after its one value");
    }
    if (c.type == FieldType::elements) {
      c.lists = get_sequence(r, c.values, false, column_fail);
      if (c.lists.form == IndexNode::Sequence::progression) column_fail("has lists as a progression");
      if (c.lists.form == IndexNode::Sequence::same && c.values) {
        ByteReader one(c.lists.value, "set index");  // the one list, whole
        skip_list(one, column_fail);
        if (!one.done()) column_fail("has bytes after its one list");
      }
    }
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

std::uint32_t IndexNode::instance_step() const {
  switch (rows_are_) {
    case kRanks: return workers_;
    case kListed: return 0;
    default: return 1;
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

std::string IndexNode::read(const Part& part) const {
  // A node's parts are disjoint in a file dpipe writes: one that reads more than the file holds has parts
  // that overlap (crafted to make it allocate several times over), and is passed over as damaged.
  if (part.length > index_->parts_size() - std::min(read_bytes_, index_->parts_size()))
    throw SetIndexDamaged("node '" + key_ + "' reads more of the index than it holds: its parts overlap");
  read_bytes_ += part.length;
  return index_->read(part);
}

const IndexNode::Sequence::Chunk& IndexNode::chunk(std::size_t k, const Sequence& s, std::size_t c) const {
  Sequence::Chunk& out = s.cache[c];
  if (out.loaded) return out;
  const Column& col = columns_[k];
  out.bytes = read(s.chunks[c]);
  ByteReader in(out.bytes, "set index");
  const auto fail = [&](const std::string& what) { in.fail("field '" + col.name + "' of node '" + key_ + "' " + what); };
  const std::uint64_t values = std::min<std::uint64_t>(s.per_chunk, col.values - c * s.per_chunk);
  if (values > out.bytes.size())  // every value takes a byte at least
    fail("has a chunk of " + std::to_string(out.bytes.size()) + " bytes for " + std::to_string(values) + " values");
  out.at.resize(static_cast<std::size_t>(values));
  for (auto& at : out.at) {
    at = static_cast<std::uint32_t>(in.pos() - out.bytes.data());
    if (&s == &col.lists) {
      skip_list(in, fail);
    } else if (col.type == FieldType::str) {
      get_text(in);
    } else if (const std::uint64_t v = get_varint(in); s.bounded && (v < s.least || v > s.greatest)) {
      fail("has a value " + std::to_string(v) + " outside the bounds its directory states [" + std::to_string(s.least) +
           ", " + std::to_string(s.greatest) + "]");
    }
  }
  if (!in.done()) fail("has bytes after its values");
  out.loaded = true;
  return out;
}

std::string_view IndexNode::bytes_of(std::size_t k, const Sequence& s, std::size_t n) const {
  if (s.form == Sequence::same) return s.value;
  const auto c = static_cast<std::size_t>(n / s.per_chunk);
  const Sequence::Chunk& ch = chunk(k, s, c);
  return std::string_view(ch.bytes).substr(ch.at[n - c * s.per_chunk]);
}

std::uint64_t IndexNode::number_of(std::size_t k, const Sequence& s, std::size_t n) const {
  if (s.form == Sequence::progression) return s.first + std::uint64_t(n) * s.step;
  ByteReader in(bytes_of(k, s, n), "set index");
  return get_varint(in);
}

std::uint64_t IndexNode::row_number(std::size_t k, std::size_t r) const {
  return number_of(k, columns_[k].numbers, nth(k, r));
}

std::uint64_t IndexNode::number(std::size_t i, std::size_t k) const {
  return has(i, k) ? row_number(k, row(i)) : 0;
}

std::string_view IndexNode::text(std::size_t i, std::size_t k) const {
  if (!has(i, k)) return {};
  ByteReader in(bytes_of(k, columns_[k].numbers, nth(k, row(i))), "set index");
  return get_text(in);
}

IndexNode::ListValue IndexNode::list_value(std::size_t k, std::size_t r) const {
  ListValue l;
  l.count = row_number(k, r);
  const Column& c = columns_[k];
  ByteReader in(bytes_of(k, c.lists, nth(k, r)), "set index");
  const auto fail = [&](const std::string& what) { in.fail("field '" + c.name + "' of node '" + key_ + "' " + what); };
  ByteReader value = in;
  const auto how = skip_list(in, fail);
  value = ByteReader(value.bytes(static_cast<std::size_t>(in.pos() - value.pos())).substr(1), "set index");
  if ((how == kNoElements) != (l.count == 0))
    fail("has a list of " + std::to_string(l.count) + " elements stored as " + (how == kNoElements ? "empty" : "not empty"));
  if (how == kValuesHere) {
    if (get_varint(value) != l.count) fail("has a list whose values are not as many as its count");
    l.values_here = true;
    l.values = value.bytes(value.remaining());
  } else if (how == kPlace) {
    l.offset = get_varint(value);
    l.bytes = get_varint(value);
    l.crc = value.get<std::uint32_t>();
    if (l.count > l.bytes / 8 || l.offset > std::numeric_limits<std::uint64_t>::max() - l.bytes)
      fail("claims " + std::to_string(l.count) + " elements in " + std::to_string(l.bytes) + " bytes");
  }
  return l;
}

std::size_t IndexNode::first_text(std::size_t k) const {
  const Column& c = columns_[k];
  if (c.type == FieldType::str && c.numbers.form == Sequence::same) {  // every row that has it has one text
    ByteReader in(c.numbers.value, "set index");
    if (c.values == 0 || get_text(in).empty()) return rows_;
  }
  return OldColumns::first_text(k);
}

rescale::Numbers IndexNode::all_numbers(std::size_t k) const {
  const Column& c = columns_[k];
  if (c.type == FieldType::str) return OldColumns::all_numbers(k);
  const Sequence& s = c.numbers;
  const bool by_row = c.present.empty() && order_.empty();  // value n is slot n's
  if (by_row && s.form == Sequence::progression) return rescale::Numbers(rows_, s.first, s.step);  // one value too
  if (by_row && s.form == Sequence::same) return rescale::Numbers(rows_, rows_ ? number_of(k, s, 0) : 0, 0);
  // The values in row order (rows that have the field), a chunk at a time; then by slot.
  std::vector<std::uint64_t> values(c.values);
  if (s.form == Sequence::chunked) {
    for (std::size_t j = 0; j < s.chunks.size(); ++j) {
      const Sequence::Chunk& ch = chunk(k, s, j);
      ByteReader in(ch.bytes, "set index");
      for (std::size_t v = 0; v < ch.at.size(); ++v) values[j * s.per_chunk + v] = get_varint(in);
    }
  } else {
    for (std::size_t n = 0; n < values.size(); ++n) values[n] = number_of(k, s, n);
  }
  if (by_row) return rescale::Numbers(std::move(values));
  std::vector<std::uint64_t> out(rows_, 0);
  for (std::size_t i = 0; i < rows_; ++i)
    if (const std::size_t r = row(i); c.present.empty() || c.present[r]) out[i] = values[nth(k, r)];
  return rescale::Numbers(std::move(out));
}

rescale::Numbers IndexNode::numbers_on_demand(std::size_t k) const {
  const Column& c = columns_[k];
  const Sequence& s = c.numbers;
  if (c.type == FieldType::str || s.form != Sequence::chunked || !s.bounded) return all_numbers(k);
  // A row without the field reads 0.
  const std::uint64_t least = c.present.empty() ? s.least : 0;
  return rescale::Numbers(rows_, [this, k](std::size_t i) { return number(i, k); }, least, s.greatest);
}

std::uint64_t IndexNode::list_size(std::size_t i, std::size_t k) const {
  return has(i, k) ? row_number(k, row(i)) : 0;
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
    if (loaded_.count(id) || row_number(std::size_t(k), r) == 0) continue;
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
    case FieldType::u64: f.u = node->row_number(k, row); break;
    case FieldType::i64: f.i = static_cast<std::int64_t>(node->row_number(k, row)); break;
    case FieldType::str: {
      ByteReader in(node->bytes_of(k, c.numbers, node->nth(k, row)), "set index");
      f.s = get_text(in);
      break;
    }
    case FieldType::elements: node->fill_list(k, row, f.elements); break;
  }
  return f;
}

void recompute_set_index_checksums(std::string& bytes) {
  if (bytes.size() < kHeadBytes) return;
  std::uint32_t length = 0;
  std::memcpy(&length, bytes.data() + 12, sizeof length);
  if (length > bytes.size() - kHeadBytes) return;
  const std::string_view parts = std::string_view(bytes).substr(kHeadBytes + length);
  // Writes the CRC-32C of parts [offset, offset + n) where the reader stands (on the CRC of that part).
  const auto fix = [&](ByteReader& r, std::uint64_t offset, std::uint64_t n) {
    const auto at = static_cast<std::size_t>(r.pos() - bytes.data());
    r.get<std::uint32_t>();
    if (offset > parts.size() || n > parts.size() - offset) return;
    const std::uint32_t crc = crc32c(parts.substr(static_cast<std::size_t>(offset), static_cast<std::size_t>(n)));
    std::memcpy(bytes.data() + at, &crc, sizeof crc);
  };
  try {
    ByteReader r(std::string_view(bytes).substr(kHeadBytes, length), "set index");
    const auto part = [&] {
      const std::uint64_t offset = get_varint(r), n = get_varint(r);
      fix(r, offset, n);
    };
    const auto sequence = [&](bool numbers) {
      const auto form = r.get<std::uint8_t>();
      if (form == IndexNode::Sequence::same) {
        get_text(r);
      } else if (form == IndexNode::Sequence::progression) {
        get_varint(r);
        get_varint(r);
      } else {
        get_varint(r);
        std::uint64_t offset = get_varint(r);
        for (std::uint64_t m = get_varint(r); m > 0; --m) {
          const std::uint64_t n = get_varint(r);
          fix(r, offset, n);
          offset += n;
        }
        if (numbers) get_varint(r), get_varint(r);  // the least and greatest
      }
    };
    get_text(r);
    get_varint(r);
    get_varint(r);
    for (std::uint64_t nodes = get_varint(r); nodes > 0; --nodes) {
      get_varint(r);  // the node's length
      get_text(r);
      get_text(r);
      get_varint(r);
      if (r.get<std::uint8_t>() == kListed) part(), part();
      if (r.get<std::uint8_t>() == 0) part();
      for (std::uint64_t c = get_varint(r); c > 0; --c) {
        get_text(r);
        const auto type = r.get<std::uint8_t>();
        if (type == static_cast<std::uint8_t>(FieldType::elements)) get_text(r);
        if (r.get<std::uint8_t>() == 0) part();
        sequence(type != static_cast<std::uint8_t>(FieldType::str));
        if (type == static_cast<std::uint8_t>(FieldType::elements)) sequence(false);
      }
    }
  } catch (const SnapshotError&) {
    // a directory that does not parse: its parts' checksums are left as they are
  }
  const std::uint32_t crc = crc32c(std::string_view(bytes).substr(kHeadBytes, length));
  std::memcpy(bytes.data() + 16, &crc, sizeof crc);
}

}  // namespace dpipe::detail
