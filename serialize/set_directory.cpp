// A snapshot set's directory: the rank files' names, the manifest and the set index beside them, and
// listing, reading and writing a set (its rescale to another layout: rescale_driver.cpp).
#include "dpipe/snapshot_set.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <set>
#include <string_view>
#include <thread>

#include "dpipe/atomic_file.hpp"
#include "dpipe/crc32c.hpp"
#include "dpipe/detail/removal_log.hpp"
#include "dpipe/error.hpp"
#include "dpipe/regular_file.hpp"
#include "dpipe/rng.hpp"
#include "durable_dir.hpp"
#include "set_index.hpp"
#include "snapshot_plan.hpp"
#include "snapshot_set_internal.hpp"

namespace dpipe {
namespace fs = std::filesystem;
using namespace set_internal;  // what the rescale driver shares (snapshot_set_internal.hpp)
using detail::RemovalLog;

namespace {
std::string hex16(std::uint64_t x) {
  char b[17];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(x));
  return b;
}
}  // namespace

namespace set_internal {

std::string hex_id(std::uint64_t id) { return "0x" + hex16(id); }

std::string steps_text(const std::optional<std::uint64_t>& step) {
  return step ? "step " + std::to_string(*step) : std::string("no step");
}

}  // namespace set_internal

namespace {

/// Throws unless `ranks` is a complete, consistent set (rank r at index r).
void check_set(const std::vector<Snapshot>& ranks) {
  check_metas(static_cast<int>(ranks.size()), [&](int r) -> const SnapshotMeta& { return ranks[static_cast<std::size_t>(r)].meta; });
}

}  // namespace

SnapshotSet::SnapshotSet(std::vector<Snapshot> ranks) : ranks_(std::move(ranks)) { check_set(ranks_); }

// ---- file names -------------------------------------------------------------------------------------
// A rank's file is named for what a reader needs to check the set without opening the other ranks'
// files: `rank-R-of-W.wK[.sS].TAG.dpipe`, TAG a digest of what every rank of one snapshot shares
// (pipeline fingerprint, seed, epoch, world size, workers, step). A same-layout resume lists the
// directory, compares the names, and reads its own file only. Files named `rank-R-of-W.dpipe` (written
// before) stay readable: a set with one such file is read whole, as before.

namespace {

std::uint64_t set_tag(const SnapshotMeta& m) {
  std::uint64_t h = mix64(m.fingerprint ^ mix64(m.seed ^ mix64(m.epoch)));
  for (const std::uint64_t x : {std::uint64_t(std::uint32_t(m.layout.world_size)), std::uint64_t(std::uint32_t(m.layout.num_workers)),
                                m.step ? *m.step + 1 : 0})
    h = mix64(h ^ x);
  return h;
}

/// A name's dot-separated parts; more than kMaxParts (no rank file has as many) gives an empty list.
struct DotParts {
  static constexpr std::size_t kMaxParts = 5;
  std::array<std::string_view, kMaxParts> part{};
  std::size_t size = 0;
  std::string_view back() const { return part[size - 1]; }
};
DotParts split_dots(std::string_view s) {
  DotParts out;
  for (;;) {
    if (out.size == DotParts::kMaxParts) return {};
    const auto dot = s.find('.');
    out.part[out.size++] = s.substr(0, dot);
    if (dot == std::string_view::npos) return out;
    s.remove_prefix(dot + 1);
  }
}

/// "0, 1, 2" or "0, 1, 2, … (40 ranks)" — at most a few named.
std::string rank_list(const std::vector<int>& ranks) {
  constexpr std::size_t kNamed = 5;
  std::string out;
  for (std::size_t i = 0; i < ranks.size() && i < kNamed; ++i) out += (i ? ", " : "") + std::to_string(ranks[i]);
  if (ranks.size() > kNamed) out += ", … (" + std::to_string(ranks.size()) + " ranks)";
  return (ranks.size() == 1 ? "rank " : "ranks ") + out;
}

}  // namespace

namespace set_internal {

std::optional<std::uint64_t> decimal(std::string_view s) {
  if (s.empty() || s.size() > 20 || (s.size() > 1 && s[0] == '0')) return std::nullopt;
  std::uint64_t v = 0;
  for (const char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    const std::uint64_t d = static_cast<std::uint64_t>(c - '0');
    if (v > (UINT64_MAX - d) / 10) return std::nullopt;
    v = v * 10 + d;
  }
  return v;
}

}  // namespace set_internal

std::string SnapshotSet::file_name(int rank, int world_size) {
  return "rank-" + std::to_string(rank) + "-of-" + std::to_string(world_size) + ".dpipe";
}

namespace {

/// "-of-W.wK[.sS].TAG.dpipe": the part of the name after the rank, the same on every rank of the set.
std::string set_suffix(const SetIdentity& s) {
  std::string out = "-of-" + std::to_string(s.world) + ".w" + std::to_string(s.workers);
  if (s.step) out += ".s" + std::to_string(*s.step);
  return out + "." + hex16(s.tag) + ".dpipe";
}

}  // namespace

