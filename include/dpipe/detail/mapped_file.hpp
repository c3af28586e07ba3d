#pragma once
/// A read-only memory map of a whole data file (nodes/mapped_file.cpp). The descriptor is closed as
/// soon as the file is mapped, so a source holds no open file however many files it covers.
#include <algorithm>
#include <cstddef>
#include <string>

namespace dpipe::detail {

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
  std::string path_;
  const char* data_ = nullptr;
  std::size_t size_ = 0;
};

/// Asks the CPU to load the first bytes of [p, p + n) into the cache (at most 4 KiB; the hardware's
/// stream prefetcher carries on from there). A hint only: never faults (a page not mapped yet is
/// skipped), changes no result.
inline void prefetch_bytes(const char* p, std::size_t n) {
  constexpr std::size_t kLine = 64, kMost = 4096;
  for (std::size_t at = 0; at < std::min(n, kMost); at += kLine) __builtin_prefetch(p + at);
}

}  // namespace dpipe::detail
