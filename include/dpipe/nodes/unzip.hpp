#pragma once
/// Rows to one stream per column, as torch's unzip. In: std::vector<T> (rows of `count` values, as zip
/// makes them) → Out: T on each of `count` outputs, output j giving column j. A row of another length
/// fails the run. `std::vector<Pipeline<T>> v = p | unzip({.count = 2});` (or `unzip<2>()` for
/// `auto [a, b]`). State: per output, the values it has not taken yet: at most `buffer` between the
/// output furthest ahead and the one furthest behind. Rescale: refused (kit/split.hpp).
#include <array>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "dpipe/kit/length.hpp"
#include "dpipe/kit/rescale.hpp"
#include "dpipe/kit/spec.hpp"
#include "dpipe/kit/split.hpp"
#include "dpipe/nodes/fork.hpp"
#include "dpipe/nodes/from.hpp"

namespace dpipe {

struct UnzipOptions {
  std::int64_t count = 2;
  /// Values the output furthest ahead may be ahead of the one furthest behind (torch's buffer_size).
  std::int64_t buffer = 1000;
  std::string name{};
};

/// How an unzip routes: value j of each row to output j.
struct UnzipRoute {
  ForkRoute lag;  // the same bound as a fork's
  template <class T>
  std::size_t held(const SplitQueues<T>& q, std::size_t output) const {
    return lag.held(q, output);
  }
  template <class T>
  void route(std::vector<std::vector<T>>& rows, SplitQueues<T>& q, std::vector<Provenance>* traces, TraceQueues* tq) const {
    for (std::size_t i = 0; i < rows.size(); ++i) {
      auto& row = rows[i];
      if (row.size() != q.size())
        throw std::length_error("a row of " + std::to_string(row.size()) + " values; it splits rows of " +
                                std::to_string(q.size()));
      for (std::size_t j = 0; j < q.size(); ++j) q[j].push_back(std::move(row[j]));
      if (tq)  // value j of a row: the row's provenance at offset j, as unbatch's
        for (std::size_t j = 0; j < q.size(); ++j) (*tq)[j].push_back(at_offset((*traces)[i], j));
    }
  }
  /// Value j of the row of the key without its last offset j.
  template <class T>
  T remake(const Iter<std::vector<T>>& input, const Provenance& p) const {
    std::uint64_t j = 0;
    const std::optional<Provenance> row = without_last_offset(p, j);
    if (!row) throw SnapshotError(lag.label + ": a restore key names no value of a row (" + to_string(p) + ")");
    std::vector<T> values = input.recompute(*row);
    if (j >= values.size()) throw SnapshotError(lag.label + ": a restore key names value " + std::to_string(j) + " of a row of " + std::to_string(values.size()));
    return std::move(values[j]);
  }
  template <class T>
  std::string overflow(const SplitQueues<T>& q, std::size_t output, std::size_t buffer) const {
    return lag.overflow(q, output, buffer);
  }
};

/// The unzip node (its output 0: column 0); outputs_of() gives them all.
template <Snapshottable T>
Pipeline<T> unzip_node(const Pipeline<std::vector<T>>& p, const UnzipOptions& o) {
  return make_pipeline<SplitDef<std::vector<T>, T, UnzipRoute>>(
      "unzip", o.name, split_params("unzip", o.name, o.count, o.buffer), p.def(), static_cast<std::size_t>(o.count),
      static_cast<std::size_t>(o.buffer), UnzipRoute{ForkRoute{node_label("unzip", o.name)}});
}

/// `p | unzip({.count = n})`: the n columns, column 0 first.
inline auto unzip(UnzipOptions o = {}) {
  return make_closure([o = std::move(o)](const auto& p) { return outputs_of(unzip_node(p, o)); });
}

/// `auto [a, b] = p | unzip<2>();` (the count is N).
template <std::size_t N>
auto unzip(UnzipOptions o = {}) {
  static_assert(N >= 1, "an unzip has at least one output");
  o.count = static_cast<std::int64_t>(N);
  return make_closure([o = std::move(o)](const auto& p) { return outputs_array<N>(unzip_node(p, o)); });
}

struct UnzipKind {
  static constexpr std::string_view name = "unzip";
  static constexpr LengthFn length = &same_length;
  static constexpr std::string_view doc =
      "Rows (zip's) to one stream per column (torch's unzip): output j gives value j of each row; output 0 "
      "continues the chain, output i is read with {\"op\": \"from\", \"name\": NAME, \"output\": i}.";
  static constexpr std::string_view provenance = "value j of a row has the row's at offset j; what the outputs hold is saved as restore keys";
  static constexpr ParamSchema params[] = {
      {.name = "count", .type = ParamType::integer,
       .doc = "values per row, 1 to 1024 (absent: output 0 and every output a `from` reads)", .fallback = "null",
       .positional = true},
      {.name = "buffer", .type = ParamType::integer,
       .doc = "values the output furthest ahead may be ahead of the one furthest behind (torch's buffer_size)",
       .fallback = "1000"},
  };
  using State = SplitState<ElementBlobs>;
  static RescaleRule rescale() { return RescaleRule::refused(kSplitNotDealt); }
  /// `{"op": "unzip", "name": N, "count": C, "buffer": B}`: its input yields rows (batches).
  template <class Spec>
  static SpecPipeline from_spec(Spec& s) {
    UnzipOptions o{.name = s.name()};
    std::optional<std::int64_t> count;
    s.param("count", count);
    s.param("buffer", o.buffer);
    if (o.name.empty()) throw ConfigError("unzip: name it (\"name\": N), so that {\"op\": \"from\", \"name\": N} can read its other outputs");
    o.count = count ? *count : static_cast<std::int64_t>(s.outputs_read(o.name));
    return s.input().apply([&]<class T>(const Pipeline<T>& p) requires detail::is_vector_v<T> { return unzip_node(p, o); },
                           "unzip takes rows (zip's, or batches)");
  }
};

}  // namespace dpipe
