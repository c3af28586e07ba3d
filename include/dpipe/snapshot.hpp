#pragma once
/// A Snapshot is the complete state of a Run at the consumer's position: metadata, then one record per
/// node and instance, each a list of named, typed fields. Buffered elements are stored as opaque
/// length-delimited blobs with a type tag, so any program can show, check and (later) rescale a snapshot
/// without knowing the element types. Converts to and from bytes and files; see docs/snapshot-format.md.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dpipe/layout.hpp"

namespace dpipe {

/// How a node's state is captured (DESIGN §3): by its hook, not at all, or by replay from the
/// initial RNG state.
enum class StateMode : std::uint8_t { hook = 1, stateless = 2, replay = 3 };
const char* to_string(StateMode m);

/// A replay record (format 5 on) holds `count`, `digest` and `digest_steps`: the digest after 2^16, 2^17,
/// … elements, one per power of two from 2^16 up to count. How many steps a record of `count` holds:
inline constexpr unsigned kReplayFirstStepLog2 = 16;
inline constexpr std::size_t replay_steps_for(std::uint64_t count) {
  std::size_t bits = 0;  // std::bit_width(count), without <bit> in this widely included header
  for (std::uint64_t c = count; c; c >>= 1) ++bits;
  return bits > kReplayFirstStepLog2 ? bits - kReplayFirstStepLog2 : 0;
}

/// The field a node that names elements by their index in its input saves after its own (format 6 on):
/// how many elements it has taken from its input since it was first built (IterBase::input_taken). A
/// rescale drops it, since no instance of another layout has that input.
inline constexpr const char* kInputTakenField = "input_taken";

enum class FieldType : std::uint8_t { u64 = 1, i64 = 2, str = 3, elements = 4 };

/// Elements [begin, end) of stored list `list` of a rescale plan: a rescale that reads only what it
/// deals (SnapshotSet::read_rank) first deals ranges of the old ranks' lists, then loads the ranges its
/// own rank received.
struct ElementRange {
  std::uint64_t list = 0, begin = 0, end = 0;
};

/// A list of encoded elements: element i is data[offsets[i], offsets[i+1]); an empty list may have no
/// offsets at all (a default one allocates nothing).
struct ElementBlobs {
  std::string tag;                   // Codec<T>::tag() of the element type
  std::vector<std::uint64_t> offsets{};
  std::string data;
  /// In a rescale plan only: when not empty, the list's elements are these ranges, in order; offsets
  /// and data then hold a loaded copy of the same elements, or none (loaded() false).
  std::vector<ElementRange> ranges{};

  std::size_t size() const {
    if (ranges.empty()) return offsets.empty() ? 0 : offsets.size() - 1;
    std::size_t n = 0;
    for (const auto& r : ranges) n += static_cast<std::size_t>(r.end - r.begin);
    return n;
  }
  /// Whether the elements' bytes are here (always, but for a plan's lists not loaded).
  bool loaded() const { return ranges.empty() || (offsets.empty() ? 0 : offsets.size() - 1) == size(); }
  std::string_view at(std::size_t i) const {
    return std::string_view(data).substr(offsets[i], offsets[i + 1] - offsets[i]);
  }
  void append(std::string_view bytes) {
    if (offsets.empty()) offsets.push_back(0);
    data.append(bytes);
    offsets.push_back(data.size());
  }
  /// Appends elements [begin, end) of `src`: as ranges when `src` is a plan's list, else as bytes. A
  /// list holds one kind or the other (the rescale rules deal a plan's lists among themselves).
  void append_from(const ElementBlobs& src, std::size_t begin, std::size_t end);
  /// Empty again, keeping the storage (a recycled snapshot's records are overwritten in place).
  void clear() {
    tag.clear();
    offsets.clear();
    data.clear();
    ranges.clear();
  }
};

struct Field {
  std::string name;
  FieldType type = FieldType::u64;
  std::uint64_t u = 0;
  std::int64_t i = 0;
  std::string s;
  ElementBlobs elements;

  /// As a new Field, keeping the storage of its strings and lists.
  void clear() {
    name.clear();
    type = FieldType::u64;
    u = 0;
    i = 0;
    s.clear();
    elements.clear();
  }
};

/// The state of one node on one instance.
struct NodeState {
  std::string key;
  std::string kind;
  std::uint32_t instance = 0;
  StateMode mode = StateMode::hook;
  std::vector<Field> fields;
};

/// Where a snapshot's node records go: appended to `out`, each taking over the storage of the record at
/// the same position in `spare` (an earlier snapshot's, see Run::recycle) while there is one. Nodes are
/// saved in the same order every time, so a node's record usually gets its own old buffers back.
class StateSink {
 public:
  explicit StateSink(std::vector<NodeState>& out, std::vector<NodeState>* spare = nullptr) : out_(out), spare_(spare) {}
  NodeState& add() {
    if (spare_ && next_ < spare_->size()) out_.push_back(std::move((*spare_)[next_++]));
    else out_.emplace_back();
    return out_.back();
  }

