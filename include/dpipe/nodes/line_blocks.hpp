#pragma once
/// The lines of text files, many to an element: each element is a TextBlock of consecutive whole lines
/// of one logical shard, at most `block_bytes` long (a longer line makes a block of its own). The same
/// logical shards, deal, epochs and state as `lines` (detail/line_shards.hpp): unpacked, the blocks hold
/// exactly the lines `lines` gives, in the same order when both have the same name (it seeds the shards'
/// order). One read into one buffer, and one array of line ends, per block instead of one string per
/// line: on short lines, several times the throughput.
/// Out: TextBlock.
/// State: the work items dealt so far and the shards started, with where it is in each.
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "dpipe/detail/line_shards.hpp"
#include "dpipe/detail/read_file.hpp"
#include "dpipe/text_block.hpp"
#include "dpipe/kit/rescale.hpp"
#include "dpipe/kit/spec.hpp"
#include "dpipe/nodes/map.hpp"

namespace dpipe {

struct LineBlocksOptions {
  std::int64_t logical_shards = 64;
  std::int64_t epochs = 1;
  bool shuffle_shards = true;
  /// A block ends after the last whole line within this many bytes of its start (at least one line).
  std::int64_t block_bytes = 64 << 10;
  std::string name{};
  /// The data root the file names are resolved against and how the files are identified in snapshots.
  DataFiles data{};
};

namespace detail {

/// Line ends found by find_newlines: a vector whose growth does not zero its new room.
using LineEnds = std::vector<std::uint64_t, PooledAllocator<std::uint64_t>>;

/// Appends to `out` the offset (from `p`) of every '\n' in [p, p + n), in order.
inline void find_newlines(const char* p, std::size_t n, LineEnds& out) {
  std::size_t count = out.size();
  constexpr std::size_t kPiece = 4096;  // room for a newline per byte of a piece, made before its scan
  for (std::size_t piece = 0; piece < n; piece += kPiece) {
    const std::size_t end = std::min(n, piece + kPiece);
    out.resize(count + (end - piece));
    std::uint64_t* w = out.data() + count;
    std::size_t i = piece;
#if defined(__SSE2__)
    // 64 bytes per step: four 16-byte compares folded into one mask, then one store per newline.
    const __m128i nl = _mm_set1_epi8('\n');
    auto mask16 = [&](std::size_t at) {
      const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + at));
      return static_cast<std::uint64_t>(static_cast<std::uint32_t>(_mm_movemask_epi8(_mm_cmpeq_epi8(v, nl))));
    };
    for (; i + 64 <= end; i += 64) {
      std::uint64_t m = mask16(i) | mask16(i + 16) << 16 | mask16(i + 32) << 32 | mask16(i + 48) << 48;
      while (m) {
        *w++ = i + static_cast<std::uint64_t>(__builtin_ctzll(m));
        m &= m - 1;
      }
    }
#endif
    for (; i < end; ++i)
      if (p[i] == '\n') *w++ = i;
    count = static_cast<std::size_t>(w - out.data());
  }
  out.resize(count);
}

}  // namespace detail

class LineBlocksDef final : public NodeDef<TextBlock> {
 public:
  LineBlocksDef(std::vector<std::string> files, LineBlocksOptions o)
      : NodeDef<TextBlock>("line_blocks", o.name,
                           {{"logical_shards", param_text(o.logical_shards)},
                            {"epochs", param_text(o.epochs)},
                            {"shuffle_shards", param_text(o.shuffle_shards)},
                            {"block_bytes", param_text(o.block_bytes)}}),
        table_(files, o.data, o.logical_shards, o.epochs, o.shuffle_shards, node_label("line_blocks", o.name)),
        block_bytes_(o.block_bytes) {
    if (block_bytes_ < 1 || block_bytes_ > (std::int64_t{1} << 30))
      throw ConfigError(node_label("line_blocks", o.name) + ": block_bytes must be between 1 and 1073741824, got " +
                        param_text(block_bytes_));
    for (auto& [key, value] : table_.file_params()) add_param(std::move(key), std::move(value));
  }
  // Declared inline (it is defined below the Iter): a class without a non-inline virtual has its vtable
  // emitted only where an object is made, not in every file that includes this header.
  inline std::unique_ptr<Iter<TextBlock>> instantiate(BuildContext& ctx) const override;
  const detail::LineShardTable& table() const { return table_; }
  std::uint64_t block_bytes() const { return static_cast<std::uint64_t>(block_bytes_); }

