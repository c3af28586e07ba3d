#pragma once
/// An AsyncLane runs one iterator chain (a worker) on the engine's threads and buffers its output in a
/// bounded queue of chunks for one consumer. The producer never waits: a task produces chunks while
/// there is room and then ends; the consumer restarts it when the queue drains below half. Only the
/// consumer waits, on a condition variable, and only when its lane has nothing ready.
///
/// A consumer that finds its lane empty first spins for a short while (as long as its recent waits
/// were short: a cheap producer is about to publish) and only then blocks; a wake-up through the
/// kernel costs more than a chunk of cheap elements takes to produce.
///
/// Snapshots: `pause()` stops production and waits until the running task (if any) has finished its
/// chunk, so the chain is idle and the queue holds everything produced but not yet delivered. How much
/// that is depends on timing; `settle_paused()` then brings the lane to a point that does not (see there).
///
/// An exact snapshot need not wait for the chunk under way. When chunks are slow (a batch of elements
/// that take milliseconds) and saving the chain is cheap beside one (at most 1/20 of it), the producer
/// saves the chain's records after each chunk and publishes them with it, under the lock: the records and
/// the queue then describe one point, the chain as of its last published chunk. `request_snapshot()` lends
/// a copy of both while the producer works on; the chunk under way is not in the snapshot, and a resume
/// produces it again. Fast chunks are not captured: waiting for one costs less than saving after each.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <algorithm>
#include <exception>
#include <iterator>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "dpipe/detail/executor.hpp"
#include "dpipe/detail/fifo.hpp"
#include "dpipe/kit/node.hpp"
#include "dpipe/kit/restore_keys.hpp"

namespace dpipe::detail {

class AsyncLaneBase {
 public:
  /// `capacity`: elements buffered at most; `chunk`: elements produced per pull at most. With
  /// `inline_mode` the consumer's thread produces on demand (the single-threaded reference).
  AsyncLaneBase(Executor* executor, std::size_t capacity, std::size_t chunk, bool inline_mode);
  virtual ~AsyncLaneBase();
  AsyncLaneBase(const AsyncLaneBase&) = delete;
  AsyncLaneBase& operator=(const AsyncLaneBase&) = delete;

  /// Stops scheduling production and waits until no task of this lane runs.
  void pause();
  /// The two halves of pause(), so that many lanes can be asked first and waited for after: then the
  /// wait is for the chunks already under way, not for chunks other lanes start meanwhile.
  void request_pause();
  void wait_idle();
  /// Lets production go on after pause(), and ends a snapshot's loan (request_snapshot).
  void resume();
  /// For an exact snapshot, consumer: if the producer is busy and holds its chain's records as of the last
  /// published chunk, copies them and the queue (the lane's lent view, see `lent()`) and lets it go on;
  /// true. Otherwise asks it to pause, as request_pause(), and returns false: wait_idle() next.
  bool request_snapshot();
  /// Whether the lane lent its view to the snapshot under way.
  bool lent() const { return lent_; }
  /// For chains that share state with other workers' (a dispatch): never capture (pauses wait).
  void disable_captures() { captures_ = false; }
  /// Consumer: moves production to the consumer's thread (true: inside its pulls, as `inline_mode`) or
  /// to the engine's (false), at a point between chunks. Going inline waits for a chunk under way and
  /// moves what the queue holds to the consumer's side. The stream is the same either way. A lane with
  /// no executor stays inline.
  void set_inline(bool on);
  /// Cancels and joins; called by the typed lane's destructor before its chain goes away.
  void stop();
  /// Consumer: waits up to `limit` until a chunk, the end or a failure is queued (true; nothing is
  /// taken), else false. Inline lanes produce on demand: true.
  bool wait_published(std::chrono::nanoseconds limit);
  /// Whether the chain has ended (no more chunks will come).
  bool producer_done() const;
  /// Consumer: whether `n` elements, `at_hand` of them on the consumer's side, can be taken without
  /// waiting for the producer: the rest is queued, or the producer is not running (it waits for the
  /// consumer to take, so waiting longer brings no more), or the lane has ended or failed.
  bool holds(std::size_t n, std::size_t at_hand) const;
  /// The chain's failure, if it failed (the consumer sees it after the elements before it).
  std::exception_ptr producer_error() const;

  /// The pending count of the lane's settled point: more than timing can ever leave pending (1.5 queue
  /// depths, or an inline chunk), plus what is left of the elements restored into it. See settle_paused().
  std::size_t settled_pending() const;

