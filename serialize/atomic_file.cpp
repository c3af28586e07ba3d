// The one atomic-write routine (contract in include/dpipe/atomic_file.hpp).
#include "dpipe/atomic_file.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <random>

#include "dpipe/error.hpp"
#include "durable_dir.hpp"
#include "file_type.hpp"

namespace dpipe {
namespace {

constexpr std::size_t kBufferBytes = 1 << 16;
constexpr int kMaxLinkHops = 40;  // as the kernel's ELOOP limit
// A temporary's name holds at most this much of the target's name, so it stays within NAME_MAX.
constexpr std::size_t kMaxNameInTemp = 200;

std::string in_quotes(const std::string& p) { return "'" + p + "'"; }

std::string dir_of(const std::string& p) {
  const auto slash = p.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : p.substr(0, slash);
}

std::string name_of(const std::string& p) {
  const auto slash = p.find_last_of('/');
  return slash == std::string::npos ? p : p.substr(slash + 1);
}

std::string temp_prefix(const std::string& target) {
  return "." + name_of(target).substr(0, kMaxNameInTemp) + ".dpipe-tmp.";
}

/// Follows symbolic links from `path` to the name they end at (which may not exist yet).
std::string follow_links(const std::string& path) {
  std::string p = path;
  for (int hop = 0; hop <= kMaxLinkHops; ++hop) {
    struct stat st;
    if (::lstat(p.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) return p;
    std::string link(static_cast<std::size_t>(st.st_size > 0 ? st.st_size : 4096) + 1, '\0');
    const ssize_t n = ::readlink(p.c_str(), link.data(), link.size());
    if (n < 0) throw FileError("cannot write " + in_quotes(path) + ": cannot read the link " + in_quotes(p) + ": " + std::strerror(errno));
    link.resize(static_cast<std::size_t>(n));
    p = (link.empty() || link[0] == '/') ? link : dir_of(p) + "/" + link;
  }
  throw FileError("cannot write " + in_quotes(path) + ": more than " + std::to_string(kMaxLinkHops) +
                  " symbolic links to follow");
}


/// Removes the temporaries a killed writer left for `target`: `.NAME.dpipe-tmp.PID.HEX` with PID dead.
void remove_stale_temporaries(const std::string& target) {
  const std::string dir = dir_of(target), prefix = temp_prefix(target);
  DIR* d = ::opendir(dir.c_str());
  if (!d) return;  // creating the temporary will report what is wrong with the directory
  while (const dirent* e = ::readdir(d)) {
    const std::string_view name = e->d_name;
    if (name.substr(0, prefix.size()) != prefix) continue;
    if (detail::left_by_killed_writer(name.substr(prefix.size())))
      ::unlinkat(::dirfd(d), e->d_name, 0);  // a race with another cleaner is harmless
  }
  ::closedir(d);
}

std::string random_hex() {
  // No thread_local generator: libdpipe's thread-local storage must stay a few bytes, because Python
  // loads it with dlopen into the C library's small static TLS surplus (see t_innermost_guard).
  std::random_device rd;
  const std::uint64_t r = (std::uint64_t{rd()} << 32) | rd();
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(r));
  return buf;
}

/// Refuses a `target` (the given path with links followed) that exists and is not a regular file;
/// sets `exists`, and `st` when it exists.
void check_replaceable(const std::string& given, const std::string& target, struct stat& st, bool& exists) {
  exists = ::stat(target.c_str(), &st) == 0;
  if (!exists && errno != ENOENT)
    throw FileError("cannot write " + in_quotes(given) + ": " + std::strerror(errno));
  if (exists && !S_ISREG(st.st_mode))
    throw FileError("cannot write " + in_quotes(given) + ": it is " + detail::file_type_name(st.st_mode) +
                    ", and dpipe replaces only regular files");
}

}  // namespace

namespace detail {

void fsync_directory(const std::string& dir, const std::string& path) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw FileError("cannot make " + in_quotes(path) + " durable: cannot open its directory: " + std::strerror(errno));
  // Some file systems cannot fsync a directory (EINVAL): the rename is as durable as they make it.
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0 && err != EINVAL && err != ENOTSUP)
    throw FileError("cannot make " + in_quotes(path) + " durable: fsync of its directory failed: " + std::strerror(err));
}

bool process_is_gone(long pid) {
  return pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH;
}

bool left_by_killed_writer(std::string_view pid_and_hex) {
  const std::string rest(pid_and_hex);
  char* end = nullptr;
  errno = 0;
  const long pid = std::strtol(rest.c_str(), &end, 10);
  if (errno != 0 || end == rest.c_str() || *end != '.' || pid <= 0 || pid == static_cast<long>(::getpid())) return false;
  const char* hex = end + 1;
  if (*hex == '\0' || std::strspn(hex, "0123456789abcdef") != std::strlen(hex)) return false;
  return process_is_gone(pid);
}

}  // namespace detail

