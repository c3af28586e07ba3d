#pragma once
/// What this process has read, for the tool's `run --stats` and the benchmarks that report bytes read.
#include <cstdint>
#include <fstream>
#include <string>

namespace dpipe::detail {

/// The bytes this process has read through read(2) and pread(2) so far (`rchar` of /proc/self/io; 0
/// where there is none). Directory listings are not counted.
inline std::uint64_t bytes_read_by_process() {
  std::ifstream io("/proc/self/io");
  std::string key;
  std::uint64_t value = 0;
  while (io >> key >> value)
    if (key == "rchar:") return value;
  return 0;
}

}  // namespace dpipe::detail