 protected:
  /// Producer, on an engine thread without the lock: pulls at most `max` elements into the staging
  /// chunk and returns how many (0 at the end of the chain).
  virtual std::size_t produce_staged(std::size_t max) = 0;
  /// Under the lock: appends the staging chunk to the queue.
  virtual void publish_staged() = 0;
  /// Before the lane starts: threaded chunks never go below `n` (what the chain needs per pull).
  void set_smallest_chunk(std::size_t n) { chunk_now_ = smallest_ = std::clamp<std::size_t>(n, 1, capacity_); }
  /// Under the lock: moves up to `max` queued elements to the consumer's side; returns how many, 0 if
  /// the queue is empty.
  virtual std::size_t take_front(std::size_t max) = 0;
  /// Inline mode: the staging chunk becomes the consumer's side directly.
  virtual void take_staged() = 0;
  /// Under the lock, the producer idle: appends the whole queue to the consumer's side.
  virtual void absorb_queue_locked() = 0;
  /// Producer, without the lock, between pulls: saves the chain's records into the capture being made;
  /// false if saving failed (the snapshot then waits and raises the failure itself).
  virtual bool capture_chain() noexcept = 0;
  /// Under the lock: the capture just made becomes the one lent to snapshots.
  virtual void publish_capture() = 0;
  /// Under the lock, consumer: copies the published capture and the queue for the snapshot under way.
  virtual void lend_locked() = 0;
  /// Consumer: drops the lent copies (their storage is kept for the next loan).
  virtual void end_loan() = 0;

  /// Consumer: brings the next chunk to the consumer's side; false once the lane has ended. A failure
  /// of the chain is rethrown here, after every element produced before it.
  bool fetch();
  /// Inline mode: the consumer pulls the chain itself. `inline_ended()` rethrows a recorded failure and
  /// says whether the chain has ended; `inline_result` records what a pull gave (0: the end).
  bool inline_mode() const { return inline_; }
  bool inline_ended() const;
  void inline_result(std::size_t produced, std::exception_ptr error = nullptr);
  /// For restore, before the lane starts: the chain had already ended, or failed.
  void set_producer_done(bool done, std::exception_ptr error);
  /// Settling (paused, on the caller's thread): whether the chain has ended or failed.
  bool chain_ended() const;
  /// Settling: records one pull of the chain — `n` elements in the staging chunk (published to the queue;
  /// in inline mode the caller has handed them to the consumer's side), the end (0), or a failure.
  void settled_pull(std::size_t n, std::exception_ptr error);

  // Consumer side: elements restored into the lane, and elements taken since (settled_pending()).
  std::size_t restored_ = 0;
  std::uint64_t taken_ = 0;

 private:
  void schedule_locked();
  void produce_loop();
  void adapt_chunk(std::chrono::steady_clock::duration took, std::size_t elements);
  /// Consumer, without the lock: spins while the lane's recent waits were short, until something is
  /// published (true) or the spin gives up (false); the caller looks at the lane again either way.
  bool spin_for_publish(std::uint64_t seen);
  /// Producer: whether to save the chain after a chunk that took (or is expected to take) `chunk_ns`.
  bool worth_capturing(double chunk_ns) const;
  /// Producer: captures the chain and times it; true if it did.
  bool capture_timed();

  Executor* executor_;  // borrowed from the engine
  // chunk_: the inline chunk; threaded chunks adapt within [smallest_, max(chunk_, capacity_ / 2)].
  const std::size_t capacity_, chunk_;
  bool inline_;  // changed by the consumer only (set_inline), under the lock
  // Producer side (one task at a time): elements per pull, adapted to how long elements take, from
  // `smallest_` at first, so a slow element is not multiplied by a chunk before anything is known.
  std::size_t smallest_ = 1;
  std::size_t chunk_now_ = 1;
  double ns_per_element_ = 0;
  mutable std::mutex mu_;
  std::condition_variable consumer_cv_, idle_cv_;
  std::size_t buffered_ = 0;  // queued elements
  bool running_ = false, paused_ = false, cancelled_ = false, done_ = false, consumer_waiting_ = false;
  std::exception_ptr error_;
  std::atomic<std::uint64_t> publishes_{0};  // bumped under the lock on every publish, the end or a failure
  double wait_ns_ = 0;                       // consumer: moving average of how long its waits took
  // Captures: whether this lane makes them, what the last one cost (producer), whether the published one
  // is as of the last published chunk (under the lock), and whether a snapshot holds a loan (consumer).
  bool captures_ = true;
  double capture_ns_ = 0;
  bool capture_fresh_ = false;
  bool lent_ = false;
};

/// The typed lane of one worker chain.
template <class T>
class AsyncLane final : public AsyncLaneBase {
 public:
  AsyncLane(std::unique_ptr<Iter<T>> chain, Executor* executor, std::size_t capacity, std::size_t chunk,
            bool inline_mode)
      : AsyncLaneBase(executor, capacity, chunk, inline_mode), chain_(std::move(chain)), traced_(chain_->traced()),
        keyed_(traced_ && chain_->recomputable()) {
    set_smallest_chunk(chain_->min_useful_pull());
  }
  ~AsyncLane() override { stop(); }

