#pragma once
/// Starts the worker segment: its input (the main prefix) runs once per rank, and its elements are
/// handed to the workers — `dispatch(round_robin)` gives element i to worker i mod num_workers;
/// `dispatch(broadcast)` gives every element to every worker as one shared, immutable object
/// (`std::shared_ptr<const T>`), never copied, so each worker can take its own part of a large shard;
/// `dispatch(broadcast_copies)` gives every worker its own copy of every element instead (small elements:
/// no shared object, no reference counts; the copies are made as the element is dealt).
/// In: T → Out: T (round_robin, broadcast_copies) or std::shared_ptr<const T> (broadcast).
/// State: the prefix's states, whose turn it is, and each worker's elements not yet taken.
#include <algorithm>
#include <exception>
#include <mutex>
#include <string>

#include "dpipe/detail/fifo.hpp"
#include "dpipe/detail/prebuilt_types.hpp"
#include "dpipe/detail/run_shared.hpp"
#include "dpipe/nodes/map.hpp"
#include "dpipe/pipeline.hpp"
#include "dpipe/kit/rescale.hpp"
#include "dpipe/kit/spec.hpp"

namespace dpipe {

/// A dispatch's saved state. Worker 0's iterator on each rank owns the dispatcher and records whose turn
/// it is, whether the prefix ended, and per worker the elements dealt and not yet taken; the other
/// workers record only that they do not own it. `Elems` is std::vector<Out> in the node, ElementBlobs in
/// its rescale rule; `backlogs` is sized to the number of workers before a record is read.
template <class Elems>
struct DispatchState {
  bool owner = false;
  std::uint64_t next_worker = 0;
  bool prefix_done = false;
  std::vector<Elems> backlogs{};
  template <class A>
  void fields(A& a) {
    a("owner", owner);
    if (!owner) return;
    a("next_worker", next_worker);
    a("prefix_done", prefix_done);
    for (std::size_t i = 0; i < backlogs.size(); ++i) a("backlog_" + std::to_string(i), backlogs[i]);
  }
};

struct DispatchOptions {
  std::string name{};
};

inline constexpr struct RoundRobin {
} round_robin{};
inline constexpr struct Broadcast {
} broadcast{};
inline constexpr struct BroadcastCopies {
} broadcast_copies{};

namespace detail {

/// The prefix of one Run and the per-worker backlogs it fills, shared by the workers' DispatchIters.
/// Workers take under a lock; the one that finds its backlog empty pulls the next prefix chunk.
template <class T, class Out>
class Dispatcher {
 public:
  static constexpr bool kShared = !std::is_same_v<T, Out>;

  /// `copies`: every element to every worker as its own copy (broadcast_copies; Out is T).
  Dispatcher(std::unique_ptr<Iter<T>> prefix, int workers, std::size_t end_key, bool copies = false)
      : end_key(end_key), prefix_(std::move(prefix)), backlog_(static_cast<std::size_t>(workers)),
        broadcast_(kShared || copies) {}

  const std::size_t end_key;  // key cursor after the prefix: where the other workers' builds go on

  std::size_t take(int worker, std::vector<Out>& out, std::size_t max) {
    std::lock_guard lock(mu_);
    auto& q = backlog_[static_cast<std::size_t>(worker)];
    while (q.empty() && !prefix_done_) {
      if (settle_failure_) std::rethrow_exception(settle_failure_);  // where the refill would have failed
      refill();
    }
    return q.take_into(out, max);
  }

  Iter<T>& prefix() { return *prefix_; }

  std::size_t workers() const { return backlog_.size(); }

  /// Paused, after every worker's queue has settled: deals the prefix one element at a time until every
  /// backlog holds more than one refill can give a worker (or the prefix ends). A refill happens only when
  /// some backlog is empty and adds at most that much to each, so timing never leaves every backlog that
  /// full: the settled point is the first one past anything timing reaches, the same on every run.
  /// A failure of the prefix here is raised where the refill would have raised it (the next refill), and
  /// the snapshot being taken is refused.
  void settle() {
    std::lock_guard lock(mu_);
    const std::size_t per_refill = broadcast_ ? 1 : (refill_size() + backlog_.size() - 1) / backlog_.size();
    auto short_of = [&] {
      return std::any_of(backlog_.begin(), backlog_.end(), [&](const auto& q) { return q.size() <= per_refill; });
    };
    while (!prefix_done_ && !settle_failure_ && short_of()) {
      scratch_.clear();
      try {
        if (prefix_->pull(scratch_, 1) == 0) {
          prefix_done_ = true;
          break;
        }
      } catch (...) {
        settle_failure_ = std::current_exception();
        throw;
      }
      deal(scratch_);
    }
  }

