#pragma once
/// Ends the worker segment: its input runs once per worker (num_workers copies, each on the engine's
/// threads), and their outputs are merged round-robin, skipping exhausted workers, so the stream is a
/// pure function of (pipeline, seed, layout). Nodes after it run in the consumer's thread.
/// A pipeline without `merge` gets one at its end. In: T → Out: T.
/// State: the merge cursor and, per worker, the elements produced but not yet delivered.
#include <chrono>
#include <string>

#include "dpipe/detail/async_lane.hpp"
#include "dpipe/pipeline.hpp"
#include "dpipe/kit/rescale.hpp"
#include "dpipe/kit/restore_keys.hpp"
#include "dpipe/kit/spec.hpp"

namespace dpipe {

/// A merge's saved state: whose turn it is, and per worker the elements produced and not yet delivered,
/// whether the worker ended, and a failure it raised ahead of the consumer (its chain is past the failure,
/// so the failure itself is recorded and raised again after the pending elements on restore). `Elems` is
/// std::vector<T> in the node, ElementBlobs in its rescale rule; `lanes` is sized to the number of workers
/// before a record is read.
template <class Elems>
struct MergeState {
  struct Lane {
    Elems pending{};
    bool done = false;
    FailureRecord failure{};
  };
  std::uint64_t cursor = 0;
  std::vector<Lane> lanes{};
  template <class A>
  void fields(A& a) {
    a("cursor", cursor);
    for (std::size_t i = 0; i < lanes.size(); ++i) {
      const std::string n = std::to_string(i);
      a("pending_" + n, lanes[i].pending);
      a("done_" + n, lanes[i].done);
      a("failure_" + n, lanes[i].failure.cause);
      a("failed_node_" + n, lanes[i].failure.node);
      a("failed_worker_" + n, lanes[i].failure.worker);
    }
  }
};

struct MergeOptions {
  std::string name{};
};

/// How many elements each worker may run ahead of the consumer, and per pull. Batches, other vectors
/// and text blocks are large units of work (is_bulk_element_v), so they move one at a time; scalars
/// move in chunks.
template <class T>
struct LaneDepth {
  static constexpr std::size_t kChunk = is_bulk_element_v<T> ? 1 : dpipe::kChunk;
  // Deep enough that a worker rarely fills its queue while the consumer is being woken (tens of µs):
  // every refill of a full queue costs a task start, every empty one a consumer wake-up.
  static constexpr std::size_t kDefaultCapacity = is_bulk_element_v<T> ? 64 : 64 * dpipe::kChunk;
};

/// The kind name of `prefetch`, whose parameter sets the depth of the worker queues it ends.
inline constexpr const char* kPrefetchKind = "prefetch";
/// The depth a `prefetch` definition asks for (its "depth" parameter).
inline std::size_t prefetch_depth(const NodeDefBase& def) {
  for (const auto& [k, v] : def.params())
    if (k == "depth") return static_cast<std::size_t>(std::stoull(v));
  return 0;
}

template <Snapshottable T>
class MergeIter final : public Hooked<T> {
 public:
  /// Builds one chain of `segment` per worker of the layout; `key` empty takes the graph's next key.
  MergeIter(BuildContext& ctx, const NodeDef<T>& segment, std::string key = {})
      : Hooked<T>(ctx, "merge", std::move(key)), executor_(ctx.executor), inline_(ctx.inline_workers) {
    std::size_t capacity = LaneDepth<T>::kDefaultCapacity, chunk = LaneDepth<T>::kChunk;
    if (segment.kind() == kPrefetchKind) {  // its depth bounds what a worker holds ahead, chunks included
      capacity = prefetch_depth(segment);
      chunk = std::min(chunk, std::max<std::size_t>(capacity, 1));
    }
    const std::size_t first_key = ctx.cursor;
    std::size_t end_key = first_key;
    for (int w = 0; w < ctx.layout.num_workers; ++w) {
      BuildContext c = ctx;
      c.worker = w;
      c.segment = Segment::worker;
      c.cursor = first_key;
      auto chain = segment.instantiate(c);
      end_key = c.cursor;
      lanes_.push_back(std::make_unique<detail::AsyncLane<T>>(std::move(chain), ctx.executor, capacity, chunk,
                                                              ctx.inline_workers));
    }
    ctx.cursor = end_key;
    finished_.assign(lanes_.size(), false);
    for (auto& l : lanes_)
      if (shares_between_workers(l->chain())) l->disable_captures();
  }
  ~MergeIter() override { stop(); }

