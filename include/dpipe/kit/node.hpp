#pragma once
/// The node interface. A NodeDef is an immutable description (kind, name, parameters, inputs) held by
/// a Pipeline; the engine instantiates an Iter from it, once per worker, with a BuildContext.
/// Iterators move chunks: `pull(out, max)` appends between 1 and `max` elements, 0 only at the end.
/// A node never holds elements beyond its declared state, so saving every node's state between
/// pulls is an exact snapshot.
#include <chrono>
#include <exception>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dpipe/kit/codec.hpp"
#include "dpipe/data_files.hpp"
#include "dpipe/error.hpp"
#include "dpipe/layout.hpp"
#include "dpipe/provenance.hpp"
#include "dpipe/rng.hpp"
#include "dpipe/snapshot.hpp"
#include "dpipe/kit/state.hpp"

namespace dpipe {

/// Elements per chunk moved between nodes.
inline constexpr std::size_t kChunk = 256;

/// Whether elements of T are large units of work (batches, text blocks) that the engine moves one at a
/// time through shallow queues, rather than kChunk at a time: 256 blocks of 64 KiB would be 16 MiB per
/// chunk. Specialise it (as true) for other element types that each own much memory.
template <class T>
inline constexpr bool is_bulk_element_v = detail::is_vector_v<T>;

using Params = std::vector<std::pair<std::string, std::string>>;

/// "batch 'b'" for a named node, "batch" otherwise: how error messages name a node.
inline std::string node_label(const std::string& kind, const std::string& name) {
  return name.empty() ? kind : kind + " '" + name + "'";
}

namespace detail {
class Executor;
struct RunShared;
}  // namespace detail

/// Where a node runs (DESIGN §4): once per rank before `dispatch`, once per worker, or in the consumer's
/// thread after `merge`.
enum class Segment : std::uint8_t { prefix, worker, suffix };
inline const char* segment_name(Segment s) {
  return s == Segment::prefix ? "prefix" : s == Segment::worker ? "worker" : "suffix";
}

/// What an iterator needs to know when it is built: seed, epoch, layout, worker and its node key.
/// Keys are handed out in the graph's pre-order (a node, then its inputs in order), so a subtree can
/// be rebuilt with the same keys by rewinding the cursor (see `cycle`).
/// How messages name the node keyed `key`: its label from `labels` (beside `keys`), else "node 'KEY'".
inline std::string label_in(const std::vector<std::string>* keys, const std::vector<std::string>* labels,
                            const std::string& key) {
  if (keys && labels)
    for (std::size_t i = 0; i < keys->size() && i < labels->size(); ++i)
      if ((*keys)[i] == key) return (*labels)[i];
  return "node '" + key + "'";
}

struct BuildContext {
  std::uint64_t seed = 0;
  std::uint64_t epoch = 0;
  Layout layout;
  int worker = 0;
  const std::vector<std::string>* keys = nullptr;
  std::size_t cursor = 0;
  const std::vector<std::string>* labels = nullptr;  // Graph::labels, beside keys
  Segment segment = Segment::worker;
  detail::Executor* executor = nullptr;  // borrowed from the Engine
  detail::RunShared* shared = nullptr;   // objects the workers of one Run share (dispatchers)
  bool inline_workers = false;           // workers run one after another in the consumer's thread
  bool collect_stats = false;            // iterators time their pulls
  bool trace = false;                    // iterators carry their elements' provenance (provenance.hpp)

  std::string next_key() {
    if (!keys || cursor >= keys->size()) throw ConfigError("internal: node keys exhausted while building a run");
    return (*keys)[cursor++];
  }
  int instance() const { return layout.instance(worker); }
  Rng rng(const std::string& key) const { return Rng::derive(seed, key, epoch); }
};

class NodeDefBase {
 public:
  NodeDefBase(std::string kind, std::string name, Params params,
              std::vector<std::shared_ptr<const NodeDefBase>> inputs = {})
      : kind_(std::move(kind)), name_(std::move(name)), params_(std::move(params)), inputs_(std::move(inputs)) {}
  virtual ~NodeDefBase() = default;

