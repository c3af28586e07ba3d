#pragma once
/// A snapshot set: one directory, one snapshot file per rank (`rank-<r>-of-<W>.dpipe`, each written
/// atomically by its own rank, with no collective). A set is usable only when every rank's file is
/// there and they agree on graph, seed, epoch and layout.
///
/// Rescaling (DESIGN §6) turns a set taken on {W ranks, K workers} into one for {W', K'}: samplers are
/// re-sliced (the new instances continue from the slowest old instance's position and skip what faster
/// ones took), and elements in shuffle buffers, partial batches, worker queues and consumers' buffers
/// are dealt to the new instances — not dropped, not re-read. Any other node with state makes the
/// rescale fail with a SnapshotError naming it. It works on the records alone, without the element
/// types, so the `dpipe` tool can rescale a set written by any program.
#include <string>
#include <vector>

#include "dpipe/snapshot.hpp"

namespace dpipe {

class SnapshotSet {
 public:
  /// Checks that `ranks` is a complete, consistent set (rank r at index r); throws SnapshotError.
  explicit SnapshotSet(std::vector<Snapshot> ranks);

  /// Writes one rank's snapshot into `dir` (created if needed), atomically.
  static void write_rank(const std::string& dir, const Snapshot& s);
  /// Reads every rank's file of `dir`; refuses a missing, extra or inconsistent rank, naming it.
  static SnapshotSet read_dir(const std::string& dir);
  /// The file name of rank r of W in a set directory.
  static std::string file_name(int rank, int world_size);

  int world_size() const { return static_cast<int>(ranks_.size()); }
  int num_workers() const { return ranks_.front().meta.layout.num_workers; }
  const Snapshot& rank(int r) const;
  const std::vector<Snapshot>& ranks() const { return ranks_; }

  /// The set redistributed over {world_size, num_workers} (see above).
  SnapshotSet rescaled(int world_size, int num_workers) const;
  /// Writes every rank's file into `dir`.
  void write_dir(const std::string& dir) const;

 private:
  std::vector<Snapshot> ranks_;
};

}  // namespace dpipe