  /// Consumer: whether an element is ready or can be fetched; false once the lane is exhausted.
  bool ready() {
    if (head_ < current_.size()) return true;
    current_.clear();
    current_traces_.clear();
    current_sums_.clear();
    head_ = 0;
    return fetch();
  }
  /// Consumer: waits up to `limit` until ready() would not wait (see wait_published).
  bool wait_ready(std::chrono::nanoseconds limit) { return head_ < current_.size() || wait_published(limit); }
  /// Consumer: waits until `deadline` for `n` elements that can be taken without waiting for the producer,
  /// or the lane's end; false if the deadline passed first. After the first chunk it looks every 1 ms.
  bool wait_available(std::size_t n, std::chrono::steady_clock::time_point deadline) {
    const auto now = std::chrono::steady_clock::now();
    if (!wait_ready(std::max<std::chrono::nanoseconds>(deadline - now, std::chrono::nanoseconds(0)))) return false;
    for (;;) {
      if (inline_mode() || holds(n, current_.size() - head_)) return true;
      const auto at = std::chrono::steady_clock::now();
      if (at >= deadline) return false;
      std::this_thread::sleep_for(std::min<std::chrono::nanoseconds>(deadline - at, std::chrono::milliseconds(1)));
    }
  }
  /// Consumer: the next element; only after ready() returned true. A traced lane appends its provenance
  /// to `traces` (a restored element's is unknown: empty).
  T take(std::vector<Provenance>* traces = nullptr) {
    ++taken_;
    if (traced_ && traces) traces->push_back(std::move(current_traces_[head_]));
    return std::move(current_[head_++]);
  }
  /// Consumer: appends up to `max` next elements to `out` (at least one unless the lane is exhausted)
  /// and returns how many, their provenance to `traces` when traced. Inline, a chain with nothing
  /// pending pulls straight into `out`.
  std::size_t take_into(std::vector<T>& out, std::size_t max, std::vector<Provenance>* traces = nullptr) {
    if (head_ == current_.size()) {
      current_.clear();
      current_traces_.clear();
      current_sums_.clear();
      head_ = 0;
      if (inline_mode()) {
        if (inline_ended()) return 0;
        const std::size_t before = out.size();
        std::size_t n = 0;
        try {
          n = chain_->pull(out, max);
        } catch (...) {
          out.erase(out.begin() + std::ptrdiff_t(before), out.end());
          inline_result(0, std::current_exception());
          throw;
        }
        inline_result(n);
        taken_ += n;
        if (traced_ && traces) move_all(chain_->traces(), *traces);
        return n;
      }
      if (!fetch()) return 0;
    }
    const std::size_t n = std::min(max, current_.size() - head_);
    taken_ += n;
    const auto from = current_.begin() + std::ptrdiff_t(head_);
    out.insert(out.end(), std::make_move_iterator(from), std::make_move_iterator(from + std::ptrdiff_t(n)));
    if (traced_ && traces) {
      const auto t = current_traces_.begin() + std::ptrdiff_t(head_);
      traces->insert(traces->end(), std::make_move_iterator(t), std::make_move_iterator(t + std::ptrdiff_t(n)));
    }
    head_ += n;
    return n;
  }