  void save(DispatchState<std::vector<Out>>& st) const {
    if (settle_failure_)
      throw SnapshotError("cannot snapshot: the prefix before dispatch failed while the snapshot settled it (" +
                          FailureRecord::of(settle_failure_).cause + "); the run raises it once the workers reach it");
    st.next_worker = next_;
    st.prefix_done = prefix_done_;
    for (std::size_t i = 0; i < backlog_.size(); ++i) st.backlogs[i].assign(backlog_[i].begin(), backlog_[i].end());
  }
  void restore(StateReader& r, DispatchState<std::vector<Out>>& st) {
    next_ = st.next_worker;
    prefix_done_ = st.prefix_done;
    if (next_ >= backlog_.size()) r.fail("next worker " + std::to_string(next_) + " is not a worker");
    for (std::size_t i = 0; i < backlog_.size(); ++i)
      backlog_[i].assign(std::move(st.backlogs[i]));
  }

 private:
  // Broadcast elements are large units (a whole shard): one at a time. Round-robin: a chunk, or one
  // element per worker when the elements are bulky (batches, text blocks).
  std::size_t refill_size() const {
    return broadcast_ ? 1 : is_bulk_element_v<T> ? backlog_.size() : std::max<std::size_t>(backlog_.size(), dpipe::kChunk);
  }
  void refill() {
    scratch_.clear();
    if (prefix_->pull(scratch_, refill_size()) == 0) {
      prefix_done_ = true;
      return;
    }
    deal(scratch_);
  }
  void deal(std::vector<T>& elements) {
    for (auto& x : elements) {
      if constexpr (kShared) {
        auto shared = std::make_shared<const T>(std::move(x));
        for (auto& q : backlog_) q.push_back(shared);
      } else if (broadcast_) {
        for (std::size_t i = 0; i + 1 < backlog_.size(); ++i) backlog_[i].push_back(x);
        backlog_.back().push_back(std::move(x));
      } else {
        backlog_[next_].push_back(std::move(x));
        next_ = next_ + 1 == backlog_.size() ? 0 : next_ + 1;
      }
    }
  }

  std::mutex mu_;
  std::unique_ptr<Iter<T>> prefix_;
  std::vector<Fifo<Out>> backlog_;
  const bool broadcast_;
  std::uint64_t next_ = 0;
  bool prefix_done_ = false;
  std::exception_ptr settle_failure_;
  std::vector<T> scratch_;
};

}  // namespace detail

template <class T, class Out>
class DispatchDef;

/// One worker's end of a dispatcher. Worker 0's iterator owns the snapshot record of the dispatcher
/// and the prefix below it; the others record nothing.
template <class T, class Out>
class DispatchIter final : public Hooked<Out> {
 public:
  DispatchIter(BuildContext& ctx, const DispatchDef<T, Out>& def) : Hooked<Out>(ctx, "dispatch") {
    if (ctx.segment != Segment::worker || !ctx.shared)
      throw ConfigError(node_label("dispatch", def.name()) +
                        ": dispatch starts the worker segment, so it cannot stand after merge or in another "
                        "dispatch's prefix");
    auto& slot = ctx.shared->objects[this->key()];
    if (!slot) {
      BuildContext c = ctx;
      c.segment = Segment::prefix;
      c.worker = 0;
      auto prefix = def.input().instantiate(c);
      slot = std::make_shared<detail::Dispatcher<T, Out>>(std::move(prefix), ctx.layout.num_workers, c.cursor,
                                                          def.copies());
      owner_ = true;
    }
    dispatcher_ = std::static_pointer_cast<detail::Dispatcher<T, Out>>(slot);
    ctx.cursor = dispatcher_->end_key;
  }

