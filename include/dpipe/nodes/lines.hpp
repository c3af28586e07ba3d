#pragma once
/// Lines of text files, one element per line, read through logical shards (see detail/line_shards.hpp
/// for the cut into shards, their deal to instances, and the state). A trailing '\r' is stripped; empty
/// lines are elements; a last line without a newline counts. For short lines, `line_blocks` hands out
/// the same lines many to an element, several times faster.
/// Out: std::string.
/// State: the work items dealt so far and the shards started, with where it is in each.
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dpipe/detail/line_shards.hpp"
#include "dpipe/kit/rescale.hpp"
#include "dpipe/kit/spec.hpp"

namespace dpipe {

struct LinesOptions {
  std::int64_t logical_shards = 64;
  std::int64_t epochs = 1;
  bool shuffle_shards = true;
  std::string name{};
  /// The data root the file names are resolved against and how the files are identified in snapshots.
  DataFiles data{};
};

class LinesDef final : public NodeDef<std::string> {
 public:
  LinesDef(std::vector<std::string> files, LinesOptions o)
      : NodeDef<std::string>("lines", o.name,
                             {{"logical_shards", param_text(o.logical_shards)}, {"epochs", param_text(o.epochs)},
                              {"shuffle_shards", param_text(o.shuffle_shards)}}),
        table_(files, o.data, o.logical_shards, o.epochs, o.shuffle_shards, node_label("lines", o.name)) {
    for (auto& [key, value] : table_.file_params()) add_param(std::move(key), std::move(value));
  }
  // Declared inline (it is defined below the Iter): a class without a non-inline virtual has its vtable
  // emitted only where an object is made, not in every file that includes this header.
  inline std::unique_ptr<Iter<std::string>> instantiate(BuildContext& ctx) const override;
  const detail::LineShardTable& table() const { return table_; }

 private:
  detail::LineShardTable table_;
};

class LinesIter final : public detail::LineShardIter<std::string> {
 public:
  LinesIter(BuildContext& ctx, const LinesDef& def) : LineShardIter(ctx, "lines", def.table()) {}

 protected:
  /// Maps one file at a time (no descriptor stays open), its pages populated up to 4 MiB ahead of the
  /// reads; every read of mapped bytes is under a MappedReadGuard.
  std::size_t take(std::vector<std::string>& out, std::size_t want, std::uint32_t file, std::uint64_t& pos,
                   bool& aligned, std::uint64_t seg_end) override {
    const auto& m = map(file);
    if (seg_end > m.size()) throw DataError("data file '" + m.path() + "' changed size since the pipeline was built");
    const char* const data = m.data();
    const std::uint64_t size = std::min<std::uint64_t>(m.size(), table().file_size(file));  // bytes added later are not read
    const detail::MappedReadGuard guard(m);
    std::uint64_t p = pos;
    if (!aligned) {
      // A line that starts before this shard belongs to the one before: skip to the next line start.
      if (p > 0 && data[p - 1] != '\n') {
        const void* nl = std::memchr(data + p, '\n', size - p);
        p = nl ? static_cast<std::uint64_t>(static_cast<const char*>(nl) - data) + 1 : size;
        guard.check();
      }
      pos = p;
      aligned = true;
    }
    std::size_t got = 0;
    for (; got < want && p < seg_end; ++got) {
      populate_from(m, p, seg_end);
      const auto* nl = static_cast<const char*>(std::memchr(data + p, '\n', size - p));
      guard.check();  // before the copy: past a lost page, the "line" runs on over zeros to the end
      const std::uint64_t end = nl ? static_cast<std::uint64_t>(nl - data) : size;
      const std::uint64_t len = end - p - (end > p && data[end - 1] == '\r' ? 1 : 0);
      out.emplace_back(data + p, len);
      if (this->traced()) this->trace_line(file, p);
      p = nl ? end + 1 : size;
    }
    pos = p;
    return got;
  }

