#pragma once
// The set index (`set.dpipe-index`, inside the library): the node records of every rank of a complete set
// in one small file, by node and by field (a column of every old instance's values), numbers as varints,
// element lists as where they lie in the rank files (offset, length, CRC-32C) or, for a generator's four
// words and short position lists, their values. It is a directory and parts, each with its checksum: a
// column of one value (or of numbers that step evenly) is that value in the directory, any other is
// stored in chunks of rows. The write that completes a set writes it beside the manifest; a rescale
// through the directory reads the directory and hands each node's columns to its rule (OldColumns): a
// column's chunks are read when a rule first asks for its rows, a record is built only for a slot a rule
// reads whole, and then only the element lists dealt to the rank are read from the rank files.
// Format: docs/snapshot-format.md, "The set index".
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "dpipe/regular_file.hpp"
#include "dpipe/kit/rescale.hpp"
#include "dpipe/snapshot.hpp"
#include "snapshot_plan.hpp"

namespace dpipe::detail {

/// A damaged part of a set index (its bytes do not match their checksum, or cannot be read), found when
/// it is first read: the caller passes the index over and reads the rank files instead.
struct SetIndexDamaged : SnapshotError {
  using SnapshotError::SnapshotError;
};

/// Builds a set index from the plans of ranks 0, 1, …, W−1 in order, one at a time (nothing of a rank is
/// kept but its values, appended to the columns).
class SetIndexWriter {
 public:
  /// `identity`: the text of the set's manifest, which a reader compares with the manifest it finds;
  /// `workers`: the set's workers per rank.
  SetIndexWriter(std::string identity, std::uint32_t workers) : identity_(std::move(identity)), workers_(workers) {}
  /// Adds rank `rank`'s records from its plan (`path`: its file, read for the values of a long position
  /// list). SnapshotError when its records of a node do not fit the node's records before.
  void add_rank(const SnapshotPlan& plan, std::uint32_t rank, const std::string& path);
  /// The file's bytes, checksums included.
  std::string finish();

  /// The values of one column (or an element column's counts, or its lists) in record order, encoded.
  struct Sequence {
    std::string bytes;
    std::vector<std::size_t> ends;  // where each value ends in `bytes`
    std::uint64_t first = 0, step = 0;
    bool progression = true;  // numbers only: every value so far is first + n × step (mod 2^64)
    std::uint64_t least = ~std::uint64_t{0}, greatest = 0;  // numbers only
    void add_number(std::uint64_t v);
    void close_value() { ends.push_back(bytes.size()); }
    bool all_same() const;
  };

 private:
  struct Column {
    std::string name;
    FieldType type = FieldType::u64;
    std::string tag;      // of an element list
    std::string present;  // per record: 1 when it has the field, else 0
    Sequence values;      // numbers, texts, or an element list's counts
    Sequence lists;       // an element list's values or place (nothing for an empty list)
  };
  struct Node {
    std::string key, kind;
    std::vector<std::uint32_t> ranks, instances;
    std::string modes;
    std::vector<Column> columns;
  };

  std::string identity_;
  std::uint32_t workers_;
  std::uint32_t ranks_ = 0;
  std::vector<Node> nodes_;                               // in the order rank 0 saved them
  std::unordered_map<std::string, std::size_t> node_of_;  // key → its place in nodes_
};

class SetIndex;

/// One node's records in a set index, as columns a rescale rule reads (OldColumns). Valid while the
/// SetIndex it came from is. A column's values are read from the file when a rule first asks for them,
/// and only the chunks of rows it asks for; corrupt values are SnapshotErrors when they are read, a
/// damaged chunk a SetIndexDamaged.
class IndexNode final : public OldColumns {
 public:
  std::size_t size() const override { return rows_; }
  std::uint32_t instance(std::size_t i) const override;
  std::uint32_t instance_step() const override;
  StateMode mode(std::size_t i) const override;
  const FieldSource& fields(std::size_t i) const override;
  std::ptrdiff_t column(std::string_view name) const override;
  bool has(std::size_t i, std::size_t k) const override;
  bool everywhere(std::size_t k) const override { return columns_[k].present.empty(); }
  std::uint64_t number(std::size_t i, std::size_t k) const override;
  std::string_view text(std::size_t i, std::size_t k) const override;
  std::uint64_t list_size(std::size_t i, std::size_t k) const override;
  rescale::Numbers all_numbers(std::size_t k) const override;
  rescale::Numbers numbers_on_demand(std::size_t k) const override;
  std::size_t first_text(std::size_t k) const override;
  ElementBlobs list(std::size_t i, std::size_t k) const override;
  const std::string& tag(std::size_t k) const override { return columns_[k].tag; }
  std::size_t column_count() const override { return columns_.size(); }
  const std::string& column_name(std::size_t k) const override { return columns_[k].name; }
  FieldType column_type(std::size_t k) const override { return columns_[k].type; }

  const std::string& kind() const { return kind_; }
  /// The list a range of a record read from here names (by its `list`): where it lies in its rank's file,
  /// or its values when the index or a load holds them.
  StoredList where(std::uint64_t id) const;
  /// The lists of column `name` whose values are neither here nor loaded, by the number a range carries.
  std::vector<std::uint64_t> lists_to_load(std::string_view name) const;
  /// Gives list `id` its values, read from its file.
  void set_loaded(std::uint64_t id, ElementBlobs values) { loaded_[id] = std::make_shared<const ElementBlobs>(std::move(values)); }

