#include "dpipe/detail/read_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "dpipe/error.hpp"

namespace dpipe::detail {

ReadFile::ReadFile(std::string path, std::uint64_t expected_size) : path_(std::move(path)), size_(expected_size) {
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw DataError("cannot open data file '" + path_ + "': " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd_, &st) != 0 || static_cast<std::uint64_t>(st.st_size) < size_) {
    ::close(fd_);
    throw DataError("data file '" + path_ + "' changed size since the pipeline was built");
  }
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