  Iter<T>& chain() { return *chain_; }
  /// Paused, not started, or lent: the elements produced but not delivered, in order.
  std::vector<T> pending() const {
    std::vector<T> out(current_.begin() + std::ptrdiff_t(head_), current_.end());
    if (lent()) out.insert(out.end(), lent_queue_.begin(), lent_queue_.end());
    else out.insert(out.end(), queue_.begin(), queue_.end());
    return out;
  }
  /// Traced, as pending(): the pending elements' provenance (unknown for those restored as data).
  std::vector<Provenance> pending_traces() const {
    std::vector<Provenance> out;
    if (!traced_) return out;
    out.assign(current_traces_.begin() + std::ptrdiff_t(std::min(head_, current_traces_.size())), current_traces_.end());
    if (lent()) out.insert(out.end(), lent_queue_traces_.begin(), lent_queue_traces_.end());
    else out.insert(out.end(), queue_traces_.begin(), queue_traces_.end());
    return out;
  }
  /// Restore keys: whether the producer takes each element's checksum (traced, the chain recomputable).
  bool keyed() const { return keyed_; }
  /// Keyed, as pending(): the pending elements' checksums.
  std::vector<std::uint32_t> pending_sums() const {
    std::vector<std::uint32_t> out(current_sums_.begin() + std::ptrdiff_t(std::min(head_, current_sums_.size())),
                                   current_sums_.end());
    if (lent()) out.insert(out.end(), lent_queue_sums_.begin(), lent_queue_sums_.end());
    else out.insert(out.end(), queue_sums_.begin(), queue_sums_.end());
    return out;
  }
  /// Keyed, paused or lent: the pending elements in place, as pending() lists them, for KeysOut (which
  /// reads an element only where its key is unknown). A loan of a queue whose keys are all known copies
  /// no element: those entries are never read.
  class PendingView {
   public:
    explicit PendingView(const AsyncLane& lane)
        : lane_(&lane), at_hand_(lane.current_.size() - lane.head_),
          queued_(lane.lent() ? lane.lent_queue_traces_.size() : lane.queue_.size()) {}
    std::size_t size() const { return at_hand_ + queued_; }
    const T& operator[](std::size_t i) const {
      if (i < at_hand_) return lane_->current_[lane_->head_ + i];
      const std::size_t j = i - at_hand_;
      if (!lane_->lent()) return *(lane_->queue_.begin() + std::ptrdiff_t(j));
      if (j >= lane_->lent_queue_.size()) throw Error("internal: a lent queue's element was asked for, but not lent");
      return lane_->lent_queue_[j];
    }

   private:
    const AsyncLane* lane_;
    std::size_t at_hand_, queued_;
  };
  /// Paused or lent: whether the chain had ended, and its failure, as of the snapshot's point (a lent
  /// lane was busy producing: neither).
  bool snapshot_done() const { return !lent() && producer_done(); }
  std::exception_ptr snapshot_error() const { return lent() ? nullptr : producer_error(); }
  /// Paused or lent: appends the chain's records, the lent copy or the chain's own.
  void save_chain(StateSink& out) const {
    if (!lent()) return chain_->save(out);
    for (const NodeState& st : lent_states_) out.add() = st;
  }

  /// Paused, on the caller's thread: pulls the chain one element at a time until settled_pending()
  /// elements are pending or the chain ends; a failure is recorded as the producer would record it.
  /// Timing decides how far a worker has run ahead of the consumer (up to 1.5 queue depths) and in what
  /// chunks; the settled point does not depend on either. The target is beyond anything timing leaves
  /// pending, so at least one pull of one element happens, and a chain's state after a pull of one element
  /// depends only on how many elements it has yielded: every node consumes its input greedily up to the
  /// element it yields (a filter stops at the element that passes, not at the end of a chunk). Taken by
  /// Run::reproducible_snapshot() so that a rescaled set gives the same streams on every run.
  void settle_paused() {
    const std::size_t target = settled_pending();
    std::size_t have = (current_.size() - head_) + queue_.size();
    while (have < target && !chain_ended()) {
      staged_.clear();
      std::size_t n = 0;
      std::exception_ptr error;
      try {
        n = chain_->pull(staged_, 1);
        stage_traces();
      } catch (...) {
        error = std::current_exception();
      }
      if (!error && inline_mode()) {
        current_.insert(current_.end(), std::make_move_iterator(staged_.begin()), std::make_move_iterator(staged_.end()));
        move_all(staged_traces_, current_traces_);
        current_sums_.insert(current_sums_.end(), staged_sums_.begin(), staged_sums_.end());
        staged_sums_.clear();
      }
      settled_pull(error ? 0 : n, error);
      if (error || n == 0) break;
      have += n;
    }
  }
  /// Before the lane starts: elements to deliver before anything the chain produces.
  /// `traces`: their provenance (restore keys), or empty when unknown.
  void set_pending(std::vector<T> elements, std::vector<Provenance> traces, bool chain_done,
                   std::exception_ptr error = nullptr) {
    current_ = std::move(elements);
    if (traced_ && traces.size() == current_.size()) current_traces_ = std::move(traces);
    else current_traces_.assign(traced_ ? current_.size() : 0, unknown_provenance());
    current_sums_.clear();
    if (keyed_)
      for (const T& x : current_) current_sums_.push_back(element_checksum(x, sum_scratch_));
    head_ = 0;
    restored_ = current_.size();
    taken_ = 0;
    set_producer_done(chain_done, std::move(error));
  }

