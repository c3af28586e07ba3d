#pragma once
/// A read-only memory map of a whole data file (nodes/files/mapped_file.cpp). The descriptor is closed as
/// soon as the file is mapped, so a source holds no open file however many files it covers.
///
/// Another process may truncate a mapped file at any time, and touching a page past its new end raises
/// SIGBUS, which would end the process. Every read of mapped bytes therefore runs under a
/// MappedReadGuard: a fault inside a guarded read of that file maps zero-filled pages over the rest of
/// the map, so the read finishes (on zeros), and the guard's `check()` then throws a DataError naming
/// the file and the lowest byte found gone. From then on every guarded read of that file fails.
#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

namespace dpipe::detail {

struct MappedFaultHandler;  // nodes/files/mapped_file.cpp: the SIGBUS handler

class MappedFile {
 public:
  /// Maps `path`; a DataError names the file when it cannot be opened or mapped.
  explicit MappedFile(std::string path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const char* data() const { return data_; }
  std::size_t size() const { return size_; }
  const std::string& path() const { return path_; }
  /// A hint that bytes [begin, end) are read soon, in order: their pages are mapped in one call
  /// instead of one fault per few pages. Changes no result; ignored where the kernel lacks it.
  void will_read(std::size_t begin, std::size_t end) const;

 private:
  friend class MappedReadGuard;
  friend struct MappedFaultHandler;
  static constexpr std::uint64_t kIntact = ~std::uint64_t{0};

  std::string path_;
  const char* data_ = nullptr;
  std::size_t size_ = 0;
  // The lowest byte offset found gone (by a fault in a guarded read, or check_size), or kIntact.
  mutable std::atomic<std::uint64_t> lost_from_{kIntact};
};

/// Marks the reads of one mapped file on this thread, from construction to destruction, as guarded
/// (guards nest). Cheap: no system call. Call `check()` after the reads, before their bytes are used.
class MappedReadGuard {
 public:
  explicit MappedReadGuard(const MappedFile& file);
  ~MappedReadGuard();
  MappedReadGuard(const MappedReadGuard&) = delete;
  MappedReadGuard& operator=(const MappedReadGuard&) = delete;

  /// Throws DataError if the file was found shorter than when it was mapped (during this guard's
  /// reads or any earlier ones): what was read may be zeros.
  void check() const {
    if (file_.lost_from_.load(std::memory_order_acquire) != MappedFile::kIntact) fail();
  }
  /// check(), and also whether the file is now shorter than when mapped (a system call: for error
  /// paths). A file cut inside a page reads as zeros past its new end, with no fault: call this
  /// before blaming the data for what is wrong with it.
  void check_size() const;

 private:
  friend struct MappedFaultHandler;
  [[noreturn]] void fail() const;

  const MappedFile& file_;
  const MappedReadGuard* outer_;  // the guard this one nests in, on this thread
};

/// Asks the CPU to load the first bytes of [p, p + n) into the cache (at most 4 KiB; the hardware's
/// stream prefetcher carries on from there). A hint only: never faults (a page not mapped yet is
/// skipped), changes no result.
inline void prefetch_bytes(const char* p, std::size_t n) {
  constexpr std::size_t kLine = 64, kMost = 4096;
  for (std::size_t at = 0; at < std::min(n, kMost); at += kLine) __builtin_prefetch(p + at);
}

}  // namespace dpipe::detail
