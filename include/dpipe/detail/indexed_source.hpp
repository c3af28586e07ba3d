#pragma once
/// The iterator of a random-access source read on its own (no sampler): every element in index order,
/// on every worker, like `range`. State: the next index.
#include <string>

#include "dpipe/kit/node.hpp"

namespace dpipe {

/// The saved state of a random-access source read on its own (records, token_windows): the next index.
struct IndexedSourceState {
  std::uint64_t next = 0;
  template <class A>
  void fields(A& a) {
    a("next", next);
  }
};

}  // namespace dpipe

namespace dpipe::detail {

template <class T>
class IndexedSourceIter final : public Hooked<T> {
 public:
  /// `source` is borrowed from the node definition, which outlives the Run.
  IndexedSourceIter(BuildContext& ctx, const RandomAccess<T>& source, std::string kind)
      : Hooked<T>(ctx, std::move(kind)), source_(source), prefetch_(source.prefetches()) {}

 protected:
  std::size_t pull_chunk(std::vector<T>& out, std::size_t max) override {
    std::size_t n = 0;
    const std::uint64_t size = source_.size();
    for (; n < max && next_ < size; ++n) {
      if (prefetch_ && next_ + 1 < size) source_.prefetch(next_ + 1);
      this->trace_source(next_);
      out.push_back(source_.at(next_++));
    }
    return n;
  }
  bool carries_provenance() const override { return true; }
  bool one_base() const override { return true; }
  bool recomputable() const override { return true; }
  T recompute(const Provenance& p) const override { return this->recompute_at(source_, p); }
  bool holds_no_elements() const override { return true; }
  void save_state(StateWriter& w) const override { w.write(IndexedSourceState{next_}); }
  void restore_state(StateReader& r) override {
    IndexedSourceState st;
    r.read(st);
    next_ = st.next;
    if (next_ > source_.size())
      r.fail("element " + std::to_string(next_) + " is past the last of " + std::to_string(source_.size()));
  }
  std::vector<IterBase*> inputs() const override { return {}; }

 private:
  const RandomAccess<T>& source_;
  const bool prefetch_;  // the source does something with prefetch hints
  std::uint64_t next_ = 0;
};

}  // namespace dpipe::detail
