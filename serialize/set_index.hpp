#pragma once
// The set index (`set.dpipe-index`, inside the library): the node records of every rank of a complete set
// in one small file, by node and by field (a column of every old instance's values), numbers as varints,
// element lists as where they lie in the rank files (offset, length, CRC-32C) or, for a generator's four
// words and short position lists, their values. The write that completes a set writes it beside the
// manifest; a rescale through the directory reads this one file, hands each node's columns to its rule
// (OldColumns: nothing is built for a record no rule reads) and then reads only the element lists it is
// dealt. Format: docs/snapshot-format.md, "The set index".
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "dpipe/rescale.hpp"
#include "dpipe/snapshot.hpp"
#include "snapshot_plan.hpp"

namespace dpipe::detail {

/// Builds a set index from the plans of ranks 0, 1, …, W−1 in order, one at a time (nothing of a rank is
/// kept but its values, appended to the columns).
class SetIndexWriter {
 public:
  /// `identity`: the text of the set's manifest, which a reader compares with the manifest it finds.
  explicit SetIndexWriter(std::string identity) : identity_(std::move(identity)) {}
  /// Adds rank `rank`'s records from its plan (`path`: its file, read for the values of a long position
  /// list). SnapshotError when its records of a node have other fields than the node's records before.
  void add_rank(const SnapshotPlan& plan, std::uint32_t rank, const std::string& path);
  /// The file's bytes, checksum included.
  std::string finish();

 private:
  struct Column {
    std::string name;
    FieldType type = FieldType::u64;
    std::string tag;      // of an element list
    std::string bytes;    // the value of every record that has the field, in order
    std::string present;  // per record: 1 when it has the field, else 0
  };
  struct Node {
    std::string key, kind;
    std::string ranks, instances, modes;
    std::vector<Column> columns;
    std::uint64_t records = 0;
  };

  std::string identity_;
  std::uint32_t ranks_ = 0;
  std::vector<Node> nodes_;                               // in the order rank 0 saved them
  std::unordered_map<std::string, std::size_t> node_of_;  // key → its place in nodes_
};

/// One node's records decoded from a set index: its columns, read by a rescale rule as records.
class IndexNode final : public OldColumns {
 public:
  /// An element list of one record: its values in the index, or where it lies in its rank's file.
  struct List {
    std::uint32_t rank = 0;
    std::uint64_t count = 0;
    bool values_here = false;
    std::string_view values{};  // values_here: `count` varint lengths, then the bytes
    std::uint64_t offset = 0, bytes = 0;
    std::uint32_t crc = 0;
    std::shared_ptr<const ElementBlobs> loaded{};  // read from the file (IndexNode::load)
  };

  std::size_t size() const override { return instance_.size(); }
  std::uint32_t instance(std::size_t i) const override { return instance_[row(i)]; }
  StateMode mode(std::size_t i) const override { return static_cast<StateMode>(mode_[row(i)]); }
  const FieldSource& fields(std::size_t i) const override;
  bool has_field(std::string_view name) const override { return column(name) >= 0; }
  std::ptrdiff_t column(std::string_view name) const override;
  bool has(std::size_t i, std::size_t k) const override;
  std::uint64_t number(std::size_t i, std::size_t k) const override;
  std::string_view text(std::size_t i, std::size_t k) const override;
  std::uint64_t list_size(std::size_t i, std::size_t k) const override;
  ElementBlobs list(std::size_t i, std::size_t k) const override;
  const std::string& tag(std::size_t k) const override;
  std::size_t column_count() const override { return columns_.size(); }
  const std::string& column_name(std::size_t k) const override { return columns_[k].name; }

  const std::string& kind() const { return kind_; }
  const std::string& tag_of_list(std::uint64_t id) const { return columns_[list_column_[id]].tag; }
  /// Every list, by the number a range of a record read from here carries.
  std::vector<List>& lists() { return lists_; }
  const std::vector<List>& lists() const { return lists_; }
  /// The lists of field `name` whose values are neither here nor loaded, by number.
  std::vector<std::uint64_t> lists_to_load(std::string_view name) const;
  /// List `id`'s values (values here or loaded).
  ElementBlobs values(std::uint64_t id) const;

 private:
  friend class SetIndex;
  struct Column {
    std::string name;
    FieldType type = FieldType::u64;
    std::string tag;
    std::vector<std::uint64_t> u;       // u64, or i64's bits
    std::vector<std::string_view> s;    // str
    std::vector<std::uint32_t> list;    // elements: a number in lists_
    std::vector<std::uint8_t> present;  // per row: 1 when it has the field; empty when every row has it
  };
  class Row final : public FieldSource {
   public:
    std::size_t field_count() const override { return node->partial_ ? present.size() : node->columns_.size(); }
    const Field& field(std::size_t k) const override;
    const IndexNode* node = nullptr;
    std::size_t row = 0;
    std::vector<std::uint32_t> present;  // the row's columns, when some rows lack some
    mutable Field scratch{};
  };
  std::size_t row(std::size_t i) const { return order_.empty() ? i : order_[i]; }
  void fill_values(std::uint64_t id, ElementBlobs& out) const;

  std::string key_, kind_;
  std::vector<std::uint32_t> rank_, instance_;
  std::vector<std::uint8_t> mode_;
  std::vector<Column> columns_;
  std::vector<List> lists_;
  std::vector<std::uint32_t> list_column_;  // per list: its column
  std::vector<std::uint32_t> order_;        // slot → row, when the rows are not in instance order
  bool partial_ = false;                    // some rows lack some columns
  mutable Row source_;
};

/// A set index read back.
class SetIndex {
 public:
  /// The index in `bytes` (a whole file) when it is one this version reads, its checksum holds and it
  /// names the set whose manifest text is `identity`; nullopt otherwise (the caller reads the rank files).
  static std::optional<SetIndex> parse(std::string bytes, std::string_view identity);

  std::uint32_t world() const { return world_; }
  /// Every node key once, in the order the ranks saved their records.
  const std::vector<std::string>& keys() const { return keys_; }
  /// The records of node `keys()[k]` as columns (valid while this index is). SnapshotError if corrupt.
  std::unique_ptr<IndexNode> node(std::size_t k) const;

 private:
  std::string bytes_;
  std::uint32_t world_ = 0;
  std::vector<std::string> keys_;
  struct Block {
    std::size_t begin = 0, end = 0;  // the node's block in bytes_
  };
  std::vector<Block> blocks_;
};

}  // namespace dpipe::detail
