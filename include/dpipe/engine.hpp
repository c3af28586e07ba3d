#pragma once
/// Engine and Run. `engine.start(pipeline, options)` builds one iterator chain per worker of this rank
/// and returns a move-only Run<T>; `next()` yields the workers' outputs merged round-robin (skipping
/// exhausted workers), so the stream is a pure function of (pipeline, seed, epoch, layout).
/// `run.snapshot()` captures the state at the consumer's position; `engine.resume(pipeline, snapshot)`
/// continues exactly there. A Run is an input range: `for (auto&& x : run)` is the loop.
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <iterator>
#include <exception>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dpipe/detail/run_record.hpp"
#include "dpipe/detail/executor.hpp"
#include "dpipe/detail/prebuilt_types.hpp"
#include "dpipe/detail/run_shared.hpp"
#include "dpipe/graph.hpp"
#include "dpipe/nodes/merge.hpp"
#include "dpipe/pipeline.hpp"
#include "dpipe/snapshot.hpp"
#include "dpipe/snapshot_set.hpp"

namespace dpipe {

struct RunOptions {
  std::uint64_t seed = 0;
  /// Every random node derives its stream from (seed, node key, epoch): a new epoch reshuffles.
  std::uint64_t epoch = 0;
  /// Unset: taken from the environment (RANK/WORLD_SIZE or Open MPI's variables) with one worker.
  std::optional<Layout> layout{};
  /// Run the workers one after another in the consumer's thread instead of on the engine's threads.
  /// The stream is the same either way; this is the single-threaded reference.
  bool inline_workers = false;
  /// Time every node's pulls, for node_stats() (costs two clock reads per pull).
  bool collect_stats = false;
  /// Carry every element's provenance (provenance.hpp) for Run::provenance(); every node must carry it.
  /// The stream is the same either way. A traced run's snapshots hold restore keys in place of the
  /// elements it buffers wherever their chain can make them again (kit/restore_keys.hpp).
  bool trace = false;
};

struct ResumeOptions {
  /// Restore a snapshot set taken on another {world_size, num_workers} by redistributing it. Without
  /// it, a layout change is refused: a wrong WORLD_SIZE must not turn into a silent rescale.
  bool rescale = false;
  /// Accept data files that changed since the snapshot (same path and size, another modification time):
  /// for data copied without its times. A changed file is refused without it.
  bool allow_changed_data = false;
  /// The most elements a node restored by replay (a user generator) may be asked to replay: a snapshot
  /// asking for more is refused before anything runs, rather than replaying for hours. Raise it for a
  /// generator that legitimately ran that far.
  std::uint64_t max_replay = std::uint64_t{1} << 30;
  /// Semantic parameters this resume may change, each "PARAM" (every node declaring it overridable: mix's
  /// "weights") or "KEY.PARAM" (one node by key, best its name: "mixer.weights"). The pipeline is built with the new values;
  /// the state restores as saved (every buffered element kept) and what follows uses them. Each change
  /// is recorded in the snapshots of the run under the metadata key "dpipe.overrides". A name that no
  /// node of the pipeline can override is refused.
  std::vector<std::string> overrides{};
};

struct EngineOptions {
  /// Engine threads that run the workers; 0 means one per core.
  int threads = 0;
};

/// Per-node figures of a Run (`RunOptions::collect_stats`).
struct NodeStats {
  std::string key{};
  std::string kind{};
  std::uint32_t instance = 0;
  std::uint64_t elements = 0;  // yielded
  double seconds = 0;          // inside pull(), inputs included
  double self_seconds = 0;     // without the time of inputs that run inside it
  std::uint64_t skipped = 0;   // elements dropped as bad (on_error = skip), resumed runs included
};

namespace detail {
/// Snapshot metadata for a run (non-template, in engine/).
SnapshotMeta make_meta(const Graph& g, const RunOptions& o, const Layout& l, std::uint64_t delivered);
/// Refuses a snapshot that does not belong to this graph, seed, epoch and layout. Returns the history of
/// overridden parameters (ResumeOptions::overrides) the run's snapshots record: the snapshot's, then this
/// resume's ("mixer.weights: 0.7, 0.3 → 0.5, 0.5 at element 1200", "… at step 300", "… at the rescale
/// from 2 ranks x 2 workers"), separated by "; ".
std::string check_snapshot(const Snapshot& s, const Graph& g, const RunOptions& o, const Layout& l, const ResumeOptions& r);
/// The key scheme a snapshot's nodes were keyed with: pre_order when its keys are this pipeline's in
/// that scheme (a snapshot of format 1 to 3, or of a run resumed from one), else stable. A run resumed
/// from a snapshot keeps its scheme, so its random streams and later snapshots continue it exactly.
KeyScheme key_scheme_of(const SnapshotMeta& m, const NodeDefBase& output);
/// The metadata key under which snapshots record the parameters resumes overrode.
inline constexpr const char* kOverridesKey = "dpipe.overrides";
Layout resolve_layout(const RunOptions& o);
/// Walks an iterator tree for node_stats().
void collect_node_stats(const IterBase& it, std::vector<NodeStats>& out);
}  // namespace detail

/// A running pipeline. Move-only; destroying it mid-stream cancels and joins its workers.
template <class T>
class Run {
 public:
  Run(Run&&) noexcept = default;
  Run& operator=(Run&& o) noexcept {
    if (this != &o) {
      root_.reset();  // joins this run's workers while their executor and shared objects still exist
      executor_ = std::move(o.executor_);
      shared_ = std::move(o.shared_);
      pipeline_ = std::move(o.pipeline_);
      options_ = std::move(o.options_);
      layout_ = o.layout_;
      graph_ = std::move(o.graph_);
      root_ = std::move(o.root_);
      buf_ = std::move(o.buf_);
      buf_traces_ = std::move(o.buf_traces_);
      last_trace_ = std::move(o.last_trace_);
      head_ = o.head_;
      delivered_ = o.delivered_;
      failed_ = std::move(o.failed_);
      report_ = std::move(o.report_);
    }
    return *this;
  }
  ~Run() {
    if (root_) root_->stop();
  }

