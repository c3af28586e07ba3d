// Whole-file and ranged reads of data files (dpipe/detail/read_file.hpp): the system calls, kept out of
// the header.
#include "dpipe/detail/read_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "dpipe/error.hpp"
#include "dpipe/regular_file.hpp"

namespace dpipe::detail {

ReadFile::ReadFile(std::string path, std::uint64_t expected_size) : path_(std::move(path)), size_(expected_size) {
  RegularFile file(path_, FileRole::data);  // a regular file only; never blocks on a FIFO
  if (file.size() < size_)
    throw DataError("data file '" + path_ + "' changed size since the pipeline was built: it was " +
                    std::to_string(size_) + " bytes, it is " + std::to_string(file.size()) + " now");
  fd_ = file.release();
}

ReadFile::~ReadFile() { ::close(fd_); }

void ReadFile::read(char* to, std::uint64_t n, std::uint64_t at) const {
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

}  // namespace dpipe::detail
