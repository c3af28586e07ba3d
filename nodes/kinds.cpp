// The kind registry, made from the list in dpipe/kinds.hpp.
#include "dpipe/kinds.hpp"

#include <algorithm>

namespace dpipe {
namespace {

template <class... K>
std::vector<KindInfo> make_registry(KindList<K...>) {
  std::vector<KindInfo> v{kind_info<K>()...};
  for (std::size_t i = 0; i < v.size(); ++i)
    for (std::size_t j = i + 1; j < v.size(); ++j)
      if (v[i].name == v[j].name)
        throw ConfigError("internal: node kind '" + std::string(v[i].name) + "' is registered twice");
  return v;
}

}  // namespace

const std::vector<KindInfo>& registered_kinds() {
  static const std::vector<KindInfo> kinds = make_registry(AllKinds{});
  return kinds;
}

const KindInfo* find_kind(std::string_view name) {
  const auto& kinds = registered_kinds();
  const auto it = std::find_if(kinds.begin(), kinds.end(), [&](const KindInfo& k) { return k.name == name; });
  return it == kinds.end() ? nullptr : &*it;
}

}  // namespace dpipe
