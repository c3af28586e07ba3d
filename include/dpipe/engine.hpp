#pragma once
/// Engine and Run. `engine.start(pipeline, options)` builds one iterator chain per worker of this rank
/// and returns a move-only Run<T>; `next()` yields the workers' outputs merged round-robin (skipping
/// exhausted workers), so the stream is a pure function of (pipeline, seed, epoch, layout).
/// `run.snapshot()` captures the state at the consumer's position; `engine.resume(pipeline, snapshot)`
/// continues exactly there.
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dpipe/graph.hpp"
#include "dpipe/pipeline.hpp"
#include "dpipe/snapshot.hpp"

namespace dpipe {

struct RunOptions {
  std::uint64_t seed = 0;
  /// Every random node derives its stream from (seed, node key, epoch): a new epoch reshuffles.
  std::uint64_t epoch = 0;
  /// Unset: taken from the environment (RANK/WORLD_SIZE or Open MPI's variables) with one worker.
  std::optional<Layout> layout;
};

namespace detail {
/// Snapshot metadata for a run (non-template, in engine/).
SnapshotMeta make_meta(const Graph& g, const RunOptions& o, const Layout& l, std::uint64_t delivered);
/// Refuses a snapshot that does not belong to this graph, seed, epoch and layout.
void check_snapshot(const Snapshot& s, const Graph& g, const RunOptions& o, const Layout& l);
Layout resolve_layout(const RunOptions& o);
}  // namespace detail

template <class T>
class Run {
 public:
  Run(Run&&) noexcept = default;
  Run& operator=(Run&&) noexcept = default;

  /// The next element, or nullopt at the end of the stream.
  std::optional<T> next() {
    const std::size_t k = workers_.size();
    for (std::size_t tried = 0; tried < k; ++tried) {
      Lane& lane = lanes_[cursor_];
      if (lane.head == lane.buf.size() && !lane.done) {
        lane.buf.clear();
        lane.head = 0;
        if (workers_[cursor_]->pull(lane.buf, kLaneChunk) == 0) lane.done = true;
      }
      const std::size_t w = cursor_;
      cursor_ = (cursor_ + 1 == k) ? 0 : cursor_ + 1;
      if (lane.head < lane.buf.size()) {
        ++delivered_;
        return std::move(lanes_[w].buf[lanes_[w].head++]);
      }
    }
    return std::nullopt;
  }

  /// The complete state at the consumer's position: every node on every worker of this rank, plus
  /// the elements already pulled from workers but not yet delivered.
  Snapshot snapshot(std::map<std::string, std::string> user_metadata = {}) const
    requires Snapshottable<T>
  {
    Snapshot s;
    s.meta = detail::make_meta(graph_, options_, layout_, delivered_);
    s.meta.user_metadata = std::move(user_metadata);
    NodeState& run = s.states.emplace_back();
    run.key = "run";
    run.kind = "run";
    run.instance = static_cast<std::uint32_t>(layout_.rank);
    run.mode = StateMode::hook;
    {
      StateWriter w(run);
      w("cursor", static_cast<std::uint64_t>(cursor_));
      w("delivered", delivered_);
      for (std::size_t i = 0; i < lanes_.size(); ++i) {
        const Lane& lane = lanes_[i];
        w("pending_" + std::to_string(i),
          std::vector<T>(lane.buf.begin() + std::ptrdiff_t(lane.head), lane.buf.end()));
        w("done_" + std::to_string(i), lane.done);
      }
    }
    for (const auto& wk : workers_) wk->save(s.states);
    return s;
  }

  const Layout& layout() const { return layout_; }
  const Graph& graph() const { return graph_; }
  std::uint64_t delivered() const { return delivered_; }
  /// How the state was restored (empty for a fresh start).
  const RestoreReport& restore_report() const { return report_; }

 private:
  friend class Engine;
  // Elements pulled from a worker at a time. Batches are already large units of work, so they are
  // pulled one by one: that keeps the elements a snapshot must carry to at most one per worker.
  static constexpr std::size_t kLaneChunk = detail::is_vector_v<T> ? 1 : kChunk;

  struct Lane {
    std::vector<T> buf;
    std::size_t head = 0;
    bool done = false;
  };

  Run(Pipeline<T> p, RunOptions o) : pipeline_(std::move(p)), options_(std::move(o)) {
    layout_ = detail::resolve_layout(options_);
    graph_ = Graph::build(*pipeline_.def());
    graph_.check_layout(layout_);
    for (int w = 0; w < layout_.num_workers; ++w) {
      BuildContext ctx{options_.seed, options_.epoch, layout_, w, &graph_.keys(), 0};
      workers_.push_back(pipeline_.def()->instantiate(ctx));
    }
    lanes_.resize(workers_.size());
  }

  void restore(const Snapshot& s) {
    const auto t0 = std::chrono::steady_clock::now();
    detail::check_snapshot(s, graph_, options_, layout_);
    const StateIndex index(s.states);
    const NodeState& run = index.at("run", static_cast<std::uint32_t>(layout_.rank));
    StateReader r(run);
    std::uint64_t cursor = 0;
    r("cursor", cursor);
    r("delivered", delivered_);
    if (cursor >= workers_.size()) r.fail("merge cursor " + std::to_string(cursor) + " is not a worker");
    cursor_ = static_cast<std::size_t>(cursor);
    for (std::size_t i = 0; i < lanes_.size(); ++i) {
      r("pending_" + std::to_string(i), lanes_[i].buf);
      r("done_" + std::to_string(i), lanes_[i].done);
      lanes_[i].head = 0;
    }
    r.finish();
    for (auto& wk : workers_) wk->restore(index, report_);
    report_.total_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  }

  Pipeline<T> pipeline_;  // keeps the definitions the iterators borrow alive
  RunOptions options_;
  Layout layout_;
  Graph graph_;
  std::vector<std::unique_ptr<Iter<T>>> workers_;
  std::vector<Lane> lanes_;
  std::size_t cursor_ = 0;
  std::uint64_t delivered_ = 0;
  RestoreReport report_;
};

class Engine {
 public:
  template <class T>
  Run<T> start(const Pipeline<T>& p, RunOptions o = {}) {
    return Run<T>(p, std::move(o));
  }
  /// A fresh Run restored from `s`; refuses a snapshot of another graph, seed, epoch or layout.
  template <class T>
    requires Snapshottable<T>
  Run<T> resume(const Pipeline<T>& p, const Snapshot& s, RunOptions o = {}) {
    Run<T> run(p, std::move(o));
    run.restore(s);
    return run;
  }
};

}  // namespace dpipe
