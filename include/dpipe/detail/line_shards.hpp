#pragma once
/// What `lines` and `line_blocks` share: text files cut into logical shards, and an iterator that deals
/// the shards' work items to instances and walks each shard's lines. The two sources differ only in
/// how they package the lines of a segment (one string per line, or one block of many lines).
///
/// The files' bytes are cut into `logical_shards` ranges of about equal size, a count fixed up front and
/// independent of the layout (a file may span shards; a line belongs to the shard where it starts). Over
/// `epochs` passes, the shards' order is reshuffled every epoch from the seed, and work item q (epoch
/// q / S, shard q mod S of that epoch's order) goes to instance q mod (world_size × num_workers) — to rank
/// q mod world_size before `dispatch`, where it runs once per rank. Each instance reads one shard at a
/// time and opens one file at a time (`lines` maps it, `line_blocks` reads it). A file that shrinks
/// while it is read is a DataError, never a crash.
/// State: like a sampler's over work items (base, stride, offset, next, skip), plus the shards it has
/// started and not finished, with where it is in each — so a snapshot set rescales by regrouping them.
#include <algorithm>
#include <cstring>
#include <deque>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dpipe/detail/mapped_file.hpp"
#include "dpipe/detail/position_deal.hpp"
#include "dpipe/permutation.hpp"
#include "dpipe/pipeline.hpp"
#include "dpipe/regular_file.hpp"

namespace dpipe::detail {

/// The files of a line source and their cut into logical shards.
class LineShardTable {
 public:
  struct Segment {
    std::uint32_t file;
    std::uint64_t begin, end;  // byte range of the file in this shard
  };

  /// Checks the options (ConfigError naming `who`), resolves the names under the data root and reads the
  /// files' sizes (DataError).
  LineShardTable(const std::vector<std::string>& names, const DataFiles& data, std::int64_t logical_shards,
                 std::int64_t epochs, bool shuffled, const std::string& who)
      : epochs_(static_cast<std::uint64_t>(epochs)), shuffled_(shuffled), identity_(data.identity) {
    if (names.empty()) throw ConfigError(who + ": no files given");
    for (auto& f : resolve_data_files(names, data)) {
      files_.push_back(std::move(f.path));
      names_.push_back(std::move(f.name));
    }
    if (logical_shards < 1 || logical_shards > (1 << 24))
      throw ConfigError(who + ": logical_shards must be between 1 and 16777216, got " + param_text(logical_shards));
    if (epochs < 1) throw ConfigError(who + ": epochs must be at least 1, got " + param_text(epochs));
    check_position_count(static_cast<std::uint64_t>(logical_shards), epochs_, who, "logical shards", "work items");
    std::uint64_t total = 0;
    for (const auto& f : files_) {
      const auto size = RegularFile(f, FileRole::data).size();  // a regular file only (FileError)
      sizes_.push_back(size);
      starts_.push_back(total);
      total += size;
    }
    // Shard s covers global bytes [s·total/S, (s+1)·total/S) of the files laid end to end.
    const auto shards = static_cast<std::uint64_t>(logical_shards);
    shards_.resize(shards);
    std::uint64_t file_start = 0;
    auto scaled = [&](std::uint64_t byte, bool up) {  // byte · S / total, rounded down or up
      const auto x = static_cast<unsigned __int128>(byte) * shards;
      return static_cast<std::uint64_t>((x + (up ? total - 1 : 0)) / total);
    };
    for (std::uint32_t f = 0; f < sizes_.size() && total > 0; ++f) {
      const std::uint64_t file_end = file_start + sizes_[f];
      // Only the shards from the one holding the file's first byte to the one holding its last (and
      // perhaps one empty neighbour): building is O(files + shards), not O(files × shards).
      const std::uint64_t last = std::min(shards, scaled(file_end, true));
      for (std::uint64_t s = scaled(file_start, false); s < last; ++s) {
        const std::uint64_t lo = static_cast<std::uint64_t>((static_cast<__int128>(total) * s) / shards);
        const std::uint64_t hi = static_cast<std::uint64_t>((static_cast<__int128>(total) * (s + 1)) / shards);
        const std::uint64_t b = std::max(lo, file_start), e = std::min(hi, file_end);
        if (b < e) shards_[s].push_back({f, b - file_start, e - file_start});
      }
      file_start = file_end;
    }
    empty_ = total == 0;
  }

