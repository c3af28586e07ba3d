#include "dpipe/detail/async_lane.hpp"

#include <algorithm>
#include <chrono>
#include <thread>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace dpipe::detail {

namespace {
// A blocked consumer waits at most this long with elements ready, then looks again (slow elements would
// otherwise hold it for half a lane of them: seconds). About ten wake-ups' worth, so cheap producers
// still fill half the lane before waking it, and slow ones hand over promptly.
constexpr std::chrono::milliseconds kLongestHold{1};
// A producing task that has run this long hands its thread on after the chunk it finishes (it queues
// itself again behind the other lanes' tasks): with more workers than engine threads, a lane of slow
// elements would otherwise fill its whole queue while the lane the consumer needs next waits for a thread.
constexpr std::chrono::milliseconds kTaskSlice{2};
// Chunks shorter than this are not captured: a snapshot waits for one instead (about a wake-up's cost).
constexpr double kCaptureFloorNs = 200'000;
// A capture may cost at most this share of the chunk it follows.
constexpr double kCaptureShare = 0.05;
}  // namespace

AsyncLaneBase::AsyncLaneBase(Executor* executor, std::size_t capacity, std::size_t chunk, bool inline_mode)
    : executor_(executor), capacity_(capacity < 1 ? 1 : capacity), chunk_(chunk < 1 ? 1 : chunk),
      inline_(inline_mode || executor == nullptr) {}

AsyncLaneBase::~AsyncLaneBase() = default;

void AsyncLaneBase::schedule_locked() {
  if (inline_ || running_ || paused_ || cancelled_ || done_ || error_ || buffered_ >= capacity_) return;
  running_ = true;
  executor_->submit([this] { produce_loop(); });
}

void AsyncLaneBase::produce_loop() {
  const auto began = std::chrono::steady_clock::now();
  std::size_t room;
  {
    std::lock_guard lock(mu_);
    if (paused_ || cancelled_) {  // asked to stop before this task began: produce nothing
      running_ = false;
      idle_cv_.notify_all();
      return;
    }
    room = capacity_ - buffered_;
  }
  // The chain as it stands (as of the last published chunk) when no capture is: a first chunk, of unknown
  // cost, or one expected to be slow after fast ones.
  if (captures_ && !capture_fresh_ &&
      (ns_per_element_ == 0 || worth_capturing(ns_per_element_ * double(std::min(room, chunk_now_)))) &&
      capture_timed()) {
    std::lock_guard lock(mu_);
    publish_capture();
    capture_fresh_ = true;
  }
  for (;;) {
    std::size_t n = 0;
    std::exception_ptr error;
    const auto t0 = std::chrono::steady_clock::now();
    try {
      n = produce_staged(std::min(room, chunk_now_));
    } catch (...) {
      error = std::current_exception();
    }
    const auto t1 = std::chrono::steady_clock::now();
    if (n > 0) adapt_chunk(t1 - t0, n);
    bool captured = false;
    if (n > 0 && !error && captures_) {
      const double chunk_ns = std::chrono::duration<double, std::nano>(t1 - t0).count();
      if (worth_capturing(chunk_ns)) captured = capture_timed();
      // A capture measured dear is tried again after a few long chunks: one slow capture (its thread
      // preempted) must not end the captures for good, which would make every snapshot wait for a chunk.
      else if (chunk_ns >= kCaptureFloorNs) capture_ns_ *= 0.75;
    }
    std::unique_lock lock(mu_);
    if (error) {
      error_ = error;
      done_ = true;
    } else if (n == 0) {
      done_ = true;
    } else {
      publish_staged();
      buffered_ += n;
      if (captured) publish_capture();
    }
    capture_fresh_ = captured;
    publishes_.fetch_add(1, std::memory_order_release);
    // Wake a waiting consumer when half the lane is ready (fewer wake-ups) or nothing more will come;
    // short of that, it looks again after kLongestHold by itself.
    const bool wake = consumer_waiting_ && (done_ || buffered_ * 2 >= capacity_ || buffered_ >= capacity_);
    if (wake) consumer_waiting_ = false;  // one notification per wait: a notify is a system call
    const bool more = !done_ && !paused_ && !cancelled_ && buffered_ < capacity_;
    if (wake) consumer_cv_.notify_one();
    if (!more) {
      running_ = false;
      idle_cv_.notify_all();
      return;  // `this` may be destroyed as soon as the lock is released
    }
    if (t1 - began >= kTaskSlice) {
      // Still running_ (stop() and pause() wait for the queued task, which ends at once if asked to).
      executor_->submit([this] { produce_loop(); });
      return;
    }
    room = capacity_ - buffered_;  // one lock per chunk
  }
}

