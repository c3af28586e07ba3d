#pragma once
/// A first-in first-out queue in one std::vector: elements are appended at the back and taken from the
/// front in runs. The taken front is dropped when the queue empties, or when it is at least half of the
/// vector (the rest moves down), so an element is moved at most twice on average and the vector is
/// reused without allocating once it has grown. The worker lanes and the dispatcher's backlogs queue
/// elements this way: it is contiguous, and per element type it compiles to much less code than
/// std::deque (docs/performance.md has the figures).
#include <cstddef>
#include <iterator>
#include <utility>
#include <vector>

namespace dpipe::detail {

template <class T>
class Fifo {
 public:
  std::size_t size() const { return items_.size() - head_; }
  bool empty() const { return head_ == items_.size(); }

  void push_back(const T& x) { items_.push_back(x); }
  void push_back(T&& x) { items_.push_back(std::move(x)); }
  /// Appends the elements of `from`, moved.
  void append_moved(std::vector<T>& from) {
    items_.insert(items_.end(), std::make_move_iterator(from.begin()), std::make_move_iterator(from.end()));
  }

  /// Appends copies of the elements of `from`.
  void append_copied(const std::vector<T>& from) { items_.insert(items_.end(), from.begin(), from.end()); }

  /// Moves up to `max` elements from the front to the end of `out`; returns how many.
  std::size_t take_into(std::vector<T>& out, std::size_t max) {
    const std::size_t n = max < size() ? max : size();
    const auto first = items_.begin() + std::ptrdiff_t(head_);
    out.insert(out.end(), std::make_move_iterator(first), std::make_move_iterator(first + std::ptrdiff_t(n)));
    head_ += n;
    if (head_ == items_.size()) {
      items_.clear();
      head_ = 0;
    } else if (2 * head_ >= items_.size()) {
      items_.erase(items_.begin(), items_.begin() + std::ptrdiff_t(head_));
      head_ = 0;
    }
    return n;
  }

  /// The queued elements, front first.
  auto begin() const { return items_.begin() + std::ptrdiff_t(head_); }
  auto end() const { return items_.end(); }

  /// Replaces the contents with `elements` (front first).
  void assign(std::vector<T> elements) {
    items_ = std::move(elements);
    head_ = 0;
  }

 private:
  std::vector<T> items_;
  std::size_t head_ = 0;  // items_[0, head_) were taken
};

}  // namespace dpipe::detail
