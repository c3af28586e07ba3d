#pragma once
/// The state shared by the instance-aware sources (`sampler` over element positions, `lines` over
/// shard work items): positions [0, total) of one global sequence dealt to the instances. An instance
/// takes base + offset + k·stride for k = next, next + 1, …, passing over positions in `skip` (taken by
/// other instances before a rescale). Initially base 0, stride = instances, offset = instance; a rescale
/// re-slices from the slowest instance's position (redeal_positions, the rule of the nodes that use it).
#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dpipe/kit/node.hpp"
#include "dpipe/kit/rescale.hpp"
#include "dpipe/kit/state.hpp"

namespace dpipe::detail {

/// Throws a ConfigError naming `who` unless `per_epoch` × `epochs` positions stay under 2^62, far from
/// overflowing the deal's arithmetic. `unit` and `positions` name the two counts in the message.
inline void check_position_count(std::uint64_t per_epoch, std::uint64_t epochs, const std::string& who,
                                 const std::string& unit, const std::string& positions) {
  if (per_epoch > 0 && epochs > (std::uint64_t{1} << 62) / per_epoch)
    throw ConfigError(who + ": " + std::to_string(per_epoch) + " " + unit + " × " + std::to_string(epochs) +
                      " epochs is more than 2^62 " + positions);
}

/// The saved part of a PositionDeal.
struct DealState {
  std::uint64_t base = 0, stride = 1, offset = 0, next = 0;
  std::vector<std::uint64_t> skip{};  // sorted
  template <class A>
  void fields(A& a) {
    a("base", base);
    a("stride", stride);
    a("offset", offset);
    a("next", next);
    a("skip", skip);
  }
  /// Its invariants for a sequence of `total` positions (at most 2^62, see check_position_count): every
  /// position it can name lies in [0, total] + one stride, so no arithmetic on it wraps; the skipped ones
  /// are in order, at or after base and inside the sequence. `what` names the positions in messages.
  void check(const StateReader& r, const std::string& what, std::uint64_t total) const {
    if (stride < 1 || stride > (std::uint64_t{1} << 31)) r.fail("stride " + std::to_string(stride) + " is not an instance count");
    if (offset >= stride) r.fail("offset " + std::to_string(offset) + " is not below the stride " + std::to_string(stride));
    if (base > total) r.fail("base " + std::to_string(base) + " is past the " + std::to_string(total) + " " + what);
    if (next > (total - base) / stride + 1)
      r.fail("next " + std::to_string(next) + " is past the " + std::to_string(total) + " " + what);
    if (!std::is_sorted(skip.begin(), skip.end())) r.fail("the skipped " + what + " are not in order");
    if (!skip.empty() && (skip.front() < base || skip.back() >= total))
      r.fail("a skipped position lies outside [base " + std::to_string(base) + ", " + std::to_string(total) + ")");
  }
};

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