namespace set_internal {

SetIdentity identity_of(const SnapshotMeta& m) {
  return {m.layout.world_size, m.layout.num_workers, m.step, set_tag(m)};
}

std::string tagged_name(int rank, const SetIdentity& s) { return "rank-" + std::to_string(rank) + set_suffix(s); }

}  // namespace set_internal

std::string SnapshotSet::file_name(const SnapshotMeta& m) { return tagged_name(m.layout.rank, identity_of(m)); }

std::optional<RankFileName> SnapshotSet::parse_file_name(std::string_view name) {
  const DotParts dots = split_dots(name);
  const auto& parts = dots.part;
  if (dots.size < 2 || dots.back() != "dpipe" || !parts[0].starts_with("rank-")) return std::nullopt;
  const std::string_view head = parts[0].substr(5);
  const auto of = head.find("-of-");
  if (of == std::string_view::npos) return std::nullopt;
  const auto r = decimal(head.substr(0, of)), w = decimal(head.substr(of + 4));
  if (!r || !w || *w == 0 || *w > std::uint64_t(std::numeric_limits<int>::max()) || *r >= *w) return std::nullopt;
  RankFileName out{.rank = static_cast<int>(*r), .world_size = static_cast<int>(*w)};
  if (dots.size == 2) return out;  // rank-R-of-W.dpipe: written before names carried more
  // rank-R-of-W.wK[.sS].TAG.dpipe
  if (dots.size != 4 && dots.size != 5) return std::nullopt;
  const auto k = parts[1].starts_with("w") ? decimal(parts[1].substr(1)) : std::nullopt;
  if (!k || *k == 0 || *k > std::uint64_t(std::numeric_limits<int>::max())) return std::nullopt;
  out.workers = static_cast<int>(*k);
  if (dots.size == 5) {
    const auto s = parts[2].starts_with("s") ? decimal(parts[2].substr(1)) : std::nullopt;
    if (!s) return std::nullopt;
    out.step = *s;
  }
  const std::string_view tag = parts[dots.size - 2];
  if (tag.size() != 16 || tag.find_first_not_of("0123456789abcdef") != std::string_view::npos) return std::nullopt;
  out.tag = std::stoull(std::string(tag), nullptr, 16);
  out.tagged = true;
  return out;
}

// ---- the manifest -------------------------------------------------------------------------------
// `set.dpipe-manifest` says that every rank's file of one snapshot was in the directory when it was
// written, so a resume on that layout opens its own file by name and lists nothing. No collective
// writes it: the rank whose write completes the set does (its one listing after its write counts the
// set's names). A rank removes one naming another set before and after removing its older files, and
// after writing; a rank that wrote a manifest lists again only if a file of its set was removed since its
// listing (the removal log). What a kill between those steps leaves open: docs/snapshot-format.md,
// "Snapshot sets".
// Without a manifest (or with one this version cannot read) a reader lists the directory.

namespace {

constexpr const char* kIndexName = "set.dpipe-index";
/// Held (created exclusively) by the reader that builds a set's missing index (build_index_once); one
/// older than kIndexLockStale is a killed builder's.
constexpr const char* kIndexLockName = ".set.dpipe-index.building";
constexpr std::chrono::minutes kIndexLockStale{10};

std::string manifest_path(const std::string& dir) { return (fs::path(dir) / kManifestName).string(); }

/// The value of `key=` at the start of `s`, up to the next space (consumed), or nullopt.
std::optional<std::string_view> manifest_field(std::string_view& s, std::string_view key) {
  if (!s.starts_with(key) || s.size() <= key.size() || s[key.size()] != '=') return std::nullopt;
  s.remove_prefix(key.size() + 1);
  const auto space = s.find(' ');
  const std::string_view value = s.substr(0, space);
  s.remove_prefix(space == std::string_view::npos ? s.size() : space + 1);
  return value;
}

}  // namespace

