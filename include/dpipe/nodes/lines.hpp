#pragma once
/// Lines of text files, read through logical shards: the files' bytes are cut into `logical_shards`
/// ranges of about equal size, a count fixed up front and independent of the layout (a file may span
/// shards; a line belongs to the shard where it starts). Over `epochs` passes, the shards' order is
/// reshuffled every epoch from the seed, and work item q (epoch q / S, shard q mod S of that epoch's
/// order) goes to instance q mod (world_size × num_workers) — to rank q mod world_size before `dispatch`,
/// where it runs once per rank. Each instance reads one shard at a time
/// and maps one file at a time (no descriptor stays open), its pages mapped up to 4 MiB at a time ahead of
/// the reads. A file that shrinks while it is read is a DataError (see MappedReadGuard), never a crash.
/// A trailing '\r' is stripped; empty lines are elements; a last line without a newline counts.
/// Out: std::string.
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

namespace dpipe {

struct LinesOptions {
  std::int64_t logical_shards = 64;
  std::int64_t epochs = 1;
  bool shuffle_shards = true;
  std::string name;
};

class LinesDef final : public NodeDef<std::string> {
 public:
  struct Segment {
    std::uint32_t file;
    std::uint64_t begin, end;  // byte range of the file in this shard
  };

  LinesDef(std::vector<std::string> files, LinesOptions o)
      : NodeDef<std::string>("lines", o.name,
                             {{"logical_shards", param_text(o.logical_shards)}, {"epochs", param_text(o.epochs)},
                              {"shuffle_shards", param_text(o.shuffle_shards)}}),
        files_(std::move(files)), opts_(std::move(o)) {
    const std::string who = node_label("lines", opts_.name);
    if (files_.empty()) throw ConfigError(who + ": no files given");
    if (opts_.logical_shards < 1 || opts_.logical_shards > (1 << 24))
      throw ConfigError(who + ": logical_shards must be between 1 and 16777216, got " + param_text(opts_.logical_shards));
    if (opts_.epochs < 1) throw ConfigError(who + ": epochs must be at least 1, got " + param_text(opts_.epochs));
    detail::check_position_count(static_cast<std::uint64_t>(opts_.logical_shards),
                                 static_cast<std::uint64_t>(opts_.epochs), who, "logical shards", "work items");
    std::vector<std::uint64_t> sizes;
    std::uint64_t total = 0;
    for (std::size_t i = 0; i < files_.size(); ++i) {
      std::error_code ec;
      const auto size = std::filesystem::file_size(files_[i], ec);
      if (ec) throw DataError("cannot read data file '" + files_[i] + "': " + ec.message());
      // The fingerprint covers every file and its size, so a snapshot of other data is refused.
      add_param("file" + std::to_string(i), files_[i] + " (" + std::to_string(size) + " bytes)");
      sizes.push_back(size);
      total += size;
    }
    empty_ = total == 0;
    // Shard s covers global bytes [s·total/S, (s+1)·total/S) of the files laid end to end.
    const auto shards = static_cast<std::uint64_t>(opts_.logical_shards);
    shards_.resize(shards);
    std::uint64_t file_start = 0;
    auto scaled = [&](std::uint64_t byte, bool up) {  // byte · S / total, rounded down or up
      const auto x = static_cast<unsigned __int128>(byte) * shards;
      return static_cast<std::uint64_t>((x + (up ? total - 1 : 0)) / total);
    };
    for (std::uint32_t f = 0; f < sizes.size() && total > 0; ++f) {
      const std::uint64_t file_end = file_start + sizes[f];
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
  }
  std::unique_ptr<Iter<std::string>> instantiate(BuildContext& ctx) const override;

  const std::vector<std::string>& files() const { return files_; }
  const std::vector<Segment>& shard(std::uint64_t s) const { return shards_[s]; }
  std::uint64_t shards() const { return shards_.size(); }
  std::uint64_t epochs() const { return static_cast<std::uint64_t>(opts_.epochs); }
  bool shuffled() const { return opts_.shuffle_shards; }
  bool empty() const { return empty_; }

 private:
  std::vector<std::string> files_;
  LinesOptions opts_;
  std::vector<std::vector<Segment>> shards_;
  bool empty_ = false;  // the files hold no bytes at all
};

class LinesIter final : public Hooked<std::string> {
 public:
  LinesIter(BuildContext& ctx, const LinesDef& def)
      : Hooked(ctx, "lines"), def_(def),
        deal_(detail::PositionDeal::in(ctx, "lines '" + key() + "'")) {
    key_ = mix64(ctx.seed ^ mix64(fnv1a(key()) ^ mix64(ctx.epoch + 0x11e5)));
  }