 protected:
  std::size_t pull_chunk(std::vector<Out>& out, std::size_t max) override {
    return dispatcher_->take(this->worker(), out, max);
  }
  void save_state(StateWriter& w) const override {
    DispatchState<std::vector<Out>> st{.owner = owner_};
    if (owner_) {
      st.backlogs.resize(dispatcher_->workers());
      dispatcher_->save(st);
    }
    w.write(st);
  }
  void restore_state(StateReader& r) override {
    DispatchState<std::vector<Out>> st;
    st.backlogs.resize(dispatcher_->workers());
    r.read(st);
    if (st.owner != owner_) r.fail("the dispatcher's record is on another worker");
    if (owner_) dispatcher_->restore(r, st);
  }
  /// The owner settles the dispatcher (its workers' queues have settled by now), then the prefix.
  void settle() override {
    if (!owner_) return;
    dispatcher_->settle();
    dispatcher_->prefix().settle();
  }
  std::vector<IterBase*> inputs() const override {
    if (owner_) return {&dispatcher_->prefix()};
    return {};
  }
  bool shared_between_workers() const override { return dispatcher_->workers() > 1; }

 private:
  std::shared_ptr<detail::Dispatcher<T, Out>> dispatcher_;
  bool owner_ = false;
};

template <class T, class Out>
class DispatchDef final : public NodeDef<Out> {
 public:
  /// `copies`: broadcast_copies (Out is T). Both broadcasts are mode "broadcast" in the graph.
  DispatchDef(std::shared_ptr<const NodeDef<T>> in, DispatchOptions o, bool copies = false)
      : NodeDef<Out>("dispatch", o.name,
                     {{"mode", std::is_same_v<T, Out> && !copies ? "round_robin" : "broadcast"}}, {in}),
        input_(std::move(in)), copies_(copies) {}
  std::unique_ptr<Iter<Out>> instantiate(BuildContext& ctx) const override {
    return std::make_unique<DispatchIter<T, Out>>(ctx, *this);
  }
  const NodeDef<T>& input() const { return *input_; }
  bool copies() const { return copies_; }

 private:
  std::shared_ptr<const NodeDef<T>> input_;
  bool copies_;
};

inline auto dispatch(RoundRobin, DispatchOptions o = {}) {
  return make_closure([o = std::move(o)](const auto& p) {
    using T = typename std::decay_t<decltype(p)>::element_type;
    static_assert(Snapshottable<T>, "dispatch keeps elements in its state: the element type must be Snapshottable");
    return make_pipeline<DispatchDef<T, T>>(p.def(), o);
  });
}
inline auto dispatch(Broadcast, DispatchOptions o = {}) {
  return make_closure([o = std::move(o)](const auto& p) {
    using T = typename std::decay_t<decltype(p)>::element_type;
    static_assert(Snapshottable<T>, "dispatch keeps elements in its state: the element type must be Snapshottable");
    return make_pipeline<DispatchDef<T, std::shared_ptr<const T>>>(p.def(), o);
  });
}
inline auto dispatch(BroadcastCopies, DispatchOptions o = {}) {
  return make_closure([o = std::move(o)](const auto& p) {
    using T = typename std::decay_t<decltype(p)>::element_type;
    static_assert(Snapshottable<T>, "dispatch keeps elements in its state: the element type must be Snapshottable");
    return make_pipeline<DispatchDef<T, T>>(p.def(), o, true);
  });
}
inline auto dispatch(DispatchOptions o = {}) { return dispatch(round_robin, std::move(o)); }

struct DispatchKind {
  static constexpr std::string_view name = "dispatch";
  static constexpr std::string_view doc =
      "Starts the worker segment: its input runs once per rank and its elements go to the workers, one each in turn (round_robin) or every one to every worker (broadcast; it does not rescale).";
  static constexpr ParamSchema params[] = {
      {.name = "mode", .type = ParamType::choice, .doc = "how elements reach the workers", .fallback = "\"round_robin\"", .choices = "round_robin|broadcast", .positional = true},
  };
  using State = DispatchState<ElementBlobs>;
  /// Its fields as worker 0 (the owner) writes them, for one worker: `backlog_N` per worker.
  static State state_prototype() { return {.owner = true, .next_worker = 0, .prefix_done = false, .backlogs = {ElementBlobs{}}}; }
  static constexpr SegmentRole segment = SegmentRole::starts_workers;
  /// Invariant: the next worker is one of the workers (the owner's record holds their backlogs).
  static void check_state(const NodeState& record, const GraphNodeRecord&) {
    check_worker_position(record, "next_worker", "backlog_");
  }
  /// Round robin deals the stream to the workers; broadcast hands every worker every element on purpose.
  static Split split(const Params& params) {
    if (param_of(params, "mode") == "round_robin") return {.deals = Split::kWorker, .covers = Split::kWorker};
    return {.covers = Split::kWorker};
  }

