#pragma once
/// Starts the worker segment: its input (the main prefix) runs once per rank, and its elements are
/// handed to the workers — `dispatch(round_robin)` gives element i to worker i mod num_workers;
/// `dispatch(broadcast)` gives every element to every worker as one shared, immutable object
/// (`std::shared_ptr<const T>`), never copied, so each worker can take its own part of a large shard.
/// In: T → Out: T (round_robin) or std::shared_ptr<const T> (broadcast).
/// State: the prefix's states, whose turn it is, and each worker's elements not yet taken.
#include <deque>
#include <mutex>
#include <string>

#include "dpipe/detail/run_shared.hpp"
#include "dpipe/pipeline.hpp"

namespace dpipe {

struct DispatchOptions {
  std::string name{};
};

inline constexpr struct RoundRobin {
} round_robin{};
inline constexpr struct Broadcast {
} broadcast{};

namespace detail {

/// The prefix of one Run and the per-worker backlogs it fills, shared by the workers' DispatchIters.
/// Workers take under a lock; the one that finds its backlog empty pulls the next prefix chunk.
template <class T, class Out>
class Dispatcher {
 public:
  static constexpr bool kBroadcast = !std::is_same_v<T, Out>;

  Dispatcher(std::unique_ptr<Iter<T>> prefix, int workers, std::size_t end_key)
      : end_key(end_key), prefix_(std::move(prefix)), backlog_(static_cast<std::size_t>(workers)) {}

  const std::size_t end_key;  // key cursor after the prefix: where the other workers' builds go on

  std::size_t take(int worker, std::vector<Out>& out, std::size_t max) {
    std::lock_guard lock(mu_);
    auto& q = backlog_[static_cast<std::size_t>(worker)];
    while (q.empty() && !prefix_done_) refill();
    const std::size_t n = std::min(max, q.size());
    for (std::size_t i = 0; i < n; ++i) {
      out.push_back(std::move(q.front()));
      q.pop_front();
    }
    return n;
  }

  Iter<T>& prefix() { return *prefix_; }

  void save(StateWriter& w) const {
    w("next_worker", next_);
    w("prefix_done", prefix_done_);
    for (std::size_t i = 0; i < backlog_.size(); ++i)
      w("backlog_" + std::to_string(i), std::vector<Out>(backlog_[i].begin(), backlog_[i].end()));
  }
  void restore(StateReader& r) {
    r("next_worker", next_);
    r("prefix_done", prefix_done_);
    if (next_ >= backlog_.size()) r.fail("next worker " + std::to_string(next_) + " is not a worker");
    for (std::size_t i = 0; i < backlog_.size(); ++i) {
      std::vector<Out> v;
      r("backlog_" + std::to_string(i), v);
      backlog_[i].assign(std::make_move_iterator(v.begin()), std::make_move_iterator(v.end()));
    }
  }

 private:
  void refill() {
    // Broadcast elements are large units (a whole shard): one at a time. Round-robin: a chunk, or one
    // element per worker when the elements are bulky (batches, text blocks).
    const std::size_t want = kBroadcast            ? 1
                             : is_bulk_element_v<T> ? backlog_.size()
                                                    : std::max<std::size_t>(backlog_.size(), dpipe::kChunk);
    scratch_.clear();
    if (prefix_->pull(scratch_, want) == 0) {
      prefix_done_ = true;
      return;
    }
    for (auto& x : scratch_) {
      if constexpr (kBroadcast) {
        auto shared = std::make_shared<const T>(std::move(x));
        for (auto& q : backlog_) q.push_back(shared);
      } else {
        backlog_[next_].push_back(std::move(x));
        next_ = next_ + 1 == backlog_.size() ? 0 : next_ + 1;
      }
    }
  }

  std::mutex mu_;
  std::unique_ptr<Iter<T>> prefix_;
  std::vector<std::deque<Out>> backlog_;
  std::uint64_t next_ = 0;
  bool prefix_done_ = false;
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
      slot = std::make_shared<detail::Dispatcher<T, Out>>(std::move(prefix), ctx.layout.num_workers, c.cursor);
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
    w("owner", owner_);
    if (owner_) dispatcher_->save(w);
  }
  void restore_state(StateReader& r) override {
    bool owner = false;
    r("owner", owner);
    if (owner != owner_) r.fail("the dispatcher's record is on another worker");
    if (owner_) dispatcher_->restore(r);
  }
  std::vector<IterBase*> inputs() const override {
    if (owner_) return {&dispatcher_->prefix()};
    return {};
  }

 private:
  std::shared_ptr<detail::Dispatcher<T, Out>> dispatcher_;
  bool owner_ = false;
};

template <class T, class Out>
class DispatchDef final : public NodeDef<Out> {
 public:
  DispatchDef(std::shared_ptr<const NodeDef<T>> in, DispatchOptions o)
      : NodeDef<Out>("dispatch", o.name,
                     {{"mode", std::is_same_v<T, Out> ? "round_robin" : "broadcast"}}, {in}),
        input_(std::move(in)) {}
  std::unique_ptr<Iter<Out>> instantiate(BuildContext& ctx) const override {
    return std::make_unique<DispatchIter<T, Out>>(ctx, *this);
  }
  const NodeDef<T>& input() const { return *input_; }

 private:
  std::shared_ptr<const NodeDef<T>> input_;
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
inline auto dispatch(DispatchOptions o = {}) { return dispatch(round_robin, std::move(o)); }

}  // namespace dpipe
