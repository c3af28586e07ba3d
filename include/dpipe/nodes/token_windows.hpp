#pragma once
/// Training windows from raw token files (nanoGPT's `.bin`: a headerless array of uint16 or uint32
/// tokens). Window k of a file covers tokens [k·L, k·L + L + 1): L inputs and their shifted targets;
/// the remainder that cannot fill a window is dropped, and windows never cross files. Random access:
/// put a `sampler` after it to read in a global order and rescale; alone it reads every window in
/// order on every worker, like `range`. Out: std::vector<Token>. State: the next window.
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "dpipe/detail/indexed_source.hpp"
#include "dpipe/detail/mapped_file.hpp"
#include "dpipe/pipeline.hpp"
#include "dpipe/kit/rescale.hpp"
#include "dpipe/kit/spec.hpp"

namespace dpipe {

enum class TokenType { uint16, uint32 };

struct TokenWindowsOptions {
  TokenType dtype = TokenType::uint16;
  std::int64_t seq_len = 1024;
  std::string name{};
  /// The data root the file names are resolved against and how the files are identified in snapshots.
  DataFiles data{};
};

template <class Token = std::int64_t>
class TokenWindowsDef final : public NodeDef<std::vector<Token>>, public RandomAccess<std::vector<Token>> {
 public:
  TokenWindowsDef(const std::vector<std::string>& names, const TokenWindowsOptions& o)
      : TokenWindowsDef(resolve_data_files(names, o.data), o) {}
  TokenWindowsDef(const std::vector<DataFile>& files, TokenWindowsOptions o)
      : NodeDef<std::vector<Token>>("token_windows", o.name, describe(files, o), {}), opts_(std::move(o)) {
    const std::string who = node_label("token_windows", opts_.name);
    if (files.empty()) throw ConfigError(who + ": no files given");
    if (opts_.seq_len < 1) throw ConfigError(who + ": seq_len must be positive, got " + param_text(opts_.seq_len));
    const std::size_t width = opts_.dtype == TokenType::uint16 ? 2 : 4;
    const auto len = static_cast<std::uint64_t>(opts_.seq_len);
    first_.push_back(0);
    for (const auto& file : files) {
      const std::string& f = file.path;
      auto m = std::make_shared<const detail::MappedFile>(f);
      if (m->size() % width != 0)
        throw DataError("token file '" + f + "' is " + std::to_string(m->size()) + " bytes, not a whole number of " +
                        std::to_string(width) + "-byte tokens (the last token is cut at byte offset " +
                        std::to_string(m->size() - m->size() % width) + ")");
      const std::uint64_t tokens = m->size() / width;
      first_.push_back(first_.back() + (tokens >= len + 1 ? (tokens - 1) / len : 0));
      maps_.push_back(std::move(m));
    }
  }
  std::unique_ptr<Iter<std::vector<Token>>> instantiate(BuildContext& ctx) const override;

  std::uint64_t size() const override { return first_.back(); }
  std::vector<Token> at(std::uint64_t i) const override {
    const auto w = window(i);
    const detail::MappedReadGuard guard(w.file);
    auto tokens = opts_.dtype == TokenType::uint16 ? copy_tokens<std::uint16_t>(w.bytes, w.count)
                                                   : copy_tokens<std::uint32_t>(w.bytes, w.count);
    guard.check();
    return tokens;
  }
  bool prefetches() const override { return true; }
  void prefetch(std::uint64_t i) const override {
    const auto w = window(i);
    detail::prefetch_bytes(w.bytes, w.count);
  }