  DealState state() const {
    return {base_, stride_, offset_, next_, {skip_.begin() + std::ptrdiff_t(skip_at_), skip_.end()}};
  }
  void save(StateWriter& w) const { w.write(state()); }
  /// `what` names the dealt things in error messages ("positions", "shards"); `total` is how many there are.
  void restore(StateReader& r, const std::string& what, std::uint64_t total) {
    DealState st;
    r.read(st);
    restore(r, what, total, std::move(st));
  }
  void restore(StateReader& r, const std::string& what, std::uint64_t total, DealState st) {
    st.check(r, what, total);
    const std::uint64_t stride = stride_;
    base_ = st.base;
    stride_ = st.stride;
    offset_ = st.offset;
    next_ = st.next;
    skip_ = std::move(st.skip);
    skip_at_ = 0;
    if (stride_ != stride)
      r.fail("the " + what + " are dealt to " + std::to_string(stride_) + " instances, this layout has " +
             std::to_string(stride));
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

/// Every old instance's DealState by field, for redeal_positions: four numbers per instance, and the
/// skipped positions of the instances that have some.
struct OldDeals {
  rescale::Numbers base, stride, offset, next;
  std::vector<std::pair<std::size_t, std::vector<std::uint64_t>>> skips;  // (slot, its skip), by slot

  std::size_t size() const { return base.size(); }
  /// The deals of records in memory, in slot order.
  static OldDeals of(std::vector<DealState> states) {
    OldDeals out;
    std::vector<std::uint64_t> base, stride, offset, next;
    for (std::size_t i = 0; i < states.size(); ++i) {
      DealState& s = states[i];
      if (!s.skip.empty()) out.skips.emplace_back(i, std::move(s.skip));
      base.push_back(s.base);
      stride.push_back(s.stride);
      offset.push_back(s.offset);
      next.push_back(s.next);
    }
    out.base = rescale::Numbers(std::move(base));
    out.stride = rescale::Numbers(std::move(stride));
    out.offset = rescale::Numbers(std::move(offset));
    out.next = rescale::Numbers(std::move(next));
    return out;
  }
};

/// The old instances' deals: from the columns of a set index, a record is read whole only where it has
/// skipped positions.
inline OldDeals read_deals(const RescaleInput& in) {
  if (!in.columns) return OldDeals::of(in.read<DealState>());
  in.check_fields<DealState>();
  OldDeals out;
  out.base = in.numbers(&DealState::base);
  out.stride = in.numbers(&DealState::stride);
  out.offset = in.numbers(&DealState::offset);
  out.next = in.numbers_on_demand(&DealState::next);  // a walk reads the few its slots ask for
  const auto skipped = in.list_sizes("skip");
  if (!skipped.all_equal(0))
    for (std::size_t i = 0; i < skipped.size(); ++i)
      if (skipped[i]) out.skips.emplace_back(i, in.read_one<DealState>(i).skip);
  return out;
}

/// The rescale rule of the nodes that deal positions of one global sequence (sampler, the line sources):
/// re-slice from the slowest old instance's position. Every position below the frontier
/// (base + slowest next × old stride) was taken by someone; above it, the ones faster instances took
/// become each new instance's `skip` list. Returns the states of the wanted new slots (RescaleInput::
/// wanted_slots), in slot order. The inputs are checked before any arithmetic: positions below 2^62, and
/// at most kMaxRedealt positions taken above the frontier listed, or kMaxWalked asked about per slot by
/// a walk, so a crafted record cannot make it wrap, allocate or loop without bound.
///
/// Its cost follows what the wanted slots are dealt, not the old instance count: with no skipped
/// positions in the old deals (every set but one rescaled just before), a wanted slot walks its own
/// positions between the frontier and the fastest old instance's position and asks each one's old owner
/// (an index into the `next` column) whether it took it; a column of one value, or of offsets that step
/// by one, is checked by its form. Only when listing every position taken above the frontier is
/// cheaper (a few old instances far ahead), or when old deals skip positions, are they listed and sorted.
inline constexpr std::uint64_t kMaxRedealt = std::uint64_t{1} << 24, kMaxWalked = std::uint64_t{1} << 16;
inline std::vector<DealState> redeal_positions(const RescaleInput& in, OldDeals old) {
  const std::size_t n_old = old.size();
  if (n_old == 0) in.refuse("it has no old instances");
  constexpr std::uint64_t kLimit = std::uint64_t{1} << 62;
  static const std::vector<std::uint64_t> none;
  // Instance i's skipped positions, for i visited in order (`at` walks old.skips along).
  const auto skip_of = [&](std::size_t i, std::size_t& at) -> const std::vector<std::uint64_t>& {
    while (at < old.skips.size() && old.skips[at].first < i) ++at;
    return at < old.skips.size() && old.skips[at].first == i ? old.skips[at].second : none;
  };
  const std::uint64_t base = old.base[0];
  const std::uint64_t min_next = old.next.min(), max_next = old.next.max();
  // owner[offset] = the slot dealing that offset, when slot i does not deal offset i.
  const bool in_order = old.base.steps(base, 0) && old.stride.steps(n_old, 0) && old.offset.steps(0, 1);
  std::vector<std::size_t> owner;
  if (!in_order) {
    owner.assign(n_old, n_old);
    for (std::size_t i = 0; i < n_old; ++i) {
      const std::uint64_t offset = old.offset[i];
      if (old.base[i] != base || old.stride[i] != n_old || offset >= n_old || owner[offset] != n_old)
        in.refuse("its instances do not deal one position sequence between them");
      owner[offset] = i;
    }
  }
  if (base > kLimit || max_next > (kLimit - base) / n_old) {
    std::size_t i = 0;
    while (i + 1 < n_old && old.next[i] != max_next) ++i;
    in.refuse("instance " + std::to_string(old.offset[i]) + "'s positions (base " + std::to_string(base) + ", next " +
              std::to_string(old.next[i]) + ") are outside any sequence dpipe deals");
  }
  for (const auto& [slot, skip] : old.skips)
    if (!std::is_sorted(skip.begin(), skip.end()) || (!skip.empty() && (skip.front() < base || skip.back() > kLimit)))
      in.refuse("instance " + std::to_string(old.offset[slot]) + "'s positions (base " + std::to_string(base) +
                ", next " + std::to_string(old.next[slot]) + ") are outside any sequence dpipe deals");
  const std::uint64_t frontier = base + min_next * n_old;
  const std::size_t n_new = in.new_slots();
  const auto [first, end] = in.wanted_slots();
  std::vector<DealState> out(end - first);
  for (std::size_t j = first; j < end; ++j) out[j - first] = {frontier, n_new, j, 0, {}};
  if (max_next == min_next && old.skips.empty()) return out;  // nothing taken above the frontier
  // Positions below `top` are all a slot may find taken (old skips aside); each wanted slot has
  // (top − frontier) / n_new of them. A walk of no more asks than old instances is the cheaper way, with
  // no pass over the old instances; else `ahead` (one pass) decides.
  const std::uint64_t top = base + max_next * n_old;
  const std::uint64_t walked = (top - frontier) / n_new + 1;
  const std::size_t wanted = std::max<std::size_t>(end - first, 1);
  // The walk's asks (walked × wanted), saturated: at most n_old needs no pass over the old instances.
  std::uint64_t asks = 0;
  if (__builtin_mul_overflow(walked, std::uint64_t(wanted), &asks)) asks = ~std::uint64_t{0};
  bool walk = old.skips.empty() && asks <= n_old;
  std::uint64_t ahead = 0;  // positions taken above the frontier, bounded before they are listed
  if (!walk) {
    old.next = old.next.held();  // every instance's, read once
    for (const auto& [i, skip] : old.skips)
      if (ahead <= kMaxRedealt) ahead += skip.size();
    if (max_next != min_next)
      for (std::size_t i = 0; i < n_old && ahead <= kMaxRedealt; ++i) ahead += std::min(old.next[i] - min_next, kMaxRedealt + 1);
    // The cheaper way; a walk also where listing would take more than kMaxRedealt and each slot walks at
    // most kMaxWalked positions (a bound per slot, so a rescale of one rank and of many ranks at once
    // refuse the same sets).
    walk = old.skips.empty() && (asks <= ahead + n_old || (ahead > kMaxRedealt && walked <= kMaxWalked));
    if (!walk && ahead > kMaxRedealt)
      in.refuse("its instances are " + std::to_string(ahead) + " positions apart, more than the " +
                std::to_string(kMaxRedealt) + " a rescale lists");
  }
  if (walk) {
    for (std::size_t j = first; j < end; ++j)
      for (std::uint64_t q = frontier + j; q < top; q += n_new) {
        const std::uint64_t offset = (q - base) % n_old, k = (q - base) / n_old;
        if (k < old.next[in_order ? offset : owner[offset]]) out[j - first].skip.push_back(q);
      }
    return out;
  }
  std::vector<std::uint64_t> taken;
  taken.reserve(ahead);
  for (std::size_t i = 0, at = 0; i < n_old; ++i) {
    const auto& skip = skip_of(i, at);
    for (std::uint64_t k = min_next; k < old.next[i]; ++k) {
      const std::uint64_t q = base + old.offset[i] + k * n_old;
      if (!std::binary_search(skip.begin(), skip.end(), q)) taken.push_back(q);
    }
    for (auto q : skip)
      if (q >= frontier) taken.push_back(q);
  }
  std::sort(taken.begin(), taken.end());
  taken.erase(std::unique(taken.begin(), taken.end()), taken.end());
  for (auto q : taken)
    if (const std::size_t j = (q - frontier) % n_new; j >= first && j < end) out[j - first].skip.push_back(q);
  return out;
}

}  // namespace dpipe::detail
