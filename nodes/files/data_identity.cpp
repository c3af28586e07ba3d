// Data identity of file sources: names under the data root, sizes, and modification times or digests
// (see dpipe/data_files.hpp).
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "dpipe/data_files.hpp"
#include "dpipe/error.hpp"
#include "dpipe/regular_file.hpp"
#include "dpipe/rng.hpp"

namespace dpipe {

namespace fs = std::filesystem;

std::vector<DataFile> resolve_data_files(const std::vector<std::string>& names, const DataFiles& data) {
  std::vector<DataFile> out;
  out.reserve(names.size());
  if (data.root.empty()) {
    for (const auto& n : names) out.push_back({n, n});
    return out;
  }
  std::error_code ec;
  fs::path root = fs::absolute(fs::path(data.root), ec);
  if (ec) throw ConfigError("data root '" + data.root + "': " + ec.message());
  root = root.lexically_normal();
  if (!root.has_filename()) root = root.parent_path();  // "/data/" → "/data"
  for (const auto& n : names) {
    const fs::path given(n);
    if (n.empty()) throw ConfigError("an empty file name (data root '" + data.root + "')");
    if (given.is_relative()) {
      const fs::path name = given.lexically_normal();
      if (!name.empty() && *name.begin() == "..")
        throw ConfigError("data file '" + n + "' lies outside the data root '" + data.root +
                          "': name it absolutely, or set a root that holds it");
      out.push_back({(root / name).string(), name.generic_string()});
      continue;
    }
    const fs::path path = given.lexically_normal();
    const fs::path inside = path.lexically_relative(root);
    const bool under = !inside.empty() && *inside.begin() != ".." && inside != ".";
    out.push_back({path.string(), under ? inside.generic_string() : path.generic_string()});
  }
  return out;
}

std::uint64_t content_digest(std::string_view bytes, std::uint64_t h) {
  // Four lanes over 8-byte words, each word mixed into its lane, the lanes and the tail folded at the end.
  std::uint64_t lane[4] = {h ^ 0x243f6a8885a308d3ULL, h ^ 0x13198a2e03707344ULL, h ^ 0xa4093822299f31d0ULL,
                           h ^ 0x082efa98ec4e6c89ULL};
  std::size_t at = 0;
  for (; at + 32 <= bytes.size(); at += 32)
    for (int i = 0; i < 4; ++i) {
      std::uint64_t w;
      std::memcpy(&w, bytes.data() + at + 8 * i, 8);
      lane[i] = (lane[i] ^ w) * 0x9e3779b97f4a7c15ULL;
      lane[i] ^= lane[i] >> 29;
    }
  std::uint64_t out = mix64(bytes.size());
  for (const std::uint64_t l : lane) out = mix64(out ^ l);
  return mix64(out ^ fnv1a(bytes.substr(at)));
}

namespace {

/// The digest of the file's first `size` bytes, read 1 MiB at a time; digests of chunks are chained.
std::uint64_t file_digest(const std::string& path, std::uint64_t size) {
  const RegularFile file(path, FileRole::data);
  if (file.size() < size) throw DataError("data file '" + path + "' shrank while its digest was taken");
  std::vector<char> buf(1 << 20);
  std::uint64_t h = 0, at = 0;
  while (at < size) {
    // Whole 1 MiB chunks (the last one shorter): the digest never depends on how reads come back.
    const auto want = static_cast<std::size_t>(std::min<std::uint64_t>(buf.size(), size - at));
    std::size_t filled = 0;
    while (filled < want) {
      const ssize_t got = ::pread(file.fd(), buf.data() + filled, want - filled, static_cast<off_t>(at + filled));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0)
        throw DataError("cannot read data file '" + path + "' for its digest: " +
                        (got < 0 ? std::string(std::strerror(errno)) : "it shrank"));
      filled += static_cast<std::size_t>(got);
    }
    h = content_digest(std::string_view(buf.data(), want), h);
    at += want;
  }
  return h;
}

}  // namespace

bool is_data_param(std::string_view key) {
  if (key.size() <= 4 || key.substr(0, 4) != "file") return false;
  for (char c : key.substr(4))
    if (c < '0' || c > '9') return false;
  return true;
}

std::string data_file_key(std::string_view value) {
  if (value.empty() || value.back() != ')') return std::string(value);
  // The stamp is the last one in the text (a file name may hold ", mtime " itself).
  const auto mtime = value.rfind(", mtime "), digest = value.rfind(", digest ");
  const auto at = mtime == std::string_view::npos ? digest
                  : digest == std::string_view::npos ? mtime
                                                     : std::max(mtime, digest);
  if (at == std::string_view::npos) return std::string(value);
  return std::string(value.substr(0, at)) + ")";  // "NAME (N bytes)", as snapshots before mtimes wrote it
}

std::string data_file_param(const DataFile& file, std::uint64_t size, FileIdentity identity) {
  std::string v = file.name + " (" + std::to_string(size) + " bytes";
  if (identity == FileIdentity::digest) {
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(file_digest(file.path, size)));
    return v + ", digest " + hex + ")";
  }
  struct stat st {};
  if (::stat(file.path.c_str(), &st) == 0) {
    char ns[16];
    std::snprintf(ns, sizeof ns, "%09ld", static_cast<long>(st.st_mtim.tv_nsec));
    v += ", mtime " + std::to_string(static_cast<long long>(st.st_mtim.tv_sec)) + "." + ns;
  }
  return v + ")";
}

}  // namespace dpipe
