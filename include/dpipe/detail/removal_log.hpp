#pragma once
/// A snapshot set directory's removal log, `.set.dpipe-removals`: each rank that removes its older files
/// from the directory appends, in one write, the TAG of each removed file's set (8 bytes, little-endian;
/// 0 for a file whose name carries none). The rank whose write completes a set reads the log's device,
/// inode and length before the listing that finds the set complete, and after writing the manifest reads
/// what was appended since: only when a file of its own set (or of no known set) was removed meanwhile, or
/// the log was replaced, does it list the directory again. One stat and a short read thus stand in for a
/// second listing of W names on the checkpoint path, also while the other ranks remove their older sets'
/// files at the same moment. Past kCap bytes the appender removes the log (the next one starts a new file;
/// a reader then sees it replaced). The log is not made durable: it speaks only to processes running at
/// the same time, on file systems whose appends and stats are atomic (local ones; the same the set's
/// listings assume). A removal that cannot be recorded (a full disk) goes unseen by such a reader.
#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace dpipe::detail {

class RemovalLog {
 public:
  static constexpr const char* kName = ".set.dpipe-removals";
  static constexpr off_t kCap = off_t(1) << 20;

  /// Reads the state of `dir`'s log: make it before the listing whose later removals are to be noticed.
  explicit RemovalLog(const std::string& dir);

  /// Records in `dir`'s log that this process removed files of the sets tagged `tags`. Call after the
  /// removals (the log is opened after them). Never throws.
  static void record(const std::string& dir, const std::vector<std::uint64_t>& tags);

  /// Whether nothing recorded since the state was read names set `tag` or no set, and the log is the same
  /// file (false when it was replaced, or cannot be read).
  bool saw_no_removal_of(std::uint64_t tag) const;

 private:
  struct Mark {
    bool exists = false;
    dev_t dev = 0;
    ino_t ino = 0;
    off_t size = 0;
  };
  static Mark mark(const std::string& path);

  std::string path_;
  Mark before_;
};

}  // namespace dpipe::detail