 protected:
  std::size_t pull_chunk(std::vector<std::string>& out, std::size_t max) override {
    const std::size_t before = out.size();
    std::size_t n = 0;
    try {
      while (n < max) {
        if (!current_ && !start_next_item()) break;
        n += read_lines(out, max - n);
        if (n < max) current_.reset();  // fewer than asked: the shard is done
      }
    } catch (...) {
      out.resize(before);  // a failed pull appends nothing
      throw;
    }
    return n;
  }

  void save_state(StateWriter& w) const override {
    deal_.save(w);
    // Shards started and not finished: the current one first, then any dealt here by a rescale.
    std::vector<std::uint64_t> items, segments, offsets;
    auto add = [&](const Cursor& c) {
      items.push_back(c.item);
      segments.push_back(c.segment);
      offsets.push_back(c.pos | (c.aligned ? 0 : kUnaligned));
    };
    if (current_) add(*current_);
    for (const auto& c : started_) add(c);
    w("started_items", items);
    w("started_segments", segments);
    w("started_offsets", offsets);
  }
  void restore_state(StateReader& r) override {
    std::vector<std::uint64_t> items, segments, offsets;
    deal_.restore(r, "shards");
    r("started_items", items);
    r("started_segments", segments);
    r("started_offsets", offsets);
    if (items.size() != segments.size() || items.size() != offsets.size()) r.fail("started shards are inconsistent");
    started_.clear();
    const std::uint64_t total = def_.shards() * def_.epochs();
    for (std::size_t i = 0; i < items.size(); ++i) {
      if (items[i] >= total) r.fail("work item " + std::to_string(items[i]) + " does not exist");
      const auto& segs = def_.shard(shard_of(items[i]));
      if (segments[i] > segs.size()) r.fail("shard segment " + std::to_string(segments[i]) + " does not exist");
      started_.push_back(
          {items[i], shard_of(items[i]), segments[i], offsets[i] & ~kUnaligned, (offsets[i] & kUnaligned) == 0});
    }
  }
  std::vector<IterBase*> inputs() const override { return {}; }

 private:
  static constexpr std::uint64_t kUnaligned = std::uint64_t{1} << 63;  // saved offsets: not yet at a line start
  struct Cursor {
    std::uint64_t item;     // work item: epoch item / S, shard shard_of(item)
    std::uint64_t shard;    // shard_of(item), kept so each line does not recompute it
    std::uint64_t segment;  // index into the shard's segments
    std::uint64_t pos;      // byte offset in that segment's file: the next line starts here
    bool aligned;           // pos is known to be a line start (false: skip the rest of a line first)
  };

  std::uint64_t shard_of(std::uint64_t item) const {
    const std::uint64_t s = def_.shards(), epoch = item / s, i = item % s;
    if (!def_.shuffled()) return i;
    return KeyedPermutation(s, mix64(key_ ^ mix64(epoch)))(i);
  }

