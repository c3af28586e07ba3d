#pragma once
/// The state shared by the instance-aware sources (`sampler` over element positions, `lines` over
/// shard work items): positions [0, total) of one global sequence dealt to the instances. An instance
/// takes base + offset + k·stride for k = next, next + 1, …, passing over positions in `skip` (taken by
/// other instances before a rescale). Initially base 0, stride = instances, offset = instance; a rescale
/// (serialize/snapshot_set.cpp) re-slices from the slowest instance's position.
#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dpipe/node.hpp"
#include "dpipe/state.hpp"

namespace dpipe::detail {

/// Throws a ConfigError naming `who` unless `per_epoch` × `epochs` positions stay under 2^62, far from
/// overflowing the deal's arithmetic. `unit` and `positions` name the two counts in the message.
inline void check_position_count(std::uint64_t per_epoch, std::uint64_t epochs, const std::string& who,
                                 const std::string& unit, const std::string& positions) {
  if (per_epoch > 0 && epochs > (std::uint64_t{1} << 62) / per_epoch)
    throw ConfigError(who + ": " + std::to_string(per_epoch) + " " + unit + " × " + std::to_string(epochs) +
                      " epochs is more than 2^62 " + positions);
}

class PositionDeal {
 public:
  PositionDeal(std::uint64_t instances, std::uint64_t instance) : stride_(instances), offset_(instance) {}
  /// The deal of a node built in `ctx`: over every worker of every rank in the worker segment, over the
  /// ranks in the prefix (once per rank, before dispatch). After merge is a ConfigError naming `who`.
  static PositionDeal in(const BuildContext& ctx, const std::string& who) {
    if (ctx.segment == Segment::worker)
      return {static_cast<std::uint64_t>(ctx.layout.instances()), static_cast<std::uint64_t>(ctx.instance())};
    if (ctx.segment == Segment::prefix)
      return {static_cast<std::uint64_t>(ctx.layout.world_size), static_cast<std::uint64_t>(ctx.layout.rank)};
    throw ConfigError(who + " deals its input to ranks (before dispatch) or to workers, so it cannot stand after "
                            "merge, where every rank would read all of it");
  }

  /// The next position of this instance below `total`, or nullopt when it has none left.
  std::optional<std::uint64_t> next(std::uint64_t total) {
    const auto q = find(total, next_, skip_at_);
    if (q) ++next_;
    return q;
  }

  /// What next(total) would return, without taking it.
  std::optional<std::uint64_t> peek(std::uint64_t total) const {
    std::uint64_t k = next_;
    std::size_t skip_at = skip_at_;
    return find(total, k, skip_at);
  }

  void save(StateWriter& w) const {
    w("base", base_);
    w("stride", stride_);
    w("offset", offset_);
    w("next", next_);
    w("skip", std::vector<std::uint64_t>(skip_.begin() + std::ptrdiff_t(skip_at_), skip_.end()));
  }
  /// `what` names the dealt things in error messages ("positions", "shards").
  void restore(StateReader& r, const std::string& what) {
    const std::uint64_t stride = stride_;
    r("base", base_);
    r("stride", stride_);
    r("offset", offset_);
    r("next", next_);
    r("skip", skip_);
    skip_at_ = 0;
    if (stride_ != stride)
      r.fail("the " + what + " are dealt to " + std::to_string(stride_) + " instances, this layout has " +
             std::to_string(stride));
    if (offset_ >= stride_) r.fail("offset " + std::to_string(offset_) + " is not below the stride");
    if (!std::is_sorted(skip_.begin(), skip_.end())) r.fail("the skipped " + what + " are not in order");
  }

 private:
  /// The first position from the k-th of this instance on that no other instance took (k and skip_at
  /// move past the ones passed over; k then indexes the position found), or nullopt at `total`.
  std::optional<std::uint64_t> find(std::uint64_t total, std::uint64_t& k, std::size_t& skip_at) const {
    for (;; ++k) {
      const std::uint64_t q = base_ + offset_ + k * stride_;
      if (q >= total) return std::nullopt;
      while (skip_at < skip_.size() && skip_[skip_at] < q) ++skip_at;
      if (skip_at < skip_.size() && skip_[skip_at] == q) continue;  // another instance took it
      return q;
    }
  }

  std::uint64_t base_ = 0, stride_ = 1, offset_ = 0, next_ = 0;
  std::vector<std::uint64_t> skip_;  // sorted
  std::size_t skip_at_ = 0;
};

}  // namespace dpipe::detail