namespace set_internal {

std::string index_path(const std::string& dir) { return (fs::path(dir) / kIndexName).string(); }

std::string manifest_text(const SetIdentity& s) {
  const std::string body = "dpipe-set 1 world=" + std::to_string(s.world) + " workers=" + std::to_string(s.workers) +
                           " step=" + (s.step ? std::to_string(*s.step) : "-") + " tag=" + hex16(s.tag);
  char crc[9];
  std::snprintf(crc, sizeof crc, "%08x", crc32c(body));
  return body + " crc32c=" + crc + "\n";
}

std::optional<SetIdentity> read_manifest(const std::string& dir) {
  constexpr std::uint64_t kMaxBytes = 160;  // the longest manifest is about 110 bytes
  const std::string path = manifest_path(dir);
  if (::access(path.c_str(), F_OK) != 0) return std::nullopt;  // the usual case on a rank's write
  std::string bytes;
  try {
    const RegularFile file(path, FileRole::snapshot);  // no device opened, no FIFO waited on
    if (file.size() > kMaxBytes) return std::nullopt;
    bytes = file.read_all();
  } catch (const Error&) {
    return std::nullopt;
  }
  const std::string_view text = bytes;
  std::string_view rest = text;
  if (!rest.starts_with("dpipe-set 1 ")) return std::nullopt;
  rest.remove_prefix(12);
  const auto world = manifest_field(rest, "world"), workers = manifest_field(rest, "workers"),
             step = manifest_field(rest, "step"), tag = manifest_field(rest, "tag");
  if (!world || !workers || !step || !tag || tag->size() != 16 ||
      tag->find_first_not_of("0123456789abcdef") != std::string_view::npos)
    return std::nullopt;
  const auto w = decimal(*world), k = decimal(*workers);
  const auto s = *step == "-" ? std::optional<std::uint64_t>{} : decimal(*step);
  constexpr auto kMaxInt = std::uint64_t(std::numeric_limits<int>::max());
  if (!w || !k || *w == 0 || *k == 0 || *w > kMaxInt || *k > kMaxInt || (*step != "-" && !s)) return std::nullopt;
  const SetIdentity out{static_cast<int>(*w), static_cast<int>(*k), s, std::stoull(std::string(*tag), nullptr, 16)};
  if (manifest_text(out) != text) return std::nullopt;  // the checksum, and nothing before or after
  return out;
}

}  // namespace set_internal

namespace {

/// Removes the set file `path` (`what`: "manifest" or "index"); false when there was none.
bool remove_set_file(const std::string& path, const char* what) {
  if (::unlink(path.c_str()) == 0) return true;
  if (errno != ENOENT) throw SnapshotError(std::string("cannot remove the set ") + what + " '" + path + "': " + std::strerror(errno));
  return false;
}

/// Removes `dir`'s manifest and set index, durably (a crash must not bring back one that names files now
/// gone). The index is read only beside a manifest that names its set, so it goes second.
void drop_manifest(const std::string& dir) {
  const bool manifest = remove_set_file(manifest_path(dir), "manifest");
  if (remove_set_file(index_path(dir), "index") || manifest) detail::fsync_directory(dir, manifest_path(dir));
}

/// Removes `dir`'s manifest unless it names `set`.
void drop_manifest_unless(const std::string& dir, const SetIdentity& set) {
  if (read_manifest(dir) != set) drop_manifest(dir);
}

/// Which ranks of `set` have their file among the names seen (rank-R plus the set's suffix, 0 <= R <
/// world): each rank counted once, should a listing return a name twice.
class SetFileCounter {
 public:
  explicit SetFileCounter(const SetIdentity& set) : suffix_(set_suffix(set)), world_(std::uint64_t(set.world)) {}
  void see(std::string_view name) {
    if (!name.starts_with("rank-") || !name.ends_with(suffix_)) return;
    const auto r = decimal(name.substr(5, name.size() - 5 - suffix_.size()));
    if (r && *r < world_) ranks_.push_back(*r);
  }
  /// Whether every rank of the set was seen. Memory follows the names listed, not the world size the set
  /// claims (a file naming 2^31 ranks costs its listing, not a bit per rank).
  bool complete() const {
    std::sort(ranks_.begin(), ranks_.end());
    ranks_.erase(std::unique(ranks_.begin(), ranks_.end()), ranks_.end());
    return ranks_.size() == world_;
  }

 private:
  std::string suffix_;
  std::uint64_t world_;
  mutable std::vector<std::uint64_t> ranks_;  // put in order (and duplicates dropped) when asked
};

/// Counts the rank files of `set` in `dir` (one readdir pass).
bool set_is_complete(const std::string& dir, const SetIdentity& set) {
  DIR* d = ::opendir(dir.c_str());
  if (!d) return false;
  SetFileCounter counter(set);
  errno = 0;
  while (const dirent* e = ::readdir(d)) counter.see(e->d_name);
  const bool ok = errno == 0 && counter.complete();
  ::closedir(d);
  return ok;
}

/// Removes the manifest of `set` (or one that does not read) after a listing that found the set
/// complete turned out wrong: a rank of it has written another snapshot since.
void drop_manifest_if_incomplete(const std::string& dir, const SetIdentity& set) {
  if (set_is_complete(dir, set)) return;
  // Removed when it names this set or cannot be read (a manifest that does not read as one names no set
  // for any reader); kept when it names another set, written by the rank that completed that one.
  const auto now = read_manifest(dir);
  if (!now || *now == set) drop_manifest(dir);
}

/// Writes the manifest of `set`, complete in `dir` (whole sets, offline rescales): durably, then lists
/// again and removes it if the set changed while it was written.
void write_manifest(const std::string& dir, const SetIdentity& set) {
  try {
    // Stale temporaries of the manifest are removed by the listing of the set's write.
    write_file_atomically(manifest_path(dir), manifest_text(set), {.remove_stale_temporaries = false});
  } catch (const FileError&) {
    // Two ranks on two hosts completing the set at once write the same manifest, and each may take the
    // other's temporary for a killed writer's (its process is not on this host) and remove it. The set
    // is whole either way; without a manifest its readers list it. The error may also come after the
    // rename (the directory's fsync), with the manifest in place: the check below runs either way.
  }
  drop_manifest_if_incomplete(dir, set);
}

/// The manifest written by the rank whose write completed `set`: not made durable (a manifest lost in a
/// crash, or left empty, is no manifest, and the set is listed), and checked by the removal log, whose
/// state `removals` read before the listing that found the set complete; the set is listed again only
/// when a rank has removed a file of it (or of no known set) since.
void write_completing_manifest(const std::string& dir, const SetIdentity& set, const RemovalLog& removals) {
  try {
    write_file_atomically(manifest_path(dir), manifest_text(set), {.durability = Durability::by_caller});
  } catch (const FileError&) {
    // As in write_manifest: the set is whole; the check below runs either way.
  }
  if (!removals.saw_no_removal_of(set.tag)) drop_manifest_if_incomplete(dir, set);
}

}  // namespace

