#pragma once
/// Replaces each element by the elements of the range fn returns (a vector, say), in order.
/// In: T → Out: the range's value type. State: the outputs of the current input not yet yielded; for an
/// `Expansion` (outputs made one at a time, builtins::Iota's), the remainder of the expansion instead; with
/// on_error = skip, also how many inputs it dropped because the function threw on them.
#include <algorithm>
#include <deque>
#include <iterator>
#include <limits>
#include <ranges>
#include <string>

#include "dpipe/kit/on_error.hpp"
#include "dpipe/nodes/map.hpp"
#include "dpipe/kit/rescale.hpp"
#include "dpipe/kit/restore_keys.hpp"

namespace dpipe {

/// A flat_map's saved state: the outputs of the current input not yet yielded, and with on_error = skip
/// (`kCounts`) the inputs skipped. `Elems` is std::vector<Out> in the node, ElementBlobs in its rescale rule.
template <class Elems, bool kCounts = false>
struct FlatMapState {
  Elems pending{};
  std::uint64_t skipped = 0;
  template <class A>
  void fields(A& a) {
    a("pending", pending);
    if constexpr (kCounts) a("skipped", skipped);
  }
};

namespace detail {
/// Moves up to `room` of the pending outputs from position `next` on into `out`; returns how many.
template <class T>
std::size_t take_pending(std::vector<T>& pending, std::size_t& next, std::vector<T>& out, std::size_t room) {
  const std::size_t k = std::min(room, pending.size() - next);
  std::move(pending.begin() + std::ptrdiff_t(next), pending.begin() + std::ptrdiff_t(next + k), std::back_inserter(out));
  next += k;
  return k;
}
}  // namespace detail

struct FlatMapOptions {
  /// An input the function throws on: fail the run (after the outputs before it), or skip it.
  OnDataError on_error = OnDataError::fail;
  std::string name{};
};

/// A function result that flat_map streams instead of collecting: its outputs are made one at a time
/// (`front()`, `pop_front()` until `empty()`), and what remains of it is a small Snapshottable value, so
/// a snapshot in the middle of an expansion of 2^62 outputs holds that value, and a resume continues it
/// exactly. Any other result (a vector, a range) is collected in full before its first output.
template <class R>
concept Expansion = Snapshottable<R> && requires(R r, const R& c) {
  typename R::value_type;
  { c.empty() } -> std::convertible_to<bool>;
  { c.front() } -> std::convertible_to<typename R::value_type>;
  r.pop_front();
};

/// A streaming flat_map's saved state: the remainders of its unfinished expansions, in order (one in a
/// node; more after a rescale pooled several old instances'). `Rests` is std::vector<R> in the node,
/// ElementBlobs in its rescale rule.
template <class Rests, bool kCounts = false>
struct FlatMapRestState {
  Rests rests{};
  std::uint64_t skipped = 0;
  template <class A>
  void fields(A& a) {
    a("rests", rests);
    if constexpr (kCounts) a("skipped", skipped);
  }
};

namespace detail {
template <class R>
struct flat_map_value {
  using type = std::ranges::range_value_t<R>;
};
template <Expansion R>
struct flat_map_value<R> {
  using type = typename R::value_type;
};
}  // namespace detail

template <class In, class Fn>
using flat_map_result_t = typename detail::flat_map_value<map_result_t<In, Fn>>::type;

template <class In, class Fn>
class FlatMapDef final : public NodeDef<flat_map_result_t<In, Fn>> {
 public:
  using Out = flat_map_result_t<In, Fn>;
  FlatMapDef(std::shared_ptr<const NodeDef<In>> in, Fn fn, FlatMapOptions o)
      : NodeDef<Out>("flat_map", o.name, describe_fn(fn, o.on_error), {in}), input_(std::move(in)),
        fn_(std::move(fn)), on_error_(o.on_error) {}
  std::unique_ptr<Iter<Out>> instantiate(BuildContext& ctx) const override;
  const NodeDef<In>& input() const { return *input_; }
  const Fn& fn() const { return fn_; }
  OnDataError on_error() const { return on_error_; }

