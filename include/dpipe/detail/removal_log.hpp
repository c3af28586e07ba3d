#pragma once
/// A snapshot set directory's removal log, `.set.dpipe-removals`: one byte appended each time a rank
/// removes its older files from the directory. The rank whose write completes a set reads the log's
/// device, inode and length before the listing that finds the set complete and again after writing the
/// manifest; when another process appended meanwhile, a file of the set may be gone, and it lists the
/// directory again. One stat thus stands in for a second listing of W names on the checkpoint path.
/// Past kCap bytes the appender cuts the log back to nothing (every reader then sees it changed). The log
/// is not made durable: it speaks only to processes running at the same time, on file systems whose
/// appends and stats are atomic (local ones; the same the set's listings assume).
#include <sys/types.h>

#include <string>

namespace dpipe::detail {

class RemovalLog {
 public:
  static constexpr const char* kName = ".set.dpipe-removals";
  static constexpr off_t kCap = off_t(1) << 20;

  /// Reads the state of `dir`'s log: make it before the listing whose later removals are to be noticed.
  explicit RemovalLog(const std::string& dir);

  /// Appends this process's byte (it has removed a rank file), and notes whether another process
  /// appended since the state was read. Never throws: a log that cannot be written is taken as changed.
  void record_removal();

  /// Whether no other process has appended since the state was read (this one's own bytes aside).
  bool unchanged() const;

 private:
  struct Mark {
    bool exists = false;
    dev_t dev = 0;
    ino_t ino = 0;
    off_t size = 0;
    bool operator==(const Mark&) const = default;
  };
  Mark mark() const;

  std::string path_;
  Mark expected_;
  bool changed_ = false;
};

}  // namespace dpipe::detail