 private:
  detail::LineShardTable table_;
  std::int64_t block_bytes_;
};

class LineBlocksIter final : public detail::LineShardIter<TextBlock> {
 public:
  LineBlocksIter(BuildContext& ctx, const LineBlocksDef& def)
      : LineShardIter(ctx, "line_blocks", def.table()), block_bytes_(def.block_bytes()) {}

 protected:
  /// Opens one file at a time and reads each block with pread straight into the block's buffer (one
  /// copy of each byte, no page tables to fill and tear down); a line cut off at the block's end is read
  /// again for the next block. A file that shrinks is a DataError when a read comes up short.
  std::size_t take(std::vector<TextBlock>& out, std::size_t want, std::uint32_t file, std::uint64_t& pos,
                   bool& aligned, std::uint64_t seg_end) override {
    const detail::ReadFile& f = open(file);
    const std::uint64_t size = f.size();
    if (!aligned) {
      pos = next_line_start(f, pos);
      aligned = true;
    }
    std::size_t got = 0;
    for (; got < want && pos < seg_end; ++got) {
      const std::uint64_t limit = std::min(size - pos, block_bytes_);  // the block's length at most
      const std::uint64_t scan = std::min(limit, seg_end - pos);         // a line starting past seg_end is not ours
      TextBlock block;
      auto& text = block.text_;
      // The scan, and a little past it for the line that crosses seg_end, in one read.
      text.resize(std::min(limit, scan + kLookAhead));  // not zeroed: PooledAllocator default-initialises
      f.read(text.data(), text.size(), pos);
      ends_.clear();
      detail::find_newlines(text.data(), scan, ends_);
      std::uint64_t bytes = ends_.empty() ? 0 : ends_.back() + 1;  // the block's length from pos
      if (bytes < scan) {
        // A line of ours starts at pos + bytes and does not end within the scan: it joins the block if
        // it ends within the limit or is the file's last, or if the block has no other line.
        std::optional<std::uint64_t> nl;
        if (const void* q = std::memchr(text.data() + scan, '\n', text.size() - scan))
          nl = static_cast<std::uint64_t>(static_cast<const char*>(q) - text.data());
        if (!nl && text.size() < limit) nl = read_on(f, pos, text, limit);
        if (!nl && ends_.empty() && limit < size - pos) nl = read_on(f, pos, text, size - pos);  // a long line
        if (nl) {
          ends_.push_back(*nl);
          bytes = *nl + 1;
        } else if (text.size() == size - pos) {  // the file's last line, without a newline
          ends_.push_back(text.size());
          bytes = text.size();
        }
      }
      text.resize(bytes);
      if (text.capacity() > 2 * bytes + 4096) text.shrink_to_fit();  // a block cut short holds no spare buffer
      block.ends_.assign(ends_.begin(), ends_.end());
      out.push_back(std::move(block));
      pos += bytes;
    }
    return got;
  }

 private:
  using Text = decltype(TextBlock::text_);

  const detail::ReadFile& open(std::uint32_t file) {
    if (!file_ || file_index_ != file) {
      file_.reset();  // one file open at a time
      file_ = std::make_unique<detail::ReadFile>(table().files()[file], table().file_size(file));
      file_index_ = file;
    }
    return *file_;
  }

  static constexpr std::uint64_t kLookAhead = 4096;

  /// Reads on after the `text.size()` bytes from `pos` already in `text`, in steps of 4 KiB doubling
  /// each time, until a '\n' turns up or `text` holds `upto` bytes: the newline's offset, if one did.
  static std::optional<std::uint64_t> read_on(const detail::ReadFile& f, std::uint64_t pos, Text& text,
                                              std::uint64_t upto) {
    for (std::uint64_t step = kLookAhead; text.size() < upto; step *= 2) {
      const std::uint64_t have = text.size();
      const std::uint64_t more = std::min(upto - have, step);
      text.resize(have + more);
      f.read(text.data() + have, more, pos + have);
      if (const void* nl = std::memchr(text.data() + have, '\n', more))
        return static_cast<std::uint64_t>(static_cast<const char*>(nl) - text.data());
    }
    return std::nullopt;
  }