 private:
  std::shared_ptr<const NodeDef<In>> input_;
  Fn fn_;
  OnDataError on_error_;
};

template <class In, class Fn>
class FlatMapIter final : public Hooked<flat_map_result_t<In, Fn>> {
 public:
  using Out = flat_map_result_t<In, Fn>;
  FlatMapIter(BuildContext& ctx, const FlatMapDef<In, Fn>& def)
      : Hooked<Out>(ctx, "flat_map"), input_(def.input().instantiate(ctx)), fn_(def.fn()),
        skips_(def.on_error() == OnDataError::skip) {}

 protected:
  std::size_t pull_chunk(std::vector<Out>& out, std::size_t max) override {
    if constexpr (kStreams) return pull_streaming(out, max);
    else return pull_collected(out, max);
  }
  void save_state(StateWriter& w) const override {
    if constexpr (kStreams) {
      FlatMapRestState<std::vector<Result>> st;
      for (const auto& r : rests_)
        if (!r.empty()) st.rests.push_back(r);
      w.write(st);
    } else {
      const TailView<Out> rest{&pending_, next_};
      if (this->traced() && recomputable()) {  // restore keys: this node makes its own outputs again
        std::vector<Provenance> keys;
        for (std::size_t j = next_; j < pending_.size(); ++j) keys.push_back(trace_of(j));
        w.write(FlatMapState<KeysOut<Out, TailView<Out>>>{{&rest, &keys}});
      } else {
        w.write(FlatMapState<std::vector<Out>>{{pending_.begin() + std::ptrdiff_t(next_), pending_.end()}});
      }
    }
    if (skips_) w.write(skipped_);
  }
  void restore_state(StateReader& r) override {
    if constexpr (kStreams) {
      FlatMapRestState<std::vector<Result>> st;
      r.read(st);
      rests_.assign(st.rests.begin(), st.rests.end());
      rest_traces_.clear();  // the restored expansions' provenance is unknown
    } else {
      FlatMapState<KeysIn<Out>> st{.pending = {.from = this}};
      r.read(st);
      pending_ = std::move(st.pending.values);
      next_ = 0;
      std::tie(parent_trace_, first_offset_) = parent_of_rest(st.pending.keys);  // unknown for data
      this->recomputed_ = st.pending.recomputed;
    }
    if (skips_) r.read(skipped_);
  }
  std::uint64_t skipped_elements() const override { return skipped_.skipped; }
  std::optional<std::uint64_t> input_taken() const override { return call_count(fn_); }
  bool counts_input() const override { return CountsCalls<Fn>; }
  void restore_input_taken(std::optional<std::uint64_t> taken) override { restore_call_count(fn_, taken); }
  std::vector<IterBase*> inputs() const override { return {input_.get()}; }
  bool carries_provenance() const override { return true; }
  bool one_base() const override { return input_->one_base(); }
  /// Output j of an element's expansion is made again by expanding the element again (a collected result
  /// of a function callable as const that keeps no count).
  bool recomputable() const override { return kRecomputes && input_->recomputable(); }
  Out recompute(const Provenance& p) const override {
    if constexpr (!kRecomputes) {
      return Iter<Out>::recompute(p);
    } else {
      std::uint64_t j = 0;
      const std::optional<Provenance> parent = without_last_offset(p, j);
      if (!parent) throw SnapshotError(this->label() + ": restore key " + to_string(p) + " has no offset in an expansion");
      if (!recomputed_expansion_ || recomputed_expansion_->first != *parent) {  // one expansion's rest: made once
        std::vector<Out> outputs;
        for (auto&& y : fn_(input_->recompute(*parent))) outputs.push_back(std::forward<decltype(y)>(y));
        recomputed_expansion_.emplace(*parent, std::move(outputs));
      }
      const std::vector<Out>& outputs = recomputed_expansion_->second;
      if (j >= outputs.size())
        throw SnapshotError(this->label() + ": restore key " + to_string(p) + " names output " + std::to_string(j) +
                            " of an expansion of " + std::to_string(outputs.size()));
      return outputs[j];
    }
  }

