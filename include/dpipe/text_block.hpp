#pragma once
/// TextBlock: consecutive lines of a text file in one buffer — the element of `line_blocks`. The buffer
/// holds the file's bytes as they are, each line followed by its '\n' (the last line of a file may have
/// none); `ends` marks where each line's bytes stop. A line's view drops a trailing '\r', as `lines` does.
/// Two allocations for a few thousand short lines instead of one per line, both from a pool of large
/// buffers (detail/buffer_pool.hpp).
#include <cstdint>
#include <cstring>
#include <iterator>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dpipe/kit/codec.hpp"
#include "dpipe/detail/buffer_pool.hpp"
#include "dpipe/kit/node.hpp"

namespace dpipe {

class LineBlocksIter;

class TextBlock {
 public:
  TextBlock() = default;
  /// A block of `lines` (none may hold '\n'), each followed by '\n'; throws ConfigError otherwise. As
  /// in a file, a line that ends in '\r' reads back without it.
  explicit TextBlock(const std::vector<std::string>& lines) {
    for (const auto& l : lines) {
      if (l.find('\n') != std::string::npos) throw ConfigError("a TextBlock line holds a newline");
      text_.insert(text_.end(), l.begin(), l.end());
      ends_.push_back(text_.size());
      text_.push_back('\n');
    }
  }

  /// Number of lines.
  std::size_t size() const { return ends_.size(); }
  bool empty() const { return ends_.empty(); }
  /// Line i without its '\n' and without a '\r' before it.
  std::string_view operator[](std::size_t i) const {
    const std::size_t b = i == 0 ? 0 : ends_[i - 1] + 1;
    std::size_t e = ends_[i];
    if (e > b && text_[e - 1] == '\r') --e;
    return {text_.data() + b, e - b};
  }
  /// The raw bytes: every line with its line ending, as in the file.
  std::string_view text() const { return {text_.data(), text_.size()}; }
  /// Where each line's bytes stop in text(): at its '\n', or at the end for a last line without one.
  std::span<const std::uint64_t> ends() const { return {ends_.data(), ends_.size()}; }
  std::vector<std::string> to_strings() const {
    std::vector<std::string> out;
    out.reserve(size());
    for (std::size_t i = 0; i < size(); ++i) out.emplace_back((*this)[i]);
    return out;
  }

  class const_iterator {
   public:
    using iterator_concept = std::forward_iterator_tag;
    using iterator_category = std::input_iterator_tag;  // it yields views, not references
    using value_type = std::string_view;
    using difference_type = std::ptrdiff_t;
    const_iterator() = default;
    const_iterator(const TextBlock* b, std::size_t i) : b_(b), i_(i) {}
    std::string_view operator*() const { return (*b_)[i_]; }
    const_iterator& operator++() {
      ++i_;
      return *this;
    }
    const_iterator operator++(int) {
      auto old = *this;
      ++i_;
      return old;
    }
    bool operator==(const const_iterator& o) const { return i_ == o.i_; }

   private:
    const TextBlock* b_ = nullptr;
    std::size_t i_ = 0;
  };
  const_iterator begin() const { return {this, 0}; }
  const_iterator end() const { return {this, size()}; }

  bool operator==(const TextBlock&) const = default;

  /// A block of copies of `text` and `ends`, not checked: for readers that found the line ends
  /// themselves. They must satisfy what `check` checks.
  static TextBlock assemble(std::string_view text, std::span<const std::uint64_t> ends) {
    TextBlock b;
    b.text_.assign(text.begin(), text.end());
    b.ends_.assign(ends.begin(), ends.end());
    return b;
  }
  /// Why `text` and `ends` do not make a block (a line end out of order or out of range, a byte that
  /// should be '\n' and is not, a '\n' inside a line, bytes after the last line), or empty when they do.
  static std::string check(std::string_view text, std::span<const std::uint64_t> ends) {
    std::uint64_t begin = 0;
    for (std::size_t i = 0; i < ends.size(); ++i) {
      const std::uint64_t e = ends[i];
      if (e < begin || e > text.size())
        return "line " + std::to_string(i) + " ends at " + std::to_string(e) + ", outside [" +
               std::to_string(begin) + ", " + std::to_string(text.size()) + "]";
      if (e > begin && std::memchr(text.data() + begin, '\n', e - begin))
        return "line " + std::to_string(i) + " holds a newline";
      if (e == text.size()) {
        if (i + 1 != ends.size()) return "line " + std::to_string(i) + " ends the text but is not the last line";
        return {};
      }
      if (text[e] != '\n') return "line " + std::to_string(i) + " does not end at a newline";
      begin = e + 1;
    }
    if (begin != text.size()) return std::to_string(text.size() - begin) + " bytes follow the last line";
    return {};
  }

 private:
  friend class LineBlocksIter;  // reads a file straight into text_
  std::vector<char, detail::PooledAllocator<char>> text_;
  std::vector<std::uint64_t, detail::PooledAllocator<std::uint64_t>> ends_;
};

/// Blocks are large: the engine moves them one at a time.
template <>
inline constexpr bool is_bulk_element_v<TextBlock> = true;

/// A block is encoded as its text and its line ends; decoding checks that they agree.
template <>
struct Codec<TextBlock> {
  static constexpr std::size_t kMinBytes = 16;
  static void encode(ByteWriter& w, const TextBlock& b) {
    w.str(b.text());
    w.put<std::uint64_t>(b.ends().size());
    if (!b.empty()) w.raw(b.ends().data(), b.ends().size_bytes());
  }
  static TextBlock decode(ByteReader& r) {
    const std::string_view text = r.str();
    const std::size_t n = r.length(sizeof(std::uint64_t));
    std::vector<std::uint64_t> ends(n);
    const auto bytes = r.bytes(n * sizeof(std::uint64_t));
    if (n > 0) std::memcpy(ends.data(), bytes.data(), bytes.size());
    if (const auto why = TextBlock::check(text, ends); !why.empty()) r.fail("a text block is inconsistent: " + why);
    return TextBlock::assemble(text, ends);
  }
  static std::string tag() { return "text_block"; }
};

}  // namespace dpipe
