#pragma once
/// One open data file read with pread: for sources that copy every byte anyway (`line_blocks`), a read
/// into the element's own buffer costs less than mapping the pages and copying out of the map. The
/// system calls live in nodes/files/read_file.cpp, so this header includes no POSIX header.
#include <cstdint>
#include <string>

namespace dpipe::detail {

class ReadFile {
 public:
  /// Opens `path`, which held `expected_size` bytes when the pipeline was built; a DataError names the
  /// file when it cannot be opened or is now shorter.
  ReadFile(std::string path, std::uint64_t expected_size);
  ~ReadFile();
  ReadFile(const ReadFile&) = delete;
  ReadFile& operator=(const ReadFile&) = delete;

  const std::string& path() const { return path_; }
  /// The size the file had when the pipeline was built: what is read stops there.
  std::uint64_t size() const { return size_; }

  /// Reads bytes [at, at + n) into `to` (at + n <= size()). A read that fails, or ends early because
  /// the file shrank, is a DataError naming the file and the offset.
  void read(char* to, std::uint64_t n, std::uint64_t at) const;

 private:
  std::string path_;
  std::uint64_t size_;
  int fd_ = -1;
};

}  // namespace dpipe::detail