 private:
  using Result = map_result_t<In, Fn>;
  static constexpr bool kStreams = Expansion<Result>;
  static constexpr bool kRecomputes = !kStreams && !CountsCalls<Fn> && std::is_invocable_v<const Fn&, In&&>;
  struct NoRests {};

  /// The whole result of fn collected, then yielded from the pending list.
  std::size_t pull_collected(std::vector<Out>& out, std::size_t max) {
    std::size_t n = 0;
    while (n < max) {
      if (next_ < pending_.size()) {
        const std::size_t from = next_;
        n += detail::take_pending(pending_, next_, out, max - n);
        if (this->traced())
          for (std::size_t j = from; j < next_; ++j) this->traces().push_back(trace_of(j));
        continue;
      }
      scratch_.clear();
      if (input_->pull(scratch_, 1) == 0) break;
      if (this->traced()) parent_trace_ = std::move(input_->traces()[0]);
      pending_.clear();
      next_ = 0;
      first_offset_ = 0;
      try {
        for (auto&& y : fn_(std::move(scratch_[0]))) pending_.push_back(std::forward<decltype(y)>(y));
      } catch (...) {
        pending_.clear();
        if (skip_current_exception(fn_, skips_, skipped_)) continue;
        return this->fail_after(n);
      }
    }
    return n;
  }

  /// One output at a time from the front expansion; the next input only when it is done.
  std::size_t pull_streaming(std::vector<Out>& out, std::size_t max) {
    std::size_t n = 0;
    while (n < max) {
      if (this->traced() && rest_traces_.size() < rests_.size())
        rest_traces_.resize(rests_.size(), {unknown_provenance(), 0});  // restored expansions: unknown
      if (!rests_.empty()) {
        auto& r = rests_.front();
        if (r.empty()) {
          rests_.pop_front();
          if (this->traced()) rest_traces_.pop_front();
          continue;
        }
        out.push_back(r.front());
        r.pop_front();
        if (this->traced()) {
          auto& [parent, offset] = rest_traces_.front();
          this->traces().push_back(at_offset(parent, offset++));
        }
        ++n;
        continue;
      }
      scratch_.clear();
      if (input_->pull(scratch_, 1) == 0) break;
      try {
        rests_.push_back(fn_(std::move(scratch_[0])));
        if (this->traced()) rest_traces_.emplace_back(std::move(input_->traces()[0]), 0);
      } catch (...) {
        if (skip_current_exception(fn_, skips_, skipped_)) continue;
        return this->fail_after(n);
      }
    }
    return n;
  }

  std::unique_ptr<Iter<In>> input_;
  Fn fn_;
  bool skips_;
  SkipCountState skipped_;
  std::vector<Out> pending_;
  std::size_t next_ = 0;
  std::vector<In> scratch_;
  [[no_unique_address]] std::conditional_t<kStreams, std::deque<Result>, NoRests> rests_;
  // Traced: the provenance of the expansion under way (collected), or of each rest with the offset of
  // its next output (streaming). A restored expansion's is unknown.
  Provenance parent_trace_;
  std::uint64_t first_offset_ = 0;  // pending_[0]'s offset in its expansion (not 0 after a restore of keys)
  std::deque<std::pair<Provenance, std::uint64_t>> rest_traces_;
  mutable std::optional<std::pair<Provenance, std::vector<Out>>> recomputed_expansion_;  // recompute's last