  /// The next element, or nullopt at the end of the stream. A failure in any worker is rethrown here
  /// (a NodeError naming the node and worker, nesting the original) after every element before it;
  /// the run then stops its workers, and later calls throw the same error.
  std::optional<T> next() {
    if (!fill()) return std::nullopt;
    ++delivered_;
    if (options_.trace) last_trace_ = head_ < buf_traces_.size() ? std::move(buf_traces_[head_]) : unknown_provenance();
    return std::move(buf_[head_++]);
  }

  /// A traced run (RunOptions::trace): the provenance of the element next() returned last, its sources
  /// named by graph().keys(); a base element a snapshot held is SourcePos::kUnknown (snapshots carry no
  /// provenance yet). nullptr when the run is not traced.
  const Provenance* provenance() const { return options_.trace ? &last_trace_ : nullptr; }

  /// Brings the next element at hand (computing it if need be) without taking it: false at the end of the
  /// stream. Nothing is delivered, so a snapshot taken now still counts the element as to come. (The
  /// Python package computes this way, then raises a Ctrl-C that came meanwhile before it takes.)
  bool fill() {
    if (head_ < buf_.size()) return true;
    if (failed_) std::rethrow_exception(failed_);
    buf_.clear();
    buf_traces_.clear();
    head_ = 0;
    try {
      const bool got = root_->pull(buf_, pull_size()) != 0;
      if (options_.trace) buf_traces_.swap(root_->traces());
      return got;
    } catch (...) {
      failed_ = std::current_exception();
      root_->stop();
      throw;
    }
  }

