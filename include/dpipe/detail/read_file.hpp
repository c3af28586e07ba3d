#pragma once
/// One open data file read with pread: for sources that copy every byte anyway (`line_blocks`), a read
/// into the element's own buffer costs less than mapping the pages and copying out of the map.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <sys/stat.h>

#include "dpipe/error.hpp"

namespace dpipe::detail {

class ReadFile {
 public:
  /// Opens `path`, which held `expected_size` bytes when the pipeline was built; a DataError names the
  /// file when it cannot be opened or is now shorter.
  ReadFile(std::string path, std::uint64_t expected_size) : path_(std::move(path)), size_(expected_size) {
    fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) throw DataError("cannot open data file '" + path_ + "': " + std::strerror(errno));
    struct stat st {};
    if (::fstat(fd_, &st) != 0 || static_cast<std::uint64_t>(st.st_size) < size_) {
      ::close(fd_);
      throw DataError("data file '" + path_ + "' changed size since the pipeline was built");
    }
  }
  ~ReadFile() { ::close(fd_); }
  ReadFile(const ReadFile&) = delete;
  ReadFile& operator=(const ReadFile&) = delete;

  const std::string& path() const { return path_; }
  /// The size the file had when the pipeline was built: what is read stops there.
  std::uint64_t size() const { return size_; }

  /// Reads bytes [at, at + n) into `to` (at + n <= size()). A read that fails, or ends early because
  /// the file shrank, is a DataError naming the file and the offset.
  void read(char* to, std::uint64_t n, std::uint64_t at) const {
    while (n > 0) {
      const ssize_t got = ::pread(fd_, to, n, static_cast<off_t>(at));
      if (got < 0 && errno == EINTR) continue;
      if (got < 0)
        throw DataError("cannot read data file '" + path_ + "' at byte " + std::to_string(at) + ": " +
                        std::strerror(errno));
      if (got == 0)
        throw DataError("data file '" + path_ + "' shrank while it was read: it was " + std::to_string(size_) +
                        " bytes when the pipeline was built, and ends before byte " + std::to_string(at) + " now");
      to += got;
      at += static_cast<std::uint64_t>(got);
      n -= static_cast<std::uint64_t>(got);
    }
  }

 private:
  std::string path_;
  std::uint64_t size_;
  int fd_ = -1;
};

}  // namespace dpipe::detail