  /// The fingerprint parameters: every file's name and size, so a snapshot of other data is refused.
  std::vector<std::pair<std::string, std::string>> file_params() const {
    std::vector<std::pair<std::string, std::string>> out;
    for (std::size_t i = 0; i < files_.size(); ++i)
      out.emplace_back("file" + std::to_string(i), data_file_param({files_[i], names_[i]}, sizes_[i], identity_));
    return out;
  }

  /// The paths the files are opened at.
  const std::vector<std::string>& files() const { return files_; }
  /// File f's size when the table was built.
  std::uint64_t file_size(std::uint32_t f) const { return sizes_[f]; }
  /// Where file f starts among the files laid end to end (a line's position is its byte there).
  std::uint64_t file_start(std::uint32_t f) const { return starts_[f]; }
  /// The file holding byte `global` of the files laid end to end, and the byte's offset in it; nullopt
  /// past their end.
  std::optional<std::pair<std::uint32_t, std::uint64_t>> locate(std::uint64_t global) const {
    const auto it = std::upper_bound(starts_.begin(), starts_.end(), global);
    if (it == starts_.begin()) return std::nullopt;
    const auto f = static_cast<std::uint32_t>(it - starts_.begin() - 1);
    if (global - starts_[f] >= sizes_[f]) return std::nullopt;  // past the end, or in an empty file
    return std::pair{f, global - starts_[f]};
  }
  const std::vector<Segment>& shard(std::uint64_t s) const { return shards_[s]; }
  std::uint64_t shards() const { return shards_.size(); }
  std::uint64_t epochs() const { return epochs_; }
  bool shuffled() const { return shuffled_; }
  bool empty() const { return empty_; }  // the files hold no bytes at all

 private:
  std::vector<std::string> files_, names_;  // paths, and names under the data root
  std::vector<std::uint64_t> sizes_, starts_;
  std::uint64_t epochs_;
  bool shuffled_;
  FileIdentity identity_;
  std::vector<std::vector<Segment>> shards_;
  bool empty_ = false;
};

/// The saved state of a line source: its deal of work items (epoch × shard), then the shards started and
/// not finished, as three parallel lists (work item, segment, byte offset with kUnaligned when the
/// offset is not yet at a line start).
struct LineShardsState {
  DealState deal{};
  std::vector<std::uint64_t> started_items{}, started_segments{}, started_offsets{};
  template <class A>
  void fields(A& a) {
    deal.fields(a);
    a("started_items", started_items);
    a("started_segments", started_segments);
    a("started_offsets", started_offsets);
  }
};

/// The rescale rule of the line sources: work items are re-sliced like a sampler's positions; shards
/// started and not finished are dealt whole, round-robin, to the new instances.
inline RescaleRule line_shards_rescale() {
  return RescaleRule::dealt([](const RescaleInput& in) {
    const auto old = in.read<LineShardsState>();
    std::vector<DealState> deals;
    for (const auto& s : old) deals.push_back(s.deal);
    auto redealt = redeal_positions(in, OldDeals::of(std::move(deals)));
    const auto [first, end] = in.wanted_slots();
    std::vector<LineShardsState> out(end - first);
    const std::size_t n_new = in.new_slots();
    std::size_t dealt = 0;
    for (const auto& s : old) {
      if (s.started_segments.size() != s.started_items.size() || s.started_offsets.size() != s.started_items.size())
        in.refuse("its started work is inconsistent");
      for (std::size_t k = 0; k < s.started_items.size(); ++k, ++dealt) {
        const std::size_t j = dealt % n_new;
        if (j < first || j >= end) continue;
        auto& to = out[j - first];
        to.started_items.push_back(s.started_items[k]);
        to.started_segments.push_back(s.started_segments[k]);
        to.started_offsets.push_back(s.started_offsets[k]);
      }
    }
    for (std::size_t j = first; j < end; ++j) out[j - first].deal = std::move(redealt[j - first]);
    return in.write_slots([&](std::size_t j) { return out[j - first]; });
  });
}

/// The iterator of a line source: deals work items, walks the segments of one shard at a time, and
/// leaves the packaging of lines to `take`. Its state is the same whatever `Out` is.
template <class Out>
class LineShardIter : public Hooked<Out> {
 protected:
  LineShardIter(BuildContext& ctx, std::string kind, const LineShardTable& table)
      : Hooked<Out>(ctx, kind), table_(table), deal_(PositionDeal::in(ctx, kind + " '" + this->key() + "'")) {
    key_ = derive_seed(ctx.seed, this->key(), ctx.epoch, kLineShardsSalt);
  }