bool AsyncLaneBase::worth_capturing(double chunk_ns) const {
  return chunk_ns >= kCaptureFloorNs && capture_ns_ <= kCaptureShare * chunk_ns;
}

bool AsyncLaneBase::capture_timed() {
  const auto t0 = std::chrono::steady_clock::now();
  const bool ok = capture_chain();
  const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
  capture_ns_ = capture_ns_ == 0 ? ns : 0.75 * capture_ns_ + 0.25 * ns;
  return ok;
}

void AsyncLaneBase::adapt_chunk(std::chrono::steady_clock::duration took, std::size_t elements) {
  // Chunks of about kTargetChunkNs: cheap elements travel many to a hand-off, expensive ones (a batch
  // that takes milliseconds) one at a time, so a snapshot's pause stays short either way.
  constexpr double kTargetChunkNs = 20'000;
  const double per_element = std::chrono::duration<double, std::nano>(took).count() / double(elements);
  ns_per_element_ = ns_per_element_ == 0 ? per_element : 0.75 * ns_per_element_ + 0.25 * per_element;
  const double want = kTargetChunkNs / std::max(ns_per_element_, 1.0);
  const std::size_t most = std::max(chunk_, capacity_ / 2);
  chunk_now_ = std::clamp(static_cast<std::size_t>(want), smallest_, std::max(most, smallest_));
}

bool AsyncLaneBase::inline_ended() const {
  if (error_) std::rethrow_exception(error_);
  return done_;
}

void AsyncLaneBase::inline_result(std::size_t produced, std::exception_ptr error) {
  if (error) error_ = std::move(error);
  if (produced == 0) done_ = true;
}

namespace {
// Waits shorter than this on average are spun through; longer ones block at once.
// A blocked consumer costs a wake-up, and while it sleeps a cheap producer fills its queue and ends its
// task, which then costs a task restart: 50-100 µs each on the development VM. Spinning through waits
// up to 200 µs removed those cascades there (about 40 blocking waits per 13 ms run at 50 µs, none at
// 200 µs).
constexpr double kSpinWaitNs = 200'000;

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}
}  // namespace

bool AsyncLaneBase::spin_for_publish(std::uint64_t seen) {
  if (wait_ns_ > kSpinWaitNs) return false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::nanoseconds(static_cast<long>(kSpinWaitNs));
  for (unsigned i = 1;; ++i) {
    if (publishes_.load(std::memory_order_acquire) != seen) return true;
    cpu_relax();
    if (i % 64 == 0) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::yield();  // an oversubscribed core runs the producer meanwhile
    }
  }
}

bool AsyncLaneBase::fetch() {
  if (inline_) {
    if (inline_ended()) return false;
    std::size_t n = 0;
    try {
      n = produce_staged(chunk_);
    } catch (...) {
      inline_result(0, std::current_exception());
      throw;
    }
    inline_result(n);
    if (n == 0) return false;
    take_staged();
    return true;
  }
  std::unique_lock lock(mu_);
  std::chrono::steady_clock::time_point wait_began{};
  auto waited = [&] {  // after a wait: fold its length into the average
    if (wait_began == std::chrono::steady_clock::time_point{}) return;
    const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - wait_began).count();
    wait_ns_ = 0.75 * wait_ns_ + 0.25 * ns;
  };
  for (;;) {
    // At most half the queue at a time: the producer gets room at once and keeps going while the
    // consumer works through what it took (so at most 1.5 × capacity elements are ever ahead).
    const std::size_t n = take_front(capacity_ > 1 ? capacity_ / 2 : 1);
    if (n > 0) {
      buffered_ -= n;
      if (buffered_ * 2 <= capacity_) schedule_locked();
      waited();
      return true;
    }
    if (error_) std::rethrow_exception(error_);
    if (done_) return false;
    schedule_locked();
    if (wait_began == std::chrono::steady_clock::time_point{}) {
      wait_began = std::chrono::steady_clock::now();
      const std::uint64_t seen = publishes_.load(std::memory_order_relaxed);
      lock.unlock();
      spin_for_publish(seen);
      lock.lock();
      continue;  // the lane may have changed meanwhile: look again before blocking
    }
    consumer_waiting_ = true;
    consumer_cv_.wait_for(lock, kLongestHold);  // then it looks again: a chunk may be ready unannounced
    consumer_waiting_ = false;
  }
}

