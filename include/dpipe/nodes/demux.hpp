#pragma once
/// Each element to the one output its function picks, as torch's demux. In: T → Out: T on each of
/// `count` outputs; `fn(const T&)` returns the output, 0 to count − 1 (another value fails the run).
/// `std::vector<Pipeline<T>> v = p | demux(fn, {.count = 2});` (or `demux<2>(fn)` for `auto [a, b]`).
/// State: per output, the elements routed to it that it has not taken yet: at most `buffer` for the
/// outputs other than the one asking (one more is a ConfigError naming the demux, as torch's BufferError). Rescale: refused (kit/split.hpp).
#include <array>
#include <concepts>
#include <stdexcept>
#include <string>
#include <utility>

#include "dpipe/kit/rescale.hpp"
#include "dpipe/kit/spec.hpp"
#include "dpipe/kit/split.hpp"
#include "dpipe/nodes/from.hpp"
#include "dpipe/nodes/map.hpp"

namespace dpipe {

struct DemuxOptions {
  std::int64_t count = 2;
  /// Elements held for outputs that have not taken them yet, all outputs together (torch's buffer_size).
  std::int64_t buffer = 1000;
  std::string name{};
};

/// How a demux routes: to the output `fn` picks.
template <class Fn>
struct DemuxRoute {
  Fn fn;
  std::string label;
  /// The elements held for the outputs other than the one asking (torch's buffer usage).
  template <class T>
  std::size_t held(const SplitQueues<T>& q, std::size_t output) const {
    std::size_t n = 0;
    for (std::size_t j = 0; j < q.size(); ++j)
      if (j != output) n += q[j].size();
    return n;
  }
  template <class T>
  void route(std::vector<T>& chunk, SplitQueues<T>& q, std::vector<Provenance>* traces, TraceQueues* tq) const {
    for (std::size_t i = 0; i < chunk.size(); ++i) {
      const auto j = static_cast<std::int64_t>(fn(std::as_const(chunk[i])));  // a bool picks output 0 or 1
      if (std::cmp_less(j, 0) || std::cmp_greater_equal(j, q.size()))
        throw std::out_of_range("its function returned " + std::to_string(j) +
                                " for an element; the outputs are 0 to " + std::to_string(q.size() - 1));
      q[static_cast<std::size_t>(j)].push_back(std::move(chunk[i]));
      if (tq) (*tq)[static_cast<std::size_t>(j)].push_back(std::move((*traces)[i]));
    }
  }
  /// An output's element is the input's (the function picked the output only).
  template <class T>
  T remake(const Iter<T>& input, const Provenance& p) const {
    return input.recompute(p);
  }
  template <class T>
  std::string overflow(const SplitQueues<T>& q, std::size_t output, std::size_t buffer) const {
    return label + ": it holds " + std::to_string(held(q, output)) + " elements for outputs other than output " +
           std::to_string(output) + ", more than its buffer (" + std::to_string(buffer) +
           "): read its outputs more evenly or raise buffer";
  }
};

/// The demux node (its output 0); outputs_of() gives them all.
template <Snapshottable T, class Fn>
  requires std::integral<std::invoke_result_t<const Fn&, const T&>>
Pipeline<T> demux_node(const Pipeline<T>& p, Fn fn, const DemuxOptions& o) {
  Params params = split_params("demux", o.name, o.count, o.buffer);
  for (auto& kv : describe_fn(fn)) params.push_back(std::move(kv));
  return make_pipeline<SplitDef<T, T, DemuxRoute<Fn>>>("demux", o.name, std::move(params), p.def(),
                                                       static_cast<std::size_t>(o.count), static_cast<std::size_t>(o.buffer),
                                                       DemuxRoute<Fn>{std::move(fn), node_label("demux", o.name)});
}

/// `p | demux(fn, {.count = n})`: the n outputs, output 0 first.
template <class Fn>
auto demux(Fn fn, DemuxOptions o = {}) {
  return make_closure([fn = std::move(fn), o = std::move(o)](const auto& p) { return outputs_of(demux_node(p, fn, o)); });
}

/// `auto [a, b] = p | demux<2>(fn);` (the count is N).
template <std::size_t N, class Fn>
auto demux(Fn fn, DemuxOptions o = {}) {
  static_assert(N >= 1, "a demux has at least one output");
  o.count = static_cast<std::int64_t>(N);
  return make_closure([fn = std::move(fn), o = std::move(o)](const auto& p) { return outputs_array<N>(demux_node(p, fn, o)); });
}

struct DemuxKind {
  static constexpr std::string_view name = "demux";
  static constexpr std::string_view doc =
      "Each element to the one of `count` outputs its function picks (torch's demux); output 0 continues the "
      "chain, output i is read with {\"op\": \"from\", \"name\": NAME, \"output\": i}.";
  static constexpr std::string_view provenance = "an output's element has the input's; what the outputs hold is saved as restore keys";
  static constexpr ParamSchema params[] = {
      {.name = "fn", .type = ParamType::function, .doc = "the function: element → output (0 to count − 1)", .positional = true,
       .torch = "classifier_fn"},
      {.name = "count", .type = ParamType::integer,
       .doc = "how many outputs, 1 to 1024 (absent: output 0 and every output a `from` reads)", .fallback = "null",
       .torch = "num_instances"},
      {.name = "buffer", .type = ParamType::integer,
       .doc = "elements held for outputs that have not taken them yet, all outputs together",
       .fallback = "1000", .torch = "buffer_size"},
  };
  using State = SplitState<ElementBlobs>;
  static RescaleRule rescale() { return RescaleRule::refused(kSplitNotDealt); }
  /// `{"op": "demux", "name": N, "fn": F, "count": C, "buffer": B}`.
  template <class Spec>
  static SpecPipeline from_spec(Spec& s) {
    DemuxOptions o{.name = s.name()};
    std::optional<std::int64_t> count;
    s.param("count", count);
    s.param("buffer", o.buffer);
    if (o.name.empty()) throw ConfigError("demux: name it (\"name\": N), so that {\"op\": \"from\", \"name\": N} can read its other outputs");
    o.count = count ? *count : static_cast<std::int64_t>(s.outputs_read(o.name));
    return s.demux_function(o);
  }
};

}  // namespace dpipe
