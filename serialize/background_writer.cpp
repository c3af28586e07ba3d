// SnapshotSet::write_rank_async: one writer thread per process, started on the first write, taking the
// snapshots in the order they were submitted. One thread (not one per write) keeps a later step's file
// from being written before an earlier one's, which the earlier write would then remove as older.
#include <pthread.h>

#include <condition_variable>
#include <deque>
#include <future>
#include <mutex>
#include <new>
#include <thread>

#include "dpipe/snapshot_set.hpp"

namespace dpipe {
namespace {

class BackgroundWriter {
 public:
  static BackgroundWriter& instance() {
    static BackgroundWriter writer;  // destroyed at exit, after the writes already submitted are done
    return writer;
  }

  std::future<void> submit(std::packaged_task<void()> task) {
    std::future<void> done = task.get_future();
    const std::lock_guard lock(mu_);
    if (!thread_) thread_ = new std::thread([this] { loop(); });
    queue_.push_back(std::move(task));
    cv_.notify_one();
    return done;
  }

  ~BackgroundWriter() {
    {
      const std::lock_guard lock(mu_);
      closing_ = true;
      cv_.notify_one();
    }
    if (thread_) {
      thread_->join();
      delete thread_;
    }
  }

 private:
  BackgroundWriter() {
    // A child forked while the writer exists has no writer thread: it starts its own on its first write,
    // and the parent's queued writes are the parent's to finish, not the child's. The lock is held across
    // the fork so that the child's copy of it is not held by a thread it does not have.
    ::pthread_atfork([] { instance().mu_.lock(); }, [] { instance().mu_.unlock(); },
                     [] {
                       BackgroundWriter& w = instance();
                       w.thread_ = nullptr;  // the parent's thread: not in this process (its handle is let go)
                       w.queue_.clear();
                       new (&w.cv_) std::condition_variable();  // the parent's waiter is not here either
                       w.mu_.unlock();
                     });
  }

  void loop() {
    std::unique_lock lock(mu_);
    for (;;) {
      cv_.wait(lock, [this] { return closing_ || !queue_.empty(); });
      if (queue_.empty()) return;  // closing, and every write submitted is done
      std::packaged_task<void()> task = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      task();  // an exception it throws goes to its future
      lock.lock();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::packaged_task<void()>> queue_;
  bool closing_ = false;
  std::thread* thread_ = nullptr;  // owned; a forked child lets its copy go without joining
};

}  // namespace

std::future<void> SnapshotSet::write_rank_async(std::string dir, Snapshot s) {
  return BackgroundWriter::instance().submit(std::packaged_task<void()>(
      [dir = std::move(dir), s = std::move(s)] { write_rank(dir, s); }));
}

}  // namespace dpipe
