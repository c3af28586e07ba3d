#pragma once
/// Keeps element i of the stream reaching it (its position, not its value) iff i mod N == id.
/// Levels: `all` (N = world_size × num_workers, id = rank × num_workers + worker), `rank`, `worker`;
/// or an explicit num_shards/shard_id. In: T → Out: T. State: the position.
#include <string>

#include "dpipe/kit/length.hpp"
#include "dpipe/detail/prebuilt_types.hpp"
#include "dpipe/pipeline.hpp"
#include "dpipe/kit/rescale.hpp"
#include "dpipe/kit/spec.hpp"

namespace dpipe {

enum class ShardLevel { all, rank, worker };

/// A sharding_filter's saved state: the position of the next element it sees.
struct ShardingState {
  std::uint64_t position = 0;
  template <class A>
  void fields(A& a) { a("position", position); }
};

struct ShardingOptions {
  ShardLevel level = ShardLevel::all;
  std::int64_t num_shards = 0;  // > 0 overrides the layout (with shard_id); 0: the level decides
  std::int64_t shard_id = 0;
  std::string name{};
};

inline const char* to_string(ShardLevel l) {
  switch (l) {
    case ShardLevel::rank: return "rank";
    case ShardLevel::worker: return "worker";
    default: return "all";
  }
}

/// The options' parameters as the fingerprint writes them; throws ConfigError on invalid options. Not a
/// member of the template, so that it is compiled once, not once per element type (as in every kind).
inline Params checked_params(const ShardingOptions& o) {
  const std::string who = node_label("sharding_filter", o.name);
  if (o.num_shards < 0) throw ConfigError(who + ": num_shards must be positive, got " + param_text(o.num_shards));
  if (o.shard_id < 0) throw ConfigError(who + ": shard_id must not be negative, got " + param_text(o.shard_id));
  if (o.num_shards == 0 && o.shard_id != 0)
    throw ConfigError(who + ": shard_id " + param_text(o.shard_id) + " needs num_shards (they go together)");
  if (o.num_shards > 0 && o.shard_id >= o.num_shards)
    throw ConfigError(who + ": shard_id " + param_text(o.shard_id) + " must be below num_shards " +
                      param_text(o.num_shards));
  return {{"level", to_string(o.level)}, {"num_shards", param_text(o.num_shards)}, {"shard_id", param_text(o.shard_id)}};
}

template <class T>
class ShardingFilterDef final : public NodeDef<T> {
 public:
  ShardingFilterDef(std::shared_ptr<const NodeDef<T>> in, ShardingOptions o)
      : NodeDef<T>("sharding_filter", o.name, checked_params(o), {in}), input_(std::move(in)), opts_(std::move(o)) {}

  /// (N, id) for one worker of a layout.
  std::pair<std::uint64_t, std::uint64_t> shard(const Layout& l, int worker) const {
    if (opts_.num_shards > 0) return {std::uint64_t(opts_.num_shards), std::uint64_t(opts_.shard_id)};
    switch (opts_.level) {
      case ShardLevel::rank: return {std::uint64_t(l.world_size), std::uint64_t(l.rank)};
      case ShardLevel::worker: return {std::uint64_t(l.num_workers), std::uint64_t(worker)};
      default: return {std::uint64_t(l.instances()), std::uint64_t(l.instance(worker))};
    }
  }
  std::unique_ptr<Iter<T>> instantiate(BuildContext& ctx) const override;
  const NodeDef<T>& input() const { return *input_; }

 private:
  std::shared_ptr<const NodeDef<T>> input_;
  ShardingOptions opts_;
};

template <class T>
class ShardingFilterIter final : public Hooked<T> {
 public:
  ShardingFilterIter(BuildContext& ctx, const ShardingFilterDef<T>& def)
      : Hooked<T>(ctx, "sharding_filter"), input_(def.input().instantiate(ctx)) {
    std::tie(shards_, id_) = def.shard(ctx.layout, ctx.worker);
  }

 protected:
  std::size_t pull_chunk(std::vector<T>& out, std::size_t max) override {
    if (shards_ == 1) {
      const std::size_t n = input_->pull(out, max);
      st_.position += n;
      this->pass_traces(*input_);
      return n;
    }
    // Pull about enough to yield `max` (never more than a few chunks at once), keep our positions.
    const std::size_t want = static_cast<std::size_t>(std::min<std::uint64_t>(max * shards_, 16 * kChunk));
    std::size_t kept = 0;
    while (kept == 0) {
      scratch_.clear();
      const std::size_t n = input_->pull(scratch_, want);
      if (n == 0) return 0;
      std::uint64_t phase = st_.position % shards_;
      std::size_t i = phase <= id_ ? id_ - phase : shards_ - phase + id_;
      for (; i < n; i += shards_) {
        out.push_back(std::move(scratch_[i]));
        if (this->traced()) this->traces().push_back(std::move(input_->traces()[i]));
        ++kept;
      }
      st_.position += n;
    }
    return kept;
  }
  void save_state(StateWriter& w) const override { w.write(st_); }
  void restore_state(StateReader& r) override { r.read(st_); }
  std::vector<IterBase*> inputs() const override { return {input_.get()}; }
  bool carries_provenance() const override { return true; }
  bool one_base() const override { return (*input_).one_base(); }
  bool recomputable() const override { return (*input_).recomputable(); }
  T recompute(const Provenance& p) const override { return (*input_).recompute(p); }
  bool holds_no_elements() const override { return true; }

