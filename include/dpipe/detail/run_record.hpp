#pragma once
/// The engine's own record in every snapshot, key and kind "run", one per rank: what the consumer was
/// handed and the elements it pulled and has not handed out yet. `Elems` is std::vector<T> in a Run,
/// ElementBlobs in the rescale driver.
#include <cstdint>

namespace dpipe::detail {

template <class Elems>
struct RunRecord {
  std::uint64_t delivered = 0;
  Elems pending{};
  template <class A>
  void fields(A& a) {
    a("delivered", delivered);
    a("pending", pending);
  }
};

}  // namespace dpipe::detail
