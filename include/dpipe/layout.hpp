#pragma once
/// Where a Run sits in a distributed job.
#include <string>

namespace dpipe {

/// The most workers a rank runs; world_size × num_workers must also fit an int.
inline constexpr int kMaxWorkers = 4096;

struct Layout {
  int rank = 0;
  int world_size = 1;
  int num_workers = 1;

  /// Number of physical readers: world_size × num_workers.
  int instances() const { return world_size * num_workers; }
  /// Global instance id of `worker` on this rank (worker is the fast digit).
  int instance(int worker) const { return rank * num_workers + worker; }
  std::string to_string() const {
    return "{rank " + std::to_string(rank) + ", world_size " + std::to_string(world_size) + ", num_workers " +
           std::to_string(num_workers) + "}";
  }
  /// Whether the numbers can be a layout: 0 <= rank < world_size, 1 to kMaxWorkers workers, and
  /// world_size × num_workers instances countable in an int.
  bool possible() const {
    return world_size >= 1 && rank >= 0 && rank < world_size && num_workers >= 1 && num_workers <= kMaxWorkers &&
           world_size <= 0x7fffffff / num_workers;
  }
  friend bool operator==(const Layout&, const Layout&) = default;
};

/// Checks ranges; throws ConfigError naming the bad value.
void validate_layout(const Layout& layout);

/// The layout from the environment: RANK/WORLD_SIZE (torchrun), else OMPI_COMM_WORLD_RANK/SIZE
/// (Open MPI), else rank 0 of 1; num_workers is 1 unless given.
Layout layout_from_environment(int num_workers = 1);

}  // namespace dpipe