  bool start_next_item() {
    if (def_.empty()) return false;  // no bytes: however many epochs, nothing to deal out
    if (!started_.empty()) {
      current_ = started_.front();
      started_.pop_front();
      return true;
    }
    const auto q = deal_.next(def_.shards() * def_.epochs());
    if (!q) return false;
    const std::uint64_t shard = shard_of(*q);
    const auto& segs = def_.shard(shard);
    current_ = Cursor{*q, shard, 0, segs.empty() ? 0 : segs[0].begin, false};
    return true;
  }

  const detail::MappedFile& map(std::uint32_t file) {
    if (!mapped_ || mapped_file_ != file) {
      mapped_.reset();  // one file mapped at a time
      mapped_ = std::make_unique<detail::MappedFile>(def_.files()[file]);
      mapped_file_ = file;
      populated_ = {0, 0};
    }
    return *mapped_;
  }

  /// Maps the pages of the next 4 MiB from `at` (at most to `end`) in one call, ahead of the reads.
  void populate(const detail::MappedFile& m, std::uint64_t at, std::uint64_t end) {
    constexpr std::uint64_t kAhead = 4 << 20;
    populated_ = {at, std::min(end, at + kAhead)};
    m.will_read(populated_.first, populated_.second);
  }

  /// Appends up to `want` next lines of the current shard; fewer means the shard has no more.
  std::size_t read_lines(std::vector<std::string>& out, std::size_t want) {
    const auto& segs = def_.shard(current_->shard);
    std::size_t got = 0;
    while (current_->segment < segs.size()) {
      const auto& seg = segs[current_->segment];
      const auto& m = map(seg.file);
      if (seg.end > m.size()) throw DataError("data file '" + m.path() + "' changed size since the pipeline was built");
      const char* const data = m.data();
      const std::uint64_t size = m.size();
      const detail::MappedReadGuard guard(m);
      std::uint64_t p = current_->pos;
      if (!current_->aligned) {
        // A line that starts before this shard belongs to the one before: skip to the next line start.
        if (p > 0 && data[p - 1] != '\n') {
          const void* nl = std::memchr(data + p, '\n', size - p);
          p = nl ? static_cast<std::uint64_t>(static_cast<const char*>(nl) - data) + 1 : size;
          guard.check();
        }
        current_->aligned = true;
      }
      // The lines that start in this segment (the last may run past its end, into the next shard's bytes).
      for (; got < want && p < seg.end; ++got) {
        if (p < populated_.first || p >= populated_.second) populate(m, p, seg.end);
        const auto* nl = static_cast<const char*>(std::memchr(data + p, '\n', size - p));
        guard.check();  // before the copy: past a lost page, the "line" runs on over zeros to the end
        const std::uint64_t end = nl ? static_cast<std::uint64_t>(nl - data) : size;
        const std::uint64_t len = end - p - (end > p && data[end - 1] == '\r' ? 1 : 0);
        out.emplace_back(data + p, len);
        p = nl ? end + 1 : size;
      }
      current_->pos = p;
      if (got == want) return got;
      ++current_->segment;  // no line starts in the rest of this segment
      if (current_->segment < segs.size()) current_->pos = segs[current_->segment].begin;
      current_->aligned = true;  // later segments start at a file's beginning
    }
    return got;
  }

  const LinesDef& def_;
  detail::PositionDeal deal_;  // work items: epoch × shard
  std::uint64_t key_ = 0;
  std::optional<Cursor> current_;
  std::deque<Cursor> started_;  // dealt here by a rescale: finished before new items
  std::unique_ptr<detail::MappedFile> mapped_;
  std::uint32_t mapped_file_ = 0;
  std::pair<std::uint64_t, std::uint64_t> populated_{0, 0};  // bytes of the mapped file already populated
};

inline std::unique_ptr<Iter<std::string>> LinesDef::instantiate(BuildContext& ctx) const {
  return std::make_unique<LinesIter>(ctx, *this);
}

inline Pipeline<std::string> lines(std::vector<std::string> files, LinesOptions o = {}) {
  return make_pipeline<LinesDef>(std::move(files), std::move(o));
}

}  // namespace dpipe
