#pragma once
// The set index (`set.dpipe-index`, inside the library): the node records of every rank of a complete set
// in one small file, grouped by node, numbers as varints, field names once per node, element lists as
// where they lie in the rank files (and their CRC-32C) or, for the few bytes of a generator or a short
// position list, their values. The write that completes a set writes it beside the manifest; a rescale
// through the directory then reads this one file and the element lists it is dealt, instead of every
// rank's state index. Format: docs/snapshot-format.md, "The set index".
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "dpipe/snapshot.hpp"
#include "snapshot_plan.hpp"

namespace dpipe::detail {

/// Builds a set index from the plans of ranks 0, 1, …, W−1 in order, one at a time (nothing of a rank is
/// kept but its records' encoding).
class SetIndexWriter {
 public:
  /// `identity`: the text of the set's manifest, which a reader compares with the manifest it finds.
  explicit SetIndexWriter(std::string identity) : identity_(std::move(identity)) {}
  void add_rank(const SnapshotPlan& plan, std::uint32_t rank);
  /// The file's bytes, checksum included.
  std::string finish();

 private:
  struct Node {
    std::string key, kind;
    std::vector<std::string> names;  // field names and element tags, each once
    std::string block;               // its records, encoded
    std::uint64_t records = 0;
  };
  std::uint32_t name_of(Node& n, std::string_view name);

  std::string identity_;
  std::uint32_t ranks_ = 0;
  std::vector<Node> nodes_;  // in the order rank 0 saved them (keys first seen later after)
  std::unordered_map<std::string, std::size_t> node_of_;  // key → its place in nodes_
};

/// A set index read back.
class SetIndex {
 public:
  /// The index in `bytes` (a whole file) when it is one this version reads, its checksum holds and it
  /// names the set whose manifest text is `identity`; nullopt otherwise (the caller reads the rank files).
  static std::optional<SetIndex> parse(std::string bytes, std::string_view identity);

  std::uint32_t world() const { return world_; }
  /// Every node key once, in the order the ranks saved their records.
  const std::vector<std::string>& keys() const { return keys_; }
  /// The records of node `keys()[k]` on every old instance, each element list with elements given as one
  /// range of a new entry of `lists` (file = the old rank), tiny lists loaded. SnapshotError if corrupt.
  std::vector<NodeState> records(std::size_t k, std::vector<StoredList>& lists) const;

 private:
  std::string bytes_;
  std::uint32_t world_ = 0;
  std::vector<std::string> keys_;
  struct Block {
    std::size_t begin = 0, end = 0;  // the node's kind, names and records in bytes_
  };
  std::vector<Block> blocks_;
};

}  // namespace dpipe::detail
