#pragma once
// A snapshot file read for a rescale plan (inside the library: SnapshotSet::read_rank): the metadata and
// the state index only, with the long element lists left in the file until a rank needs them.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dpipe/snapshot.hpp"

namespace dpipe::detail {

/// An element list of a plan: stored in file `file` of the set (its lengths and bytes at [offset,
/// offset + bytes), CRC-32C `crc`), or loaded from the state index where it was inline.
struct StoredList {
  std::uint32_t file = 0;
  std::string tag;
  std::uint64_t count = 0;
  bool stored = false;
  std::uint64_t offset = 0, bytes = 0;
  std::uint32_t crc = 0;
  ElementBlobs loaded{};  // the elements of an inline list
};

/// The snapshot at `path` from its header, identity, metadata, node details and state index, with every
/// element list given as one range of a new entry of `lists` (file `file`): inline lists are loaded as
/// well, stored ones are not. nullopt for a file without a state index (format 1 or 2). Checksums of
/// everything read are verified; throws SnapshotError naming the file.
std::optional<Snapshot> read_snapshot_plan(const std::string& path, std::uint32_t file, std::vector<StoredList>& lists);

/// The elements of a stored list, read from `path` (the list's file) and verified against its checksum.
ElementBlobs load_stored_list(const std::string& path, const StoredList& list);

}  // namespace dpipe::detail