  /// Rescale (round_robin): the backlogs of every rank are pooled in rank and worker order and dealt to the
  /// new workers; each new rank's prefix, re-sliced over the new ranks, goes on filling them. Broadcast is
  /// refused: which part of a shared element each worker has taken is not recorded.
  static RescaleRule rescale() {
    return RescaleRule::dealt([](const RescaleInput& in) {
      if (in.node && param_of(*in.node, "mode") == "broadcast")
        in.refuse("it broadcasts every element to all workers of a rank, and which part of it each worker has "
                  "taken is not recorded, so it cannot be dealt to another number of workers");
      using S = DispatchState<ElementBlobs>;
      S prototype;
      prototype.owner = true;  // names every field (a record is read as its own owner field says)
      prototype.backlogs.resize(static_cast<std::size_t>(in.from.num_workers));
      in.check_fields(prototype, /*every_row=*/false);
      const auto owner = in.numbers(&S::owner);
      const auto owned = in.present(&S::owner);
      std::vector<std::string> backlogs;
      for (std::size_t w = 0; w < static_cast<std::size_t>(in.from.num_workers); ++w)
        backlogs.push_back("backlog_" + std::to_string(w));
      for (std::size_t i = 0; i < owner.size(); ++i)
        if ((owner[i] != 0) != (i % static_cast<std::size_t>(in.from.num_workers) == 0) || !owned[i])
          in.refuse("the dispatcher's record is not on worker 0 of instance " + std::to_string(i));
      // An owner's record has every field, any other only `owner` (as each is read when in memory).
      rescale::FieldNames names;
      prototype.fields(names);
      for (std::size_t k = 1; k < names.names.size(); ++k) {
        const auto has = in.present(names.names[k]);
        for (std::size_t i = 0; i < has.size(); ++i)
          if (has[i] != (owner[i] != 0)) in.refuse("instance " + std::to_string(i) + "'s record has the wrong fields");
      }
      const auto dealt = in.deal_fields(backlogs, 1, [&](std::size_t i) { return owner[i] != 0; });
      const auto workers = static_cast<std::size_t>(in.to.num_workers);
      return in.write_slots([&](std::size_t j) {
        S s;
        s.owner = j % workers == 0;
        if (s.owner)  // the dispatcher asks its prefix again (prefix_done false)
          for (std::size_t w = 0; w < workers; ++w) s.backlogs.push_back(dealt[j + w]);
        return s;
      });
    });
  }

  /// `{"op": "dispatch", "mode": "round_robin" | "broadcast"}`. Spec elements are small values, so a
  /// broadcast gives each worker its own copy (broadcast_copies): no shared element type per spec type.
  /// It is followed by the map "unshare", which once copied a shared element and now passes the copy on:
  /// it keeps the graph, and so the fingerprint of snapshots written before, unchanged (the dispatch's
  /// record is the same bytes, since a shared element is encoded as the element itself).
  template <class Spec>
  static SpecPipeline from_spec(Spec& s) {
    DispatchOptions o{.name = s.name()};
    bool broadcast_mode = false;
    s.choice("mode", broadcast_mode, {{"round_robin", false}, {"broadcast", true}});
    if (!broadcast_mode) return s.input().apply([&](const auto& p) { return p | dispatch(round_robin, o); });
    return s.input().apply([&](const auto& p) { return p | dispatch(broadcast_copies, o) | map(Unshare{}); });
  }
  struct Unshare {
    template <class T>
    T operator()(T&& x) const {
      return std::move(x);
    }
    Params describe() const { return {{"fn", "unshare"}}; }
  };
};

// A dispatch of each prebuilt element type to itself is compiled once, in libdpipe
// (dpipe/detail/prebuilt_types.hpp).
#define DPIPE_DECLARE_PREBUILT_DISPATCH(T) extern template class DispatchIter<T, T>;
DPIPE_FOR_EACH_PREBUILT_TYPE(DPIPE_DECLARE_PREBUILT_DISPATCH)
#undef DPIPE_DECLARE_PREBUILT_DISPATCH

}  // namespace dpipe