  const std::string& kind() const { return kind_; }
  const std::string& name() const { return name_; }
  const Params& params() const { return params_; }
  const std::vector<std::shared_ptr<const NodeDefBase>>& inputs() const { return inputs_; }
  /// The element type's codec tag, or a C++ type name when it is not Snapshottable.
  virtual std::string element_type_tag() const = 0;
  /// Checks that need the layout (a shard id against the number of instances); throws ConfigError.
  virtual void check_layout(const Layout&) const {}
  /// Bad data records a source skipped (`on_error = skip`).
  virtual std::uint64_t skipped() const { return 0; }
  /// Bytes of its files a source did not deliver for being bad (`on_error = skip`).
  virtual std::uint64_t skipped_bytes() const { return 0; }
  /// How many outputs the node has: `count` for fork, demux and unzip (kit/split.hpp), else 1. Output 0
  /// is the node itself; output i >= 1 is read through a `from` node.
  virtual std::size_t outputs() const { return 1; }
  /// For a `from` node: the node whose output it reads, and which output (else null and 0). An edge of
  /// the graph that is not an input: the node read is built where it stands in its own chain.
  virtual const NodeDefBase* reads() const { return nullptr; }
  virtual std::size_t reads_output() const { return 0; }
  /// Where the user put the node, as messages name it ("pipeline[3]", "pipeline[2].with[0][1]"): set by a
  /// front end that knows (a spec, Python), else the graph counts it from the source (Graph::label).
  /// Not part of the fingerprint. Set once: a front end that reuses a definition keeps its first place.
  const std::string& place() const { return place_; }
  void set_place(std::string place) const {
    if (place_.empty()) place_ = std::move(place);
  }

 protected:
  /// For sources that learn a parameter while they are built (a file's size).
  void add_param(std::string key, std::string value) { params_.emplace_back(std::move(key), std::move(value)); }

 private:
  std::string kind_, name_;
  Params params_;
  std::vector<std::shared_ptr<const NodeDefBase>> inputs_;
  mutable std::string place_;  // for messages only (see place())
};

template <class T>
std::string element_type_name() {
  if constexpr (Snapshottable<T>) return Codec<T>::tag();
  else return typeid(T).name();
}

template <class T>
class Iter;

template <class T>
class NodeDef : public NodeDefBase {
 public:
  using NodeDefBase::NodeDefBase;
  using element_type = T;
  std::string element_type_tag() const override { return element_type_name<T>(); }
  virtual std::unique_ptr<Iter<T>> instantiate(BuildContext& ctx) const = 0;
};

/// A source whose size is known and whose element i is readable in O(1) (`range`, `from_vector`):
/// what a `sampler` can read in any order.
template <class T>
class RandomAccess {
 public:
  virtual ~RandomAccess() = default;
  virtual std::uint64_t size() const = 0;
  virtual T at(std::uint64_t i) const = 0;
  /// A hint that at(i) comes soon (i < size()): sources over mapped files ask the CPU to load the
  /// first bytes of element i (pages not mapped yet are skipped), so a read from memory overlaps the
  /// work on the element before it. Changes no result.
  virtual void prefetch(std::uint64_t) const {}
  /// Whether prefetch does anything: readers skip the look-ahead when it does not.
  virtual bool prefetches() const { return false; }
};

/// How one node's state was restored.
struct NodeRestore {
  std::string key;
  std::string kind;
  std::uint32_t instance = 0;
  StateMode mode = StateMode::hook;
  std::uint64_t replayed_elements = 0;
  double micros = 0;
  std::uint64_t recomputed_elements = 0;  // made again from restore keys (kit/restore_keys.hpp)
};

struct RestoreReport {
  std::vector<NodeRestore> nodes;
  double total_ms = 0;
  /// The snapshot's step, if it has one, and the elements the run had delivered at it (0 for a rank of
  /// a rescale): where the resumed run stands.
  std::optional<std::uint64_t> step{};
  std::uint64_t delivered = 0;
  std::uint64_t replayed_elements() const {
    std::uint64_t n = 0;
    for (const auto& r : nodes) n += r.replayed_elements;
    return n;
  }
  std::uint64_t recomputed_elements() const {
    std::uint64_t n = 0;
    for (const auto& r : nodes) n += r.recomputed_elements;
    return n;
  }
};

/// Node states of a snapshot, looked up by (key, instance).
class StateIndex {
 public:
  explicit StateIndex(const std::vector<NodeState>& states) {
    for (const auto& s : states) index_.emplace(std::make_pair(s.key, s.instance), &s);
  }
  const NodeState& at(const std::string& key, std::uint32_t instance) const {
    auto it = index_.find({key, instance});
    if (it == index_.end())
      throw SnapshotError("snapshot has no state for node '" + key + "' on instance " + std::to_string(instance));
    return *it->second;
  }