  /// Where a part of the index lies: after the directory, `offset` bytes on; its CRC-32C.
  struct Part {
    std::uint64_t offset = 0, length = 0;
    std::uint32_t crc = 0;
  };
  /// A column's values, or an element column's counts or lists, as the directory describes them.
  struct Sequence {
    enum Form : std::uint8_t { same = 0, progression = 1, chunked = 2 };
    Form form = same;
    std::string_view value{};         // same: the one value, encoded
    std::uint64_t first = 0, step = 0;  // progression
    std::uint64_t per_chunk = 0, offset = 0;  // chunked: values per chunk, where the first chunk starts
    std::vector<Part> chunks{};
    bool bounded = false;                    // chunked numbers: every value lies in [least, greatest]
    std::uint64_t least = 0, greatest = 0;
    struct Chunk {
      std::string bytes;
      std::vector<std::uint32_t> at;  // where each value starts in `bytes`
      bool loaded = false;
    };
    mutable std::vector<Chunk> cache{};  // per chunk, once read
  };

 private:
  friend class SetIndex;
  struct Column {
    std::string name;
    FieldType type = FieldType::u64;
    std::string tag;
    std::vector<std::uint8_t> present;  // per row: 1 when it has the field; empty when every row has it
    std::vector<std::uint32_t> nth;     // per row: its place among the rows that have the field (when some do not)
    std::size_t values = 0;             // the rows that have it
    Sequence numbers;                   // numbers, texts, or an element list's counts
    Sequence lists;                     // an element list's values or places
  };
  /// A decoded element list value.
  struct ListValue {
    std::uint64_t count = 0;
    bool values_here = false;
    std::string_view values{};  // `count` varint lengths, then the bytes
    std::uint64_t offset = 0, bytes = 0;
    std::uint32_t crc = 0;
  };
  class Row final : public FieldSource {
   public:
    std::size_t field_count() const override { return present.size(); }
    const Field& field(std::size_t k) const override;
    const IndexNode* node = nullptr;
    std::size_t row = 0;
    std::vector<std::uint32_t> present;  // the row's columns
    mutable Field scratch{};
  };

  std::size_t row(std::size_t i) const { return order_.empty() ? i : order_[i]; }
  std::uint32_t rank_of(std::size_t row) const;
  /// Value `n` of sequence `s` of column k: its bytes from its first on (not for a progression).
  std::string_view bytes_of(std::size_t k, const Sequence& s, std::size_t n) const;
  /// Value `n` of a sequence of numbers of column k.
  std::uint64_t number_of(std::size_t k, const Sequence& s, std::size_t n) const;
  /// A part of the index, counted against what this node may read (no more than the parts hold).
  std::string read(const Part& part) const;
  /// Chunk c of sequence `s` of column k, read and its values found (checked as they are) when first asked for.
  const Sequence::Chunk& chunk(std::size_t k, const Sequence& s, std::size_t c) const;
  std::size_t nth(std::size_t k, std::size_t row) const { return columns_[k].nth.empty() ? row : columns_[k].nth[row]; }
  std::uint64_t row_number(std::size_t k, std::size_t row) const;
  ListValue list_value(std::size_t k, std::size_t row) const;
  /// Row `row`'s list of column k (which the row has) into `e`: ranges of it, and its values where known.
  void fill_list(std::size_t k, std::size_t row, ElementBlobs& e) const;
  void fill_values(const ListValue& l, std::uint64_t id, ElementBlobs& out) const;
  std::uint64_t list_id(std::size_t k, std::size_t row) const { return std::uint64_t(k) * rows_ + row; }

  const SetIndex* index_ = nullptr;
  mutable std::uint64_t read_bytes_ = 0;  // of the index's parts, so far
  std::string key_, kind_;
  std::size_t rows_ = 0;
  std::uint32_t workers_ = 1;
  std::uint8_t rows_are_ = 0;                    // how rows map to ranks and instances (set_index.cpp)
  std::vector<std::uint32_t> rank_, instance_;   // rows_are_ == 0 only
  std::uint8_t one_mode_ = 0;                    // every row's mode, or 0 when they differ
  std::string modes_;
  std::vector<Column> columns_;
  std::vector<std::uint32_t> order_;             // slot → row, when the rows are not in instance order
  std::unordered_map<std::uint64_t, std::shared_ptr<const ElementBlobs>> loaded_;
  mutable Row source_;
};

/// A set index opened: its directory read and verified; its parts are read when a node's rule needs them.
class SetIndex {
 public:
  /// The index at `path` when it is one this version reads, its directory's checksum holds and it names
  /// the set whose manifest text is `identity`; nullopt otherwise (the caller reads the rank files).
  static std::optional<SetIndex> open(const std::string& path, std::string_view identity);

  std::uint32_t world() const { return world_; }
  std::uint32_t workers() const { return workers_; }
  /// Every node key once, in the order the ranks saved their records.
  const std::vector<std::string>& keys() const { return keys_; }
  /// The records of node `keys()[k]` as columns. SnapshotError if its layout is corrupt.
  std::unique_ptr<IndexNode> node(std::size_t k) const;
  /// A part's bytes, verified against its CRC-32C (SetIndexDamaged when they do not match or cannot be read).
  std::string read(const IndexNode::Part& part) const;
  /// The bytes after the directory.
  std::uint64_t parts_size() const { return file_->size() - data_begin_; }

 private:
  std::shared_ptr<const RegularFile> file_;
  std::uint64_t data_begin_ = 0;  // where the parts start: after the directory
  std::string directory_;
  std::uint32_t world_ = 0, workers_ = 1;
  std::vector<std::string> keys_;
  struct Block {
    std::size_t begin = 0, end = 0;  // the node's entry in directory_
  };
  std::vector<Block> blocks_;
};

/// For fuzzing: makes every checksum of the set index in `bytes` right again (each part's and chunk's
/// from the bytes it names, then the directory's), so that changed bytes reach the decoders.
void recompute_set_index_checksums(std::string& bytes);

}  // namespace dpipe::detail