 public:
  bool carries_provenance() const override { return true; }
  bool holds_no_elements() const override { return true; }
  bool one_base() const override { return true; }
  bool recomputable() const override { return true; }
  /// The line that starts at the key's byte, read again (from a map of its own: a restore reads keys of
  /// any file, the pull goes through one file at a time).
  std::string recompute(const Provenance& p) const override {
    const auto refuse = [&](const std::string& why) -> std::string {
      throw SnapshotError(this->label() + ": a restore key names no line of its files (" + to_string(p) + "): " + why);
    };
    if (p.size() != 1 || p[0].source != this->node_index() || !p[0].offsets.empty() || p[0].sliced())
      return refuse("not a key of this source");
    const auto at = table().locate(p[0].position);
    if (!at) return refuse("past the end of the files");
    const auto [file, pos] = *at;
    if (!recompute_map_ || recompute_file_ != file) {
      recompute_map_.reset();
      recompute_map_ = std::make_unique<detail::MappedFile>(table().files()[file]);
      recompute_file_ = file;
    }
    const detail::MappedFile& m = *recompute_map_;
    const std::uint64_t size = std::min<std::uint64_t>(m.size(), table().file_size(file));
    if (pos >= size) return refuse("past the end of its file, which shrank");
    const detail::MappedReadGuard guard(m);
    const char* const data = m.data();
    if (pos > 0 && data[pos - 1] != '\n') return refuse("not the start of a line");
    const auto* nl = static_cast<const char*>(std::memchr(data + pos, '\n', size - pos));
    guard.check();
    const std::uint64_t end = nl ? static_cast<std::uint64_t>(nl - data) : size;
    std::string line(data + pos, end - pos - (end > pos && data[end - 1] == '\r' ? 1 : 0));
    guard.check();
    return line;
  }

 private:
  mutable std::unique_ptr<detail::MappedFile> recompute_map_;
  mutable std::uint32_t recompute_file_ = 0;
};

inline std::unique_ptr<Iter<std::string>> LinesDef::instantiate(BuildContext& ctx) const {
  return std::make_unique<LinesIter>(ctx, *this);
}

inline Pipeline<std::string> lines(std::vector<std::string> files, LinesOptions o = {}) {
  return make_pipeline<LinesDef>(std::move(files), std::move(o));
}

struct LinesKind {
  static constexpr std::string_view name = "lines";
  static constexpr std::string_view doc =
      "The lines of text files, one element per line, read through logical shards dealt to the instances.";
  static constexpr std::string_view provenance =
      "a line's position is its first byte among the files laid end to end, its epoch the pass; read again there";
  static constexpr ParamSchema params[] = {
      {.name = "files", .type = ParamType::texts, .doc = "the text files, in order", .positional = true, .fingerprint = "file*"},
      {.name = "logical_shards", .type = ParamType::integer, .doc = "how many pieces the files are cut into, whatever the layout", .fallback = "64"},
      {.name = "epochs", .type = ParamType::integer, .doc = "passes over the files", .fallback = "1"},
      {.name = "shuffle_shards", .type = ParamType::boolean, .doc = "deal the shards in a random order each epoch", .fallback = "true"},
  };
  using State = detail::LineShardsState;
  static constexpr bool source = true;
  /// It deals its shards to the instances: a level-based sharding_filter after it would shard again.
  static constexpr bool deals = true;
  /// Rescale: the line sources' rule (detail/line_shards.hpp): work items re-sliced, started shards dealt.
  static RescaleRule rescale() { return detail::line_shards_rescale(); }
  /// `{"op": "lines", "files": [...], "logical_shards": 64, "epochs": 1, "shuffle_shards": true}`
  template <class Spec>
  static SpecPipeline from_spec(Spec& s) {
    std::vector<std::string> files;
    LinesOptions o{.name = s.name(), .data = s.data_files()};
    s.required("files", files);
    s.param("logical_shards", o.logical_shards);
    s.param("epochs", o.epochs);
    s.param("shuffle_shards", o.shuffle_shards);
    return lines(std::move(files), o);
  }
};

}  // namespace dpipe
