// The one routine that opens files for reading (contract in include/dpipe/regular_file.hpp).
#include "dpipe/regular_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "dpipe/error.hpp"
#include "file_type.hpp"

namespace dpipe {
namespace {

const char* role_name(FileRole role) {
  switch (role) {
    case FileRole::data: return "data file";
    case FileRole::snapshot: return "snapshot";
    case FileRole::spec: return "spec";
  }
  return "file";
}

[[noreturn]] void fail(FileRole role, const std::string& msg) {
  switch (role) {
    case FileRole::data: throw DataError(msg);
    case FileRole::snapshot: throw SnapshotError(msg);
    case FileRole::spec: throw ConfigError(msg);
  }
  throw Error(msg);
}

[[noreturn]] void not_regular(FileRole role, const std::string& path, mode_t m) {
  throw FileError(std::string("cannot read ") + role_name(role) + " '" + path + "': it is " + detail::file_type_name(m) +
                  ", and dpipe reads only regular files");
}

}  // namespace

const char* detail::file_type_name(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISSOCK(m)) return "a socket";
  return "not a regular file";
}

RegularFile::RegularFile(std::string path, FileRole role) : path_(std::move(path)), role_(role) {
  // A stat first, so a device is refused without being opened (opening one may have effects); the
  // fstat after opening decides, since the path may change in between.
  struct stat st {};
  if (::stat(path_.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) not_regular(role_, path_, st.st_mode);
  // O_NONBLOCK: opening a FIFO with no writer returns at once instead of waiting for one.
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd_ < 0) fail(role_, std::string("cannot open ") + role_name(role_) + " '" + path_ + "': " + std::strerror(errno));
  if (::fstat(fd_, &st) != 0) {
    const int err = errno;
    ::close(std::exchange(fd_, -1));
    fail(role_, std::string("cannot read ") + role_name(role_) + " '" + path_ + "': " + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(std::exchange(fd_, -1));
    not_regular(role_, path_, st.st_mode);
  }
  const int flags = ::fcntl(fd_, F_GETFL);
  if (flags >= 0) ::fcntl(fd_, F_SETFL, flags & ~O_NONBLOCK);
  size_ = static_cast<std::uint64_t>(st.st_size);
}

RegularFile::RegularFile(RegularFile&& other) noexcept
    : path_(std::move(other.path_)), role_(other.role_), size_(other.size_), fd_(std::exchange(other.fd_, -1)) {}

RegularFile::~RegularFile() {
  if (fd_ >= 0) ::close(fd_);
}

int RegularFile::release() { return std::exchange(fd_, -1); }

std::string RegularFile::read_all() const {
  std::string bytes(static_cast<std::size_t>(size_), '\0');
  std::uint64_t at = 0;
  while (at < size_) {
    const ssize_t k = ::pread(fd_, bytes.data() + at, static_cast<std::size_t>(size_ - at), static_cast<off_t>(at));
    if (k < 0 && errno == EINTR) continue;
    if (k < 0)
      fail(role_, std::string("cannot read ") + role_name(role_) + " '" + path_ + "': " + std::strerror(errno));
    if (k == 0)
      fail(role_, std::string(role_name(role_)) + " '" + path_ + "' shrank while it was read: it was " +
                      std::to_string(size_) + " bytes, and ends at byte " + std::to_string(at) + " now");
    at += static_cast<std::uint64_t>(k);
  }
  return bytes;
}

std::string read_regular_file(const std::string& path, FileRole role) { return RegularFile(path, role).read_all(); }

}  // namespace dpipe