 private:
  std::vector<NodeState>& out_;
  std::vector<NodeState>* spare_;
  std::size_t next_ = 0;
};

/// One node of the graph as the snapshot records it (for inspection without the program).
struct GraphNodeRecord {
  std::string key;
  std::string kind;
  std::string element_type;
  /// "prefix", "worker" or "suffix" (see Segment), and the node's parameters; empty in snapshots
  /// written before they were recorded.
  std::string segment;
  std::vector<std::pair<std::string, std::string>> params;
};

struct SnapshotMeta {
  std::uint32_t format_version = 0;  // of the bytes it was read from; 0 when built in memory
  std::uint64_t fingerprint = 0;
  std::uint64_t seed = 0;
  std::uint64_t epoch = 0;
  Layout layout;
  std::uint64_t elements_delivered = 0;  // by this Run before the snapshot
  std::vector<GraphNodeRecord> graph;
  std::map<std::string, std::string> user_metadata;
  /// Which snapshot this is (format 2 on): a random id drawn when it was taken (0 in files of format 1),
  /// and the user's step when one was given (`Run::snapshot(metadata, step)`, the tool's --step). A set
  /// whose ranks name different steps is refused.
  std::uint64_t id = 0;
  std::optional<std::uint64_t> step{};
};

/// A snapshot's identity, read from the start of its file without parsing the rest.
struct SnapshotIdentity {
  std::uint32_t format_version = 0;
  std::uint64_t id = 0;
  std::optional<std::uint64_t> step{};
};

class Snapshot {
 public:
  /// 2: an identity section (id, step) first after the section table. 3: a state index (the node
  /// states with each long element list replaced by where it lies and its checksum) before the node
  /// states, so a rescale reads the lists it deals only. 4: unnamed nodes keyed by their upstream
  /// subgraph (KeyScheme::stable), bytes laid out as in 3. 5: replay records carry their digest steps
  /// (replay_steps_for). 6: a node calling a Python callable saves `input_taken` after its own fields
  /// (kInputTakenField). 7: element lists may hold restore keys (kit/restore_keys.hpp: tag "keys:…").
  /// 8: a restore key may be extended (group starts, token slices: a batch of packed rows). Files of
  /// versions 1 to 7 stay readable.
  static constexpr std::uint32_t kFormatVersion = 8;

  SnapshotMeta meta;
  std::vector<NodeState> states;

  /// The binary form: header, section table, checksummed sections.
  std::string to_bytes() const;
  /// The same into `buffer`, reusing its capacity (a loop that snapshots often allocates once).
  void write_bytes(std::string& buffer) const;
  /// Parses and verifies bytes (magic, version, lengths, checksums); throws SnapshotError.
  static Snapshot from_bytes(std::string_view bytes);
  /// Writes atomically (write_file_atomically: the old or the new file, never a mix; links followed,
  /// devices and FIFOs refused); throws FileError.
  void write_file(const std::string& path) const;
  static Snapshot read_file(const std::string& path);
  /// The id and step of the snapshot file at `path`, reading its header, section table and identity
  /// section only (checksums verified); throws SnapshotError.
  static SnapshotIdentity read_identity(const std::string& path);
  /// The metadata of the snapshot file at `path` (section 1 and the identity), reading no node state
  /// (checksums verified); throws SnapshotError.
  static SnapshotMeta read_meta(const std::string& path);
  /// A JSON rendering for people; native element types are decoded, others shown as hex.
  std::string to_json() const;

  const NodeState* find(std::string_view key, std::uint32_t instance) const;
};

namespace detail {
/// The id of a snapshot: a digest of what it is (pipeline, seed, epoch, layout, position, step), so two
/// snapshots of one run at one element are the same bytes. Never 0 (no id: files of format 1).
std::uint64_t snapshot_id(const SnapshotMeta& m);
}  // namespace detail

/// Decodes one element blob with the given native type tag into JSON text; false if the tag is not
/// native (a cereal-encoded user type) or the bytes do not match it.
bool element_to_json(std::string_view tag, std::string_view bytes, std::string& out);

}  // namespace dpipe