 protected:
  std::size_t produce_staged(std::size_t max) override {
    staged_.clear();  // keeps its capacity: no allocation per chunk
    const std::size_t n = chain_->pull(staged_, max);
    stage_traces();
    return n;
  }
  void publish_staged() override {
    queue_.append_moved(staged_);
    if (traced_) {
      queue_traces_.append_moved(staged_traces_);
      staged_traces_.clear();
    }
    if (keyed_) {
      queue_sums_.append_moved(staged_sums_);
      staged_sums_.clear();
    }
  }
  void take_staged() override {
    current_.swap(staged_);
    current_traces_.swap(staged_traces_);
    current_sums_.swap(staged_sums_);
    head_ = 0;
  }
  void absorb_queue_locked() override {
    queue_.take_into(current_, queue_.size());
    if (traced_) queue_traces_.take_into(current_traces_, queue_traces_.size());
    if (keyed_) queue_sums_.take_into(current_sums_, queue_sums_.size());
  }
  // Many elements move to the consumer's side at once: one lock per refill, not per element.
  std::size_t take_front(std::size_t max) override {
    current_.clear();
    current_traces_.clear();
    current_sums_.clear();
    head_ = 0;
    if (traced_) queue_traces_.take_into(current_traces_, max);
    if (keyed_) queue_sums_.take_into(current_sums_, max);
    return queue_.take_into(current_, max);
  }
  bool capture_chain() noexcept override {
    try {
      capture_.clear();
      StateSink sink(capture_, &capture_spare_);  // the records of two captures ago, overwritten in place
      chain_->save(sink);
      return true;
    } catch (...) {
      return false;
    }
  }
  void publish_capture() override {
    published_.swap(capture_);
    capture_spare_.swap(capture_);  // the records just replaced: storage for the next capture
  }
  void lend_locked() override {
    lent_states_ = published_;
    if (traced_) lent_queue_traces_.assign(queue_traces_.begin(), queue_traces_.end());
    if (keyed_) lent_queue_sums_.assign(queue_sums_.begin(), queue_sums_.end());
    // Keyed with every key known, the snapshot saves the queue as keys and checksums: no element copied.
    const bool all_keys = keyed_ && std::all_of(lent_queue_traces_.begin(), lent_queue_traces_.end(), is_keyable);
    if (all_keys) lent_queue_.clear();
    else lent_queue_.assign(queue_.begin(), queue_.end());
  }
  void end_loan() override {
    lent_states_.clear();
    lent_queue_.clear();
    lent_queue_traces_.clear();
    lent_queue_sums_.clear();
  }

 private:
  /// Traced, producer: the staging chunk's provenance, from the chain's last pull.
  void stage_traces() {
    if (!traced_) return;
    staged_traces_.clear();
    staged_traces_.swap(chain_->traces());
    if (!keyed_) return;
    staged_sums_.clear();
    for (const T& x : staged_) staged_sums_.push_back(element_checksum(x, sum_scratch_));
  }
  static void move_all(std::vector<Provenance>& from, std::vector<Provenance>& to) {
    to.insert(to.end(), std::make_move_iterator(from.begin()), std::make_move_iterator(from.end()));
    from.clear();
  }

  std::unique_ptr<Iter<T>> chain_;
  // Traced (the chain carries provenance): the elements' provenances beside staged_, queue_ and current_.
  const bool traced_;
  std::vector<Provenance> staged_traces_, current_traces_;
  Fifo<Provenance> queue_traces_;
  // Keyed (restore keys): each element's checksum beside its provenance, taken by the producer as it
  // makes the element, so a snapshot saves the queue without copying or encoding it.
  const bool keyed_;
  std::vector<std::uint32_t> staged_sums_, current_sums_, lent_queue_sums_;
  Fifo<std::uint32_t> queue_sums_;
  ByteWriter sum_scratch_;  // the producer's (the consumer's while the producer is idle: settling, restore)
  // Captures (see the file's comment): made by the producer, published and lent under the lock.
  std::vector<NodeState> capture_, capture_spare_, published_;
  std::vector<NodeState> lent_states_;  // consumer: the snapshot's copy
  std::vector<T> lent_queue_;
  std::vector<Provenance> lent_queue_traces_;  // traced: beside lent_queue_
  std::vector<T> staged_;    // producer side
  Fifo<T> queue_;            // under the lock
  std::vector<T> current_;   // consumer side
  std::size_t head_ = 0;
};

}  // namespace dpipe::detail
