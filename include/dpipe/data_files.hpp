#pragma once
/// Where a file source finds its files, and how a snapshot knows them again.
///
/// A source names each data file it reads in a parameter "file<i>" whose value is
/// "NAME (N bytes, mtime S.NNNNNNNNN)", or "NAME (N bytes, digest HEX)" when the user asks for a content
/// digest. The graph's fingerprint covers NAME and N; the modification time or digest is compared when a
/// snapshot is restored, so a file rewritten in place is refused unless the resume accepts changed data
/// (and ranks on machines whose copies differ only in mtime still form one set).
///
/// NAME is the file's name relative to the data root when the user sets one (`DataFiles::root`, Python's
/// `data_root=`, the tool's `--data-root`): relative names are resolved against the root, absolute names
/// inside it are recorded relative to it. A snapshot taken under one root then resumes under another (the
/// same files at another mount point), while a file moved within the root is another name, refused as
/// today. Without a root, NAME is the name as given.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dpipe {

/// What identifies a data file's content besides its name and size.
enum class FileIdentity {
  mtime,   // its modification time (free: one stat)
  digest,  // a 64-bit digest of its bytes (reads the whole file once, when the pipeline is built)
};

/// The data root and the identity of a file source's files (the same for every source of a spec or
/// Python pipeline).
struct DataFiles {
  std::string root{};  // empty: names as given; relative: against the working directory
  FileIdentity identity = FileIdentity::mtime;
};

/// One data file: the path a source opens and the name a snapshot records.
struct DataFile {
  std::string path;
  std::string name;
};

/// The files `names` under `data`: relative names joined to the root, absolute names inside the root
/// named relative to it (lexically: "." and ".." are folded, symbolic links are not followed).
std::vector<DataFile> resolve_data_files(const std::vector<std::string>& names, const DataFiles& data);

/// The parameter value for `file` of `size` bytes: its name, size and modification time or digest (a
/// file that cannot be read for its digest is the DataError of its path).
std::string data_file_param(const DataFile& file, std::uint64_t size, FileIdentity identity);

/// Whether parameter `key` names a data file ("file0", "file1", …).
bool is_data_param(std::string_view key);
/// The value of a data parameter without its modification time or digest: what the fingerprint covers.
std::string data_file_key(std::string_view value);

/// The 64-bit content digest of `bytes` (not cryptographic: it tells a changed file, not a forged one).
std::uint64_t content_digest(std::string_view bytes, std::uint64_t h = 0);

}  // namespace dpipe
