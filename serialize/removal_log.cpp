// The removal log of a snapshot set directory (include/dpipe/detail/removal_log.hpp).
#include "dpipe/detail/removal_log.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace dpipe::detail {

RemovalLog::RemovalLog(const std::string& dir) : path_(dir + "/" + kName), expected_(mark()) {}

RemovalLog::Mark RemovalLog::mark() const {
  struct stat st {};
  if (::stat(path_.c_str(), &st) != 0) return {};
  return {true, st.st_dev, st.st_ino, st.st_size};
}

void RemovalLog::record_removal() {
  const int fd = ::open(path_.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0666);
  if (fd < 0) {
    changed_ = true;
    return;
  }
  const char byte = 'r';
  struct stat st {};
  if (::write(fd, &byte, 1) == 1 && ::fstat(fd, &st) == 0) {
    const Mark now{true, st.st_dev, st.st_ino, st.st_size};
    // What the log is when this byte was the only one appended since the state was read.
    const Mark ours_alone = expected_.exists ? Mark{true, expected_.dev, expected_.ino, expected_.size + 1} : Mark{true, now.dev, now.ino, 1};
    if (now != ours_alone) changed_ = true;
    expected_ = now;
    if (st.st_size >= kCap && ::ftruncate(fd, 0) == 0) {
      changed_ = true;  // a byte another process appended after this one is cut with it
      expected_.size = 0;
    }
  } else {
    changed_ = true;
  }
  ::close(fd);
}

bool RemovalLog::unchanged() const { return !changed_ && mark() == expected_; }

}  // namespace dpipe::detail