 private:
  std::unique_ptr<Iter<T>> input_;
  std::uint64_t shards_ = 1, id_ = 0;
  ShardingState st_;
  std::vector<T> scratch_;
};

template <class T>
std::unique_ptr<Iter<T>> ShardingFilterDef<T>::instantiate(BuildContext& ctx) const {
  if (opts_.num_shards == 0 && opts_.level != ShardLevel::rank && ctx.segment != Segment::worker)
    throw ConfigError(node_label("sharding_filter", this->name()) + ": level " + to_string(opts_.level) +
                      " needs a worker, but this node runs " +
                      (ctx.segment == Segment::prefix ? "once per rank, before dispatch" : "after merge") +
                      "; use level rank or an explicit num_shards/shard_id");
  const auto [n, id] = shard(ctx.layout, ctx.worker);
  if (n == 0 || id >= n)
    throw ConfigError(node_label("sharding_filter", this->name()) + ": shard id " + std::to_string(id) +
                      " is not below the number of shards " + std::to_string(n) + " for layout " +
                      ctx.layout.to_string());
  return std::make_unique<ShardingFilterIter<T>>(ctx, *this);
}

inline auto sharding_filter(ShardingOptions o = {}) {
  return make_closure([o = std::move(o)](const auto& p) {
    using T = typename std::decay_t<decltype(p)>::element_type;
    return make_pipeline<ShardingFilterDef<T>>(p.def(), o);
  });
}

struct ShardingFilterKind {
  static constexpr std::string_view name = "sharding_filter";
  /// Element i of its input where i mod N is this instance's share (by hand: `shard_id` of `num_shards`).
  static std::optional<std::uint64_t> length(const Params& p, std::span<const std::uint64_t> in, const LengthAt& at) {
    if (in.empty()) return std::nullopt;
    const auto shards = count_param(p, "num_shards"), id = count_param(p, "shard_id");
    if (shards && *shards > 0) return id ? std::optional<std::uint64_t>(in[0] / *shards + (*id < in[0] % *shards ? 1 : 0)) : std::nullopt;
    return at.share(in[0], split(p).shards);
  }
  static constexpr std::string_view doc =
      "Keeps element i iff i mod N == id: N and id from the layout at the chosen level, or given.";
  /// Provenance (docs/design.md, "Provenance"; a kind without this line does not carry it).
  static constexpr std::string_view provenance = "passes the kept elements' on; an element out of it is the one that went in";
  static constexpr ParamSchema params[] = {
      {.name = "level", .type = ParamType::choice, .doc = "split over every instance, the ranks, or a rank's workers", .fallback = "\"all\"", .choices = "all|rank|worker", .positional = true},
      {.name = "num_shards", .type = ParamType::integer, .doc = "split by hand into this many shards (0: the level decides)", .fallback = "0"},
      {.name = "shard_id", .type = ParamType::integer, .doc = "with num_shards: the shard kept", .fallback = "0"},
  };
  using State = ShardingState;
  /// It keeps one share per instance of its level; with explicit shards the user splits by hand.
  static Split split(const Params& params) {
    const std::string_view shards = param_of(params, "num_shards");
    if (!shards.empty() && shards != "0") return {.by_hand = true};
    const std::string_view level = param_of(params, "level");
    return {.shards = level == "rank" ? Split::kRank : level == "worker" ? Split::kWorker : Split::kSegment};
  }
  /// Rescale: refused; every instance reads the whole stream before the filter, so the filters' positions
  /// are not parts of one whole.
  static RescaleRule rescale() {
    return RescaleRule::refused("it keeps positions in a stream that every instance reads in full, so its "
                                "instances' states are not parts of one whole; read the data through sampler() "
                                "instead");
  }
  /// `{"op": "sharding_filter", "level": "all" | "rank" | "worker", "num_shards": N, "shard_id": I}`
  template <class Spec>
  static SpecPipeline from_spec(Spec& s) {
    ShardingOptions o{.name = s.name()};
    s.choice("level", o.level, {{"all", ShardLevel::all}, {"rank", ShardLevel::rank}, {"worker", ShardLevel::worker}});
    s.param("num_shards", o.num_shards);
    s.param("shard_id", o.shard_id);
    return s.input().apply([&](const auto& p) { return p | sharding_filter(o); });
  }
};

// Compiled once, in libdpipe, for the prebuilt element types (dpipe/detail/prebuilt_types.hpp).
DPIPE_DECLARE_PREBUILT_NODE(ShardingFilterDef, ShardingFilterIter)

}  // namespace dpipe
