#pragma once
/// Nodes of several outputs (fork, demux, unzip). Output 0 is the node itself, where it stands in its
/// chain; output i >= 1 is a `from` node (nodes/from.hpp) that reads it. On each worker the outputs
/// share one core: the input's iterator and, per output, the elements routed to it that it has not
/// taken yet, at most `buffer` of them (the kind's Route says what the bound counts). The core is the
/// node's state, saved in output 0's record; a `from` keeps none.
///
/// A kind's Route:
///   std::size_t held(const Queues& queues, std::size_t output) const;
///       what the buffer bounds while `output` (whose queue is empty) asks for more: more than `buffer`
///       fails the run (torch's BufferError)
///   void route(std::vector<In>& chunk, Queues& queues, std::vector<Provenance>* traces, TraceQueues* out);
///       puts each element (or its parts) in the queues; traced (`traces` and `out` given), each
///       element's provenance (or its parts') in the same place of `out`
///   std::string overflow(const Queues&, std::size_t output, std::size_t buffer) const;  // the failure
///   Out remake(const Iter<In>& input, const Provenance& p) const;
///       restore keys: the element of provenance `p` an output holds, made again through the input
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dpipe/detail/fifo.hpp"
#include "dpipe/detail/run_shared.hpp"
#include "dpipe/kit/call_count.hpp"
#include "dpipe/kit/restore_keys.hpp"
#include "dpipe/pipeline.hpp"

namespace dpipe {

/// The saved state of a node of several outputs: how many elements each output holds, those elements
/// (output 0's first), and whether the input ended. `Elems` is std::vector<T> in the node, ElementBlobs
/// in its rescale rule.
template <class Elems>
struct SplitState {
  std::vector<std::uint64_t> counts{};
  Elems held{};
  bool input_done = false;
  template <class A>
  void fields(A& a) {
    a("counts", counts);
    a("held", held);
    a("input_done", input_done);
  }
};

template <class T>
using SplitQueues = std::vector<detail::Fifo<T>>;
/// Traced: the provenances of the elements of SplitQueues, queue for queue.
using TraceQueues = std::vector<detail::Fifo<Provenance>>;

namespace detail {

/// What a `from` pulls from: one worker's core of a node of several outputs.
template <class T>
class SplitOutputs {
 public:
  virtual ~SplitOutputs() = default;
  /// Traced, the elements' provenances go to `traces`.
  virtual std::size_t pull_output(std::size_t output, std::vector<T>& out, std::size_t max,
                                  std::vector<Provenance>* traces) = 0;
  virtual bool recomputable() const = 0;
  virtual bool one_base() const = 0;
  virtual T remake(const Provenance& p) const = 0;
};

/// The RunShared slot of a node's core on one worker (the prefix and the suffix build as worker 0).
inline std::string split_slot(const NodeDefBase* def, int worker) {
  return "split:" + std::to_string(reinterpret_cast<std::uintptr_t>(def)) + ":" + std::to_string(worker);
}

template <class In, class Out, class Route>
class SplitCore final : public SplitOutputs<Out> {
 public:
  SplitCore(std::unique_ptr<Iter<In>> input, std::size_t outputs, std::size_t buffer, Route route, bool traced)
      : input_(std::move(input)), queues_(outputs), trace_queues_(traced ? outputs : 0), buffer_(buffer),
        route_(std::move(route)) {}

  /// Between 1 and `max` elements of `output`; 0 once the input ended and its queue is empty. Pulls the
  /// input while the queue is empty, routing what comes to every output's queue.
  std::size_t pull_output(std::size_t output, std::vector<Out>& out, std::size_t max,
                          std::vector<Provenance>* traces) override {
    const std::size_t n = pull_queue(output, out, max);
    if (traced()) {
      std::vector<Provenance> ignored;
      trace_queues_[output].take_into(traces ? *traces : ignored, n);
    }
    return n;
  }
  bool recomputable() const override { return input_->recomputable(); }
  bool one_base() const override { return input_->one_base(); }
  Out remake(const Provenance& p) const override { return route_.remake(*input_, p); }
  bool traced() const { return !trace_queues_.empty(); }

