#include "dpipe/detail/mapped_file.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "dpipe/error.hpp"

namespace dpipe::detail {

MappedFile::MappedFile(std::string path) : path_(std::move(path)) {
  const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw DataError("cannot open data file '" + path_ + "': " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    const int err = errno;
    ::close(fd);
    throw DataError("data file '" + path_ + "' is not a readable regular file" +
                    (err ? std::string(": ") + std::strerror(err) : std::string()));
  }
  size_ = static_cast<std::size_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      throw DataError("cannot map data file '" + path_ + "': " + std::strerror(err));
    }
    data_ = static_cast<const char*>(p);
  }
  ::close(fd);
}

void MappedFile::will_read(std::size_t begin, std::size_t end) const {
#ifdef MADV_POPULATE_READ
  end = std::min(end, size_);
  if (!data_ || begin >= end) return;
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  const std::size_t from = begin / page * page;
  ::madvise(const_cast<char*>(data_) + from, end - from, MADV_POPULATE_READ);  // a hint: errors ignored
#else
  (void)begin;
  (void)end;
#endif
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<char*>(data_), size_);
}

}  // namespace dpipe::detail