  /// fill() for a consumer that must be able to stop a long computation (the Python package, when the
  /// pipeline runs inline and Ctrl-C comes): the pull is made `step` elements at a time, and after each
  /// `stop()` may end it early. Then fewer elements than a whole pull are at hand, still in order, and
  /// the next fill() goes on from there; only a snapshot's bytes (not what it resumes to) can tell.
  template <class Stop>
  bool fill_until(std::size_t step, Stop&& stop) {
    if (head_ < buf_.size()) return true;
    if (failed_) std::rethrow_exception(failed_);
    buf_.clear();
    buf_traces_.clear();
    head_ = 0;
    const std::size_t want = pull_size();
    step = std::max<std::size_t>(step, 1);
    try {
      while (buf_.size() < want) {
        const std::size_t ask = std::min(step, want - buf_.size());
        const std::size_t got = root_->pull(buf_, ask);
        if (options_.trace) {
          std::vector<Provenance>& t = root_->traces();
          buf_traces_.insert(buf_traces_.end(), std::make_move_iterator(t.begin()), std::make_move_iterator(t.end()));
          t.clear();
        }
        if (got < ask || stop()) break;  // short: the stream ended
      }
    } catch (...) {
      failed_ = std::current_exception();
      root_->stop();
      if (buf_.empty()) throw;  // else the elements before the failure come first, then next() rethrows it
    }
    return !buf_.empty();
  }

  /// Whether next() will return an element it already holds: no node runs and nothing waits. (A consumer
  /// holding a lock the workers may need takes such elements without releasing it: the Python package
  /// keeps the GIL for them.)
  bool at_hand() const noexcept { return head_ < buf_.size(); }

  /// Waits up to `limit` until next() can start without waiting for the workers (an element is at hand,
  /// a worker queue holds a chunk, or the stream has ended); false if the limit passed first. next() may
  /// still compute, and a node after the workers that needs many of their elements may wait again. For a
  /// consumer that must stay responsive while it waits (the Python package checks for Ctrl-C between).
  bool wait_ready(std::chrono::nanoseconds limit) {
    if (head_ < buf_.size() || failed_) return true;
    return root_->wait_ready(limit, pull_size());
  }

  /// The input iterator of `for (auto&& x : run)`. It owns the current element by value, so a
  /// reference to it stays valid until the iterator moves on; it is move-only and single-pass, like
  /// the stream. Each step is a `next()`: the loop continues from wherever the run is, a `break`
  /// leaves the run positioned just after the element the body last saw (a snapshot taken in the
  /// body or after the loop resumes at the element after it), and errors are thrown from `++`.
  class iterator {
   public:
    using iterator_concept = std::input_iterator_tag;
    using value_type = T;
    using difference_type = std::ptrdiff_t;

    iterator() = default;
    iterator(iterator&&) noexcept = default;
    iterator& operator=(iterator&&) noexcept = default;

    T& operator*() const { return *current_; }
    T* operator->() const { return &*current_; }
    iterator& operator++() {
      current_ = run_->next();
      return *this;
    }
    void operator++(int) { ++*this; }
    friend bool operator==(const iterator& it, std::default_sentinel_t) { return !it.current_; }

   private:
    friend class Run;
    explicit iterator(Run& run) : run_(&run), current_(run.next()) {}

    Run* run_ = nullptr;
    mutable std::optional<T> current_;
  };

  /// Pulls the next element (as `next()` does) into the returned iterator; the end is
  /// std::default_sentinel. Do not move the Run while iterating it.
  iterator begin() { return iterator(*this); }
  std::default_sentinel_t end() const { return {}; }

  /// The complete state at the consumer's position: production pauses, every node on every worker is
  /// saved together with the elements produced but not yet delivered, and production goes on. A worker
  /// busy with a slow chunk does not make it wait: it lends its chain's records as of its last published
  /// chunk and goes on (AsyncLane), and a resume produces that chunk again; a fast chunk is waited for.
  /// `step` (the trainer's step, say) is recorded in the file's identity: a set whose ranks' snapshots
  /// name different steps is refused.
  Snapshot snapshot(std::map<std::string, std::string> user_metadata = {}, std::optional<std::uint64_t> step = {})
    requires Snapshottable<T>
  {
    return take_snapshot(std::move(user_metadata), step, /*settle=*/false);
  }

