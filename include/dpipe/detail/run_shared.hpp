#pragma once
/// Objects that the worker chains of one Run share, found by node key when the chains are built
/// (a `dispatch` node's dispatcher). Owned by the Run; the chains hold shared references.
#include <map>
#include <memory>
#include <string>

namespace dpipe::detail {

struct RunShared {
  std::map<std::string, std::shared_ptr<void>> objects;
};

}  // namespace dpipe::detail
