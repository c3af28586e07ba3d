// One part of the JSON front end's op table: the kinds at positions p of dpipe/kinds.hpp with
// p mod kOpParts == DPIPE_OPS_PART. Compiled once per part, so the kinds' spec builders, each instantiated
// for every spec element type, are spread over several translation units.
#include <utility>

#include "dpipe/kinds.hpp"
#include "json_node.hpp"

namespace dpipe::json_spec_detail {
namespace {

template <std::size_t I, class K>
void add_if_in_part(std::vector<std::pair<std::size_t, OpEntry>>& out) {
  if constexpr (I % kOpParts == DPIPE_OPS_PART)
    out.emplace_back(I, OpEntry{K::name, is_source<K>(), reads_by_index<K>(), [](JsonNode& n) { return K::from_spec(n); }});
}

template <class... K, std::size_t... I>
std::vector<std::pair<std::size_t, OpEntry>> entries(KindList<K...>, std::index_sequence<I...>) {
  std::vector<std::pair<std::size_t, OpEntry>> out;
  (add_if_in_part<I, K>(out), ...);
  return out;
}

template <class... K>
std::vector<std::pair<std::size_t, OpEntry>> entries(KindList<K...> kinds) {
  return entries(kinds, std::index_sequence_for<K...>{});
}

}  // namespace

template <>
std::vector<std::pair<std::size_t, OpEntry>> op_part<DPIPE_OPS_PART>() {
  return entries(AllKinds{});
}

}  // namespace dpipe::json_spec_detail
