// TFRecord framing: reading (indexing once, then random access) and writing.
#include "dpipe/nodes/records.hpp"

#include <cstdio>
#include <cstring>


#include "dpipe/atomic_file.hpp"
#include "dpipe/crc32c.hpp"

namespace dpipe {

std::uint32_t masked_crc32c(const void* data, std::size_t n) {
  const std::uint32_t crc = crc32c_raw(data, n);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

namespace detail {
namespace {

std::string where(const MappedFile& f, std::uint64_t offset) {
  return "records file '" + f.path() + "', byte offset " + std::to_string(offset);
}

std::uint32_t load_u32(const char* p) {
  std::uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

}  // namespace

void index_records(const MappedFile& file, std::uint32_t file_no, OnDataError on_error, std::vector<RecordSpan>& out,
                   SkipCounts& skipped) {
  const char* p = file.data();
  const std::uint64_t size = file.size();
  std::uint64_t at = 0;
  const MappedReadGuard guard(file);
  auto bad = [&](const std::string& what) {
    guard.check_size();  // bad framing read from a file that shrank meanwhile: that is the error
    if (on_error == OnDataError::fail) throw DataError(where(file, at) + ": " + what);
    ++skipped.records;
  };
  auto length_ok = [&](std::uint64_t q) {  // a header at q whose length checksum holds
    return size - q >= 12 && masked_crc32c(p + q, 8) == load_u32(p + q + 8);
  };
  auto length_at = [&](std::uint64_t q) {
    std::uint64_t len;
    std::memcpy(&len, p + q, 8);
    return len;
  };
  // The next offset from `q` where records can be framed again: a header whose length checksum holds,
  // whose record fits in the file, and after which the file ends or another header's length checksum
  // holds. O(1) per offset, so a damaged stretch costs time linear in its bytes. The end if none.
  auto resync = [&](std::uint64_t q) {
    for (; size - q >= 16; ++q) {
      if (!length_ok(q)) continue;
      const std::uint64_t len = length_at(q);
      if (len > size - q - 16) continue;
      const std::uint64_t next = q + 16 + len;
      if (next == size || length_ok(next)) return q;
    }
    return size;
  };
  auto give_up_to = [&](std::uint64_t to) {  // the bytes [at, to) cannot be framed
    skipped.bytes += to - at;
    at = to;
  };
  while (at < size) {
    if (size - at < 12) {
      bad("truncated record header (" + std::to_string(size - at) + " bytes left, 12 needed)");
      give_up_to(size);
      break;
    }
    const std::uint64_t len = length_at(at);
    if (!length_ok(at)) {
      bad("length checksum mismatch");
      give_up_to(resync(at + 1));
      continue;
    }
    if (len > size - at - 12 || size - at - 12 - len < 4) {
      bad("truncated record: " + std::to_string(len) + " data bytes announced, " +
          std::to_string(size - at - 12) + " bytes left with the data checksum");
      give_up_to(resync(at + 1));
      continue;
    }
    const RecordSpan r{file_no, at, len};
    if (on_error == OnDataError::skip && masked_crc32c(p + at + 12, len) != load_u32(p + at + 12 + len)) {
      bad("data checksum mismatch");  // framing holds: go on with the next record
      skipped.bytes += 12 + len + 4;
    } else {
      out.push_back(r);
    }
    at += 12 + len + 4;
  }
  guard.check();
}

std::string read_record(const MappedFile& file, const RecordSpan& r) {
  const char* data = file.data() + r.offset + 12;
  const MappedReadGuard guard(file);
  const bool checksum_ok = masked_crc32c(data, r.length) == load_u32(data + r.length);
  std::string record(data, r.length);
  guard.check();
  if (!checksum_ok) {
    guard.check_size();
    throw DataError(where(file, r.offset) + ": data checksum mismatch");
  }
  return record;
}

}  // namespace detail

RecordsDef::RecordsDef(const std::vector<std::string>& files, RecordsOptions o)
    : NodeDef<std::string>("records", o.name, {{"on_error", o.on_error == OnDataError::skip ? "skip" : "fail"}}, {}) {
  if (files.empty()) throw ConfigError(node_label("records", o.name) + ": no files given");
  for (const auto& f : resolve_data_files(files, o.data)) {
    auto m = std::make_shared<const detail::MappedFile>(f.path);
    detail::index_records(*m, static_cast<std::uint32_t>(maps_.size()), o.on_error, index_, skipped_);
    // The fingerprint covers every file's name and size, so a snapshot of other data is refused.
    add_param("file" + std::to_string(maps_.size()), data_file_param(f, m->size(), o.data.identity));
    maps_.push_back(std::move(m));
  }
}

void write_records(const std::string& path, const std::vector<std::string>& records) {
  AtomicFileWriter out(path);
  for (const auto& r : records) {
    const std::uint64_t len = r.size();
    const std::uint32_t len_crc = masked_crc32c(&len, 8), data_crc = masked_crc32c(r.data(), r.size());
    out.write({reinterpret_cast<const char*>(&len), 8});
    out.write({reinterpret_cast<const char*>(&len_crc), 4});
    out.write(r);
    out.write({reinterpret_cast<const char*>(&data_crc), 4});
  }
  out.commit();
}

}  // namespace dpipe