  /// A snapshot whose state depends only on the consumer's position, never on how far the workers had
  /// run ahead: each worker's queue is first filled to a fixed depth (1.5 queue depths and one element, on
  /// the engine's threads) and each dispatch backlog to one refill and one element. Resuming it on the same
  /// layout gives the same stream as snapshot() would; rescaling a set of them gives the same per-rank
  /// streams on every run, whatever the timing — the snapshot to write into a set. The pause costs
  /// producing what the queues lacked (docs/checks.md has the figures); the elements are not wasted, the
  /// run delivers them next.
  Snapshot reproducible_snapshot(std::map<std::string, std::string> user_metadata = {},
                                 std::optional<std::uint64_t> step = {})
    requires Snapshottable<T>
  {
    return take_snapshot(std::move(user_metadata), step, /*settle=*/true);
  }
  /// Runs the workers in the consumer's thread from now on (true, as RunOptions::inline_workers) or on
  /// the engine's threads (false); the stream is the same. Going inline waits for the chunks under way.
  /// For a consumer that knows which pays: the Python Loader switches as its loop's steps change.
  void set_inline_workers(bool on) { root_->set_inline_production(on); }
  /// Hands back a snapshot of this run the caller is done with (written, sent): the next snapshot
  /// overwrites its records in place instead of allocating its buffers again. A loop that snapshots
  /// often (a Python state_dict per step) then neither allocates nor page-faults its state anew.
  void recycle(Snapshot&& old) { spare_states_ = std::move(old.states); }

  /// Elements and time per node and instance, from the moment the run started (needs
  /// RunOptions::collect_stats for the times). Pauses production while it reads.
  std::vector<NodeStats> node_stats();

  const Layout& layout() const { return layout_; }
  const Graph& graph() const { return *graph_; }
  std::uint64_t delivered() const { return delivered_; }
  /// What this run delivers that the user may not mean (a source read in full by several instances with
  /// nothing splitting it); empty when nothing looks wrong. The tool prints these on stderr.
  const std::vector<std::string>& warnings() const { return warnings_; }
  /// How the state was restored (empty for a fresh start).
  const RestoreReport& restore_report() const { return report_; }

 private:
  friend class Engine;

  Snapshot take_snapshot(std::map<std::string, std::string> user_metadata, std::optional<std::uint64_t> step,
                         bool settle)
    requires Snapshottable<T>;

  // Elements the consumer pulls from the graph at a time: batches and blocks one by one; strings four at a time,
  // so the blocks they own go back through the allocator's per-thread cache while still hot (records of
  // 1 KiB read 30 % faster than 256 at a time); other values in chunks.
  static constexpr std::size_t kRunChunk =
      is_bulk_element_v<T> ? 1 : std::is_same_v<T, std::string> ? 4 : kChunk;
  /// How many elements the next pull asks for (the consumer's side is empty): up to the next position
  /// that is a power of two below kRunChunk and a multiple of it from there on. A pull returns what it asks
  /// for unless the stream ends, so what the run holds is a function of its position, which a reproducible
  /// snapshot needs (it is saved and dealt per rank); and the first elements of a stream arrive after
  /// one, two, four … are produced instead of after a whole chunk.
  std::size_t pull_size() const {
    const std::uint64_t at = delivered_;
    if (at >= kRunChunk) return kRunChunk - static_cast<std::size_t>(at % kRunChunk);
    std::uint64_t next = 1;
    while (next <= at) next *= 2;
    return static_cast<std::size_t>(next - at);
  }

  struct Paused {
    /// `for_snapshot`: an exact snapshot's pause (IterBase::pause_for_snapshot).
    explicit Paused(IterBase& r, bool for_snapshot = false) : root(r) {
      if (for_snapshot) root.pause_for_snapshot();
      else root.pause();
    }
    ~Paused() { root.resume(); }
    IterBase& root;
  };

  Run(Pipeline<T> p, RunOptions o, std::shared_ptr<detail::Executor> executor, KeyScheme keys = KeyScheme::stable);
  void restore(const Snapshot& s, const ResumeOptions& resume);