 private:
  std::size_t file_of(std::uint64_t i) const {
    return static_cast<std::size_t>(std::upper_bound(first_.begin(), first_.end(), i) - first_.begin() - 1);
  }
  /// Window i's file, where its bytes start in that file's map, and how many there are.
  struct Window {
    const detail::MappedFile& file;
    const char* bytes;
    std::size_t count;
  };
  Window window(std::uint64_t i) const {
    const std::size_t f = file_of(i);
    const std::size_t width = opts_.dtype == TokenType::uint16 ? 2 : 4;
    const auto len = static_cast<std::uint64_t>(opts_.seq_len);
    return {*maps_[f], maps_[f]->data() + (i - first_[f]) * len * width, static_cast<std::size_t>(len + 1) * width};
  }
  template <class Raw>
  static std::vector<Token> copy_tokens(const char* bytes, std::size_t count) {
    // The map is page-aligned and windows start at multiples of the token width: aligned reads.
    const auto* p = reinterpret_cast<const Raw*>(bytes);
    return std::vector<Token>(p, p + count / sizeof(Raw));  // one pass: converts (or copies), no zero-fill
  }
  // The fingerprint covers the file list, the files' sizes and the window shape, and a restore compares
  // the files' modification times, so a snapshot of other data is refused.
  static Params describe(const std::vector<DataFile>& files, const TokenWindowsOptions& o) {
    Params p{{"dtype", o.dtype == TokenType::uint16 ? "uint16" : "uint32"}, {"seq_len", param_text(o.seq_len)}};
    for (std::size_t i = 0; i < files.size(); ++i) {
      std::error_code ec;
      const auto bytes = std::filesystem::file_size(files[i].path, ec);
      // A file that cannot be sized is refused by the constructor's body, naming it.
      p.emplace_back("file" + std::to_string(i), ec ? files[i].name + " (? bytes)"
                                                    : data_file_param(files[i], static_cast<std::uint64_t>(bytes), o.data.identity));
    }
    return p;
  }

  TokenWindowsOptions opts_;
  std::vector<std::shared_ptr<const detail::MappedFile>> maps_;
  std::vector<std::uint64_t> first_;  // first window index of each file; back() = total
};

template <class Token>
std::unique_ptr<Iter<std::vector<Token>>> TokenWindowsDef<Token>::instantiate(BuildContext& ctx) const {
  return std::make_unique<detail::IndexedSourceIter<std::vector<Token>>>(ctx, *this, "token_windows");
}

template <class Token = std::int64_t>
Pipeline<std::vector<Token>> token_windows(const std::vector<std::string>& files, TokenWindowsOptions o = {}) {
  return make_pipeline<TokenWindowsDef<Token>>(files, std::move(o));
}

struct TokenWindowsKind {
  static constexpr std::string_view name = "token_windows";
  static constexpr std::string_view doc =
      "Windows of `seq_len` + 1 tokens from flat token files (uint16 or uint32), random-access: put a sampler after it.";
  /// Provenance (docs/design.md, "Provenance"; a kind without this line does not carry it).
  static constexpr std::string_view provenance = "names window i by position i (read in order); makes it again from its key";
  static constexpr ParamSchema params[] = {
      {.name = "files", .type = ParamType::texts, .doc = "the token files, in order", .positional = true, .fingerprint = "file*"},
      {.name = "seq_len", .type = ParamType::integer, .doc = "tokens per window, before the one extra target token"},
      {.name = "dtype", .type = ParamType::choice, .doc = "the token type of the files", .fallback = "\"uint16\"", .choices = "uint16|uint32"},
  };
  using State = IndexedSourceState;
  static constexpr bool source = true;
  /// Rescale: as range's (read it through a sampler to rescale).
  static RescaleRule rescale() { return RescaleRule::refused(rescale::kReadInFull); }
  /// `{"op": "token_windows", "files": [...], "seq_len": N, "dtype": "uint16" | "uint32"}`: windows of
  /// seq_len + 1 tokens as integers.
  template <class Spec>
  static SpecPipeline from_spec(Spec& s) {
    std::vector<std::string> files;
    TokenWindowsOptions o{.name = s.name(), .data = s.data_files()};
    s.required("files", files);
    s.choice("dtype", o.dtype, {{"uint16", TokenType::uint16}, {"uint32", TokenType::uint32}});
    s.required("seq_len", o.seq_len);
    return token_windows(files, o);
  }
};

}  // namespace dpipe