 private:
  std::size_t pull_queue(std::size_t output, std::vector<Out>& out, std::size_t max) {
    auto& q = queues_[output];
    while (q.empty()) {
      if (input_done_) return 0;
      // Pulls no more than fits; with the buffer full, one element: the input's end, an element for this
      // output (fine), or one too many.
      const std::size_t held = route_.held(queues_, output);
      const std::size_t room = held >= buffer_ ? 1 : buffer_ - held;
      scratch_.clear();
      if (input_->pull(scratch_, std::min(max, room)) == 0) {
        input_done_ = true;
        continue;
      }
      if (traced()) route_.route(scratch_, queues_, &input_->traces(), &trace_queues_);
      else route_.route(scratch_, queues_, nullptr, nullptr);
      scratch_.clear();
      if (route_.held(queues_, output) > buffer_) throw ConfigError(route_.overflow(queues_, output, buffer_));
    }
    return q.take_into(out, max);
  }

 public:
  Iter<In>& input() const { return *input_; }
  Route& route() { return route_; }
  const Route& route() const { return route_; }

  SplitState<std::vector<Out>> state() const {
    SplitState<std::vector<Out>> st;
    st.input_done = input_done_;
    for (const auto& q : queues_) {
      st.counts.push_back(q.size());
      st.held.insert(st.held.end(), q.begin(), q.end());
    }
    return st;
  }
  /// Traced: the provenances of state()'s `held`, beside them.
  std::vector<Provenance> held_traces() const {
    std::vector<Provenance> out;
    for (const auto& q : trace_queues_) out.insert(out.end(), q.begin(), q.end());
    return out;
  }
  /// Restores the queues; traced, their provenances from `traces` (beside `held`: a key's, unknown for data).
  void restore(SplitState<std::vector<Out>>&& st, StateReader& r, std::vector<Provenance> traces = {}) {
    if (st.counts.size() != queues_.size())
      r.fail("it holds elements for " + std::to_string(st.counts.size()) + " outputs, the node has " +
             std::to_string(queues_.size()));
    std::uint64_t total = 0;
    for (const std::uint64_t c : st.counts) {
      if (c > st.held.size() - total) r.fail("its counts add up to more than the " + std::to_string(st.held.size()) + " elements it holds");
      total += c;
    }
    if (total != st.held.size())
      r.fail("its counts add up to " + std::to_string(total) + ", it holds " + std::to_string(st.held.size()) + " elements");
    auto it = st.held.begin();
    traces.resize(st.held.size(), unknown_provenance());
    auto trace = traces.begin();
    for (std::size_t j = 0; j < queues_.size(); ++j) {
      const auto end = it + static_cast<std::ptrdiff_t>(st.counts[j]);
      queues_[j].assign(std::vector<Out>(std::make_move_iterator(it), std::make_move_iterator(end)));
      const auto trace_end = trace + static_cast<std::ptrdiff_t>(st.counts[j]);
      if (traced())
        trace_queues_[j].assign(std::vector<Provenance>(std::make_move_iterator(trace), std::make_move_iterator(trace_end)));
      it = end;
      trace = trace_end;
    }
    input_done_ = st.input_done;
  }

 private:
  std::unique_ptr<Iter<In>> input_;
  SplitQueues<Out> queues_;
  TraceQueues trace_queues_;  // traced: beside queues_ (else none)
  std::size_t buffer_;
  Route route_;
  bool input_done_ = false;
  std::vector<In> scratch_;
};

}  // namespace detail

/// Output 0 of a node of several outputs: it builds the worker's core (with the input below it) and
/// owns its record.
template <class In, class Out, class Route>
class SplitIter final : public Hooked<Out> {
  using Core = detail::SplitCore<In, Out, Route>;

 public:
  SplitIter(BuildContext& ctx, const char* kind, const NodeDefBase& def, const NodeDef<In>& input, std::size_t buffer,
            Route route)
      : Hooked<Out>(ctx, kind) {
    if (!ctx.shared) throw ConfigError(node_label(kind, def.name()) + ": it must run inside a Run");
    // The route's failures name the node as every message does (its place in the graph, Graph::labels).
    if constexpr (requires { route.label = this->label(); }) route.label = this->label();
    else if constexpr (requires { route.lag.label = this->label(); }) route.lag.label = this->label();
    core_ = std::make_shared<Core>(input.instantiate(ctx), def.outputs(), buffer, std::move(route), this->traced());
    // The run's shared objects hold a weak reference: the core (and the upstream it owns) goes with the
    // iterators that use it, when the run's tree is destroyed, not after the run's graph.
    ctx.shared->objects[detail::split_slot(&def, ctx.worker)] =
        std::make_shared<std::weak_ptr<detail::SplitOutputs<Out>>>(std::shared_ptr<detail::SplitOutputs<Out>>(core_));
  }