namespace set_internal {

SetListing list_set(const std::string& dir) {
  // One pass over the entries with readdir (a set of thousands of ranks is listed by every rank that
  // resumes): rank files kept with their parsed names, in one list.
  std::vector<std::pair<std::string, RankFileName>> files;
  std::string odd;  // .dpipe files that are no rank of a set
  {
    DIR* d = ::opendir(dir.c_str());
    if (!d) {
      if (errno == ENOENT || errno == ENOTDIR) throw SnapshotError("snapshot set '" + dir + "' is not a directory");
      throw SnapshotError("cannot list snapshot set '" + dir + "': " + std::strerror(errno));
    }
    errno = 0;
    while (const dirent* e = ::readdir(d)) {
      const std::string_view name = e->d_name;
      if (const auto f = SnapshotSet::parse_file_name(name)) files.emplace_back(std::string(name), *f);
      else if (name.size() > 6 && name.ends_with(".dpipe")) odd += (odd.empty() ? "'" : ", '") + std::string(name) + "'";
    }
    const int err = errno;
    ::closedir(d);
    if (err) throw SnapshotError("cannot list snapshot set '" + dir + "': " + std::strerror(err));
  }
  // The usual set: one world size, each rank once. Placed by rank without sorting.
  SetListing out;
  out.world = files.empty() ? 0 : files.front().second.world_size;
  if (odd.empty() && !files.empty() && files.size() == static_cast<std::size_t>(out.world)) {
    out.ranks.resize(files.size());
    bool usual = true;
    for (auto& file : files) {
      if (file.second.world_size != out.world ||  // then rank < world (the parse checks it against its own)
          !out.ranks[static_cast<std::size_t>(file.second.rank)].first.empty()) {
        usual = false;
        break;
      }
      auto& slot = out.ranks[static_cast<std::size_t>(file.second.rank)];
      out.all_tagged = out.all_tagged && file.second.tagged;
      slot = std::move(file);
    }
    if (usual) return out;
    // Not the usual set: gather the files back and report what is wrong with it below.
    for (auto& slot : out.ranks)
      if (!slot.first.empty()) files.push_back(std::move(slot));
    files.erase(std::remove_if(files.begin(), files.end(), [](const auto& f) { return f.first.empty(); }), files.end());
    out = SetListing{};
  }
  std::map<int, std::map<int, std::vector<std::pair<std::string, RankFileName>>>> by_world;  // W → R → files
  for (auto& file : files) by_world[file.second.world_size][file.second.rank].push_back(std::move(file));
  // A file that looks like a rank's but is not one (rank-1-of-02, rank-5-of-2) is refused, not skipped:
  // it may be the very rank that is missing, written by other tools.
  if (!odd.empty())
    throw SnapshotError("snapshot set '" + dir + "' holds " + odd +
                        ", which no rank of a set is named (rank-R-of-W.wK[.sS].TAG.dpipe or rank-R-of-W.dpipe, "
                        "0 <= R < W)");
  if (by_world.empty()) throw SnapshotError("snapshot set '" + dir + "' holds no rank files (rank-R-of-W...dpipe)");
  if (by_world.size() > 1) {
    // Named by two of their files: the world sizes the file names disagree on.
    std::string sizes;
    for (const auto& [w, rs] : by_world)
      sizes += (sizes.empty() ? "" : ", ") + std::to_string(w) + " ('" + rs.begin()->second.front().first + "')";
    throw SnapshotError("snapshot set '" + dir + "' mixes files of " + std::to_string(by_world.size()) +
                        " different world sizes: " + sizes + "; a set holds one run's ranks only");
  }
  out.world = by_world.begin()->first;
  const auto& found = by_world.begin()->second;
  // The work is bounded by the files present, never by the world size a file name claims: the missing
  // ranks are counted, and only the first few named.
  if (found.size() != static_cast<std::size_t>(out.world)) {
    constexpr int kNamed = 5;
    std::string missing;
    int named = 0, r = 0;
    for (auto it = found.begin(); named < kNamed && r < out.world; ++r) {
      if (it != found.end() && it->first == r) ++it;
      else missing += (named++ ? ", " : "") + std::to_string(r);
    }
    const std::size_t absent = static_cast<std::size_t>(out.world) - found.size();
    if (absent > static_cast<std::size_t>(named)) missing += ", …";
    throw SnapshotError("snapshot set '" + dir + "' is incomplete: ranks present: " + std::to_string(found.size()) +
                        " of " + std::to_string(out.world) + "; first missing: " + missing);
  }
  out.ranks.reserve(found.size());
  for (const auto& [r, files] : found) {
    if (files.size() > 1) {
      std::string names;
      for (const auto& f : files) names += (names.empty() ? "'" : ", '") + f.first + "'";
      throw SnapshotError("snapshot set '" + dir + "' holds " + std::to_string(files.size()) + " files for rank " +
                          std::to_string(r) + ": " + names + "; a set holds one per rank (a rank that writes "
                          "into a set removes its older file)");
    }
    out.all_tagged = out.all_tagged && files.front().second.tagged;
    out.ranks.push_back(files.front());
  }
  return out;
}

}  // namespace set_internal

