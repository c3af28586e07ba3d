#pragma once
/// The engine's threads, behind a pimpl so no public header includes oneTBB (engine/executor.cpp).
/// Tasks are fire-and-forget; whoever submits one is responsible for waiting until it has finished
/// (AsyncLane does, with its own lock), so the executor itself never blocks a caller.
#include <cstddef>
#include <functional>
#include <memory>

namespace dpipe::detail {

class Executor {
 public:
  /// `threads` engine threads; 0 means one per core.
  explicit Executor(int threads);
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  int threads() const;
  /// Runs `task` on an engine thread, later. It must not throw.
  void submit(std::function<void()> task);
  /// Calls `body(i)` for every i in [0, n), spread over the engine threads; the caller takes part and
  /// returns when all calls have returned. The first exception is rethrown in the caller.
  void parallel_for(std::size_t n, const std::function<void(std::size_t)>& body);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dpipe::detail