 private:
  std::map<std::pair<std::string, std::uint32_t>, const NodeState*> index_;
};

template <class T>
class Stateless;
template <class T>
class Hooked;
template <class T>
class Replayed;
template <class T>
class HookedIf;

namespace detail {
struct ModeKey {  // only the three mode bases below can construct an Iter
 private:
  ModeKey() = default;
  template <class T>
  friend class dpipe::Stateless;
  template <class T>
  friend class dpipe::Hooked;
  template <class T>
  friend class dpipe::Replayed;
  template <class T>
  friend class dpipe::HookedIf;
};
}  // namespace detail

/// Untyped part of every iterator: identity, counters, and the save/restore wrappers that walk the
/// iterator tree in pre-order.
class IterBase {
 public:
  virtual ~IterBase() = default;
  IterBase(const IterBase&) = delete;
  IterBase& operator=(const IterBase&) = delete;

  const std::string& key() const { return key_; }
  const std::string& kind() const { return kind_; }
  /// How messages name this node: "pipeline[3] (batch)" (Graph::labels).
  const std::string& label() const { return label_; }
  int worker() const { return worker_; }
  std::uint32_t instance() const { return instance_; }
  StateMode mode() const { return mode_; }
  /// Elements this iterator has yielded since it was built.
  std::uint64_t produced() const { return produced_; }
  /// This node's index among the graph's keys (how provenance names a source).
  std::uint32_t node_index() const { return node_index_; }

  /// Provenance (provenance.hpp). A traced iterator leaves beside the elements of each pull their
  /// provenance, one per element in order, in `traces()` until its next pull; its consumer moves them
  /// out. A kind that carries provenance says so here; a traced run of one that does not is refused.
  bool traced() const { return traced_; }
  virtual bool carries_provenance() const { return false; }
  /// Whether this node's state holds no elements, so that a resume loses no provenance here (snapshots
  /// keep none yet): true for sources and the kinds that pass elements on within a pull.
  virtual bool holds_no_elements() const { return false; }
  std::vector<Provenance>& traces() { return traces_; }
  /// Restore keys (kit/restore_keys.hpp): whether each element this node yields has exactly one base
  /// element (sources, and the kinds that map, filter, reorder or expand elements one by one), so that a
  /// batch can split its provenance into its elements'.
  virtual bool one_base() const { return false; }
  /// Restore keys: whether this node can make an element it yielded again from its provenance alone
  /// (Iter::recompute): its output is a function of its inputs, the run's seed and the provenance, and so
  /// is every node's between it and its sources. False for a user generator and the kinds that do not
  /// say otherwise.
  virtual bool recomputable() const { return false; }