namespace {

/// Throws unless a snapshot with metadata `m` is what its file name `f` says (a file of a set keeps the name
/// its rank gave it).
void check_named(const SnapshotMeta& m, const RankFileName& f) {
  if (f.tagged && (m.layout.rank != f.rank || m.layout.world_size != f.world_size ||
                   m.layout.num_workers != f.workers || m.step != f.step || set_tag(m) != f.tag))
    throw SnapshotError("the file holds rank " + std::to_string(m.layout.rank) + " of " +
                        std::to_string(m.layout.world_size) + " with " + std::to_string(m.layout.num_workers) +
                        " workers at " + steps_text(m.step) + " (its name would be '" + SnapshotSet::file_name(m) +
                        "'): a file of a set must keep the name its rank gave it");
}

/// Reads a rank's file and checks that it holds what its name says.
Snapshot read_named(const std::string& path, const RankFileName& f) {
  Snapshot s = Snapshot::read_file(path);
  check_named(s.meta, f);
  return s;
}

}  // namespace

namespace set_internal {

Snapshot read_listed(const std::string& dir, const SetListing& l, int r) { return with_rank_file(dir, l, r, read_named); }

std::optional<Snapshot> read_by_manifest(const std::string& dir, const SetIdentity& set, int r) {
  const std::string name = tagged_name(r, set);
  struct stat st {};
  if (::stat((fs::path(dir) / name).c_str(), &st) != 0) return std::nullopt;
  const RankFileName f{r, set.world, set.workers, set.step, set.tag, true};
  return with_rank_file(dir, r, name, f, read_named);
}

std::optional<detail::SnapshotPlan> read_named_plan(const std::string& dir, const SetListing& l, int r) {
  return with_rank_file(dir, l, r, [&](const std::string& path, const RankFileName& f) {
    auto p = detail::read_snapshot_plan(path);
    if (p) check_named(p->meta, f);
    return p;
  });
}

// ---- the set index -------------------------------------------------------------------------------
// `set.dpipe-index` holds every rank's node records in one small file (serialize/set_index.hpp), so a
// rescale reads it and the element lists it is dealt instead of every rank's state index. The write that
// completes a set builds it from the rank files, before the manifest; a reader uses it only beside a
// manifest that names its set, and it goes whenever the manifest goes. A rank file rewritten while the
// index was built from it (a rank writing the same step again) is caught by the stamps below.

std::optional<FileStamp> stamp_of(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return std::nullopt;
  return FileStamp{st.st_dev, st.st_ino, st.st_size, std::int64_t(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec};
}

std::optional<std::vector<FileStamp>> write_set_index(const std::string& dir, const SetIdentity& set,
                                                      Durability durability) {
  try {
    detail::SetIndexWriter index(manifest_text(set), static_cast<std::uint32_t>(set.workers));
    std::vector<FileStamp> stamps;
    stamps.reserve(static_cast<std::size_t>(set.world));
    SetListing l;
    l.world = set.world;
    l.named = set;
    for (int r = 0; r < set.world; ++r) {
      const std::string path = (fs::path(dir) / tagged_name(r, set)).string();
      const auto stamp = stamp_of(path);
      if (!stamp) return std::nullopt;
      const auto plan = read_named_plan(dir, l, r);
      if (!plan) return std::nullopt;
      index.add_rank(*plan, static_cast<std::uint32_t>(r), path);
      stamps.push_back(*stamp);
    }
    write_file_atomically(index_path(dir), index.finish(), {.durability = durability});
    return stamps;
  } catch (const Error&) {
    return std::nullopt;
  } catch (const std::exception&) {  // out of memory for a very large set: it goes without an index
    return std::nullopt;
  }
}

}  // namespace set_internal

namespace {

/// Removes `dir`'s set index, durably.
void drop_index(const std::string& dir) {
  if (remove_set_file(index_path(dir), "index")) detail::fsync_directory(dir, index_path(dir));
}

/// Writes the index of `set`, complete in `dir`, and removes it again when a rank file changed while it
/// was built (or an older one when none could be written); whether it stands.
bool write_checked_index(const std::string& dir, const SetIdentity& set) {
  const auto stamps = write_set_index(dir, set);
  bool stands = stamps.has_value();
  for (int r = 0; stands && r < set.world; ++r)
    stands = stamp_of((fs::path(dir) / tagged_name(r, set)).string()) == (*stamps)[static_cast<std::size_t>(r)];
  if (!stands) drop_index(dir);  // built from files that changed, or none written: no older one may stand
  return stands;
}

/// Writes the manifest of `set`, complete in `dir` (write_manifest), and its index.
void write_index_and_manifest(const std::string& dir, const SetIdentity& set) {
  write_manifest(dir, set);
  write_checked_index(dir, set);
}

}  // namespace

namespace set_internal {

void create_set_dir(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw SnapshotError("cannot create snapshot directory '" + dir + "': " + ec.message());
}

}  // namespace set_internal

namespace {

/// Whether `name` is a temporary a killed writer left for a rank file of rank R of `world` that this write
/// replaced (`.rank-R-of-W.….dpipe-tmp.PID.HEX`, PID gone), whatever step or set the file was for: a killed
/// write of step 5 is not left behind by the complete write of step 6.
bool stale_rank_temporary(std::string_view name, int world, const std::vector<std::string>& written_by_rank) {
  int rank = -1, of = -1, used = 0;
  const std::string text(name.substr(0, 64));
  if (std::sscanf(text.c_str(), ".rank-%d-of-%d.%n", &rank, &of, &used) != 2 || used == 0 || of != world || rank < 0 ||
      static_cast<std::size_t>(rank) >= written_by_rank.size() || written_by_rank[static_cast<std::size_t>(rank)].empty())
    return false;
  constexpr std::string_view kMark = ".dpipe-tmp.";
  const auto at = name.rfind(kMark);
  return at != std::string_view::npos && detail::left_by_killed_writer(name.substr(at + kMark.size()));
}

/// Whether `name` is a temporary a killed writer left for the manifest (`.set.dpipe-manifest.dpipe-tmp.PID.HEX`).
bool stale_manifest_temporary(std::string_view name) {
  constexpr std::string_view kPrefix = ".set.dpipe-manifest.dpipe-tmp.";
  return name.starts_with(kPrefix) && detail::left_by_killed_writer(name.substr(kPrefix.size()));
}

/// What the listing after a set write found: the set's ranks (counted), and the written ranks' other
/// files (their older snapshots, or another run's).
struct WrittenListing {
  explicit WrittenListing(const SetIdentity& set) : counter(set) {}
  SetFileCounter counter;
  std::vector<std::string> older;
  std::vector<std::uint64_t> older_tags;  // each older file's set TAG (0: a name that carries none)
};

/// Lists `dir` once after ranks were written (a non-empty name in `written_by_rank` is rank R's file,
/// just written): counts the set's ranks and collects the written ranks' files under other names of
/// world size `world`. The temporaries killed writers left for those ranks' files and for the manifest
/// are removed on the way (whatever their step).
WrittenListing list_after_write(const std::string& dir, int world, const std::vector<std::string>& written_by_rank,
                                const SetIdentity& set) {
  DIR* d = ::opendir(dir.c_str());
  if (!d) throw SnapshotError("cannot list '" + dir + "' for the older files of the ranks written: " + std::strerror(errno));
  // One rank written (write_rank): only its names are parsed, the rest of a big set's listing is passed
  // over by prefix.
  std::string prefix = "rank-";
  const auto written = [](const std::string& n) { return !n.empty(); };
  if (std::count_if(written_by_rank.begin(), written_by_rank.end(), written) == 1)
    prefix += std::to_string(std::find_if(written_by_rank.begin(), written_by_rank.end(), written) - written_by_rank.begin()) +
              "-of-";
  WrittenListing out(set);
  errno = 0;
  while (const dirent* e = ::readdir(d)) {
    const std::string_view name = e->d_name;
    out.counter.see(name);
    if (name.starts_with(".") && ((name.substr(1).starts_with(prefix) && stale_rank_temporary(name, world, written_by_rank)) ||
                                  stale_manifest_temporary(name))) {
      ::unlinkat(::dirfd(d), e->d_name, 0);  // a race with another cleaner is harmless
      errno = 0;
      continue;
    }
    if (!name.starts_with(prefix)) continue;
    const auto f = SnapshotSet::parse_file_name(name);
    if (!f || f->world_size != world || static_cast<std::size_t>(f->rank) >= written_by_rank.size()) continue;
    const std::string& mine = written_by_rank[static_cast<std::size_t>(f->rank)];
    if (!mine.empty() && name != mine) {
      out.older.emplace_back(name);
      out.older_tags.push_back(f->tagged ? f->tag : 0);
    }
  }
  const int err = errno;
  ::closedir(d);
  if (err) throw SnapshotError("cannot list '" + dir + "' for the older files of the ranks written: " + std::strerror(err));
  return out;
}

/// Removes the listed older files of the ranks just written (`older`, from list_after_write): a set
/// directory written into again holds one file per rank. Only the written ranks' names are touched, so
/// ranks writing at once need no collective. A manifest naming another set than `set` goes first (a kill
/// between the removals must not leave one naming a removed file) and once more after (one written
/// since by a rank that had found that set complete before); the removal is recorded in the removal log
/// between the two (the removed files' set TAGs), and everything is made as durable as the writes (a
/// crash must not bring a file back).
void remove_older_files(const std::string& dir, const WrittenListing& listed, const SetIdentity& set) {
  const std::vector<std::string>& older = listed.older;
  if (older.empty()) return;
  drop_manifest_unless(dir, set);
  // What was removed is recorded, and a late manifest removed, also when a later removal fails.
  const auto recorded = [&](std::size_t removed) {
    RemovalLog::record(dir, {listed.older_tags.begin(), listed.older_tags.begin() + std::ptrdiff_t(removed)});
    drop_manifest_unless(dir, set);
  };
  for (std::size_t i = 0; i < older.size(); ++i) {
    const std::string path = (fs::path(dir) / older[i]).string();
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
      const int err = errno;
      recorded(i);
      throw SnapshotError("wrote a snapshot into '" + dir + "' but cannot remove that rank's older file '" + older[i] +
                          "': " + std::strerror(err));
    }
  }
  recorded(older.size());
  detail::fsync_directory(dir, dir);
}

/// Refuses the write of `s` (its file `name`, just written into `dir`) when this rank's file there under
/// another name (`older`) belongs to another run (another pipeline or seed): removing it as this rank's
/// older file would break that run's set. The file just written is removed again first, unless it
/// replaced a file of the same name (which was this run's). An older file of this run (another step or
/// epoch) is replaced as before; one that cannot be read is no set anybody can resume, and is replaced
/// too. Reads the metadata of this rank's other files only.
void refuse_another_runs_set(const std::string& dir, const Snapshot& s, const SetIdentity& set, const std::string& name,
                             bool replaced, const std::vector<std::string>& older) {
  for (const auto& other : older) {
    SnapshotMeta m;
    try {
      m = Snapshot::read_meta((fs::path(dir) / other).string());
    } catch (const Error&) {
      continue;
    }
    if (m.fingerprint == s.meta.fingerprint && m.seed == s.meta.seed) continue;
    if (!replaced && ::unlink((fs::path(dir) / name).c_str()) == 0) {
      // Another rank of this run may have counted the file: its set is incomplete again, as its
      // completing rank learns from the removal log, and a manifest naming it goes.
      RemovalLog::record(dir, {set.tag});
      if (read_manifest(dir) == set) drop_manifest(dir);
      detail::fsync_directory(dir, dir);
    }
    throw SnapshotError("snapshot set directory '" + dir + "' holds the set of another run ('" + other + "': seed " +
                        std::to_string(m.seed) + ", graph fingerprint " + hex_id(m.fingerprint) + "; this snapshot: seed " +
                        std::to_string(s.meta.seed) + ", graph fingerprint " + hex_id(s.meta.fingerprint) +
                        "): writing would replace that run's files. Write into another directory, or remove that set first");
  }
}

}  // namespace

