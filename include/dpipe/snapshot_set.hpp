#pragma once
/// A snapshot set: one directory, one snapshot file per rank, each written atomically by its own rank
/// with no collective, and named for what the set's consistency needs: `rank-R-of-W.wK[.sS].TAG.dpipe`
/// (K workers, step S, TAG a digest of pipeline, seed, epoch, W, K and step). A set is usable only when
/// every rank's file is there and they agree on graph, seed, epoch, step and layout. The write that
/// completes a set also writes its manifest (`set.dpipe-manifest`, one line: W, K, step, TAG); a resume
/// on the set's own layout opens its own file by the name the manifest gives, or without a manifest
/// checks the set from the directory listing, and reads its own file only.
///
/// Rescaling (DESIGN §6) turns a set taken on {W ranks, K workers} into one for {W', K'}: samplers are
/// re-sliced (the new instances continue from the slowest old instance's position and skip what faster
/// ones took), and elements in shuffle buffers, partial batches, worker queues and consumers' buffers
/// are dealt to the new instances — not dropped, not re-read. Any other node with state makes the
/// rescale fail with a SnapshotError naming it. It works on the records alone, without the element
/// types, so the `dpipe` tool can rescale a set written by any program; from a directory, on each old
/// rank's state index, loading only the element lists it deals (read_rank, rescale_dir).
#include <cstdint>
#include <functional>
#include <future>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dpipe/snapshot.hpp"

namespace dpipe {

/// What a rank file's name says (SnapshotSet::file_name).
struct RankFileName {
  int rank = 0;
  int world_size = 1;
  int workers = 0;                      // 0 in names of before (rank-R-of-W.dpipe)
  std::optional<std::uint64_t> step{};  // the snapshot's step, when it has one
  std::uint64_t tag = 0;                // digest of pipeline fingerprint, seed, epoch, world size, workers, step
  bool tagged = false;                  // the name carries workers, step and tag
};

/// A set directory to resume from (Engine::resume): on the set's own layout only this rank's file is read.
struct SnapshotDir {
  std::string path;
};

class SnapshotSet {
 public:
  /// Checks that `ranks` is a complete, consistent set (rank r at index r); throws SnapshotError.
  explicit SnapshotSet(std::vector<Snapshot> ranks);

  /// Writes one rank's snapshot into `dir` (created if needed), atomically, then removes this rank's
  /// older files there (another step, or the names of before): the directory holds one file per rank.
  /// The write that completes the set writes its manifest; every write first removes the manifest
  /// (docs/snapshot-format.md, "Snapshot sets").
  static void write_rank(const std::string& dir, const Snapshot& s);
  /// write_rank on a background thread: the caller pays the capture only (take the snapshot, move it in);
  /// the encoding, write, fsync and rename happen on one writer thread per process, in the order the
  /// writes were submitted. The future holds the write's error, if any. A crash mid-write leaves the last
  /// complete file, as write_rank does; writes still queued when the process exits normally are finished.
  static std::future<void> write_rank_async(std::string dir, Snapshot s);
  /// Reads every rank's file of `dir`; refuses a missing, extra or inconsistent rank, naming it.
  static SnapshotSet read_dir(const std::string& dir);
  /// Rank `to.rank`'s snapshot of the set in `dir`, for a run of layout `to`. On the set's own layout it
  /// reads this rank's file only (checking that it holds what its name says), by the name the set's
  /// manifest gives, or, without one, after checking from the directory listing that every rank is
  /// there with one step and one tag: what a rank reads does not grow with the world size. Another layout (with `rescale`; refused without) reads
  /// every rank's state index and then only the element lists dealt to this rank (docs/snapshot-format.md,
  /// "Snapshot sets"). Sets of names of before, or of files before format 3, are read whole.
  static Snapshot read_rank(const std::string& dir, const Layout& to, bool rescale);
  /// The name rank `m.layout.rank` writes its snapshot under (see above).
  static std::string file_name(const SnapshotMeta& m);
  /// The name of rank r of W in sets written before names carried more (still read).
  static std::string file_name(int rank, int world_size);
  /// A rank file's name parsed (either form), or nullopt for any other name.
  static std::optional<RankFileName> parse_file_name(std::string_view name);

  int world_size() const { return static_cast<int>(ranks_.size()); }
  int num_workers() const { return ranks_.front().meta.layout.num_workers; }
  const Snapshot& rank(int r) const;
  const std::vector<Snapshot>& ranks() const { return ranks_; }

  /// The set redistributed over {world_size, num_workers} (see above).
  SnapshotSet rescaled(int world_size, int num_workers) const;
  /// Writes every rank's file into `dir`, the set's index and its manifest.
  void write_dir(const std::string& dir) const;
  /// Writes the index of the complete set in `dir` (the one its manifest names): what the first rescale
  /// that finds none does. write_rank leaves it out, so that no rank's checkpoint reads every rank's file.
  /// Whether it stands (false: no manifest, or a rank file changed while it was built).
  static bool write_index(const std::string& dir);
  /// Rescales the set in `dir` onto {world_size, num_workers} into the directory `out` (absent or empty),
  /// holding the old ranks' state indexes (kept encoded) and the records of one batch of new ranks (at
  /// least 512, in at most 8 passes over the old records), writing one new rank at a time, not the set
  /// (a set written before format 3 is read whole). The files are written into a directory beside
  /// `out`, made durable, and renamed into place: `out` ends up holding the whole new set or nothing.
  /// `on_rank` sees each new rank's snapshot once its file is written.
  static void rescale_dir(const std::string& dir, const std::string& out, int world_size, int num_workers,
                          const std::function<void(const Snapshot&)>& on_rank = {});

 private:
  std::vector<Snapshot> ranks_;
};

}  // namespace dpipe