  /// Appends this node's record, then its inputs' (a replay node's inputs are rebuilt by replay and
  /// are not saved).
  void save(std::vector<NodeState>& out) const {
    StateSink sink(out);
    save(sink);
  }
  void save(StateSink& out) const {
    NodeState& st = out.add();
    st.key = key_;
    st.kind = kind_;
    st.instance = instance_;
    st.mode = mode_;
    {
      StateWriter w(st);
      save_state(w);
      if (const std::optional<std::uint64_t> taken = input_taken()) w(kInputTakenField, *taken);
      if (deferred_) {  // a failure this node holds back until its next pull (see fail_after)
        const FailureRecord f = FailureRecord::of(deferred_);
        w("deferred_failure", f.cause);
        w("deferred_node", f.node);
        w("deferred_worker", f.worker);
      }
    }
    if (mode_ != StateMode::replay) save_inputs(out);
  }

  /// Stops background production below this node and waits until it is idle (snapshots, statistics).
  virtual void pause() {
    for (IterBase* in : inputs()) in->pause();
  }
  /// As pause(), for an exact snapshot (Run::snapshot): a worker lane busy with a chunk that holds its
  /// chain's state as of its last published chunk lends that state and goes on producing, so the pause
  /// does not wait for the chunk (merge). resume() ends it either way.
  virtual void pause_for_snapshot() {
    for (IterBase* in : inputs()) in->pause_for_snapshot();
  }
  /// Moves the workers' production below this node to the consumer's thread or to the engine's
  /// (merge's lanes, AsyncLane::set_inline); the stream does not change. Run::set_inline_workers.
  virtual void set_inline_production(bool on) {
    for (IterBase* in : inputs()) in->set_inline_production(on);
  }
  /// Whether this node's state changes when another worker's chain pulls (dispatch, whose dispatcher the
  /// workers share): a chain holding one cannot be saved apart from the others' (AsyncLane's captures).
  virtual bool shared_between_workers() const { return false; }
  /// Lets background production go on after pause().
  virtual void resume() {
    for (IterBase* in : inputs()) in->resume();
  }
  /// Cancels background production below this node and joins it (a failed or abandoned run).
  virtual void stop() {
    for (IterBase* in : inputs()) in->stop();
  }
  /// Paused: brings production below this node to its settled point, where the state depends only on
  /// what the consumer has taken, not on how far the workers ran ahead (Run::reproducible_snapshot()).
  /// Only the nodes that buffer between threads (merge's worker queues, dispatch's backlogs) override it.
  virtual void settle() {
    for (IterBase* in : inputs()) in->settle();
  }

  /// Waits up to `limit` until a pull of `want` elements would not wait for production on another thread
  /// (the worker queues hold them, or have ended); false if the limit passed first. Nothing is taken. For
  /// a consumer that must stay responsive while it waits (Ctrl-C in Python). Nodes fed by other threads
  /// answer for their queues; a node of one input asks it for as many; a node of several cannot tell (true).
  virtual bool wait_ready(std::chrono::nanoseconds limit, std::size_t want) {
    const std::vector<IterBase*> in = inputs();
    return in.size() == 1 ? in.front()->wait_ready(limit, want) : true;
  }

  /// A node that names an element by its index in its input (one calling a Python callable) counts the
  /// elements it has taken from its input since it was first built (the run's start; under `cycle`, the
  /// pass's): saved after its own fields as the record's `input_taken` (format 6 on) and given back at
  /// restore, so the index runs on across a resume. nullopt for every other node, and for a counting node
  /// whose count started at a resume that did not give it one (so no later snapshot passes it off as whole).
  virtual std::optional<std::uint64_t> input_taken() const { return std::nullopt; }
  /// Whether this node counts its input (it then accepts `input_taken` at restore).
  virtual bool counts_input() const { return false; }
  /// At restore, for a node that counts: the saved count, or nullopt when its record has none (a file of
  /// format 5 or before, a set rescaled to another layout): it then counts from the resume, and says so.
  virtual void restore_input_taken(std::optional<std::uint64_t> taken) { (void)taken; }

