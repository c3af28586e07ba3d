#pragma once
/// The one way dpipe opens a file to read it: data files (`lines`, `line_blocks`, `records`,
/// `token_windows`), snapshots (`Snapshot::read_file`, the rank files of a set) and the tool's spec files.
///
/// Only regular files are read. A FIFO, a device, a socket or a directory is refused with a FileError
/// naming the path and what it is (`cannot read snapshot 'x': it is a FIFO, and dpipe reads only regular
/// files`), and nothing blocks on the way: the path is opened with O_NONBLOCK (a FIFO with no writer
/// opens at once instead of waiting), checked with fstat, and only then set back to blocking. Every read
/// is bounded by the size fstat reported when the file was opened: bytes appended later are not read,
/// and `/dev/zero` is never read at all. A file that cannot be opened or read raises the reader's own
/// error (DataError for data, SnapshotError for snapshots, ConfigError for specs), naming the path.
/// The system calls live in serialize/regular_file.cpp, so this header includes no POSIX header.
#include <cstdint>
#include <string>

namespace dpipe {

/// What a file is read as: names it in messages and chooses the error for a file that cannot be read.
enum class FileRole { data, snapshot, spec };

/// An open regular file: a blocking, close-on-exec descriptor and the file's size when it was opened.
class RegularFile {
 public:
  /// Opens `path`; throws FileError when it is not a regular file, the role's error when it cannot be
  /// opened. Never blocks on a FIFO.
  RegularFile(std::string path, FileRole role);
  ~RegularFile();
  RegularFile(RegularFile&& other) noexcept;
  RegularFile& operator=(RegularFile&&) = delete;
  RegularFile(const RegularFile&) = delete;
  RegularFile& operator=(const RegularFile&) = delete;

  int fd() const { return fd_; }
  /// The size fstat reported when the file was opened.
  std::uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }
  /// Hands the descriptor over (the caller closes it); this object closes nothing afterwards.
  int release();
  /// Reads bytes [0, size()), no more: a file that shrank meanwhile is the role's error.
  std::string read_all() const;

 private:
  std::string path_;
  FileRole role_;
  std::uint64_t size_ = 0;
  int fd_ = -1;
};

/// Reads the whole regular file `path` (RegularFile(path, role).read_all()).
std::string read_regular_file(const std::string& path, FileRole role);

}  // namespace dpipe
