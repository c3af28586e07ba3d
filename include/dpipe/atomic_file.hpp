#pragma once
/// The one way dpipe writes a file: snapshots, snapshot sets, records files and the tool's outputs.
///
/// Guarantee: the content goes to a temporary file in the target's directory; the temporary is
/// fsynced, renamed over the target, and the directory is fsynced (which makes the rename durable).
/// After a crash or a kill at any moment the path holds the old complete file or the new complete
/// file, never a mix. What a path may be, decided once for every writer:
/// - a regular file or a new name: replaced (a new file gets 0666 less the umask; a replaced file keeps
///   its permission bits; hard links to the old file keep the old content). A file this process may
///   not write is refused, even where the directory would allow replacing it.
/// - a symbolic link (also a chain, also one that names no file yet): the file the link names is
///   replaced; the link stays a link.
/// - a directory, a block device or a socket: refused with a FileError, never replaced.
/// - a character device (/dev/null) or a FIFO: refused with a FileError, unless the writer is opened
///   with `SpecialFiles::write_in_place` (the tool's --output does, so `--output /dev/null` and
///   `--output /dev/stdout` stream as before); then it is written in place with no temporary, and the
///   guarantee above does not apply. Neither is ever replaced by a regular file.
/// Temporaries are named `.NAME.dpipe-tmp.PID.RANDOM` beside the target. Each write first removes the
/// temporaries of the same NAME whose process no longer exists (a writer that was killed), so they do
/// not pile up; those of live processes are left alone. This assumes that the writers of one path share
/// one machine's process ids, as the ranks of a snapshot set do (each writes its own file names).
#include <string>
#include <string_view>

namespace dpipe {

/// What to do when the path is a character device or a FIFO.
enum class SpecialFiles { refuse, write_in_place };

/// Who makes a write durable.
enum class Durability {
  each_write,  // every commit fsyncs the temporary and the directory (the guarantee above)
  by_caller,   // neither, and no stale temporaries are looked for: the caller writes many files into a
               // directory of its own and makes it durable once (SnapshotSet::rescale_dir)
};

struct AtomicWriteOptions {
  SpecialFiles special = SpecialFiles::refuse;
  Durability durability = Durability::each_write;
  /// Whether a durable write first removes the temporaries killed writers left for the path (one listing
  /// of its directory); false when the caller removes them in a listing of its own (a set's rank writes).
  bool remove_stale_temporaries = true;
};

/// Streams a file into place: construct (the path is checked and a temporary made), write() any number
/// of times, then commit(). Destroyed without commit(), it removes the temporary and the path keeps
/// what it held. Throws FileError naming the path and the reason. Not thread-safe; not copyable.
class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(std::string path, AtomicWriteOptions options = {});
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;
  ~AtomicFileWriter();

  /// Appends bytes (buffered; a write error may surface here, in flush() or in commit()).
  void write(std::string_view bytes);
  /// Hands the buffered bytes to the file (not durable until commit()).
  void flush();
  /// Flushes, fsyncs and renames the temporary over the target, then fsyncs the directory. Once.
  void commit();
  /// Like commit(), but puts the content at the target's path plus `suffix` (PATH.partial) and leaves
  /// the target as it was; that path follows the same rules. Returns it; empty when writing in place
  /// (there is no separate content to keep).
  std::string commit_beside(std::string_view suffix);

  /// The path as given.
  const std::string& path() const { return path_; }
  /// The file that is replaced: the path with symbolic links followed.
  const std::string& target() const { return target_; }
  /// True when writing a character device or FIFO in place.
  bool in_place() const { return temp_.empty(); }

 private:
  void write_out(const char* data, std::size_t n);
  void finish(const std::string& final_path);
  [[noreturn]] void fail(const std::string& what, int err) const;

  std::string path_;
  std::string target_;
  std::string temp_;  // empty when writing in place
  std::string buffer_;
  int fd_ = -1;
  bool done_ = false;
  bool sync_ = true;  // Durability::each_write
};

/// Writes `bytes` to `path` with the guarantee above (special files refused unless `options` say so).
void write_file_atomically(const std::string& path, std::string_view bytes, AtomicWriteOptions options = {});

}  // namespace dpipe
