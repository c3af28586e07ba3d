#pragma once
// A snapshot file read for a rescale plan (inside the library: SnapshotSet::read_rank): the metadata and
// the state index only, with the long element lists left in the file until a rank needs them.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dpipe/regular_file.hpp"
#include "dpipe/snapshot.hpp"

namespace dpipe::detail {

/// An element list of a plan: stored in file `file` of the set (its lengths and bytes at [offset,
/// offset + bytes), CRC-32C `crc`), or loaded (from the state index where it was inline, or from the file
/// once a rank needs it). A plan holds one per list of every old rank, so it is kept small.
struct StoredList {
  std::uint32_t file = 0;
  std::string tag;
  std::uint64_t count = 0;
  bool stored = false;
  std::uint64_t offset = 0, bytes = 0;
  std::uint32_t crc = 0;
  std::unique_ptr<ElementBlobs> loaded{};  // the elements, when loaded
};

/// A snapshot file read for a rescale plan: its metadata, and its state index kept encoded with where
/// each node record starts, so the records are decoded one node at a time (decode_plan_record).
struct SnapshotPlan {
  SnapshotMeta meta;
  std::string index;  // the state index's bytes, verified against its checksum
  std::uint64_t states_begin = 0, states_end = 0;  // the node-state section, where stored lists lie
  std::uint64_t index_begin = 0;                    // where the state index starts in the file
  struct Record {
    std::string key;
    std::size_t offset = 0;  // in `index`
  };
  std::vector<Record> records;  // in the order they were saved
};

/// The plan of the snapshot at `path` from its header, identity, metadata, node details and state index
/// (every record passed over once, bounded as decoding is). nullopt for a file without a state index
/// (format 1 or 2). Checksums of everything read are verified; throws SnapshotError naming the file.
std::optional<SnapshotPlan> read_snapshot_plan(const std::string& path);

/// The record at `offset` of a plan's state index, every element list with elements given as one range of
/// a new entry of `lists` (file `file`); inline lists are loaded as well, stored ones are not.
NodeState decode_plan_record(const SnapshotPlan& plan, std::size_t offset, std::uint32_t file, std::vector<StoredList>& lists);

/// Every record of a plan's state index, in order, handed to `each` with its element lists located: each
/// list with elements gets one range of `lists` (cleared per record), stored where section 2 holds it or,
/// for an inline list, where the state index itself holds its lengths and bytes, with the CRC-32C of
/// those bytes computed here; an inline list is loaded as well. For the set index (set_index.hpp).
void for_each_located_record(const SnapshotPlan& plan, std::uint32_t file,
                             const std::function<void(const NodeState&, const std::vector<StoredList>&)>& each);

/// Bytes [offset, offset + length) of the open snapshot `file` at `path`, bounded by its size first (a
/// SnapshotError naming it if they cannot be read).
std::string read_at(const RegularFile& file, const std::string& path, std::uint64_t offset, std::uint64_t length);

/// The elements of a stored list, read from `path` (the list's file) and verified against its checksum.
ElementBlobs load_stored_list(const std::string& path, const StoredList& list);

}  // namespace dpipe::detail