  /// Elements this instance dropped as bad (`on_error = skip`), counted across resumes (it is state).
  virtual std::uint64_t skipped_elements() const { return 0; }
  /// Nanoseconds spent in pull(), inputs included (only when the run collects statistics).
  std::uint64_t busy_ns() const { return busy_ns_; }
  /// Whether this node's inputs run inside its pull() (false for merge: workers run on other threads).
  virtual bool runs_inputs_inline() const { return true; }
  /// The fewest elements worth asking for in one pull, for a worker lane sizing its chunks (it never
  /// pulls fewer): nodes that pass `max` through report their input's, parallel_map its window (a
  /// smaller pull leaves its threads idle).
  virtual std::size_t min_useful_pull() const { return 1; }
  /// The iterators this one pulls from, in input order.
  virtual std::vector<IterBase*> inputs() const = 0;

  /// Restores this freshly built iterator and its inputs.
  void restore(const StateIndex& states, RestoreReport& report) {
    if (started_) throw SnapshotError(label_ + ": restore() into an iterator that has already run");
    const NodeState& st = states.at(key_, instance_);
    if (st.kind != kind_)
      throw SnapshotError(label_ + ": the snapshot's node '" + key_ + "' is a " + st.kind + ", the pipeline's a " +
                          kind_);
    if (st.mode != mode_)
      throw SnapshotError(label_ + ": the snapshot's node '" + key_ + "' was saved by " + to_string(st.mode) +
                          ", expected " + to_string(mode_));
    const auto t0 = std::chrono::steady_clock::now();
    StateReader r(st);
    replayed_ = 0;
    recomputed_ = 0;
    restore_state(r);
    std::optional<std::uint64_t> taken;
    if (r.next_is(kInputTakenField)) {
      if (!counts_input()) r.fail("it has a field '" + std::string(kInputTakenField) + "', which this node does not keep");
      r(kInputTakenField, taken.emplace());
    }
    restore_input_taken(taken);
    if (r.has_more()) {
      FailureRecord f;
      r("deferred_failure", f.cause);
      r("deferred_node", f.node);
      r("deferred_worker", f.worker);
      deferred_ = f.to_exception(f.node == key_ ? label_ : label_in(keys_, labels_, f.node));
    }
    r.finish();
    const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    report.nodes.push_back({key_, kind_, instance_, mode_, replayed_, us, recomputed_});
    if (mode_ != StateMode::replay)
      for (IterBase* in : inputs()) in->restore(states, report);
  }

 protected:
  /// `key` empty: the next key of the graph's pre-order (every node of the graph); otherwise a key of
  /// the engine's own (the implicit merge of a pipeline without one).
  IterBase(StateMode mode, BuildContext& ctx, std::string kind, std::string key = {})
      : key_(key.empty() ? ctx.next_key() : std::move(key)), kind_(std::move(kind)), worker_(ctx.worker),
        instance_(static_cast<std::uint32_t>(ctx.instance())), mode_(mode), timed_(ctx.collect_stats),
        traced_(ctx.trace), build_epoch_(ctx.epoch) {
    keys_ = ctx.keys;
    labels_ = ctx.labels;
    const bool graph_key = key.empty() && ctx.labels && ctx.cursor >= 1 && ctx.cursor <= ctx.labels->size();
    label_ = graph_key ? (*ctx.labels)[ctx.cursor - 1] : "node '" + key_ + "'";
    if (graph_key) node_index_ = static_cast<std::uint32_t>(ctx.cursor - 1);
  }

  virtual void save_state(StateWriter&) const = 0;
  virtual void restore_state(StateReader&) = 0;
  /// Appends the records of this node's inputs, after its own (merge saves a lane's lent state instead).
  virtual void save_inputs(StateSink& out) const {
    for (IterBase* in : inputs()) in->save(out);
  }