  // Destruction runs bottom-up: the root (which joins the workers) goes before the objects the
  // workers share and the executor they run on.
  std::shared_ptr<detail::Executor> executor_;
  std::unique_ptr<detail::RunShared> shared_;
  Pipeline<T> pipeline_;  // keeps the definitions the iterators borrow alive
  RunOptions options_;
  Layout layout_;
  std::unique_ptr<Graph> graph_;  // on the heap: iterators keep pointers to its keys across moves
  std::unique_ptr<Iter<T>> root_;
  std::vector<T> buf_;
  std::vector<Provenance> buf_traces_;  // traced: beside buf_ (shorter after a restore: unknown)
  Provenance last_trace_;
  std::size_t head_ = 0;
  std::uint64_t delivered_ = 0;
  std::vector<NodeState> spare_states_;  // a recycled snapshot's records (recycle())
  std::exception_ptr failed_;
  RestoreReport report_;
  std::vector<std::string> warnings_;
  std::string overrides_;  // the parameters resumes overrode (detail::check_snapshot), for the snapshots
};

// The members that build, save and restore a run's iterators, defined outside the class so that an
// explicit instantiation declaration (`extern template class Run<T>;`, below) keeps them out of a
// translation unit.

template <class T>
Run<T>::Run(Pipeline<T> p, RunOptions o, std::shared_ptr<detail::Executor> executor, KeyScheme keys)
    : executor_(std::move(executor)), pipeline_(std::move(p)), options_(std::move(o)) {
  layout_ = detail::resolve_layout(options_);
  graph_ = std::make_unique<Graph>(Graph::build(*pipeline_.def(), keys));
  graph_->check_layout(layout_);
  warnings_ = graph_->warnings(layout_);
  shared_ = std::make_unique<detail::RunShared>();
  BuildContext ctx{options_.seed, options_.epoch, layout_, 0, &graph_->keys(), 0, &graph_->labels()};
  ctx.executor = executor_.get();
  ctx.shared = shared_.get();
  ctx.inline_workers = options_.inline_workers;
  ctx.collect_stats = options_.collect_stats;
  ctx.trace = options_.trace;
  if (graph_->has_merge()) {
    ctx.segment = Segment::suffix;
    root_ = pipeline_.def()->instantiate(ctx);
  } else {
    root_ = std::make_unique<MergeIter<T>>(ctx, *pipeline_.def(), "merge@out");
  }
}

template <class T>
void Run<T>::restore(const Snapshot& s, const ResumeOptions& resume) {
  const auto t0 = std::chrono::steady_clock::now();
  overrides_ = detail::check_snapshot(s, *graph_, options_, layout_, resume);
  const StateIndex index(s.states);
  const NodeState& run = index.at("run", static_cast<std::uint32_t>(layout_.rank));
  StateReader r(run);
  detail::RunRecord<KeysIn<T>> record;
  record.pending.from = root_.get();
  r.read(record);
  r.finish();
  delivered_ = record.delivered;
  report_.step = s.meta.step;
  report_.delivered = record.delivered;
  buf_ = std::move(record.pending.values);
  buf_traces_ = options_.trace ? std::move(record.pending.keys) : std::vector<Provenance>{};
  head_ = 0;
  if (record.pending.recomputed)
    report_.nodes.push_back({"run", "run", run.instance, StateMode::hook, 0, 0, record.pending.recomputed});
  root_->restore(index, report_);
  report_.total_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

template <class T>
Snapshot Run<T>::take_snapshot(std::map<std::string, std::string> user_metadata, std::optional<std::uint64_t> step,
                               bool settle)
  requires Snapshottable<T>
{
  if (failed_) throw SnapshotError("cannot snapshot a run that failed; use a snapshot taken before the failure");
  Paused paused(*root_, /*for_snapshot=*/!settle);
  if (settle) root_->settle();
  Snapshot s;
  s.meta = detail::make_meta(*graph_, options_, layout_, delivered_);
  s.meta.user_metadata = std::move(user_metadata);
  if (!overrides_.empty()) s.meta.user_metadata.emplace(detail::kOverridesKey, overrides_);
  s.meta.step = step;
  s.meta.id = detail::snapshot_id(s.meta);
  StateSink sink(s.states, &spare_states_);
  NodeState& run = sink.add();
  run.key = "run";
  run.kind = "run";
  run.instance = static_cast<std::uint32_t>(layout_.rank);
  run.mode = StateMode::hook;
  {
    StateWriter w(run);
    const TailView<T> pending{&buf_, head_};
    if (options_.trace && root_->recomputable()) {  // as restore keys (kit/restore_keys.hpp)
      std::vector<Provenance> keys;
      if (buf_traces_.size() == buf_.size()) keys.assign(buf_traces_.begin() + std::ptrdiff_t(head_), buf_traces_.end());
      w.write(detail::RunRecord<KeysOut<T, TailView<T>>>{delivered_, {&pending, &keys}});
    } else {
      w.write(detail::RunRecord<std::vector<T>>{delivered_, {buf_.begin() + std::ptrdiff_t(head_), buf_.end()}});
    }
  }
  root_->save(sink);
  spare_states_.clear();
  return s;
}

template <class T>
std::vector<NodeStats> Run<T>::node_stats() {
  Paused paused(*root_);
  std::vector<NodeStats> out;
  detail::collect_node_stats(*root_, out);
  return out;
}

/// Owns the engine threads (a oneTBB arena, kept out of this header) and starts Runs on them.
class Engine {
 public:
  explicit Engine(EngineOptions o = {}) : executor_(std::make_shared<detail::Executor>(o.threads)) {}

  template <class T>
  Run<T> start(const Pipeline<T>& p, RunOptions o = {}) {
    return Run<T>(p, std::move(o), executor_);
  }
  /// A fresh Run restored from `s`; refuses a snapshot of another graph, seed, epoch or layout.
  template <class T>
    requires Snapshottable<T>
  Run<T> resume(const Pipeline<T>& p, const Snapshot& s, RunOptions o = {}, ResumeOptions r = {}) {
    Run<T> run(p, std::move(o), executor_, detail::key_scheme_of(s.meta, *p.def()));
    run.restore(s, r);
    return run;
  }
  /// A fresh Run restored from this rank's snapshot of a set; with `rescale`, a set taken on another
  /// layout is redistributed first (every rank computes the same redistribution, no collective).
  template <class T>
    requires Snapshottable<T>
  Run<T> resume(const Pipeline<T>& p, const SnapshotSet& set, RunOptions o = {}, ResumeOptions r = {}) {
    const Layout l = detail::resolve_layout(o);
    o.layout = l;
    if (set.world_size() == l.world_size && set.num_workers() == l.num_workers) return resume(p, set.rank(l.rank), o, r);
    if (!r.rescale)
      throw SnapshotError("the snapshot set was taken with world_size " + std::to_string(set.world_size()) + " and " +
                          std::to_string(set.num_workers()) + " workers, this run has world_size " +
                          std::to_string(l.world_size) + " and " + std::to_string(l.num_workers) +
                          " workers; ask for a rescale to redistribute it");
    return resume(p, set.rescaled(l.world_size, l.num_workers).rank(l.rank), o, r);
  }
  /// A fresh Run restored from this rank's snapshot in a set directory: on the set's own layout only
  /// this rank's file is read (SnapshotSet::read_rank); another layout is rescaled when `r.rescale` asks.
  template <class T>
    requires Snapshottable<T>
  Run<T> resume(const Pipeline<T>& p, const SnapshotDir& dir, RunOptions o = {}, ResumeOptions r = {}) {
    const Layout l = detail::resolve_layout(o);
    o.layout = l;
    return resume(p, SnapshotSet::read_rank(dir.path, l, r.rescale), o, r);
  }
  int threads() const { return executor_->threads(); }

 private:
  std::shared_ptr<detail::Executor> executor_;
};

// Compiled once in libdpipe for the prebuilt element types (dpipe/detail/prebuilt_types.hpp).
#define DPIPE_DECLARE_PREBUILT_RUN(T) \
  extern template class Run<T>;       \
  extern template class MergeIter<T>; \
  extern template class detail::AsyncLane<T>;
DPIPE_FOR_EACH_PREBUILT_TYPE(DPIPE_DECLARE_PREBUILT_RUN)
#undef DPIPE_DECLARE_PREBUILT_RUN

}  // namespace dpipe
