#pragma once
/// A process-wide pool of large buffers, and an allocator over it, for elements that each own tens of
/// KiB (TextBlock). Freed buffers of 4 KiB to 2 MiB are kept, by power-of-two size class, for the next
/// element instead of going back to malloc: glibc gives such memory back to the kernel when it is freed
/// at the heap's top and faults it in again on the next allocation, which cost line_blocks more than
/// half its throughput. Each class keeps at most 8 MiB (and at least 4 buffers); any other size goes
/// to operator new. Thread-safe: one mutex per class, taken once per buffer. Under AddressSanitizer
/// nothing is kept, so a use after free is still caught.
#include <array>
#include <bit>
#include <cstddef>
#include <mutex>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

namespace dpipe::detail {

class BufferPool {
 public:
  static BufferPool& instance() {
    static BufferPool* pool = new BufferPool;  // never destroyed: buffers may be freed during exit
    return *pool;
  }

  BufferPool() {
    for (int c = 0; c < static_cast<int>(classes_.size()); ++c)
      classes_[static_cast<std::size_t>(c)].free.reserve(kept_per_class(c));  // release() never allocates
  }

  void* allocate(std::size_t bytes) {
    const int c = size_class(bytes);
    if (c < 0) return ::operator new(bytes);
    Class& k = classes_[static_cast<std::size_t>(c)];
    {
      const std::lock_guard lock(k.mutex);
      if (!k.free.empty()) {
        void* p = k.free.back();
        k.free.pop_back();
        return p;
      }
    }
    return ::operator new(class_bytes(c));
  }

  void release(void* p, std::size_t bytes) {
    const int c = size_class(bytes);
    if (c >= 0) {
      Class& k = classes_[static_cast<std::size_t>(c)];
      const std::lock_guard lock(k.mutex);
      if (k.free.size() < kept_per_class(c)) {
        k.free.push_back(p);
        return;
      }
    }
    ::operator delete(p);
  }

 private:
  static constexpr int kMinShift = 12, kMaxShift = 21;  // 4 KiB .. 2 MiB
  struct Class {
    std::mutex mutex;
    std::vector<void*> free;
  };

  /// The class of a request (its size rounded up to a power of two), or -1 when it is not pooled.
  static int size_class(std::size_t bytes) {
#if defined(__SANITIZE_ADDRESS__)
    (void)bytes;
    return -1;
#else
    if (bytes < (std::size_t{1} << kMinShift) || bytes > (std::size_t{1} << kMaxShift)) return -1;
    return static_cast<int>(std::bit_width(bytes - 1)) - kMinShift;
#endif
  }
  static std::size_t class_bytes(int c) { return std::size_t{1} << (c + kMinShift); }
  static std::size_t kept_per_class(int c) {
    const std::size_t n = (std::size_t{8} << 20) / class_bytes(c);
    return n < 4 ? 4 : n;
  }

  std::array<Class, kMaxShift - kMinShift + 1> classes_;
};

/// A stateless allocator over BufferPool: containers that use it allocate small sizes from operator
/// new as usual and large ones from the pool.
template <class T>
struct PooledAllocator {
  using value_type = T;
  PooledAllocator() = default;
  template <class U>
  PooledAllocator(const PooledAllocator<U>&) noexcept {}
  T* allocate(std::size_t n) { return static_cast<T*>(BufferPool::instance().allocate(n * sizeof(T))); }
  void deallocate(T* p, std::size_t n) noexcept { BufferPool::instance().release(p, n * sizeof(T)); }
  /// Value-initialises only when given arguments: a vector<char> resized for a read is not zeroed first.
  template <class U>
  void construct(U* p) noexcept(std::is_nothrow_default_constructible_v<U>) {
    ::new (static_cast<void*>(p)) U;
  }
  template <class U, class... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
  template <class U>
  bool operator==(const PooledAllocator<U>&) const noexcept {
    return true;
  }
};

}  // namespace dpipe::detail
