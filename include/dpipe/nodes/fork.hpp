#pragma once
/// Every element to every output, as torch's fork. In: T → Out: T on each of `count` outputs.
/// `auto [a, b] = p | fork<2>();` or `std::vector<Pipeline<T>> v = p | fork({.count = 3});`; output 0
/// continues the chain, the others are `from` nodes (nodes/from.hpp). State: per output, the elements
/// it has not taken yet: at most `buffer` between the output furthest ahead and the one furthest behind
/// (one more is a ConfigError naming the fork, as torch's BufferError). Rescale: refused (kit/split.hpp).
#include <array>
#include <string>
#include <utility>

#include "dpipe/kit/length.hpp"
#include "dpipe/kit/rescale.hpp"
#include "dpipe/kit/spec.hpp"
#include "dpipe/kit/split.hpp"
#include "dpipe/nodes/from.hpp"

namespace dpipe {

struct ForkOptions {
  std::int64_t count = 2;
  /// Elements the output furthest ahead may be ahead of the one furthest behind (torch's buffer_size).
  /// dpipe moves elements in chunks (up to 256), so zip of two outputs holds up to a chunk.
  std::int64_t buffer = 1000;
  std::string name{};
};

/// How a fork routes: a copy of each element to every output.
struct ForkRoute {
  std::string label;
  template <class T>
  std::size_t held(const SplitQueues<T>& q, std::size_t output) const {
    return longest_other_queue(q, output);
  }
  template <class T>
  void route(std::vector<T>& chunk, SplitQueues<T>& q, std::vector<Provenance>* traces, TraceQueues* tq) const {
    for (std::size_t j = 1; j < q.size(); ++j) q[j].append_copied(chunk);
    q[0].append_moved(chunk);
    if (!tq) return;
    for (std::size_t j = 1; j < tq->size(); ++j) (*tq)[j].append_copied(*traces);
    (*tq)[0].append_moved(*traces);
  }
  /// Every output's element is the input's.
  template <class T>
  T remake(const Iter<T>& input, const Provenance& p) const {
    return input.recompute(p);
  }
  template <class T>
  std::string overflow(const SplitQueues<T>& q, std::size_t output, std::size_t buffer) const {
    std::size_t behind = 0;
    for (std::size_t j = 0; j < q.size(); ++j)
      if (j != output && q[j].size() >= q[behind].size()) behind = j;
    return label + ": output " + std::to_string(output) + " is " + std::to_string(q[behind].size()) +
           " elements ahead of output " + std::to_string(behind) + ", more than its buffer (" + std::to_string(buffer) +
           ") allows: read its outputs more evenly (zip them) or raise buffer";
  }
};

/// The fork node (its output 0); outputs_of() gives them all.
template <Snapshottable T>
Pipeline<T> fork_node(const Pipeline<T>& p, const ForkOptions& o) {
  return make_pipeline<SplitDef<T, T, ForkRoute>>("fork", o.name, split_params("fork", o.name, o.count, o.buffer), p.def(),
                                                  static_cast<std::size_t>(o.count), static_cast<std::size_t>(o.buffer),
                                                  ForkRoute{node_label("fork", o.name)});
}

/// `p | fork({.count = n})`: the n outputs, output 0 first.
inline auto fork(ForkOptions o = {}) {
  return make_closure([o = std::move(o)](const auto& p) { return outputs_of(fork_node(p, o)); });
}

/// `auto [a, b] = p | fork<2>();` (the count is N).
template <std::size_t N>
auto fork(ForkOptions o = {}) {
  static_assert(N >= 1, "a fork has at least one output");
  o.count = static_cast<std::int64_t>(N);
  return make_closure([o = std::move(o)](const auto& p) { return outputs_array<N>(fork_node(p, o)); });
}

struct ForkKind {
  static constexpr std::string_view name = "fork";
  static constexpr LengthFn length = &same_length;
  static constexpr std::string_view doc =
      "Every element to each of `count` outputs (torch's fork); output 0 continues the chain, output i is "
      "read with {\"op\": \"from\", \"name\": NAME, \"output\": i}.";
  static constexpr std::string_view provenance = "each output's element has the input's; what the outputs hold is saved as restore keys";
  static constexpr ParamSchema params[] = {
      {.name = "count", .type = ParamType::integer,
       .doc = "how many outputs, 1 to 1024 (absent: output 0 and every output a `from` reads)", .fallback = "null",
       .positional = true, .torch = "num_instances"},
      {.name = "buffer", .type = ParamType::integer,
       .doc = "elements the output furthest ahead may be ahead of the one furthest behind",
       .fallback = "1000", .torch = "buffer_size"},
  };
  using State = SplitState<ElementBlobs>;
  static RescaleRule rescale() { return RescaleRule::refused(kSplitNotDealt); }
  /// `{"op": "fork", "name": N, "count": C, "buffer": B}`: its other outputs are read by `from` nodes.
  template <class Spec>
  static SpecPipeline from_spec(Spec& s) {
    ForkOptions o{.name = s.name()};
    std::optional<std::int64_t> count;
    s.param("count", count);
    s.param("buffer", o.buffer);
    if (o.name.empty()) throw ConfigError("fork: name it (\"name\": N), so that {\"op\": \"from\", \"name\": N} can read its other outputs");
    o.count = count ? *count : static_cast<std::int64_t>(s.outputs_read(o.name));
    return s.input().apply([&](const auto& p) { return fork_node(p, o); });
  }
};

}  // namespace dpipe
