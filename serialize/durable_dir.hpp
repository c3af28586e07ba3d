#pragma once
// Making a directory's entries durable, and knowing a killed writer's leftovers (inside the library:
// atomic writes, snapshot sets).
#include <string>
#include <string_view>

namespace dpipe::detail {

/// fsyncs directory `dir` so that the renames and removals in it survive a crash; `path` names what is
/// being made durable in the error (FileError). File systems that cannot fsync a directory are accepted.
void fsync_directory(const std::string& dir, const std::string& path);

/// Whether no process `pid` exists any more (a temporary named for it was left by a killed writer).
bool process_is_gone(long pid);

/// Whether `pid_and_hex`, what follows `.dpipe-tmp.` in a temporary's name, is `PID.HEX` of a process
/// other than this one that is gone: the temporary is a killed writer's.
bool left_by_killed_writer(std::string_view pid_and_hex);

}  // namespace dpipe::detail
