#pragma once
// Making a directory's entries durable (inside the library: atomic writes, snapshot sets).
#include <string>

namespace dpipe::detail {

/// fsyncs directory `dir` so that the renames and removals in it survive a crash; `path` names what is
/// being made durable in the error (FileError). File systems that cannot fsync a directory are accepted.
void fsync_directory(const std::string& dir, const std::string& path);

}  // namespace dpipe::detail