  void pause() override {
    for (auto& l : lanes_) l->request_pause();
    for (auto& l : lanes_) l->wait_idle();
  }
  /// Lanes that can lend their chain's records as of their last published chunk go on producing; the
  /// others pause, and the wait is for their chunks under way only.
  void pause_for_snapshot() override {
    std::vector<bool> lent(lanes_.size());
    for (std::size_t i = 0; i < lanes_.size(); ++i) lent[i] = lanes_[i]->request_snapshot();
    for (std::size_t i = 0; i < lanes_.size(); ++i)
      if (!lent[i]) lanes_[i]->wait_idle();
  }
  void resume() override {
    for (auto& l : lanes_) l->resume();
  }
  void set_inline_production(bool on) override {
    for (auto& l : lanes_) l->set_inline(on);
    inline_ = on;
  }
  void stop() override {
    for (auto& l : lanes_) l->stop();
  }
  /// Every worker's queue to its settled depth (the workers in parallel on the engine's threads), then
  /// the chains below: a dispatch settles after every worker has taken what its queue needed.
  void settle() override {
    auto fill = [&](std::size_t i) { lanes_[i]->settle_paused(); };
    if (executor_ && !inline_ && lanes_.size() > 1) executor_->parallel_for(lanes_.size(), fill);
    else for (std::size_t i = 0; i < lanes_.size(); ++i) fill(i);
    for (auto& l : lanes_) l->chain().settle();
  }
  bool runs_inputs_inline() const override { return false; }
  /// Ready when every worker the round robin takes from for `want` elements, from the cursor on, has its
  /// share queued or has ended (a pull returns what it asks for, so it would wait for those).
  bool wait_ready(std::chrono::nanoseconds limit, std::size_t want) override {
    start_lanes();
    const auto deadline = std::chrono::steady_clock::now() + limit;
    const std::size_t k = lanes_.size();
    for (std::size_t j = 0; j < k && j < want; ++j) {
      const std::size_t i = (st_.cursor + j) % k;
      if (finished_[i]) continue;
      const std::size_t share = want / k + (j < want % k ? 1 : 0);
      if (!lanes_[i]->wait_available(share, deadline)) return false;
    }
    return true;
  }

