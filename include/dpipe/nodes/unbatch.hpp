#pragma once
/// Yields the elements of each batch in order. In: std::vector<T> → Out: T. State: the rest of the
/// current batch.
#include <iterator>
#include <string>

#include "dpipe/pipeline.hpp"
#include "dpipe/kit/rescale.hpp"
#include "dpipe/kit/restore_keys.hpp"
#include "dpipe/kit/spec.hpp"

namespace dpipe {

/// An unbatch's saved state: the rest of the current batch. `Elems` is std::vector<T> in the node.
template <class Elems>
struct UnbatchState {
  Elems rest{};
  template <class A>
  void fields(A& a) {
    a("rest", rest);
  }
};

struct UnbatchOptions {
  std::string name{};
};

template <Snapshottable T>
class UnbatchDef final : public NodeDef<T> {
 public:
  UnbatchDef(std::shared_ptr<const NodeDef<std::vector<T>>> in, UnbatchOptions o)
      : NodeDef<T>("unbatch", o.name, {}, {in}), input_(std::move(in)) {}
  std::unique_ptr<Iter<T>> instantiate(BuildContext& ctx) const override;
  const NodeDef<std::vector<T>>& input() const { return *input_; }

 private:
  std::shared_ptr<const NodeDef<std::vector<T>>> input_;
};

template <Snapshottable T>
class UnbatchIter final : public Hooked<T> {
 public:
  UnbatchIter(BuildContext& ctx, const UnbatchDef<T>& def) : Hooked<T>(ctx, "unbatch"), input_(def.input().instantiate(ctx)) {}

 protected:
  std::size_t pull_chunk(std::vector<T>& out, std::size_t max) override {
    std::size_t n = 0;
    while (n < max) {
      if (next_ < current_.size()) {
        const std::size_t k = std::min(max - n, current_.size() - next_);
        std::move(current_.begin() + std::ptrdiff_t(next_), current_.begin() + std::ptrdiff_t(next_ + k),
                  std::back_inserter(out));
        if (this->traced())
          for (std::size_t j = next_; j < next_ + k; ++j) this->traces().push_back(trace_of(j));
        next_ += k;
        n += k;
        continue;
      }
      batches_.clear();
      if (input_->pull(batches_, 1) == 0) break;
      current_ = std::move(batches_[0]);
      next_ = 0;
      first_offset_ = 0;
      if (this->traced()) current_trace_ = std::move(input_->traces()[0]);
    }
    return n;
  }
  bool carries_provenance() const override { return true; }
  /// Element j of a batch is made again from the batch's key.
  bool recomputable() const override { return input_->recomputable(); }
  T recompute(const Provenance& p) const override {
    std::uint64_t j = 0;
    const std::optional<Provenance> parent = without_last_offset(p, j);
    if (!parent) throw SnapshotError(this->label() + ": restore key " + to_string(p) + " has no offset in a batch");
    if (!recomputed_batch_ || recomputed_batch_->first != *parent)  // the rest of one batch: made once
      recomputed_batch_.emplace(*parent, input_->recompute(*parent));
    const std::vector<T>& b = recomputed_batch_->second;
    if (j >= b.size())
      throw SnapshotError(this->label() + ": restore key " + to_string(p) + " names element " + std::to_string(j) +
                          " of a batch of " + std::to_string(b.size()));
    return b[j];
  }
  void save_state(StateWriter& w) const override {
    const TailView<T> rest{&current_, next_};
    if (!this->traced() || !recomputable()) return w.write(UnbatchState<std::vector<T>>{{current_.begin() + std::ptrdiff_t(next_), current_.end()}});
    std::vector<Provenance> keys;  // restore keys: this node makes its own elements again
    for (std::size_t j = next_; j < current_.size(); ++j) keys.push_back(trace_of(j));
    w.write(UnbatchState<KeysOut<T, TailView<T>>>{{&rest, &keys}});
  }
  void restore_state(StateReader& r) override {
    UnbatchState<KeysIn<T>> st{.rest = {.from = this}};
    r.read(st);
    current_ = std::move(st.rest.values);
    next_ = 0;
    std::tie(current_trace_, first_offset_) = parent_of_rest(st.rest.keys);  // unknown for data
    this->recomputed_ = st.rest.recomputed;
  }
  std::vector<IterBase*> inputs() const override { return {input_.get()}; }