  bool started_ = false;
  std::uint64_t produced_ = 0;
  std::uint64_t replayed_ = 0;
  std::uint64_t recomputed_ = 0;  // elements this node's restore made again from restore keys
  std::uint64_t busy_ns_ = 0;
  std::exception_ptr deferred_;  // a failure raised on the next pull (Iter::fail_after)
  std::vector<Provenance> traces_;  // traced: the provenance of the last pull's elements

  /// Traced: appends the provenance of the first `kept` elements of `in`'s last pull (those this pull
  /// delivers, compacted to the front with them: filters, skips, a failure mid-chunk).
  void pass_traces(IterBase& in, std::size_t kept) {
    if (!traced_) return;
    in.traces_.resize(kept);
    pass_traces(in);
  }
  /// Traced: appends the provenance of `in`'s last pull.
  void pass_traces(IterBase& in) {
    if (!traced_) return;
    if (traces_.empty()) traces_.swap(in.traces_);
    else traces_.insert(traces_.end(), std::make_move_iterator(in.traces_.begin()), std::make_move_iterator(in.traces_.end()));
    in.traces_.clear();
  }
  /// Traced: the element this source yields next was base element `position` of its `epoch` (by default
  /// the run's epoch the source was built in).
  void trace_source(std::uint64_t epoch, std::uint64_t position) {
    if (traced_) traces_.push_back(Provenance{SourcePos{.source = node_index_, .epoch = epoch, .position = position}});
  }
  void trace_source(std::uint64_t position) { trace_source(build_epoch_, position); }

 private:
  std::string key_;
  std::string kind_;
  std::string label_;
  const std::vector<std::string>* keys_;    // the graph's, to name another node's failure restored here
  const std::vector<std::string>* labels_;
  int worker_;
  std::uint32_t instance_;
  StateMode mode_;
  std::uint32_t node_index_ = 0;

 protected:
  const bool timed_;
  const bool traced_;
  const std::uint64_t build_epoch_;
};

/// A typed iterator. Derive from Stateless<T>, Hooked<T> or Replayed<T>: the constructor is only
/// reachable through them, so a node without an explicit snapshot story does not compile.
template <class T>
class Iter : public IterBase {
 public:
  using element_type = T;

  /// The element of provenance `p` this node yielded, made again from its sources; only when
  /// recomputable(). Reads no state and changes none: a freshly built iterator answers before it is
  /// restored. A key that names no element of this node is a SnapshotError.
  virtual T recompute(const Provenance& p) const {
    (void)p;
    throw SnapshotError("internal: " + label() + " cannot recompute an element");
  }