void SnapshotSet::write_rank(const std::string& dir, const Snapshot& s) {
  create_set_dir(dir);
  const SetIdentity set = identity_of(s.meta);
  const std::string name = tagged_name(s.meta.layout.rank, set), path = (fs::path(dir) / name).string();
  // Read before the listing below: whether another rank removes a file of this set after it.
  RemovalLog removals(dir);
  // An index stamps the file about to be replaced under its own name.
  const bool replaced = ::access(path.c_str(), F_OK) == 0;
  if (replaced) drop_index(dir);
  write_file_atomically(path, s.to_bytes(), {.remove_stale_temporaries = false});
  // One listing: another run's file of this rank (refused, and this file removed again, before anything
  // of that set changes), this rank's older files, the completion count, stale temporaries.
  std::vector<std::string> written(static_cast<std::size_t>(s.meta.layout.rank) + 1);
  written.back() = name;
  const WrittenListing listed = list_after_write(dir, s.meta.layout.world_size, written, set);
  refuse_another_runs_set(dir, s, set, name, replaced, listed.older);
  // Now that the file changed: an index another rank was building from this rank's older file may have
  // been written since (its own check sees the change only if it comes after the rename).
  drop_index(dir);
  remove_older_files(dir, listed, set);
  // The write that completes the set writes its manifest; any other removes one that names another set
  // (a rank that found the set before complete may have written it after this rank's first removal).
  // The index is left to the first rescale that reads the set (build_index_once): written here, it would
  // read every rank's file on this rank's checkpoint path.
  if (listed.counter.complete()) write_completing_manifest(dir, set, removals);
  else drop_manifest_unless(dir, set);
}