  /// Traced: pending output j's provenance (its input's at its offset), unknown for a restored one.
  Provenance trace_of(std::size_t j) const {
    return is_known(parent_trace_) ? at_offset(parent_trace_, first_offset_ + j) : unknown_provenance();
  }
};

template <class In, class Fn>
std::unique_ptr<Iter<flat_map_result_t<In, Fn>>> FlatMapDef<In, Fn>::instantiate(BuildContext& ctx) const {
  return std::make_unique<FlatMapIter<In, Fn>>(ctx, *this);
}

template <class Fn>
auto flat_map(Fn fn, FlatMapOptions o = {}) {
  return make_closure([fn = std::move(fn), o = std::move(o)](const auto& p) {
    using In = typename std::decay_t<decltype(p)>::element_type;
    return make_pipeline<FlatMapDef<In, Fn>>(p.def(), fn, o);
  });
}

struct FlatMapKind {
  static constexpr std::string_view name = "flat_map";
  static constexpr std::string_view doc =
      "Replaces each element by the elements of the range a function returns, in order (a streamed expansion "
      "saves `rests` instead of `pending`).";
  /// Provenance (docs/design.md, "Provenance"; a kind without this line does not carry it).
  static constexpr std::string_view provenance = "output j of an expansion gets its input's at offset j; made again by expanding again (not a streaming function); what it holds is saved as restore keys";
  static constexpr ParamSchema params[] = {
      {.name = "fn", .type = ParamType::function,
       .doc = "the function: a builtin function's name, or a Python callable (absent: flatten, each list → its elements)",
       .fallback = "\"flatten\"", .positional = true},
      kFieldParam,
      kIntoParam,
      kOnErrorFunctionParam,
  };
  /// `skipped` only with on_error = skip.
  using State = FlatMapState<ElementBlobs, true>;

  /// Rescale: the pending outputs of every old instance are pooled and dealt (rescale::deal) to the new ones;
  /// for a streaming flat_map, the remainders of its expansions, each whole. Skip counts are summed into the
  /// first new instance.
  static RescaleRule rescale() {
    return RescaleRule::dealt([](const RescaleInput& in) {
      const bool streams = in.has_field(rescale::field_name(&FlatMapRestState<ElementBlobs>::rests));
      const bool counts = in.has_field(rescale::field_name(&SkipCountState::skipped));
      const auto dealt = [&]<class S>(S, auto member) {
        in.check_fields<S>();
        const auto parts = in.deal(member);
        std::uint64_t total = 0;
        if (counts) {
          const auto skipped = in.numbers(&S::skipped);
          for (std::size_t i = 0; i < skipped.size(); ++i) {
            if (skipped[i] > std::numeric_limits<std::uint64_t>::max() - total) in.refuse("the skip counts overflow");
            total += skipped[i];
          }
        }
        return in.write_slots([&](std::size_t j) {
          S s;
          s.*member = parts[j];
          s.skipped = j == 0 ? total : 0;
          return s;
        });
      };
      if (streams)
        return counts ? dealt(FlatMapRestState<ElementBlobs, true>{}, &FlatMapRestState<ElementBlobs, true>::rests)
                      : dealt(FlatMapRestState<ElementBlobs>{}, &FlatMapRestState<ElementBlobs>::rests);
      return counts ? dealt(FlatMapState<ElementBlobs, true>{}, &FlatMapState<ElementBlobs, true>::pending)
                    : dealt(FlatMapState<ElementBlobs>{}, &FlatMapState<ElementBlobs>::pending);
    });
  }
  /// `{"op": "flat_map", "fn": NAME, ...the function's parameters, "field": F, "into": G, "on_error": "skip"}`: a
  /// function the front end provides.
  template <class Spec>
  static SpecPipeline from_spec(Spec& s) {
    FlatMapOptions o{.name = s.name()};
    s.choice("on_error", o.on_error, {{"fail", OnDataError::fail}, {"skip", OnDataError::skip}});
    return s.flat_map_function([&](const auto& p, auto fn) { return p | flat_map(std::move(fn), o); }, o.on_error);
  }
};

}  // namespace dpipe