  /// Appends between 1 and `max` elements to `out` and returns how many; 0 means end of stream.
  /// An exception from user code becomes a NodeError naming this node.
  std::size_t pull(std::vector<T>& out, std::size_t max) {
    started_ = true;
    if (deferred_) std::rethrow_exception(deferred_);  // kept: a failed node stays failed
    const std::size_t before = out.size();
    const auto t0 = timed_ ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
    if (traced_) {
      if (!carries_provenance())
        throw ConfigError(label() + " does not carry provenance yet, so this pipeline cannot be traced "
                          "(dpipe run --provenance, Loader.provenance(), map with rng): see docs/design.md, \"Provenance\"");
      traces_.clear();
    }
    std::size_t n;
    try {
      n = pull_chunk(out, max);
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      throw NodeError(key(), label(), worker(), e.what());
    } catch (...) {
      throw NodeError(key(), label(), worker(), "unknown exception");
    }
    if (timed_)
      busy_ns_ += static_cast<std::uint64_t>(
          std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
    produced_ += n;
    if (traced_ && traces_.size() != n)
      throw Error("internal: " + label() + " yielded " + std::to_string(n) + " elements with " +
                  std::to_string(traces_.size()) + " provenances");
    if (mode() == StateMode::replay) on_replay_elements(out, before);
    return n;
  }

 protected:
  Iter(detail::ModeKey, StateMode mode, BuildContext& ctx, std::string kind, std::string key = {})
      : IterBase(mode, ctx, std::move(kind), std::move(key)) {}
  virtual std::size_t pull_chunk(std::vector<T>& out, std::size_t max) = 0;
  /// recompute() of a source: element `p`'s position of `source`, for a key of one base element naming
  /// this node, with no offsets.
  T recompute_at(const RandomAccess<T>& source, const Provenance& p) const {
    if (p.size() != 1 || p[0].source != node_index() || !p[0].offsets.empty() || p[0].position >= source.size())
      throw SnapshotError(label() + ": a restore key names no element of this source (" + to_string(p) + ")");
    return source.at(p[0].position);
  }
  virtual void on_replay_elements(const std::vector<T>&, std::size_t) {}

  /// For nodes that run user code on a chunk: call in a catch block after `delivered` elements of the
  /// chunk succeeded. With none, rethrows; otherwise returns `delivered` and raises the failure on the
  /// next pull, so every element before a failing one still reaches the consumer.
  std::size_t fail_after(std::size_t delivered) {
    if (delivered == 0) throw;
    try {
      throw;
    } catch (const Error&) {
      deferred_ = std::current_exception();
    } catch (const std::exception& e) {
      try {
        throw NodeError(key(), label(), worker(), e.what());
      } catch (...) {
        deferred_ = std::current_exception();
      }
    } catch (...) {
      try {
        throw NodeError(key(), label(), worker(), "unknown exception");
      } catch (...) {
        deferred_ = std::current_exception();
      }
    }
    return delivered;
  }
};

/// Pulls from `in` until `out` has grown by `n` or the input ended; returns how many were added.
template <class T>
std::size_t pull_exact(Iter<T>& in, std::vector<T>& out, std::size_t n, std::vector<Provenance>* traces = nullptr) {
  std::size_t got = 0;
  while (got < n) {
    const std::size_t k = in.pull(out, n - got);
    if (k == 0) break;
    got += k;
    if (traces)  // traced: the elements' provenances, beside them
      traces->insert(traces->end(), std::make_move_iterator(in.traces().begin()), std::make_move_iterator(in.traces().end()));
  }
  return got;
}

/// A node with no state at all (pure functions over their input).
template <class T>
class Stateless : public Iter<T> {
 protected:
  Stateless(BuildContext& ctx, std::string kind) : Iter<T>(detail::ModeKey{}, StateMode::stateless, ctx, std::move(kind)) {}
  void save_state(StateWriter&) const final {}
  void restore_state(StateReader&) final {}
};

/// A node that saves and restores a typed state struct; restore costs O(state), never O(position).
template <class T>
class Hooked : public Iter<T> {
 protected:
  Hooked(BuildContext& ctx, std::string kind, std::string key = {})
      : Iter<T>(detail::ModeKey{}, StateMode::hook, ctx, std::move(kind), std::move(key)) {}
};

/// A node whose state exists under some options only (map with on_error = skip keeps a skip count):
/// Hooked when `hooked`, else Stateless, so the plain node's snapshot is any stateless node's. Its
/// save_state/restore_state write nothing when stateless.
template <class T>
class HookedIf : public Iter<T> {
 protected:
  HookedIf(bool hooked, BuildContext& ctx, std::string kind)
      : Iter<T>(detail::ModeKey{}, hooked ? StateMode::hook : StateMode::stateless, ctx, std::move(kind)) {}
};

/// What a Replayed node saves: how many elements it yielded, a digest of them that proves a replay
/// reproduced the same stream, and the digest as it stood after 2^16, 2^17, … elements (each power of two
/// from 2^16 up to `count`; format 5 on), so a replay that departs from the recorded stream is refused at
/// the first of them past the departure, not after all `count` elements.
struct ReplayRecord {
  std::uint64_t count = 0, digest = 0;
  std::vector<std::uint64_t> steps{};
  static constexpr unsigned kFirstStepLog2 = kReplayFirstStepLog2;
  static std::size_t steps_for(std::uint64_t count) { return replay_steps_for(count); }
  template <class A>
  void fields(A& a) {
    a("count", count);
    a("digest", digest);
    a("digest_steps", steps);
  }
};

/// A node that cannot save its state (a user generator). It is restored by rebuilding it from the
/// initial RNG state and pulling the recorded number of elements; a digest of what it yields proves
/// the replay reproduced the same stream, checked at each recorded step and at the end.
template <class T>
class Replayed : public Iter<T> {
  static_assert(Snapshottable<T>,
                "READ THIS IF YOUR COMPILE BREAKS HERE: a replayed node digests the elements it yields to "
                "verify a replay, so its element type must be Snapshottable (built-in or cereal).");