bool SnapshotSet::write_index(const std::string& dir) {
  const auto set = read_manifest(dir);
  if (!set) return false;
  try {
    return write_checked_index(dir, *set);
  } catch (const Error&) {
    return false;
  }
}

void SnapshotSet::write_dir(const std::string& dir) const {
  create_set_dir(dir);
  drop_manifest(dir);
  std::vector<std::string> written;
  for (const auto& s : ranks_) {
    written.push_back(file_name(s.meta));
    write_file_atomically((fs::path(dir) / written.back()).string(), s.to_bytes(), {.remove_stale_temporaries = false});
  }
  const SetIdentity set = identity_of(ranks_.front().meta);
  const WrittenListing listed = list_after_write(dir, world_size(), written, set);  // one listing for the whole set
  remove_older_files(dir, listed, set);
  if (listed.counter.complete()) write_index_and_manifest(dir, set);
}

const Snapshot& SnapshotSet::rank(int r) const {
  if (r < 0 || r >= world_size())
    throw SnapshotError("snapshot set has ranks 0 to " + std::to_string(world_size() - 1) + ", not rank " +
                        std::to_string(r));
  return ranks_[static_cast<std::size_t>(r)];
}

SnapshotSet SnapshotSet::read_dir(const std::string& dir) {
  const SetListing l = list_set(dir);
  std::vector<Snapshot> ranks;
  ranks.reserve(l.ranks.size());
  for (int r = 0; r < l.world; ++r) ranks.push_back(read_listed(dir, l, r));
  return SnapshotSet(std::move(ranks));
}