bool AsyncLaneBase::wait_published(std::chrono::nanoseconds limit) {
  if (inline_) return true;
  const auto deadline = std::chrono::steady_clock::now() + limit;
  std::unique_lock lock(mu_);
  for (;;) {
    if (buffered_ > 0 || error_ || done_) return true;
    schedule_locked();
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return false;
    consumer_waiting_ = true;
    consumer_cv_.wait_for(lock, std::min<std::chrono::steady_clock::duration>(deadline - now, kLongestHold));
    consumer_waiting_ = false;
  }
}

void AsyncLaneBase::pause() {
  request_pause();
  wait_idle();
}

void AsyncLaneBase::request_pause() {
  std::lock_guard lock(mu_);
  paused_ = true;
}

void AsyncLaneBase::wait_idle() {
  std::unique_lock lock(mu_);
  idle_cv_.wait(lock, [this] { return !running_; });
}

void AsyncLaneBase::set_inline(bool on) {
  if (executor_ == nullptr) return;
  std::unique_lock lock(mu_);
  if (on == inline_) return;
  if (!on) {
    inline_ = false;
    schedule_locked();
    return;
  }
  const bool was_paused = paused_;
  paused_ = true;  // no task starts; the one under way finishes its chunk
  idle_cv_.wait(lock, [this] { return !running_; });
  paused_ = was_paused;
  absorb_queue_locked();
  buffered_ = 0;
  inline_ = true;
  capture_fresh_ = false;  // the consumer moves the chain on without captures
}

bool AsyncLaneBase::request_snapshot() {
  std::lock_guard lock(mu_);
  if (!inline_ && running_ && capture_fresh_ && !paused_ && !cancelled_) {
    lend_locked();
    lent_ = true;
    return true;
  }
  paused_ = true;
  return false;
}

void AsyncLaneBase::resume() {
  if (lent_) {
    end_loan();
    lent_ = false;
  }
  std::lock_guard lock(mu_);
  paused_ = false;
  schedule_locked();
}

void AsyncLaneBase::stop() {
  std::unique_lock lock(mu_);
  cancelled_ = true;
  idle_cv_.wait(lock, [this] { return !running_; });
}

bool AsyncLaneBase::producer_done() const {
  std::lock_guard lock(mu_);
  return done_;
}

bool AsyncLaneBase::holds(std::size_t n, std::size_t at_hand) const {
  std::lock_guard lock(mu_);
  // Not running (and not ended): the queue is full or the producer waits for the consumer to take it
  // below half, so no more comes until the consumer takes.
  return at_hand + buffered_ >= n || !running_ || done_ || error_ != nullptr;
}

std::exception_ptr AsyncLaneBase::producer_error() const {
  std::lock_guard lock(mu_);
  return error_;
}

std::size_t AsyncLaneBase::settled_pending() const {
  // Threaded: the queue holds at most capacity_, the consumer's side at most half of it (or one); inline:
  // the consumer's side holds at most one chunk. Restored elements come on top until they are taken.
  const std::size_t timing_bound = std::max(capacity_ + std::max<std::size_t>(capacity_ / 2, 1), chunk_);
  const std::size_t restored_left = taken_ < restored_ ? restored_ - static_cast<std::size_t>(taken_) : 0;
  return timing_bound + 1 + restored_left;
}

bool AsyncLaneBase::chain_ended() const {
  std::lock_guard lock(mu_);
  return done_ || error_ != nullptr;
}

void AsyncLaneBase::settled_pull(std::size_t n, std::exception_ptr error) {
  std::lock_guard lock(mu_);
  if (error) {
    error_ = std::move(error);
    done_ = true;
  } else if (n == 0) {
    done_ = true;
  } else if (!inline_) {
    publish_staged();
    buffered_ += n;  // may exceed capacity_: production resumes once the consumer has taken it back below
  }
  capture_fresh_ = false;  // the chain moved on without one
  publishes_.fetch_add(1, std::memory_order_release);
}

void AsyncLaneBase::set_producer_done(bool done, std::exception_ptr error) {
  std::lock_guard lock(mu_);
  done_ = done || error;
  error_ = std::move(error);
  capture_fresh_ = false;
}

}  // namespace dpipe::detail