  /// Where the first line starting at or after `pos` starts (the file's size if none does).
  static std::uint64_t next_line_start(const detail::ReadFile& f, std::uint64_t pos) {
    if (pos == 0) return 0;
    char before;
    f.read(&before, 1, pos - 1);
    if (before == '\n') return pos;
    // Reads of 4 KiB, doubling up to 1 MiB, into one buffer: a long line costs few calls, little memory.
    Text buf;
    for (std::uint64_t step = 4096; pos < f.size(); step = std::min<std::uint64_t>(2 * step, 1 << 20)) {
      const std::uint64_t n = std::min(step, f.size() - pos);
      buf.resize(n);
      f.read(buf.data(), n, pos);
      if (const void* nl = std::memchr(buf.data(), '\n', n)) return pos + (static_cast<const char*>(nl) - buf.data()) + 1;
      pos += n;
    }
    return pos;
  }

  std::uint64_t block_bytes_;
  detail::LineEnds ends_;  // scratch: the line ends of one block
  std::unique_ptr<detail::ReadFile> file_;
  std::uint32_t file_index_ = 0;
};

inline std::unique_ptr<Iter<TextBlock>> LineBlocksDef::instantiate(BuildContext& ctx) const {
  return std::make_unique<LineBlocksIter>(ctx, *this);
}

inline Pipeline<TextBlock> line_blocks(std::vector<std::string> files, LineBlocksOptions o = {}) {
  return make_pipeline<LineBlocksDef>(std::move(files), std::move(o));
}

struct LineBlocksKind {
  static constexpr std::string_view name = "line_blocks";
  static constexpr std::string_view doc =
      "The lines of text files, many to an element (a block of whole lines of one logical shard), dealt to the instances like `lines`.";
  static constexpr ParamSchema params[] = {
      {.name = "files", .type = ParamType::texts, .doc = "the text files, in order", .positional = true, .fingerprint = "file*"},
      {.name = "logical_shards", .type = ParamType::integer, .doc = "how many pieces the files are cut into, whatever the layout", .fallback = "64"},
      {.name = "epochs", .type = ParamType::integer, .doc = "passes over the files", .fallback = "1"},
      {.name = "shuffle_shards", .type = ParamType::boolean, .doc = "deal the shards in a random order each epoch", .fallback = "true"},
      {.name = "block_bytes", .type = ParamType::integer, .doc = "a block ends after the last whole line within this many bytes", .fallback = "65536"},
  };
  using State = detail::LineShardsState;
  static constexpr bool source = true;
  /// It deals its shards to the instances: a level-based sharding_filter after it would shard again.
  static constexpr bool deals = true;
  /// Rescale: the line sources' rule (detail/line_shards.hpp); a block in a later buffer is dealt whole.
  static RescaleRule rescale() { return detail::line_shards_rescale(); }
  /// `{"op": "line_blocks", "files": [...], "logical_shards": 64, "epochs": 1, "shuffle_shards": true,
  /// "block_bytes": 65536}`. Spec elements have no text-block type yet: a block is the batch of its lines.
  template <class Spec>
  static SpecPipeline from_spec(Spec& s) {
    std::vector<std::string> files;
    LineBlocksOptions o{.name = s.name(), .data = s.data_files()};
    s.required("files", files);
    s.param("logical_shards", o.logical_shards);
    s.param("epochs", o.epochs);
    s.param("shuffle_shards", o.shuffle_shards);
    s.param("block_bytes", o.block_bytes);
    return line_blocks(std::move(files), o) | map(BlockLines{});
  }
  /// A text block as the list of its lines.
  struct BlockLines {
    std::vector<std::string> operator()(const TextBlock& b) const { return b.to_strings(); }
  };
};

}  // namespace dpipe