namespace set_internal {

bool build_index_once(const std::string& dir, const SetIdentity& set) {
  using namespace std::chrono_literals;
  const std::string lock = (fs::path(dir) / kIndexLockName).string(), index = index_path(dir);
  const auto deadline = std::chrono::steady_clock::now() + std::max<std::chrono::milliseconds>(10s, set.world * 2ms);
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (const int fd = ::open(lock.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644); fd >= 0) {
      ::close(fd);
      // The lock goes however the build ends: one left standing would make every rescale wait.
      struct Unlock {
        const std::string& path;
        ~Unlock() { ::unlink(path.c_str()); }
      } unlock{lock};
      try {
        return write_checked_index(dir, set);
      } catch (const Error&) {
        return false;
      }
    }
    if (errno != EEXIST) return false;  // a directory this process cannot write into
    // Another reader is building it: wait while its lock stands.
    auto pause = 1ms;
    for (struct stat st {};;) {
      if (::stat(index.c_str(), &st) == 0) return true;
      if (::stat(lock.c_str(), &st) != 0) return ::stat(index.c_str(), &st) == 0;  // it gave up, or just finished
      const auto age = std::chrono::system_clock::now().time_since_epoch() -
                       (std::chrono::seconds(st.st_mtim.tv_sec) + std::chrono::nanoseconds(st.st_mtim.tv_nsec));
      if (age > kIndexLockStale) {  // its builder was killed: take the lock over once
        ::unlink(lock.c_str());
        break;
      }
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::sleep_for(pause);
      pause = std::min<std::chrono::milliseconds>(pause * 2, 50ms);
    }
  }
  return false;
}

void check_one_snapshot(const std::string& dir, const SetListing& l) {
  const RankFileName& first = l.ranks.front().second;
  if (std::all_of(l.ranks.begin(), l.ranks.end(),
                  [&](const auto& r) { return r.second.step == first.step && r.second.tag == first.tag; }))
    return;
  std::map<std::pair<std::optional<std::uint64_t>, std::uint64_t>, std::vector<int>> groups;
  for (int r = 0; r < l.world; ++r) {
    const RankFileName& f = l.ranks[static_cast<std::size_t>(r)].second;
    groups[{f.step, f.tag}].push_back(r);
  }
  std::set<std::optional<std::uint64_t>> steps;
  for (const auto& g : groups) steps.insert(g.first.first);
  std::string parts;
  for (const auto& [key, ranks] : groups)
    parts += (parts.empty() ? "" : "; ") + (steps.size() > 1 ? steps_text(key.first) : "tag " + hex16(key.second)) +
             " on " + rank_list(ranks);
  if (steps.size() > 1)
    throw SnapshotError("snapshot set '" + dir + "' mixes the snapshots of different steps: " + parts +
                        "; a set holds the snapshots of one step");
  throw SnapshotError("snapshot set '" + dir + "' mixes snapshots of different pipelines, seeds, epochs or worker "
                      "counts (the tags of their file names differ): " + parts);
}

}  // namespace set_internal

}  // namespace dpipe
