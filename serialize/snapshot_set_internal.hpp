#pragma once
// What the snapshot set's two halves share (inside the library): the set directory's names, manifest and
// listing (set_directory.cpp), through which the rescale driver (rescale_driver.cpp) reads a set.
#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dpipe/atomic_file.hpp"
#include "dpipe/error.hpp"
#include "dpipe/snapshot_set.hpp"
#include "dpipe/kit/state.hpp"
#include "snapshot_plan.hpp"

namespace dpipe {
namespace fs = std::filesystem;
}  // namespace dpipe

namespace dpipe::set_internal {

/// "0x" and the 16 hex digits of snapshot id `id`.
std::string hex_id(std::uint64_t id);

/// "step S", or "no step".
std::string steps_text(const std::optional<std::uint64_t>& step);

/// Throws unless the metadata of `world` ranks (`meta_of(r)`, rank r's) make a complete, consistent set.
template <class MetaOf>
void check_metas(int world, MetaOf meta_of) {
  if (world == 0) throw SnapshotError("a snapshot set needs at least one rank's snapshot");
  const SnapshotMeta& m0 = meta_of(0);
  for (int r = 0; r < world; ++r) {
    const SnapshotMeta& m = meta_of(r);
    const std::string who = "snapshot set: rank " + std::to_string(r) + "'s snapshot";
    if (m.layout.rank != r || m.layout.world_size != world)
      throw SnapshotError(who + " says it is rank " + std::to_string(m.layout.rank) + " of " +
                          std::to_string(m.layout.world_size) + ", expected rank " + std::to_string(r) + " of " +
                          std::to_string(world));
    if (m.fingerprint != m0.fingerprint)
      throw SnapshotError(who + " was taken from a different pipeline than rank 0's (graph fingerprints differ)");
    if (m.seed != m0.seed || m.epoch != m0.epoch)
      throw SnapshotError(who + " has seed " + std::to_string(m.seed) + " and epoch " + std::to_string(m.epoch) +
                          ", rank 0's has seed " + std::to_string(m0.seed) + " and epoch " + std::to_string(m0.epoch));
    if (m.step != m0.step) {
      throw SnapshotError("snapshot set: rank " + std::to_string(r) + "'s snapshot (id " + hex_id(m.id) + ") names " +
                          steps_text(m.step) + ", rank 0's (id " + hex_id(m0.id) + ") " + steps_text(m0.step) +
                          "; a set holds the snapshots of one step, so these come from different snapshots");
    }
    if (m.layout.num_workers != m0.layout.num_workers)
      throw SnapshotError(who + " has " + std::to_string(m.layout.num_workers) + " workers, rank 0's has " +
                          std::to_string(m0.layout.num_workers));
  }
}

// ---- file names ----------------------------------------------------------------------------------

/// A decimal number as file names write it (no sign, no leading zero), or nullopt.
std::optional<std::uint64_t> decimal(std::string_view s);

/// What the tagged name of every rank file of one snapshot shares, and the manifest records.
struct SetIdentity {
  int world = 0;
  int workers = 0;
  std::optional<std::uint64_t> step{};
  std::uint64_t tag = 0;
  bool operator==(const SetIdentity&) const = default;
};

/// The identity of the set a snapshot with metadata `m` belongs to.
SetIdentity identity_of(const SnapshotMeta& m);

/// Rank `rank`'s file name in set `s`: rank-R plus the set's suffix.
std::string tagged_name(int rank, const SetIdentity& s);

// ---- the manifest --------------------------------------------------------------------------------

constexpr const char* kManifestName = "set.dpipe-manifest";

/// `dir`'s set index file.
std::string index_path(const std::string& dir);

/// "dpipe-set 1 world=W workers=K step=S|- tag=TAG crc32c=CRC\n", CRC over what precedes " crc32c=".
std::string manifest_text(const SetIdentity& s);

/// The set `dir`'s manifest names; nullopt when there is none, it is no regular file, or its text is not
/// exactly what manifest_text writes (checksum included): the reader then lists the directory.
std::optional<SetIdentity> read_manifest(const std::string& dir);

// ---- a listed set --------------------------------------------------------------------------------

/// A set directory's rank files, from their names alone: one world size, every rank once.
struct SetListing {
  int world = 0;
  std::vector<std::pair<std::string, RankFileName>> ranks;  // at index r: rank r's file
  bool all_tagged = true;                                   // every name carries the set's identity
  /// Set instead of `ranks` for a set its manifest names: rank r's file is named from it.
  std::optional<SetIdentity> named{};
};

/// Lists set directory `dir`; throws unless it holds one world size's rank files, every rank once.
SetListing list_set(const std::string& dir);

/// Runs `read` on rank `r`'s file of a listed set, naming the set, the rank and the file in its errors.
template <class Read>
auto with_rank_file(const std::string& dir, int r, const std::string& name, const RankFileName& f, Read read) {
  try {
    return read((fs::path(dir) / name).string(), f);
  } catch (const ElementsNotLoaded&) {
    throw;
  } catch (const SnapshotError& e) {
    throw SnapshotError("snapshot set '" + dir + "', rank " + std::to_string(r) + " ('" + name + "'): " + e.what());
  }
}
template <class Read>
auto with_rank_file(const std::string& dir, const SetListing& l, int r, Read read) {
  if (l.named) {
    const SetIdentity& set = *l.named;
    return with_rank_file(dir, r, tagged_name(r, set), RankFileName{r, set.world, set.workers, set.step, set.tag, true},
                          read);
  }
  const auto& [name, f] = l.ranks[static_cast<std::size_t>(r)];
  return with_rank_file(dir, r, name, f, read);
}

/// Reads rank `r`'s file of a listed set.
Snapshot read_listed(const std::string& dir, const SetListing& l, int r);

/// Rank `r`'s file of the set a manifest names, opened by its name; nullopt when it is not there (the
/// set is then listed, and the listing says what is wrong with it).
std::optional<Snapshot> read_by_manifest(const std::string& dir, const SetIdentity& set, int r);

/// Rank `r`'s file of a listed set read for a rescale plan (read_snapshot_plan), checked against its name;
/// nullopt for a file without a state index.
std::optional<detail::SnapshotPlan> read_named_plan(const std::string& dir, const SetListing& l, int r);

/// Throws unless every rank file of a listed set with today's names names one step and one tag.
void check_one_snapshot(const std::string& dir, const SetListing& l);

// ---- the set index -------------------------------------------------------------------------------

/// What a rank file was when the index was built from it: a rewrite renames another file into place.
struct FileStamp {
  dev_t dev = 0;
  ino_t ino = 0;
  off_t size = 0;
  std::int64_t mtime_ns = 0;
  bool operator==(const FileStamp&) const = default;
};

/// What the file at `path` is now, or nullopt when there is none.
std::optional<FileStamp> stamp_of(const std::string& path);

/// Builds the index of `set`, complete in `dir`, from its rank files' state indexes and writes it; returns
/// the files' stamps, or nullopt when no index was written (a file gone, changed or without a state
/// index: the set's readers then read the rank files, as without an index).
std::optional<std::vector<FileStamp>> write_set_index(const std::string& dir, const SetIdentity& set,
                                                      Durability durability = Durability::each_write);

/// Makes sure the complete set `set` in `dir` has its index, for a rescale that found none: the first
/// reader to create the directory's lock file builds and writes it (write_set_index, checked against the
/// rank files' stamps); every other reader waits while that lock stands (at most 10 s, or 2 ms per rank
/// when more), then uses the index. A lock left by a killed builder (10 minutes old) is taken over once.
/// Whether an index may now stand; false (the reader reads the rank files) when the directory is read-only,
/// the builder gave up, or the wait ran out.
bool build_index_once(const std::string& dir, const SetIdentity& set);

/// Creates directory `dir` and its parents where missing; a SnapshotError when it cannot.
void create_set_dir(const std::string& dir);

}  // namespace dpipe::set_internal
