// The removal log of a snapshot set directory (include/dpipe/detail/removal_log.hpp).
#include "dpipe/detail/removal_log.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

namespace dpipe::detail {

namespace {
std::string log_path(const std::string& dir) { return dir + "/" + RemovalLog::kName; }
}  // namespace

RemovalLog::RemovalLog(const std::string& dir) : path_(log_path(dir)), before_(mark(path_)) {}

RemovalLog::Mark RemovalLog::mark(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return {};
  return {true, st.st_dev, st.st_ino, st.st_size};
}

void RemovalLog::record(const std::string& dir, const std::vector<std::uint64_t>& tags) {
  if (tags.empty()) return;
  std::string entries(tags.size() * 8, '\0');
  for (std::size_t i = 0; i < tags.size(); ++i)
    for (int b = 0; b < 8; ++b) entries[i * 8 + std::size_t(b)] = static_cast<char>(tags[i] >> (8 * b));
  const std::string path = log_path(dir);
  const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0666);
  if (fd < 0) return;
  struct stat st {};
  // One write: an append is atomic, so entries of two processes never interleave.
  if (::write(fd, entries.data(), entries.size()) == static_cast<ssize_t>(entries.size()) && ::fstat(fd, &st) == 0 &&
      st.st_size >= kCap)
    ::unlink(path.c_str());  // the next appender starts a new file; a reader of this one sees it replaced
  ::close(fd);
}

bool RemovalLog::saw_no_removal_of(std::uint64_t tag) const {
  const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT && !before_.exists;  // none then, none now
  struct stat st {};
  bool clear = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode);  // anything else in its place tells nothing
  const off_t from = before_.exists ? before_.size : 0;
  if (clear && before_.exists && (st.st_dev != before_.dev || st.st_ino != before_.ino)) clear = false;  // replaced
  if (clear && (st.st_size < from || from % 8 != 0 || (st.st_size - from) % 8 != 0 || st.st_size - from > kCap)) clear = false;
  if (clear && st.st_size > from) {
    std::string entries(static_cast<std::size_t>(st.st_size - from), '\0');
    clear = ::pread(fd, entries.data(), entries.size(), from) == static_cast<ssize_t>(entries.size());
    for (std::size_t at = 0; clear && at + 8 <= entries.size(); at += 8) {
      std::uint64_t removed = 0;
      for (int b = 0; b < 8; ++b) removed |= std::uint64_t(static_cast<unsigned char>(entries[at + std::size_t(b)])) << (8 * b);
      clear = removed != tag && removed != 0;
    }
  }
  ::close(fd);
  return clear;
}

}  // namespace dpipe::detail