 protected:
  bool carries_provenance() const override { return true; }
  std::size_t pull_chunk(std::vector<T>& out, std::size_t max) override {
    start_lanes();
    const std::size_t k = lanes_.size();
    if (k == 1) {  // one worker: its elements move on in runs, not one at a time
      // As many as asked unless the worker ends, like the round-robin below: how many the consumer holds
      // must not depend on how the worker's chunks happened to be cut (a reproducible snapshot saves it).
      std::size_t n = 0;
      while (n < max && !finished_[0]) {
        std::size_t got = 0;
        try {
          got = lanes_[0]->take_into(out, max - n, this->traced() ? &this->traces() : nullptr);
        } catch (...) {
          return this->fail_after(n);  // the worker failed: what came before it is delivered first
        }
        if (got == 0) finished_[0] = true;
        n += got;
      }
      return n;
    }
    std::size_t n = 0, skipped = 0;
    while (n < max && skipped < k) {
      auto& lane = *lanes_[st_.cursor];
      try {
        if (!finished_[st_.cursor] && !lane.ready()) finished_[st_.cursor] = true;
      } catch (...) {
        return this->fail_after(n);  // a worker failed: what came before it is delivered first
      }
      if (finished_[st_.cursor]) {
        ++skipped;
      } else {
        out.push_back(lane.take(this->traced() ? &this->traces() : nullptr));
        ++n;
        skipped = 0;
      }
      st_.cursor = st_.cursor + 1 == k ? 0 : st_.cursor + 1;
    }
    return n;
  }
  void save_state(StateWriter& w) const override {
    if (this->traced() && lanes_.front()->keyed()) return save_keys(w);
    MergeState<std::vector<T>> st{.cursor = st_.cursor};
    st.lanes.resize(lanes_.size());
    for (std::size_t i = 0; i < lanes_.size(); ++i) {
      st.lanes[i].pending = lanes_[i]->pending();
      st.lanes[i].done = finished_[i] || lanes_[i]->snapshot_done();
      st.lanes[i].failure = FailureRecord::of(lanes_[i]->snapshot_error());
    }
    w.write(st);
  }
  /// Restore keys: each worker's pending elements as their provenance and the checksums its producer
  /// took (kit/restore_keys.hpp), read in place: nothing is copied or encoded but an element of unknown
  /// provenance.
  void save_keys(StateWriter& w) const {
    using View = typename detail::AsyncLane<T>::PendingView;
    std::vector<View> views;
    std::vector<std::vector<Provenance>> traces(lanes_.size());
    std::vector<std::vector<std::uint32_t>> sums(lanes_.size());
    MergeState<KeysOut<T, View>> keyed{.cursor = st_.cursor};
    keyed.lanes.resize(lanes_.size());
    views.reserve(lanes_.size());
    for (std::size_t i = 0; i < lanes_.size(); ++i) {
      views.emplace_back(*lanes_[i]);
      traces[i] = lanes_[i]->pending_traces();
      sums[i] = lanes_[i]->pending_sums();
      keyed.lanes[i] = {{&views[i], &traces[i], &sums[i]}, finished_[i] || lanes_[i]->snapshot_done(),
                        FailureRecord::of(lanes_[i]->snapshot_error())};
    }
    w.write(keyed);
  }
  /// Every worker's chain is the same function of provenance: the first one's makes an element again.
  bool one_base() const override { return lanes_.front()->chain().one_base(); }
  bool recomputable() const override { return lanes_.front()->chain().recomputable(); }
  T recompute(const Provenance& p) const override { return lanes_.front()->chain().recompute(p); }
  void save_inputs(StateSink& out) const override {
    for (const auto& l : lanes_) l->save_chain(out);
  }
  void restore_state(StateReader& r) override {
    MergeState<KeysIn<T>> st;
    st.lanes.resize(lanes_.size());
    for (auto& lane : st.lanes) lane.pending.from = &lanes_.front()->chain();
    r.read(st);
    if (st.cursor >= lanes_.size())
      r.fail("merge cursor " + std::to_string(st.cursor) + " is not one of the " + std::to_string(lanes_.size()) +
             " workers");
    st_.cursor = static_cast<std::size_t>(st.cursor);
    for (std::size_t i = 0; i < lanes_.size(); ++i) {
      auto& lane = st.lanes[i];
      std::exception_ptr error = lane.failure.to_exception();
      finished_[i] = lane.done && lane.pending.values.empty() && !error;
      this->recomputed_ += lane.pending.recomputed;
      lanes_[i]->set_pending(std::move(lane.pending.values), std::move(lane.pending.keys), lane.done, error);
    }
  }
  std::vector<IterBase*> inputs() const override {
    std::vector<IterBase*> v;
    for (const auto& l : lanes_) v.push_back(&l->chain());
    return v;
  }

