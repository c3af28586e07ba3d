#pragma once
// What a path that is not a regular file is, in the words dpipe's messages use (inside the library:
// reading files, atomic writes).
#include <sys/types.h>

namespace dpipe::detail {

/// "a directory", "a character device", "a block device", "a FIFO", "a socket", else "not a regular file".
const char* file_type_name(mode_t mode);

}  // namespace dpipe::detail
