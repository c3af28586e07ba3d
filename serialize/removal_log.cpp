// The removal log of a snapshot set directory (include/dpipe/detail/removal_log.hpp).
#include "dpipe/detail/removal_log.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace dpipe::detail {

namespace {

std::string log_path(const std::string& dir) { return dir + "/" + RemovalLog::kName; }

/// Whether `path` names the regular file open as `fd` (its size in `size`).
bool names_open_file(const std::string& path, int fd, off_t& size) {
  struct stat held {}, named {};
  if (::fstat(fd, &held) != 0 || ::stat(path.c_str(), &named) != 0 || !S_ISREG(held.st_mode)) return false;
  size = held.st_size;
  return held.st_dev == named.st_dev && held.st_ino == named.st_ino;
}

}  // namespace

RemovalLog::RemovalLog(const std::string& dir) : path_(log_path(dir)) {
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CREAT | O_CLOEXEC, 0666);
  if (fd_ >= 0 && !names_open_file(path_, fd_, from_)) {
    ::close(fd_);
    fd_ = -1;
  }
}

RemovalLog::~RemovalLog() {
  if (fd_ >= 0) ::close(fd_);
}

void RemovalLog::record(const std::string& dir, const std::vector<std::uint64_t>& tags) {
  if (tags.empty()) return;
  std::string entries(tags.size() * 8, '\0');
  for (std::size_t i = 0; i < tags.size(); ++i)
    for (int b = 0; b < 8; ++b) entries[i * 8 + std::size_t(b)] = static_cast<char>(tags[i] >> (8 * b));
  const std::string path = log_path(dir);
  const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0666);
  if (fd < 0) return;
  off_t size = 0;
  // One write: an append is atomic, so entries of two processes never interleave. Past the cap, the log
  // is removed only while its name is still this file (another appender may have started the next one).
  if (::write(fd, entries.data(), entries.size()) == static_cast<ssize_t>(entries.size()) &&
      names_open_file(path, fd, size) && size >= kCap)
    ::unlink(path.c_str());
  ::close(fd);
}

bool RemovalLog::saw_no_removal_of(std::uint64_t tag) const {
  off_t size = 0;
  if (fd_ < 0 || !names_open_file(path_, fd_, size)) return false;  // replaced, removed, or never opened
  if (size < from_ || from_ % 8 != 0 || (size - from_) % 8 != 0 || size - from_ > kCap) return false;
  std::string entries(static_cast<std::size_t>(size - from_), '\0');
  if (::pread(fd_, entries.data(), entries.size(), from_) != static_cast<ssize_t>(entries.size())) return false;
  for (std::size_t at = 0; at + 8 <= entries.size(); at += 8) {
    std::uint64_t removed = 0;
    for (int b = 0; b < 8; ++b) removed |= std::uint64_t(static_cast<unsigned char>(entries[at + std::size_t(b)])) << (8 * b);
    if (removed == tag || removed == 0) return false;
  }
  return true;
}

}  // namespace dpipe::detail