 private:
  struct State {
    std::size_t cursor = 0;
  };
  std::vector<std::unique_ptr<detail::AsyncLane<T>>> lanes_;
  std::vector<bool> finished_;  // consumer side: lane exhausted
  detail::Executor* executor_ = nullptr;
  bool inline_ = false;
  bool started_lanes_ = false;
  static bool shares_between_workers(const IterBase& node) {
    if (node.shared_between_workers()) return true;
    for (const IterBase* in : node.inputs())
      if (shares_between_workers(*in)) return true;
    return false;
  }
  void start_lanes() {  // every worker starts at once, not when the round-robin first reaches it
    if (started_lanes_) return;
    started_lanes_ = true;
    for (auto& l : lanes_) l->resume();
  }
  State st_;
};

template <Snapshottable T>
class MergeDef final : public NodeDef<T> {
 public:
  MergeDef(std::shared_ptr<const NodeDef<T>> in, MergeOptions o)
      : NodeDef<T>("merge", o.name, {}, {in}), input_(std::move(in)) {}
  std::unique_ptr<Iter<T>> instantiate(BuildContext& ctx) const override {
    if (ctx.segment != Segment::suffix)
      throw ConfigError(node_label("merge", this->name()) + ": merge can only end the worker segment once");
    return std::make_unique<MergeIter<T>>(ctx, *input_);
  }

 private:
  std::shared_ptr<const NodeDef<T>> input_;
};

inline auto merge(MergeOptions o = {}) {
  return make_closure([o = std::move(o)](const auto& p) {
    using T = typename std::decay_t<decltype(p)>::element_type;
    return make_pipeline<MergeDef<T>>(p.def(), o);
  });
}

struct MergeKind {
  static constexpr std::string_view name = "merge";
  static constexpr std::string_view doc =
      "Ends the worker segment: its input runs once per worker and their outputs are merged round-robin, skipping exhausted workers.";
  /// Provenance (docs/design.md, "Provenance"; a kind without this line does not carry it).
  static constexpr std::string_view provenance = "the workers queue it beside their elements; their queues are saved as restore keys when the chain makes elements again";
  static constexpr std::span<const ParamSchema> params{};
  using State = MergeState<ElementBlobs>;
  /// Its fields for one worker: `dpipe ops` lists the per-worker ones as `pending_N`, ….
  static State state_prototype() { return {.cursor = 0, .lanes = std::vector<State::Lane>(1)}; }
  static constexpr SegmentRole segment = SegmentRole::ends_workers;
  /// Invariant: the cursor names one of its workers.
  static void check_state(const NodeState& record, const GraphNodeRecord&) {
    check_worker_position(record, "cursor", "pending_");
  }

  /// Rescale: the queued elements of every worker of every rank are pooled in rank and worker order and
  /// dealt to the new workers, each new merge starting at worker 0. A worker that had failed refuses it.
  static RescaleRule rescale() {
    return RescaleRule::dealt([](const RescaleInput& in) {
      using S = MergeState<ElementBlobs>;
      S prototype;
      prototype.lanes.resize(static_cast<std::size_t>(in.from.num_workers));
      in.check_fields(prototype);
      std::vector<std::string> pending;
      for (std::size_t w = 0; w < static_cast<std::size_t>(in.from.num_workers); ++w) {
        if (const auto failed = in.first_text("failure_" + std::to_string(w)))
          in.refuse("worker " + std::to_string(w) + " of rank " + std::to_string(failed->first) + " had failed: " + failed->second);
        pending.push_back("pending_" + std::to_string(w));
      }
      const auto workers = static_cast<std::size_t>(in.to.num_workers);
      const auto dealt = in.deal_fields(pending, workers);
      return in.write_slots([&](std::size_t r) {
        S s;
        s.lanes.resize(workers);
        for (std::size_t w = 0; w < workers; ++w) s.lanes[w].pending = dealt[r * workers + w];
        return s;
      });
    });
  }

  /// `{"op": "merge"}`: ends the worker segment.
  template <class Spec>
  static SpecPipeline from_spec(Spec& s) {
    MergeOptions o{.name = s.name()};
    return s.input().apply([&](const auto& p) { return p | merge(o); });
  }
};

}  // namespace dpipe