AtomicFileWriter::AtomicFileWriter(std::string path, AtomicWriteOptions options) : path_(std::move(path)) {
  if (path_.empty()) throw FileError("cannot write a file with an empty path");
  struct stat st;
  // stat() follows links, so a link to /dev/null counts as the device.
  if (::stat(path_.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    const bool streamable = S_ISCHR(st.st_mode) || S_ISFIFO(st.st_mode);
    if (!streamable || options.special != SpecialFiles::write_in_place)
      throw FileError("cannot write " + in_quotes(path_) + ": it is " + detail::file_type_name(st.st_mode) +
                      ", and dpipe replaces only regular files" +
                      (streamable ? " (the tool's --output writes devices and FIFOs in place)" : ""));
    target_ = path_;
    // Opening a FIFO waits for a reader, as a shell redirection does.
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd_ < 0) fail("cannot open", errno);
    return;
  }
  target_ = follow_links(path_);
  bool exists = false;
  check_replaceable(path_, target_, st, exists);
  // Replacing needs only a writable directory; a file the user protected stays protected.
  if (exists && ::access(target_.c_str(), W_OK) != 0) fail("cannot replace", errno);
  sync_ = options.durability == Durability::each_write;
  if (sync_ && options.remove_stale_temporaries) remove_stale_temporaries(target_);
  const std::string dir = dir_of(target_), stem = dir + "/" + temp_prefix(target_) + std::to_string(::getpid()) + ".";
  for (int attempt = 0; fd_ < 0; ++attempt) {
    temp_ = stem + random_hex();
    fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd_ < 0 && (errno != EEXIST || attempt == 8)) {
      const int err = errno;
      temp_.clear();
      throw FileError("cannot write " + in_quotes(path_) + ": cannot create a temporary file in " + in_quotes(dir) + ": " +
                      std::strerror(err));
    }
  }
  if (exists && ::fchmod(fd_, st.st_mode & 07777) != 0) {
    const int err = errno;
    ::close(fd_);  // the destructor does not run when the constructor throws
    ::unlink(temp_.c_str());
    fail("cannot set the permissions of", err);
  }
}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!temp_.empty() && !done_) ::unlink(temp_.c_str());
}

void AtomicFileWriter::fail(const std::string& what, int err) const {
  throw FileError(what + " " + in_quotes(path_) + (target_ != path_ && !target_.empty() ? " (" + in_quotes(target_) + ")" : "") +
                  ": " + std::strerror(err));
}

void AtomicFileWriter::write_out(const char* data, std::size_t n) {
  while (n > 0) {
    const ssize_t k = ::write(fd_, data, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) fail("cannot write", k < 0 ? errno : EIO);
    data += k;
    n -= static_cast<std::size_t>(k);
  }
}

void AtomicFileWriter::write(std::string_view bytes) {
  if (done_ || fd_ < 0) throw FileError("cannot write " + in_quotes(path_) + ": it is already committed");
  if (buffer_.size() + bytes.size() > kBufferBytes) {
    flush();
    if (bytes.size() >= kBufferBytes) return write_out(bytes.data(), bytes.size());  // no copy of big writes
  }
  buffer_.append(bytes);
}

void AtomicFileWriter::flush() {
  if (fd_ < 0 || buffer_.empty()) return;
  write_out(buffer_.data(), buffer_.size());
  buffer_.clear();
}

void AtomicFileWriter::finish(const std::string& final_path) {
  if (done_ || fd_ < 0) throw FileError("cannot commit " + in_quotes(path_) + " twice");
  flush();
  if (!in_place() && sync_ && ::fsync(fd_) != 0) fail("cannot flush", errno);
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) fail("cannot write", errno);
  if (in_place()) {
    done_ = true;
    return;
  }
  if (::rename(temp_.c_str(), final_path.c_str()) != 0) {
    const int err = errno;
    throw FileError("cannot move the new content of " + in_quotes(path_) + " into place at " + in_quotes(final_path) + ": " +
                    std::strerror(err));
  }
  done_ = true;
  if (sync_) detail::fsync_directory(dir_of(final_path), final_path);
}

void AtomicFileWriter::commit() { finish(target_); }

std::string AtomicFileWriter::commit_beside(std::string_view suffix) {
  if (in_place()) {
    finish(target_);
    return "";
  }
  const std::string beside = target_ + std::string(suffix);
  const std::string final_path = follow_links(beside);
  struct stat st;
  bool exists = false;
  check_replaceable(beside, final_path, st, exists);
  finish(final_path);
  return beside;
}

void write_file_atomically(const std::string& path, std::string_view bytes, AtomicWriteOptions options) {
  AtomicFileWriter w(path, options);
  w.write(bytes);
  w.commit();
}

}  // namespace dpipe