 private:
  std::unique_ptr<Iter<std::vector<T>>> input_;
  std::vector<T> current_;
  std::size_t next_ = 0;
  std::vector<std::vector<T>> batches_;
  Provenance current_trace_;  // traced: the batch's
  std::uint64_t first_offset_ = 0;  // current_[0]'s offset in its batch (not 0 after a restore of keys)
  mutable std::optional<std::pair<Provenance, std::vector<T>>> recomputed_batch_;  // recompute's last batch

  /// Element `j` of the current batch: the batch's provenance at offset `j` (a map between the batch and
  /// here may have reordered its elements, so its base elements are not matched to its elements).
  Provenance trace_of(std::size_t j) const {
    return is_known(current_trace_) ? at_offset(current_trace_, first_offset_ + j) : unknown_provenance();
  }
};

template <Snapshottable T>
std::unique_ptr<Iter<T>> UnbatchDef<T>::instantiate(BuildContext& ctx) const {
  return std::make_unique<UnbatchIter<T>>(ctx, *this);
}

inline auto unbatch(UnbatchOptions o = {}) {
  return make_closure([o = std::move(o)](const auto& p) {
    using B = typename std::decay_t<decltype(p)>::element_type;
    static_assert(detail::is_vector_v<B>, "unbatch takes a pipeline of batches (std::vector<T>)");
    return make_pipeline<UnbatchDef<typename B::value_type>>(p.def(), o);
  });
}

struct UnbatchKind {
  static constexpr std::string_view name = "unbatch";
  static constexpr std::string_view doc =
      "The elements of each batch, in order.";
  /// Provenance (docs/design.md, "Provenance"; a kind without this line does not carry it).
  static constexpr std::string_view provenance = "element j of a batch gets the batch's at offset j; what it holds is saved as restore keys";
  static constexpr ParamSchema params[] = {
      {.name = "level", .type = ParamType::integer,
       .doc = "levels of batches removed: 1, 2, … (one unbatch node each; a name goes to the first), -1 all, 0 none",
       .fallback = "1", .torch = "unbatch_level"},
  };
  using State = UnbatchState<ElementBlobs>;
  static RescaleRule rescale() { return RescaleRule::refused(rescale::kNotDealt); }
  /// `{"op": "unbatch", "level": 1}`
  template <class Spec>
  static SpecPipeline from_spec(Spec& s) {
    UnbatchOptions o{.name = s.name()};
    std::int64_t level = 1;
    s.param("level", level);
    if (level < -1) throw ConfigError(node_label("unbatch", o.name) + ": level must be -1 (all), 0 or more, got " + std::to_string(level));
    SpecPipeline p = s.input();
    auto batches = [](const SpecPipeline& q) { return q.visit([]<class T>(const Pipeline<T>&) { return detail::is_vector_v<T>; }); };
    for (std::int64_t k = 0; level == -1 ? batches(p) || k == 0 : k < level; ++k) {
      if (!batches(p) && k > 0)
        throw ConfigError(node_label("unbatch", o.name) + ": level " + std::to_string(level) + " needs " + std::to_string(level) +
                          " levels of batches, its input has " + std::to_string(k));
      p = p.apply([&]<class T>(const Pipeline<T>& q) requires detail::is_vector_v<T> { return q | unbatch(o); },
                  "unbatch takes batches");
      o.name.clear();  // keys of their own for the unbatch nodes after the first
    }
    return p;
  }
};

}  // namespace dpipe