  /// Appends up to `want` elements made of the lines of file `file` that start in [pos, seg_end), and
  /// moves pos past the lines taken. Unless `aligned`, pos may be inside a line that belongs to the
  /// shard before: skip to the next line start first, then set `aligned`. Fewer than `want` means no
  /// line is left there. Nothing half-made is appended when it throws.
  virtual std::size_t take(std::vector<Out>& out, std::size_t want, std::uint32_t file, std::uint64_t& pos,
                           bool& aligned, std::uint64_t seg_end) = 0;

  const LineShardTable& table() const { return table_; }

  /// Traced: the element taken next is the line at byte `pos` of file `file`: its provenance is (this
  /// source, the work item's epoch, the line's byte among the files laid end to end).
  void trace_line(std::uint32_t file, std::uint64_t pos) {
    this->trace_source(current_->item / table_.shards(), table_.file_start(file) + pos);
  }

  /// The map of file `file`: the one mapped file, replaced when another is asked for.
  const MappedFile& map(std::uint32_t file) {
    if (!mapped_ || mapped_file_ != file) {
      mapped_.reset();  // one file mapped at a time
      mapped_ = std::make_unique<MappedFile>(table_.files()[file]);
      mapped_file_ = file;
      populated_ = {0, 0};
    }
    return *mapped_;
  }

  /// Maps the pages of the next 4 MiB from `at` (at most to `end`) in one call when `at` is outside the
  /// last such range: cheaper than a fault every few pages.
  void populate_from(const MappedFile& m, std::uint64_t at, std::uint64_t end) {
    if (at >= populated_.first && at < populated_.second) return;
    constexpr std::uint64_t kAhead = 4 << 20;
    populated_ = {at, std::min(end, at + kAhead)};
    m.will_read(populated_.first, populated_.second);
  }

  std::size_t pull_chunk(std::vector<Out>& out, std::size_t max) override {
    const std::size_t before = out.size();
    std::size_t n = 0;
    try {
      while (n < max) {
        if (!current_ && !start_next_item()) break;
        n += read_items(out, max - n);
        if (n < max) current_.reset();  // fewer than asked: the shard is done
      }
    } catch (...) {
      out.resize(before);  // a failed pull appends nothing
      throw;
    }
    return n;
  }