 protected:
  Replayed(BuildContext& ctx, std::string kind) : Iter<T>(detail::ModeKey{}, StateMode::replay, ctx, std::move(kind)) {}

  void save_state(StateWriter& w) const final { w.write(ReplayRecord{this->produced_, digest_, steps_}); }
  void restore_state(StateReader& r) final {
    ReplayRecord record;
    r("count", record.count);
    r("digest", record.digest);
    const bool stepped = r.next_is("digest_steps");  // files before format 5 have no steps
    if (stepped) {
      r("digest_steps", record.steps);
      if (record.steps.size() != ReplayRecord::steps_for(record.count))
        r.fail("a replay of " + std::to_string(record.count) + " elements records " + std::to_string(record.steps.size()) +
               " digest steps, not " + std::to_string(ReplayRecord::steps_for(record.count)));
    }
    const std::uint64_t count = record.count;
    std::vector<T> sink;
    std::size_t checked = 0;
    while (this->produced_ < count) {
      sink.clear();
      const std::uint64_t want = std::min<std::uint64_t>(count - this->produced_, kChunk);
      if (this->pull(sink, static_cast<std::size_t>(want)) == 0)
        r.fail("replay ended after " + std::to_string(this->produced_) + " of the " + std::to_string(count) +
               " recorded elements: the node does not reproduce its stream from the saved seed");
      for (; stepped && checked < steps_.size(); ++checked)
        if (steps_[checked] != record.steps[checked])
          r.fail("replay departed from the recorded stream within its first " +
                 std::to_string(std::uint64_t{1} << (ReplayRecord::kFirstStepLog2 + checked)) + " of " +
                 std::to_string(count) + " elements (digest mismatch there): the node is not a deterministic "
                 "function of the pipeline seed and epoch, or the snapshot is not of this pipeline");
    }
    if (digest_ != record.digest)
      r.fail("replay of " + std::to_string(count) +
             " elements produced a different stream than the one recorded (digest mismatch): the node is "
             "not a deterministic function of the pipeline seed and epoch");
    this->replayed_ = count;
  }
  void on_replay_elements(const std::vector<T>& out, std::size_t from) final {
    ByteWriter w;
    std::uint64_t position = this->produced_ - (out.size() - from);  // elements yielded before out[from]
    for (std::size_t i = from; i < out.size(); ++i) {
      w.buffer().clear();
      Codec<T>::encode(w, out[i]);
      digest_ = mix64(digest_ ^ fnv1a(w.buffer()));
      if (++position == next_step_) {
        steps_.push_back(digest_);
        next_step_ <<= 1;
      }
    }
  }

 private:
  std::uint64_t digest_ = 0;
  std::vector<std::uint64_t> steps_;  // the digest after 2^16, 2^17, … elements
  std::uint64_t next_step_ = std::uint64_t{1} << ReplayRecord::kFirstStepLog2;
};

}  // namespace dpipe
