#pragma once
/// Stream lengths, as a kind declares them (`XKind::length`) and `Graph::length` combines them: how many
/// elements one instance of a layout delivers, when every node on the way can say (tf.data's
/// cardinality). A kind that cannot say (a filter, a file source) declares none.
#include <algorithm>
#include <charconv>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string_view>

#include "dpipe/kit/rescale.hpp"
#include "dpipe/kit/schema.hpp"

namespace dpipe {

/// The instance a stream is counted on.
struct LengthAt {
  int rank = 0, world_size = 1, worker = 0, num_workers = 1;
  bool worker_segment = true;  // false: the rank's part before dispatch or after merge

  /// Of `n` elements dealt position by position over `levels` (Split::kRank, kWorker, kSegment: the
  /// levels of the node's segment), how many reach this instance.
  std::uint64_t share(std::uint64_t n, unsigned levels) const {
    if (levels & Split::kSegment)
      levels = (levels & ~Split::kSegment) | (worker_segment ? Split::kRank | Split::kWorker : Split::kRank);
    std::uint64_t index = 0, count = 1;
    if (levels & Split::kRank) {
      index = static_cast<std::uint64_t>(rank);
      count = static_cast<std::uint64_t>(world_size);
    }
    if (levels & Split::kWorker) {
      index = index * static_cast<std::uint64_t>(num_workers) + static_cast<std::uint64_t>(worker);
      count *= static_cast<std::uint64_t>(num_workers);
    }
    return n / count + (index < n % count ? 1 : 0);
  }
};

/// A kind's stream length on one instance, from its parameters and its inputs' lengths (all known);
/// nullopt when it cannot say.
using LengthFn = std::optional<std::uint64_t> (*)(const std::vector<std::pair<std::string, std::string>>& params,
                                                  std::span<const std::uint64_t> inputs, const LengthAt& at);

/// The integer value of parameter `key` as N (std::uint64_t: not negative), or nullopt ("forever", absent).
template <class N>
std::optional<N> number_param(const std::vector<std::pair<std::string, std::string>>& params, std::string_view key) {
  const std::string_view text = param_of(params, key);
  N v = 0;
  const auto r = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || r.ec != std::errc{} || r.ptr != text.data() + text.size()) return std::nullopt;
  return v;
}
inline std::optional<std::uint64_t> count_param(const std::vector<std::pair<std::string, std::string>>& params,
                                                std::string_view key) {
  return number_param<std::uint64_t>(params, key);
}

/// `length` of a kind that passes every element of its one input on.
inline std::optional<std::uint64_t> same_length(const std::vector<std::pair<std::string, std::string>>&,
                                                std::span<const std::uint64_t> inputs, const LengthAt&) {
  return inputs.empty() ? std::nullopt : std::optional<std::uint64_t>(inputs[0]);
}

/// `length` of a kind that passes every element on unless its function may throw and be skipped.
inline std::optional<std::uint64_t> same_length_unless_skipping(
    const std::vector<std::pair<std::string, std::string>>& params, std::span<const std::uint64_t> inputs,
    const LengthAt& at) {
  if (param_of(params, "on_error") == "skip") return std::nullopt;
  return same_length(params, inputs, at);
}

/// `length` of a kind that delivers every element of every input.
inline std::optional<std::uint64_t> summed_length(const std::vector<std::pair<std::string, std::string>>&,
                                                  std::span<const std::uint64_t> inputs, const LengthAt&) {
  std::uint64_t sum = 0;
  for (std::uint64_t n : inputs) {
    if (sum + n < sum) return std::nullopt;
    sum += n;
  }
  return sum;
}

/// `length` of a kind that batches `size` elements, the short last batch unless `drop_last`.
inline std::optional<std::uint64_t> batched_length(const std::vector<std::pair<std::string, std::string>>& params,
                                                   std::span<const std::uint64_t> inputs, const LengthAt&) {
  const auto size = count_param(params, "size");
  if (inputs.empty() || !size || *size == 0) return std::nullopt;
  return inputs[0] / *size + (param_of(params, "drop_last") != "true" && inputs[0] % *size ? 1 : 0);
}

/// a × b, or nullopt past 2^64 − 1.
inline std::optional<std::uint64_t> times(std::uint64_t a, std::uint64_t b) {
  if (a != 0 && b > std::numeric_limits<std::uint64_t>::max() / a) return std::nullopt;
  return a * b;
}

}  // namespace dpipe