  void save_state(StateWriter& w) const override {
    LineShardsState st{deal_.state(), {}, {}, {}};
    // Shards started and not finished: the current one first, then any dealt here by a rescale.
    auto add = [&](const Cursor& c) {
      st.started_items.push_back(c.item);
      st.started_segments.push_back(c.segment);
      st.started_offsets.push_back(c.pos | (c.aligned ? 0 : kUnaligned));
    };
    if (current_) add(*current_);
    for (const auto& c : started_) add(c);
    w.write(st);
  }
  void restore_state(StateReader& r) override {
    LineShardsState st;
    r.read(st);
    deal_.restore(r, "shards", table_.shards() * table_.epochs(), std::move(st.deal));
    const auto& items = st.started_items;
    const auto& segments = st.started_segments;
    const auto& offsets = st.started_offsets;
    if (items.size() != segments.size() || items.size() != offsets.size()) r.fail("started shards are inconsistent");
    started_.clear();
    const std::uint64_t total = table_.shards() * table_.epochs();
    for (std::size_t i = 0; i < items.size(); ++i) {
      if (items[i] >= total) r.fail("work item " + std::to_string(items[i]) + " does not exist");
      const auto& segs = table_.shard(shard_of(items[i]));
      if (segments[i] > segs.size()) r.fail("shard segment " + std::to_string(segments[i]) + " does not exist");
      const std::uint64_t pos = offsets[i] & ~kUnaligned;
      if (segments[i] < segs.size()) {
        const auto& seg = segs[segments[i]];
        if (pos < seg.begin || pos > table_.file_size(seg.file))
          r.fail("offset " + std::to_string(pos) + " is outside shard segment " + std::to_string(segments[i]) +
                 " (bytes " + std::to_string(seg.begin) + " to " + std::to_string(table_.file_size(seg.file)) +
                 " of its file)");
      }
      started_.push_back(
          {items[i], shard_of(items[i]), segments[i], offsets[i] & ~kUnaligned, (offsets[i] & kUnaligned) == 0});
    }
  }
  std::vector<IterBase*> inputs() const override { return {}; }

 private:
  static constexpr std::uint64_t kUnaligned = std::uint64_t{1} << 63;  // saved offsets: not yet at a line start
  struct Cursor {
    std::uint64_t item;     // work item: epoch item / S, shard shard_of(item)
    std::uint64_t shard;    // shard_of(item), kept so each pull does not recompute it
    std::uint64_t segment;  // index into the shard's segments
    std::uint64_t pos;      // byte offset in that segment's file: the next line starts here
    bool aligned;           // pos is known to be a line start (false: skip the rest of a line first)
  };

  std::uint64_t shard_of(std::uint64_t item) const {
    const std::uint64_t s = table_.shards(), epoch = item / s, i = item % s;
    if (!table_.shuffled()) return i;
    return KeyedPermutation(s, mix64(key_ ^ mix64(epoch)))(i);
  }

  bool start_next_item() {
    if (table_.empty()) return false;  // no bytes: however many epochs, nothing to deal out
    if (!started_.empty()) {
      current_ = started_.front();
      started_.pop_front();
      return true;
    }
    const auto q = deal_.next(table_.shards() * table_.epochs());
    if (!q) return false;
    const std::uint64_t shard = shard_of(*q);
    const auto& segs = table_.shard(shard);
    current_ = Cursor{*q, shard, 0, segs.empty() ? 0 : segs[0].begin, false};
    return true;
  }

  /// Appends up to `want` elements of the current shard; fewer means the shard has no more.
  std::size_t read_items(std::vector<Out>& out, std::size_t want) {
    const auto& segs = table_.shard(current_->shard);
    std::size_t got = 0;
    while (current_->segment < segs.size()) {
      const auto& seg = segs[current_->segment];
      // The lines that start in this segment (the last may run past its end, into the next shard's bytes).
      std::uint64_t p = current_->pos;
      bool aligned = current_->aligned;
      got += take(out, want - got, seg.file, p, aligned, seg.end);
      current_->pos = p;
      current_->aligned = aligned;
      if (got == want) return got;
      ++current_->segment;  // no line starts in the rest of this segment
      if (current_->segment < segs.size()) current_->pos = segs[current_->segment].begin;
      current_->aligned = true;  // later segments start at a file's beginning
    }
    return got;
  }

  const LineShardTable& table_;
  PositionDeal deal_;  // work items: epoch × shard
  std::uint64_t key_ = 0;
  std::optional<Cursor> current_;
  std::deque<Cursor> started_;  // dealt here by a rescale: finished before new items
  std::unique_ptr<MappedFile> mapped_;
  std::uint32_t mapped_file_ = 0;
  std::pair<std::uint64_t, std::uint64_t> populated_{0, 0};  // bytes of the mapped file already populated
};

}  // namespace dpipe::detail
