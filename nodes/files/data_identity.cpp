// Data identity parameters of file sources: path, size and modification time (see dpipe/kit/node.hpp).
#include <sys/stat.h>

#include <cstdio>
#include <string>
#include <string_view>

#include "dpipe/kit/node.hpp"

namespace dpipe {

bool is_data_param(std::string_view key) {
  if (key.size() <= 4 || key.substr(0, 4) != "file") return false;
  for (char c : key.substr(4))
    if (c < '0' || c > '9') return false;
  return true;
}

std::string without_mtime(std::string_view value) {
  const auto at = value.rfind(", mtime ");
  if (at == std::string_view::npos || value.empty() || value.back() != ')') return std::string(value);
  return std::string(value.substr(0, at)) + ")";  // "PATH (N bytes)", as snapshots before mtimes wrote it
}

std::string data_file_param(const std::string& path, std::uint64_t size) {
  std::string v = path + " (" + std::to_string(size) + " bytes";
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    char ns[16];
    std::snprintf(ns, sizeof ns, "%09ld", static_cast<long>(st.st_mtim.tv_nsec));
    v += ", mtime " + std::to_string(static_cast<long long>(st.st_mtim.tv_sec)) + "." + ns;
  }
  return v + ")";
}

}  // namespace dpipe
