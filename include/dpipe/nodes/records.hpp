#pragma once
/// Records from TFRecord files: each record is a little-endian uint64 length, the masked CRC-32C of
/// those 8 bytes, the data, and the masked CRC-32C of the data — byte-compatible with TensorFlow.
/// `write_records` writes such files. The files are memory-mapped and indexed once when the pipeline is
/// built, so the source is random-access: put a `sampler` after it to read in a global order and
/// rescale; alone it reads every record in order on every worker. Out: std::string (the record's
/// bytes). State: the next record.
///
/// Bad data — a truncated record, a CRC mismatch, an unreadable file — is a DataError naming the file
/// and byte offset; with `on_error = skip` bad records are skipped and counted instead. After a header
/// whose length checksum fails (or whose record runs past the end), reading resynchronises on the next
/// offset where a header's length checksum holds, its record fits, and the end of the file or another
/// such header follows it (a false match in damaged bytes has odds of about 2^-64 per offset); the
/// records from there on are read as usual. Counted: `skipped()` records (each bad data checksum, and
/// one per damaged stretch), `skipped_bytes()` every byte not delivered in a good record.
#include <memory>
#include <string>
#include <vector>

#include "dpipe/detail/indexed_source.hpp"
#include "dpipe/detail/mapped_file.hpp"
#include "dpipe/pipeline.hpp"
#include "dpipe/kit/on_error.hpp"
#include "dpipe/kit/rescale.hpp"
#include "dpipe/kit/spec.hpp"

namespace dpipe {

struct RecordsOptions {
  OnDataError on_error = OnDataError::fail;
  std::string name{};
  /// The data root the file names are resolved against and how the files are identified in snapshots.
  DataFiles data{};
};

/// Writes `records` as a TFRecord file through AtomicFileWriter (atomic_file.hpp); throws FileError.
void write_records(const std::string& path, const std::vector<std::string>& records);

/// The TFRecord checksum: CRC-32C rotated right by 15 bits plus a constant.
std::uint32_t masked_crc32c(const void* data, std::size_t n);

namespace detail {

struct RecordSpan {
  std::uint32_t file;
  std::uint64_t offset;  // of the record's length field
  std::uint64_t length;  // of its data
};

/// What `on_error = skip` gave up: records, and bytes not delivered in a good record.
struct SkipCounts {
  std::uint64_t records = 0, bytes = 0;
};

/// Frames every record of `file`; appends them to `out`. With `skip`, bad records are counted in
/// `skipped` (and their data CRC checked here), and a damaged header is passed by resynchronising on the
/// next valid one; otherwise the first bad framing throws DataError.
void index_records(const MappedFile& file, std::uint32_t file_no, OnDataError on_error, std::vector<RecordSpan>& out,
                   SkipCounts& skipped);
/// The data of one record, its CRC checked; DataError naming file and offset on a mismatch.
std::string read_record(const MappedFile& file, const RecordSpan& r);

}  // namespace detail

class RecordsDef final : public NodeDef<std::string>, public RandomAccess<std::string> {
 public:
  RecordsDef(const std::vector<std::string>& files, RecordsOptions o);
  // Declared inline (it is defined below the Iter): a class without a non-inline virtual has its vtable
  // emitted only where an object is made, not in every file that includes this header.
  inline std::unique_ptr<Iter<std::string>> instantiate(BuildContext& ctx) const override;
  std::uint64_t size() const override { return index_.size(); }
  std::string at(std::uint64_t i) const override {
    const auto& r = index_[i];
    return detail::read_record(*maps_[r.file], r);
  }
  bool prefetches() const override { return true; }
  void prefetch(std::uint64_t i) const override {
    const auto& r = index_[i];
    detail::prefetch_bytes(maps_[r.file]->data() + r.offset, r.length + 16);
  }
  /// Records skipped as bad (on_error = skip): each bad data checksum, and one per damaged stretch.
  std::uint64_t skipped() const override { return skipped_.records; }
  /// Bytes of the files not delivered in a good record (on_error = skip).
  std::uint64_t skipped_bytes() const override { return skipped_.bytes; }

 private:
  std::vector<std::shared_ptr<const detail::MappedFile>> maps_;
  std::vector<detail::RecordSpan> index_;
  detail::SkipCounts skipped_;
};

inline std::unique_ptr<Iter<std::string>> RecordsDef::instantiate(BuildContext& ctx) const {
  return std::make_unique<detail::IndexedSourceIter<std::string>>(ctx, *this, "records");
}

inline Pipeline<std::string> records(const std::vector<std::string>& files, RecordsOptions o = {}) {
  return make_pipeline<RecordsDef>(files, std::move(o));
}

struct RecordsKind {
  static constexpr std::string_view name = "records";
  static constexpr std::string_view doc =
      "Records from TFRecord files (checked CRCs), random-access: put a sampler after it.";
  /// Provenance (docs/design.md, "Provenance"; a kind without this line does not carry it).
  static constexpr std::string_view provenance = "names record i by position i (read in order); makes it again from its key";
  static constexpr ParamSchema params[] = {
      {.name = "files", .type = ParamType::texts, .doc = "the TFRecord files, in order", .positional = true, .fingerprint = "file*"},
      {.name = "on_error", .type = ParamType::choice, .doc = "a damaged record: fail the run, or skip it and count it", .fallback = "\"fail\"", .choices = "fail|skip"},
  };
  using State = IndexedSourceState;
  static constexpr bool source = true;
  /// Rescale: as range's (read it through a sampler to rescale).
  static RescaleRule rescale() { return RescaleRule::refused(rescale::kReadInFull); }
  /// `{"op": "records", "files": [...], "on_error": "fail" | "skip"}`. The elements are bytes: the front
  /// end decides how it shows them (the JSON one as base64 strings).
  template <class Spec>
  static SpecPipeline from_spec(Spec& s) {
    std::vector<std::string> files;
    RecordsOptions o{.name = s.name(), .data = s.data_files()};
    s.required("files", files);
    s.choice("on_error", o.on_error, {{"fail", OnDataError::fail}, {"skip", OnDataError::skip}});
    return s.bytes(records(files, o));
  }
};

}  // namespace dpipe
