// The only translation unit of the library that includes oneTBB: an arena of engine threads.
#include "dpipe/detail/executor.hpp"

#include <oneapi/tbb/global_control.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/task_arena.h>

#include <algorithm>
#include <mutex>
#include <thread>

#include "dpipe/error.hpp"

// ThreadSanitizer cannot see the synchronisation inside Debian's (uninstrumented) oneTBB, so the
// hand-off of a task to an engine thread is announced to it explicitly: release before enqueue,
// acquire when the task starts. (Under TSan this file itself is compiled uninstrumented: see meson.build.)
#if defined(DPIPE_TSAN_ANNOTATE) || defined(__SANITIZE_THREAD__)
extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);
#define DPIPE_TSAN_RELEASE(p) __tsan_release(p)
#define DPIPE_TSAN_ACQUIRE(p) __tsan_acquire(p)
#else
#define DPIPE_TSAN_RELEASE(p) (void)(p)
#define DPIPE_TSAN_ACQUIRE(p) (void)(p)
#endif

namespace dpipe::detail {
namespace {

int hardware_threads() { return std::max(1, static_cast<int>(std::thread::hardware_concurrency())); }

/// oneTBB caps every arena at the process-wide parallelism limit (the core count by default). An
/// engine that asks for more threads than cores raises the limit for the rest of the process.
void allow_parallelism(int threads) {
  static std::mutex mu;
  static std::unique_ptr<oneapi::tbb::global_control> control;
  static int allowed = 0;
  const int wanted = threads + 1;  // the engine threads and the consumer
  std::lock_guard lock(mu);
  if (wanted <= std::max(allowed, hardware_threads())) return;
  auto next = std::make_unique<oneapi::tbb::global_control>(
      oneapi::tbb::global_control::max_allowed_parallelism, static_cast<std::size_t>(wanted));
  control = std::move(next);  // the new limit is in force before the old one is released
  allowed = wanted;
}

}  // namespace

struct Executor::Impl {
  explicit Impl(int n) : threads(n), arena(n, /*reserved_for_masters=*/0) {}
  int threads;
  oneapi::tbb::task_arena arena;
};

Executor::Executor(int threads) {
  if (threads < 0 || threads > 1024)
    throw ConfigError("engine threads must be between 0 (one per core) and 1024, got " + std::to_string(threads));
  const int n = threads == 0 ? hardware_threads() : threads;
  allow_parallelism(n);
  impl_ = std::make_unique<Impl>(n);
}

Executor::~Executor() = default;

int Executor::threads() const { return impl_->threads; }

void Executor::submit(std::function<void()> task) {
  auto* heap = new std::function<void()>(std::move(task));
  DPIPE_TSAN_RELEASE(heap);
  impl_->arena.enqueue([heap] {
    DPIPE_TSAN_ACQUIRE(heap);
    (*heap)();
    delete heap;
  });
}

void Executor::parallel_for(std::size_t n, const std::function<void(std::size_t)>& body) {
  if (n == 0) return;
  if (n == 1) {
    body(0);
    return;
  }
  int token = 0;  // a sync address for ThreadSanitizer: inputs flow out to the calls, results back
  DPIPE_TSAN_RELEASE(&token);
  // Isolated: while it waits for its iterations, this thread must not pick up another worker's task,
  // which could need a lock the caller holds (a dispatcher pulling its prefix through a parallel_map).
  impl_->arena.execute([&] {
    oneapi::tbb::this_task_arena::isolate([&] {
      oneapi::tbb::parallel_for(std::size_t{0}, n, [&](std::size_t i) {
        DPIPE_TSAN_ACQUIRE(&token);
        body(i);
        DPIPE_TSAN_RELEASE(&token);
      });
    });
  });
  DPIPE_TSAN_ACQUIRE(&token);
}

}  // namespace dpipe::detail
