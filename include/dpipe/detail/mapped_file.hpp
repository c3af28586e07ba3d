#pragma once
/// A read-only memory map of a whole data file (nodes/mapped_file.cpp). The descriptor is closed as
/// soon as the file is mapped, so a source holds no open file however many files it covers.
#include <cstddef>
#include <string>

namespace dpipe::detail {

class MappedFile {
 public:
  /// Maps `path`; a DataError names the file when it cannot be opened or mapped.
  explicit MappedFile(std::string path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const char* data() const { return data_; }
  std::size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const char* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace dpipe::detail
