#pragma once
/// A snapshot set directory's removal log, `.set.dpipe-removals`: each rank that removes files from the
/// directory appends, in one write, the TAG of each removed file's set (8 bytes, little-endian; 0 for a
/// file whose name carries none). The rank whose write completes a set opens the log (creating it) and
/// notes its length before the listing that finds the set complete, and after writing the manifest reads
/// what was appended since, through the file it holds open: only when a file of its own set (or of no
/// known set) was removed meanwhile, or the log's name now names another file or none, does it list the
/// directory again. One open and a short read thus stand in for a second listing of W names on the
/// checkpoint path, also while the other ranks remove their older sets' files at the same moment. Past
/// kCap bytes an appender removes the log (the next one starts a new file; a holder of the old one sees
/// it replaced). The log is not made durable: it speaks only to processes running at the same time, on
/// file systems whose appends are atomic (local ones; the same the set's listings assume). A removal that
/// cannot be recorded (a full disk) goes unseen by such a reader.
#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace dpipe::detail {

class RemovalLog {
 public:
  static constexpr const char* kName = ".set.dpipe-removals";
  static constexpr off_t kCap = off_t(1) << 20;

  /// Opens `dir`'s log (created if missing) and notes its length: make it before the listing whose later
  /// removals are to be noticed. A log that cannot be opened makes saw_no_removal_of() false.
  explicit RemovalLog(const std::string& dir);
  ~RemovalLog();
  RemovalLog(const RemovalLog&) = delete;
  RemovalLog& operator=(const RemovalLog&) = delete;

  /// Records in `dir`'s log that this process removed files of the sets tagged `tags`. Call after the
  /// removals (the log is opened after them). Never throws.
  static void record(const std::string& dir, const std::vector<std::uint64_t>& tags);

  /// Whether nothing appended since the log was opened names set `tag` or no set, and the log's name
  /// still names the file held open (false when it was replaced or removed, or cannot be read).
  bool saw_no_removal_of(std::uint64_t tag) const;

 private:
  std::string path_;
  int fd_ = -1;
  off_t from_ = 0;
};

}  // namespace dpipe::detail