 protected:
  std::size_t pull_chunk(std::vector<Out>& out, std::size_t max) override {
    return core_->pull_output(0, out, max, this->traced() ? &this->traces() : nullptr);
  }
  void save_state(StateWriter& w) const override {
    SplitState<std::vector<Out>> st = core_->state();
    if (!this->traced() || !core_->recomputable()) return w.write(st);
    const std::vector<Provenance> traces = core_->held_traces();
    w.write(SplitState<KeysOut<Out>>{std::move(st.counts), {&st.held, &traces}, st.input_done});
  }
  void restore_state(StateReader& r) override {
    SplitState<KeysIn<Out>> st;
    if (core_->recomputable()) st.held.make = [core = core_.get()](const Provenance& p) { return core->remake(p); };
    r.read(st);
    this->recomputed_ = st.held.recomputed;
    core_->restore({std::move(st.counts), std::move(st.held.values), st.input_done}, r, std::move(st.held.keys));
  }
  bool carries_provenance() const override { return true; }
  bool one_base() const override { return core_->one_base(); }
  bool recomputable() const override { return core_->recomputable(); }
  Out recompute(const Provenance& p) const override { return core_->remake(p); }
  /// A route that calls a function once per input element (demux's) saves the function's call count.
  std::optional<std::uint64_t> input_taken() const override {
    if constexpr (requires { core_->route().fn; }) return call_count(std::as_const(*core_).route().fn);
    else return std::nullopt;
  }
  bool counts_input() const override {
    if constexpr (requires { core_->route().fn; }) return CountsCalls<decltype(core_->route().fn)>;
    else return false;
  }
  void restore_input_taken(std::optional<std::uint64_t> taken) override {
    if constexpr (requires { core_->route().fn; }) restore_call_count(core_->route().fn, taken);
  }
  std::vector<IterBase*> inputs() const override { return {&core_->input()}; }

 private:
  std::shared_ptr<Core> core_;
};

/// The definition of a node of several outputs; `Route` is its kind's.
template <class In, class Out, class Route>
class SplitDef final : public NodeDef<Out> {
 public:
  SplitDef(const char* kind, std::string name, Params params, std::shared_ptr<const NodeDef<In>> in,
           std::size_t outputs, std::size_t buffer, Route route)
      : NodeDef<Out>(kind, std::move(name), std::move(params), {in}), kind_(kind), input_(std::move(in)),
        outputs_(outputs), buffer_(buffer), route_(std::move(route)) {}
  std::unique_ptr<Iter<Out>> instantiate(BuildContext& ctx) const override {
    return std::make_unique<SplitIter<In, Out, Route>>(ctx, kind_, *this, *input_, buffer_, route_);
  }
  std::size_t outputs() const override { return outputs_; }

 private:
  const char* kind_;
  std::shared_ptr<const NodeDef<In>> input_;
  std::size_t outputs_, buffer_;
  Route route_;
};

/// The check every node of several outputs makes of its count and buffer; returns their parameters.
inline Params split_params(const char* kind, const std::string& name, std::int64_t count, std::int64_t buffer) {
  if (count < 1 || count > 1024)
    throw ConfigError(node_label(kind, name) + ": count must be between 1 and 1024, got " + std::to_string(count));
  if (buffer < 1) throw ConfigError(node_label(kind, name) + ": buffer must be positive, got " + std::to_string(buffer));
  return {{"count", param_text(count)}, {"buffer", param_text(buffer)}};
}

/// What a fork's or unzip's buffer bounds: how far the output asking is ahead of the one furthest behind.
template <class T>
std::size_t longest_other_queue(const SplitQueues<T>& q, std::size_t output) {
  std::size_t longest = 0;
  for (std::size_t j = 0; j < q.size(); ++j)
    if (j != output) longest = std::max(longest, q[j].size());
  return longest;
}

/// The rescale reason of the nodes of several outputs.
inline constexpr const char* kSplitNotDealt =
    "its outputs' queues pair elements across the outputs on each instance (an element one output has taken "
    "and another not yet); dealt to other instances, the pairs would break";

}  // namespace dpipe
