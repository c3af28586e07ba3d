// Snapshot sets (one file per rank) and their rescaling to another layout, on records alone.
#include "dpipe/detail/run_record.hpp"
#include "dpipe/snapshot_set.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <limits>
#include <map>
#include <set>
#include <unordered_map>

#include "dpipe/atomic_file.hpp"
#include "dpipe/codec.hpp"
#include "dpipe/crc32c.hpp"
#include "dpipe/error.hpp"
#include "dpipe/node_kind.hpp"
#include "dpipe/regular_file.hpp"
#include "dpipe/rng.hpp"
#include "durable_dir.hpp"
#include "set_index.hpp"
#include "snapshot_plan.hpp"

namespace dpipe {
namespace fs = std::filesystem;
namespace {
std::string hex16(std::uint64_t x) {
  char b[17];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(x));
  return b;
}

std::string hex_id(std::uint64_t id) { return "0x" + hex16(id); }

std::string steps_text(const std::optional<std::uint64_t>& step) {
  return step ? "step " + std::to_string(*step) : std::string("no step");
}
}  // namespace

namespace {

/// Throws unless the metadata of `world` ranks (`meta_of(r)`, rank r's) make a complete, consistent set.
template <class MetaOf>
void check_metas(int world, MetaOf meta_of) {
  if (world == 0) throw SnapshotError("a snapshot set needs at least one rank's snapshot");
  const SnapshotMeta& m0 = meta_of(0);
  for (int r = 0; r < world; ++r) {
    const SnapshotMeta& m = meta_of(r);
    const std::string who = "snapshot set: rank " + std::to_string(r) + "'s snapshot";
    if (m.layout.rank != r || m.layout.world_size != world)
      throw SnapshotError(who + " says it is rank " + std::to_string(m.layout.rank) + " of " +
                          std::to_string(m.layout.world_size) + ", expected rank " + std::to_string(r) + " of " +
                          std::to_string(world));
    if (m.fingerprint != m0.fingerprint)
      throw SnapshotError(who + " was taken from a different pipeline than rank 0's (graph fingerprints differ)");
    if (m.seed != m0.seed || m.epoch != m0.epoch)
      throw SnapshotError(who + " has seed " + std::to_string(m.seed) + " and epoch " + std::to_string(m.epoch) +
                          ", rank 0's has seed " + std::to_string(m0.seed) + " and epoch " + std::to_string(m0.epoch));
    if (m.step != m0.step) {
      throw SnapshotError("snapshot set: rank " + std::to_string(r) + "'s snapshot (id " + hex_id(m.id) + ") names " +
                          steps_text(m.step) + ", rank 0's (id " + hex_id(m0.id) + ") " + steps_text(m0.step) +
                          "; a set holds the snapshots of one step, so these come from different snapshots");
    }
    if (m.layout.num_workers != m0.layout.num_workers)
      throw SnapshotError(who + " has " + std::to_string(m.layout.num_workers) + " workers, rank 0's has " +
                          std::to_string(m0.layout.num_workers));
  }
}

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

/// A decimal number as file names write it (no sign, no leading zero), or nullopt.
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

std::string SnapshotSet::file_name(int rank, int world_size) {
  return "rank-" + std::to_string(rank) + "-of-" + std::to_string(world_size) + ".dpipe";
}

namespace {

/// What the tagged name of every rank file of one snapshot shares, and the manifest records.
struct SetIdentity {
  int world = 0;
  int workers = 0;
  std::optional<std::uint64_t> step{};
  std::uint64_t tag = 0;
  bool operator==(const SetIdentity&) const = default;
};

SetIdentity identity_of(const SnapshotMeta& m) {
  return {m.layout.world_size, m.layout.num_workers, m.step, set_tag(m)};
}

/// "-of-W.wK[.sS].TAG.dpipe": the part of the name after the rank, the same on every rank of the set.
std::string set_suffix(const SetIdentity& s) {
  std::string out = "-of-" + std::to_string(s.world) + ".w" + std::to_string(s.workers);
  if (s.step) out += ".s" + std::to_string(*s.step);
  return out + "." + hex16(s.tag) + ".dpipe";
}

std::string tagged_name(int rank, const SetIdentity& s) { return "rank-" + std::to_string(rank) + set_suffix(s); }

}  // namespace

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
// writes it: the rank whose write completes the set does (its own listing counts the set's names).
// A rank removes it before its file changes, and one naming another set after removing its older file
// and after writing; a rank that wrote a manifest lists again and removes it if the set changed
// meanwhile. What a kill between those steps leaves open: docs/snapshot-format.md, "Snapshot sets".
// Without a manifest (or with one this version cannot read) a reader lists the directory.

namespace {

constexpr const char* kManifestName = "set.dpipe-manifest";
constexpr const char* kIndexName = "set.dpipe-index";

std::string manifest_path(const std::string& dir) { return (fs::path(dir) / kManifestName).string(); }
std::string index_path(const std::string& dir) { return (fs::path(dir) / kIndexName).string(); }

/// "dpipe-set 1 world=W workers=K step=S|- tag=TAG crc32c=CRC\n", CRC over what precedes " crc32c=".
std::string manifest_text(const SetIdentity& s) {
  const std::string body = "dpipe-set 1 world=" + std::to_string(s.world) + " workers=" + std::to_string(s.workers) +
                           " step=" + (s.step ? std::to_string(*s.step) : "-") + " tag=" + hex16(s.tag);
  char crc[9];
  std::snprintf(crc, sizeof crc, "%08x", crc32c(body));
  return body + " crc32c=" + crc + "\n";
}

/// The value of `key=` at the start of `s`, up to the next space (consumed), or nullopt.
std::optional<std::string_view> manifest_field(std::string_view& s, std::string_view key) {
  if (!s.starts_with(key) || s.size() <= key.size() || s[key.size()] != '=') return std::nullopt;
  s.remove_prefix(key.size() + 1);
  const auto space = s.find(' ');
  const std::string_view value = s.substr(0, space);
  s.remove_prefix(space == std::string_view::npos ? s.size() : space + 1);
  return value;
}

/// The set `dir`'s manifest names; nullopt when there is none, it is no regular file, or its text is not
/// exactly what manifest_text writes (checksum included): the reader then lists the directory.
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
  explicit SetFileCounter(const SetIdentity& set) : suffix_(set_suffix(set)), seen_(std::size_t(set.world)) {}
  void see(std::string_view name) {
    if (!name.starts_with("rank-") || !name.ends_with(suffix_)) return;
    const auto r = decimal(name.substr(5, name.size() - 5 - suffix_.size()));
    if (r && *r < seen_.size() && !seen_[*r]) {
      seen_[*r] = true;
      ++count_;
    }
  }
  bool complete() const { return count_ == seen_.size(); }

 private:
  std::string suffix_;
  std::vector<bool> seen_;
  std::size_t count_ = 0;
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

/// Writes the manifest of `set`, complete in `dir`; lists again and removes it if the set changed while
/// it was written (a rank of it has written another snapshot since the listing that found it complete).
void write_manifest(const std::string& dir, const SetIdentity& set) {
  try {
    write_file_atomically(manifest_path(dir), manifest_text(set));
  } catch (const FileError&) {
    // Two ranks on two hosts completing the set at once write the same manifest, and each may take the
    // other's temporary for a killed writer's (its process is not on this host) and remove it. The set
    // is whole either way; without a manifest its readers list it. The error may also come after the
    // rename (the directory's fsync), with the manifest in place: the check below runs either way.
  }
  if (set_is_complete(dir, set)) return;
  // Removed when it names this set or cannot be read (a manifest that does not read as one names no set
  // for any reader); kept when it names another set, written by the rank that completed that one.
  const auto now = read_manifest(dir);
  if (!now || *now == set) drop_manifest(dir);
}

}  // namespace

namespace {

/// A set directory's rank files, from their names alone: one world size, every rank once.
struct SetListing {
  int world = 0;
  std::vector<std::pair<std::string, RankFileName>> ranks;  // at index r: rank r's file
  bool all_tagged = true;                                   // every name carries the set's identity
  /// Set instead of `ranks` for a set its manifest names: rank r's file is named from it.
  std::optional<SetIdentity> named{};
};

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

/// Runs `read` on rank `r`'s file of a listed set, naming the set, the rank and the file in its errors.
template <class Read>
auto with_rank_file(const std::string& dir, int r, const std::string& name, const RankFileName& f, Read read) {
  try {
    return read((fs::path(dir) / name).string(), f);
  } catch (const ElementsNotLoaded&) {
    throw;
  } catch (const SnapshotError& e) {
    throw SnapshotError("snapshot set '" + dir + "', rank " + std::to_string(r) + " ('" + name + "'): " + e.what());
  }
}
template <class Read>
auto with_rank_file(const std::string& dir, const SetListing& l, int r, Read read) {
  if (l.named) {
    const SetIdentity& set = *l.named;
    return with_rank_file(dir, r, tagged_name(r, set), RankFileName{r, set.world, set.workers, set.step, set.tag, true},
                          read);
  }
  const auto& [name, f] = l.ranks[static_cast<std::size_t>(r)];
  return with_rank_file(dir, r, name, f, read);
}

/// Reads a rank's file and checks that it holds what its name says.
Snapshot read_named(const std::string& path, const RankFileName& f) {
  Snapshot s = Snapshot::read_file(path);
  check_named(s.meta, f);
  return s;
}

/// Rank `r`'s file of a listed set read for a rescale plan (read_snapshot_plan), checked against its name;
/// nullopt for a file without a state index.
std::optional<detail::SnapshotPlan> read_named_plan(const std::string& dir, const SetListing& l, int r);

/// Reads rank `r`'s file of a listed set.
Snapshot read_listed(const std::string& dir, const SetListing& l, int r) { return with_rank_file(dir, l, r, read_named); }

/// Rank `r`'s file of the set a manifest names, opened by its name; nullopt when it is not there (the
/// set is then listed, and the listing says what is wrong with it).
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

/// What a rank file was when the index was built from it: a rewrite renames another file into place.
struct FileStamp {
  dev_t dev = 0;
  ino_t ino = 0;
  off_t size = 0;
  std::int64_t mtime_ns = 0;
  bool operator==(const FileStamp&) const = default;
};

std::optional<FileStamp> stamp_of(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return std::nullopt;
  return FileStamp{st.st_dev, st.st_ino, st.st_size, std::int64_t(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec};
}

/// Builds the index of `set`, complete in `dir`, from its rank files' state indexes and writes it; returns
/// the files' stamps, or nullopt when no index was written (a file gone, changed or without a state
/// index: the set's readers then read the rank files, as without an index).
std::optional<std::vector<FileStamp>> write_set_index(const std::string& dir, const SetIdentity& set,
                                                      Durability durability = Durability::each_write) {
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

/// Removes `dir`'s set index, durably.
void drop_index(const std::string& dir) {
  if (remove_set_file(index_path(dir), "index")) detail::fsync_directory(dir, index_path(dir));
}

/// Writes the index and the manifest of `set`, complete in `dir` (write_manifest); the index is removed
/// again when a rank file changed while it was built.
void write_index_and_manifest(const std::string& dir, const SetIdentity& set) {
  const auto stamps = write_set_index(dir, set);
  if (!stamps) drop_index(dir);  // one another rank wrote before this rank's file changed
  write_manifest(dir, set);
  if (!stamps) return;
  for (int r = 0; r < set.world; ++r)
    if (stamp_of((fs::path(dir) / tagged_name(r, set)).string()) != (*stamps)[static_cast<std::size_t>(r)]) {
      drop_index(dir);
      return;
    }
}

[[noreturn]] void refuse_layout(int world, int workers, const Layout& to) {
  throw SnapshotError("the snapshot set was taken with world_size " + std::to_string(world) + " and " +
                      std::to_string(workers) + " workers, this run has world_size " + std::to_string(to.world_size) +
                      " and " + std::to_string(to.num_workers) + " workers; ask for a rescale to redistribute it");
}

/// The old records of a set, handed to the rescale driver one node at a time.
class OldRecords {
 public:
  virtual ~OldRecords() = default;
  /// Every node key once, in the order the ranks saved their records.
  virtual const std::vector<std::string>& keys() const = 0;
  /// The records of node `key` on every old instance, by instance (valid until the next call).
  virtual const std::map<std::uint32_t, const NodeState*>& records(const std::string& key) = 0;
  /// Loads the values of field `field` of the records last given, where a plan left them in the files (a
  /// rule reads them, as a sampler does its skipped positions); false when none was left there.
  virtual bool load(const std::string& field) {
    (void)field;
    return false;
  }
  /// The records of node `key` as columns, when they are kept so (a set index); else nullptr and the
  /// driver asks for records().
  virtual const OldColumns* columns(const std::string& key) {
    (void)key;
    return nullptr;
  }
  /// Node `key`'s kind, for the columns of a node (records say it themselves).
  virtual std::string kind(const std::string& key) {
    (void)key;
    return {};
  }
  /// Makes the element ranges of the new records `out` of the node last given refer to lists that outlive
  /// it (columns number their lists per node).
  virtual void resolve(std::vector<NodeState>& out) { (void)out; }
};

[[noreturn]] void refuse(const std::string& msg) { throw SnapshotError("cannot rescale: " + msg); }

/// Adds `st` to `by_instance`, refusing a second record of one instance.
void place_record(std::map<std::uint32_t, const NodeState*>& by_instance, const NodeState& st) {
  if (!by_instance.emplace(st.instance, &st).second)
    refuse("node '" + st.key + "' has two records for instance " + std::to_string(st.instance));
}

/// The records of snapshots in memory.
class SnapshotRecords final : public OldRecords {
 public:
  explicit SnapshotRecords(const std::vector<Snapshot>& ranks) {
    for (const auto& snap : ranks)
      for (const auto& st : snap.states) {
        auto& slot = by_key_[st.key];
        if (slot.empty()) keys_.push_back(st.key);
        place_record(slot, st);
      }
  }
  const std::vector<std::string>& keys() const override { return keys_; }
  const std::map<std::uint32_t, const NodeState*>& records(const std::string& key) override { return by_key_[key]; }

 private:
  std::vector<std::string> keys_;
  std::map<std::string, std::map<std::uint32_t, const NodeState*>> by_key_;
};

/// The new ranks' snapshots of a consistent set (`old_world` ranks, rank 0's metadata `meta`, its records
/// `old`) rescaled to {world_size, num_workers}: the snapshots of new ranks [first, end) (`end` negative:
/// every rank from `first` on; defined with the rescaling below).
std::vector<Snapshot> rescale_records(const SnapshotMeta& meta, int old_world, OldRecords& old, int world_size,
                                      int num_workers, int first, int end);

/// Every new rank's snapshot of `ranks` (a consistent set) rescaled to {world_size, num_workers}.
std::vector<Snapshot> rescale_ranks(const std::vector<Snapshot>& ranks, int world_size, int num_workers) {
  SnapshotRecords old(ranks);
  return rescale_records(ranks.front().meta, static_cast<int>(ranks.size()), old, world_size, num_workers, 0, -1);
}

/// Loads stored list `list` from its file of a listed set.
void load_list(detail::StoredList& list, const std::string& dir, const SetListing& l) {
  list.loaded = std::make_unique<ElementBlobs>(
      with_rank_file(dir, l, static_cast<int>(list.file),
                     [&](const std::string& path, const RankFileName&) { return detail::load_stored_list(path, list); }));
}

/// Replaces the ranges of every element list of `s` by the elements they name, reading each stored list
/// they touch once.
void load_ranges(Snapshot& s, std::vector<detail::StoredList>& lists, const std::string& dir, const SetListing& l) {
  for (auto& st : s.states)
    for (auto& f : st.fields) {
      if (f.type != FieldType::elements || f.elements.ranges.empty()) continue;
      ElementBlobs out;
      out.tag = f.elements.tag;
      for (const ElementRange& range : f.elements.ranges) {
        if (range.list >= lists.size() || range.end > lists[range.list].count || range.begin > range.end)
          throw SnapshotError("cannot rescale: a plan's range names elements that are not there");
        detail::StoredList& list = lists[range.list];
        if (!list.loaded) load_list(list, dir, l);
        out.append_from(*list.loaded, static_cast<std::size_t>(range.begin), static_cast<std::size_t>(range.end));
      }
      f.elements = std::move(out);
    }
}

/// A set read for a rescale: of every old rank its metadata and its state index, kept encoded (a few
/// numbers per node record, and the short element lists); the long lists stay in the files, as ranges
/// of `lists`, which gains an entry per list of each node as the driver decodes it.
struct SetPlan {
  std::vector<detail::SnapshotPlan> files;  // rank r's at index r
  std::vector<detail::StoredList> lists;
};

/// The plan of a listed set, or nullopt when a file has no state index (written before format 3).
std::optional<SetPlan> read_plan(const std::string& dir, const SetListing& l) {
  SetPlan plan;
  plan.files.reserve(l.ranks.size());
  for (int r = 0; r < l.world; ++r) {
    auto rank = read_named_plan(dir, l, r);
    if (!rank) return std::nullopt;
    if (r > 0) {  // rank 0's graph and user metadata serve the new set
      rank->meta.graph = {};
      rank->meta.user_metadata = {};
    }
    plan.files.push_back(std::move(*rank));
  }
  check_metas(l.world, [&](int r) -> const SnapshotMeta& { return plan.files[static_cast<std::size_t>(r)].meta; });
  return plan;
}

/// Loads the values of field `field` of `records` where they were left in the files (OldRecords::load).
template <class Records>
bool load_field(Records& records, const std::string& field, std::vector<detail::StoredList>& lists,
                const std::string& dir, const SetListing& l) {
  bool loaded = false;
  for (NodeState& st : records)
    for (Field& f : st.fields) {
      if (f.name != field || f.type != FieldType::elements || f.elements.loaded()) continue;
      detail::StoredList& list = lists.at(f.elements.ranges.front().list);
      if (!list.loaded) load_list(list, dir, l);
      f.elements.offsets = list.loaded->offsets;
      f.elements.data = list.loaded->data;
      loaded = true;
    }
  return loaded;
}

/// The records of a plan, decoded from the kept state indexes one node at a time: the previous node's
/// records are dropped when the next one's are asked for.
class PlanRecords final : public OldRecords {
 public:
  PlanRecords(SetPlan& plan, const std::string& dir, const SetListing& l) : plan_(plan), dir_(dir), listing_(l) {
    std::map<std::string_view, std::size_t> index;  // key → its position in keys_
    for (std::size_t r = 0; r < plan_.files.size(); ++r)
      for (const auto& rec : plan_.files[r].records) {
        const auto [it, added] = index.emplace(rec.key, keys_.size());
        if (added) {
          keys_.push_back(rec.key);
          where_.emplace_back();
        }
        where_[it->second].push_back({r, rec.offset});
      }
  }
  const std::vector<std::string>& keys() const override { return keys_; }
  const std::map<std::uint32_t, const NodeState*>& records(const std::string& key) override {
    by_instance_.clear();
    decoded_.clear();
    const auto k = static_cast<std::size_t>(std::find(keys_.begin(), keys_.end(), key) - keys_.begin());
    for (const auto& [r, offset] : where_.at(k)) {  // the driver asks for the keys it was given
      try {
        decoded_.push_back(detail::decode_plan_record(plan_.files[r], offset, static_cast<std::uint32_t>(r), plan_.lists));
      } catch (const SnapshotError& e) {  // named as a file of the set is when it is read
        with_rank_file(dir_, listing_, static_cast<int>(r), [&](const std::string& path, const RankFileName&) -> int {
          throw SnapshotError("'" + path + "': " + e.what());
        });
      }
    }
    for (const NodeState& st : decoded_) place_record(by_instance_, st);
    return by_instance_;
  }
  bool load(const std::string& field) override { return load_field(decoded_, field, plan_.lists, dir_, listing_); }

 private:
  SetPlan& plan_;
  const std::string& dir_;
  const SetListing& listing_;
  std::vector<std::string> keys_;
  // Per key (as in keys_): its records as (old rank, offset in that rank's state index), in rank order.
  std::vector<std::vector<std::pair<std::size_t, std::size_t>>> where_;
  std::deque<NodeState> decoded_;  // the records of the node last asked for (no reallocation as it grows)
  std::map<std::uint32_t, const NodeState*> by_instance_;
};

/// The new ranks' snapshots of a plan (see rescale_records), their element lists still ranges.
std::vector<Snapshot> rescale_plan(SetPlan& plan, const std::string& dir, const SetListing& l, int world_size,
                                   int num_workers, int first, int end) {
  PlanRecords old(plan, dir, l);
  return rescale_records(plan.files.front().meta, static_cast<int>(plan.files.size()), old, world_size, num_workers,
                         first, end);
}

/// The records of a set index as columns, decoded one node at a time (the previous node's are dropped);
/// the lists the new records are dealt join `lists`, where load_ranges finds them.
class IndexRecords final : public OldRecords {
 public:
  IndexRecords(const detail::SetIndex& index, std::vector<detail::StoredList>& lists, const std::string& dir,
               const SetListing& l)
      : index_(index), lists_(lists), dir_(dir), listing_(l) {}
  const std::vector<std::string>& keys() const override { return index_.keys(); }
  const std::map<std::uint32_t, const NodeState*>& records(const std::string&) override { return none_; }
  const OldColumns* columns(const std::string& key) override {
    const auto& keys = index_.keys();
    const auto k = static_cast<std::size_t>(std::find(keys.begin(), keys.end(), key) - keys.begin());
    node_.reset();
    resolved_.clear();
    try {
      node_ = index_.node(k);
    } catch (const detail::SetIndexDamaged&) {
      throw;
    } catch (const SnapshotError& e) {
      throw SnapshotError("snapshot set '" + dir_ + "', its index '" + index_path(dir_) + "': " + e.what());
    }
    return node_.get();
  }
  std::string kind(const std::string&) override { return node_->kind(); }
  bool load(const std::string& field) override {
    const auto ids = node_->lists_to_load(field);
    for (const std::uint64_t id : ids) {
      const detail::StoredList where = node_->where(id);
      node_->set_loaded(id, with_rank_file(dir_, listing_, static_cast<int>(where.file), [&](const std::string& path, const RankFileName&) {
        return detail::load_stored_list(path, where);
      }));
    }
    return !ids.empty();
  }
  void resolve(std::vector<NodeState>& out) override {
    for (NodeState& st : out)
      for (Field& f : st.fields)
        for (ElementRange& range : f.elements.ranges) {
          const auto [it, added] = resolved_.emplace(range.list, lists_.size());
          if (added) lists_.push_back(node_->where(range.list));
          range.list = it->second;
        }
  }

 private:
  const detail::SetIndex& index_;
  std::vector<detail::StoredList>& lists_;
  const std::string& dir_;
  const SetListing& listing_;
  std::unique_ptr<detail::IndexNode> node_;
  std::unordered_map<std::uint64_t, std::uint64_t> resolved_;  // the node's list numbers → lists_
  std::map<std::uint32_t, const NodeState*> none_;
};

/// The index of the set `set` (its manifest) in `dir`, or nullopt when there is none that names it.
std::optional<detail::SetIndex> read_set_index(const std::string& dir, const SetIdentity& set) {
  auto index = detail::SetIndex::open(index_path(dir), manifest_text(set));
  if (!index || index->world() != static_cast<std::uint32_t>(set.world) ||
      index->workers() != static_cast<std::uint32_t>(set.workers))
    return std::nullopt;
  return index;
}

/// Rank `to.rank`'s snapshot of the set its manifest names (`set`) rescaled to `to`, from the set's index,
/// rank 0's metadata and the element lists dealt to this rank: no listing, no other rank's state index.
/// nullopt when the set has no index naming it, or rank 0's file is not there (the set is then listed).
std::optional<Snapshot> read_rescaled_by_index(const std::string& dir, const SetIdentity& set, const Layout& to) {
  const auto index = read_set_index(dir, set);
  if (!index) return std::nullopt;
  SetListing l;
  l.world = set.world;
  l.named = set;
  if (!stamp_of((fs::path(dir) / tagged_name(0, set)).string())) return std::nullopt;
  const auto first = read_named_plan(dir, l, 0);
  if (!first) return std::nullopt;
  std::vector<detail::StoredList> lists;
  IndexRecords old(*index, lists, dir, l);
  std::optional<Snapshot> out;
  try {
    out = std::move(rescale_records(first->meta, set.world, old, to.world_size, to.num_workers, to.rank, to.rank + 1).front());
  } catch (const detail::SetIndexDamaged&) {
    return std::nullopt;  // a part of the index that does not match its checksum: the rank files are read
  }
  load_ranges(*out, lists, dir, l);
  return out;
}

/// Rank `to.rank`'s snapshot of a listed set rescaled to `to`, reading the set's plan and, of the long
/// element lists, only those dealt to this rank. nullopt for a set without state indexes.
std::optional<Snapshot> read_rescaled(const std::string& dir, const SetListing& l, const Layout& to) {
  auto plan = read_plan(dir, l);
  if (!plan) return std::nullopt;
  Snapshot out = std::move(rescale_plan(*plan, dir, l, to.world_size, to.num_workers, to.rank, to.rank + 1).front());
  load_ranges(out, plan->lists, dir, l);
  return out;
}

}  // namespace

namespace {

void create_set_dir(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw SnapshotError("cannot create snapshot directory '" + dir + "': " + ec.message());
}

/// Removes the rank files of `dir` of world size `world` whose rank has just been written (a non-empty
/// name in `written_by_rank`) under another name: a set directory written into again holds one file
/// per rank. Only the given ranks' names are touched, so ranks writing at once need no
/// collective. The removals are made as durable as the writes (a crash must not bring one back).
/// `counter` sees every name listed. When a file was removed, a manifest naming another set than
/// `set` is removed at once, before the removals are made durable (one that names the removed file may
/// have been written since this rank's first removal of it).
void remove_older_files(const std::string& dir, int world, const std::vector<std::string>& written_by_rank,
                        SetFileCounter& counter, const SetIdentity& set) {
  DIR* d = ::opendir(dir.c_str());
  if (!d) throw SnapshotError("cannot list '" + dir + "' for the older files of the ranks written: " + std::strerror(errno));
  // One rank written (write_rank): only its names are parsed, the rest of a big set's listing is passed
  // over by prefix.
  std::string prefix = "rank-";
  const auto written = [](const std::string& n) { return !n.empty(); };
  if (std::count_if(written_by_rank.begin(), written_by_rank.end(), written) == 1)
    prefix += std::to_string(std::find_if(written_by_rank.begin(), written_by_rank.end(), written) - written_by_rank.begin()) +
              "-of-";
  bool removed = false;
  errno = 0;
  while (const dirent* e = ::readdir(d)) {
    const std::string_view name = e->d_name;
    counter.see(name);
    if (!name.starts_with(prefix)) continue;
    const auto f = SnapshotSet::parse_file_name(name);
    if (!f || f->world_size != world || static_cast<std::size_t>(f->rank) >= written_by_rank.size()) continue;
    const std::string& written = written_by_rank[static_cast<std::size_t>(f->rank)];
    if (written.empty() || name == written) continue;
    if (::unlinkat(::dirfd(d), e->d_name, 0) != 0 && errno != ENOENT) {
      const int err = errno;
      ::closedir(d);
      throw SnapshotError("wrote '" + written + "' into '" + dir + "' but cannot remove that rank's older file '" +
                          std::string(name) + "': " + std::strerror(err));
    }
    removed = true;
    errno = 0;
  }
  const int err = errno;
  ::closedir(d);
  if (err) throw SnapshotError("cannot list '" + dir + "' for the older files of the ranks written: " + std::strerror(err));
  if (!removed) return;
  drop_manifest_unless(dir, set);
  detail::fsync_directory(dir, dir);
}

}  // namespace

void SnapshotSet::write_rank(const std::string& dir, const Snapshot& s) {
  create_set_dir(dir);
  drop_manifest(dir);  // before this rank's file changes
  const SetIdentity set = identity_of(s.meta);
  const std::string name = tagged_name(s.meta.layout.rank, set);
  s.write_file((fs::path(dir) / name).string());
  // Again now that the file changed: an index another rank was building from this rank's older file
  // while the first removal ran may have been written since (its own check sees the change only if it
  // comes after the rename).
  drop_index(dir);
  std::vector<std::string> written(static_cast<std::size_t>(s.meta.layout.rank) + 1);
  written.back() = name;
  SetFileCounter counter(set);
  remove_older_files(dir, s.meta.layout.world_size, written, counter, set);
  // The write that completes the set writes its manifest; any other removes one that names another set
  // (a rank that found the set before complete may have written it after this rank's first removal).
  if (counter.complete()) write_index_and_manifest(dir, set);
  else drop_manifest_unless(dir, set);
}

void SnapshotSet::write_dir(const std::string& dir) const {
  create_set_dir(dir);
  drop_manifest(dir);
  std::vector<std::string> written;
  for (const auto& s : ranks_) {
    written.push_back(file_name(s.meta));
    s.write_file((fs::path(dir) / written.back()).string());
  }
  const SetIdentity set = identity_of(ranks_.front().meta);
  SetFileCounter counter(set);
  remove_older_files(dir, world_size(), written, counter, set);  // one listing for the whole set
  if (counter.complete()) write_index_and_manifest(dir, set);
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

namespace {

/// Throws unless every rank file of a listed set with today's names names one step and one tag.
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

}  // namespace

Snapshot SnapshotSet::read_rank(const std::string& dir, const Layout& to, bool rescale) {
  // A manifest of this layout: this rank's file by its name, and no listing.
  if (const auto set = read_manifest(dir)) {
    if (set->world == to.world_size && set->workers == to.num_workers) {
      if (to.rank >= 0 && to.rank < set->world)
        if (auto s = read_by_manifest(dir, *set, to.rank)) return std::move(*s);
    } else if (rescale && Layout{0, to.world_size, to.num_workers}.possible() && to.rank >= 0 && to.rank < to.world_size) {
      // A manifest of another layout, for a rescale: the set's index, and no listing.
      if (auto s = read_rescaled_by_index(dir, *set, to)) return std::move(*s);
    }
  }
  const SetListing l = list_set(dir);
  if (l.all_tagged) {
    // The names say it all: one snapshot (one step and tag on every rank), and its layout.
    check_one_snapshot(dir, l);
    const int workers = l.ranks.front().second.workers;
    if (l.world == to.world_size && workers == to.num_workers) {
      if (to.rank < 0 || to.rank >= l.world)
        throw SnapshotError("snapshot set '" + dir + "' has ranks 0 to " + std::to_string(l.world - 1) + ", not rank " +
                            std::to_string(to.rank));
      return read_listed(dir, l, to.rank);  // this rank's file, and no other
    }
    if (!rescale) refuse_layout(l.world, workers, to);
    if (!Layout{0, to.world_size, to.num_workers}.possible() || to.rank < 0 || to.rank >= to.world_size)
      throw SnapshotError("cannot rescale to rank " + std::to_string(to.rank) + " of world size " +
                          std::to_string(to.world_size) + " with " + std::to_string(to.num_workers) + " workers");
    if (auto out = read_rescaled(dir, l, to)) return std::move(*out);
  }
  // Another layout (every rank's records are dealt), or names of before that do not say the step.
  const SnapshotSet set = read_dir(dir);
  if (set.world_size() == to.world_size && set.num_workers() == to.num_workers) return set.rank(to.rank);
  if (!rescale) refuse_layout(set.world_size(), set.num_workers(), to);
  return set.rescaled(to.world_size, to.num_workers).rank(to.rank);
}

namespace {

// An offline rescale plans the new ranks in batches of at least kRescaleBatch, in at most kRescalePasses
// passes over the old records: memory for a batch's records, time for the passes.
constexpr int kRescaleBatch = 512;
constexpr int kRescalePasses = 8;

/// Removes the directories `PREFIX<pid>` in `parent` that a killed rescale_dir left (its process gone).
void remove_stale_staging(const std::string& parent, const std::string& prefix) {
  DIR* d = ::opendir(parent.c_str());
  if (!d) return;  // creating the staging directory reports what is wrong with the parent
  std::vector<std::string> stale;
  while (const dirent* e = ::readdir(d)) {
    const std::string_view name = e->d_name;
    if (!name.starts_with(prefix)) continue;
    const auto pid = decimal(name.substr(prefix.size()));
    if (pid && *pid <= std::uint64_t(std::numeric_limits<long>::max()) && detail::process_is_gone(static_cast<long>(*pid)))
      stale.emplace_back(name);
  }
  ::closedir(d);
  std::error_code ec;
  for (const auto& name : stale) fs::remove_all(fs::path(parent) / name, ec);  // a race with another cleaner is harmless
}

/// Flushes the file system that holds `dir` to stable storage (every file written into it).
void sync_file_system(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw FileError("cannot open '" + dir + "' to make it durable: " + std::strerror(errno));
  const int rc = ::syncfs(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) throw FileError("cannot make '" + dir + "' durable: " + std::strerror(err));
}

}  // namespace

void SnapshotSet::rescale_dir(const std::string& dir, const std::string& out, int world_size, int num_workers,
                              const std::function<void(const Snapshot&)>& on_rank) {
  if (!Layout{0, world_size, num_workers}.possible())
    throw SnapshotError("cannot rescale to world size " + std::to_string(world_size) + " with " +
                        std::to_string(num_workers) + " workers");
  std::error_code ec;
  if (fs::exists(out, ec) && !(fs::is_directory(out, ec) && fs::is_empty(out, ec)))
    throw FileError("cannot rescale into '" + out + "': it exists and is not an empty directory");
  const SetListing l = list_set(dir);
  if (l.all_tagged) check_one_snapshot(dir, l);
  // The set's index (beside a manifest that names the set listed), else its plan (its state indexes, kept
  // encoded), or, for a set without state indexes, the set read whole and rescaled.
  std::optional<detail::SetIndex> index;
  std::optional<detail::SnapshotPlan> first_rank;  // rank 0's metadata, with the index
  if (const auto set = l.all_tagged ? read_manifest(dir) : std::nullopt;
      set && *set == SetIdentity{l.world, l.ranks.front().second.workers, l.ranks.front().second.step, l.ranks.front().second.tag}) {
    index = read_set_index(dir, *set);
    if (index) first_rank = read_named_plan(dir, l, 0);
    if (!first_rank) index.reset();
  }
  auto plan = !index && l.all_tagged ? read_plan(dir, l) : std::nullopt;
  std::vector<detail::StoredList> index_lists;
  std::vector<detail::StoredList>* lists = index ? &index_lists : plan ? &plan->lists : nullptr;
  // New ranks are planned a batch at a time (each batch deals the old records again and keeps only its
  // own ranks' records), so memory holds the plan and one batch, never the whole new set.
  const int batch = lists ? std::max(kRescaleBatch, (world_size + kRescalePasses - 1) / kRescalePasses) : world_size;
  struct Batch {
    int first = 0, end = 0;
    std::vector<Snapshot> ranks;                         // new ranks [first, end), lists as ranges
    std::vector<std::vector<std::uint64_t>> done_after;  // per rank: the stored lists it is the last to use
  };
  const auto plan_batch = [&](int first) {
    Batch b{first, std::min(world_size, first + batch), {}, {}};
    b.done_after.resize(static_cast<std::size_t>(b.end - first));
    if (!lists) {
      b.ranks = read_dir(dir).rescaled(world_size, num_workers).ranks_;
      return b;
    }
    lists->clear();  // the lists of the batch before, its ranges done with
    if (index) {
      try {
        IndexRecords old(*index, *lists, dir, l);
        b.ranks = rescale_records(first_rank->meta, l.world, old, world_size, num_workers, first, b.end);
      } catch (const detail::SetIndexDamaged& e) {
        // A part of the index that does not match its checksum: from here on the set is read without it.
        index.reset();
        plan = read_plan(dir, l);
        if (!plan) throw SnapshotError("snapshot set '" + dir + "': its index is damaged (" + e.what() +
                                       ") and its rank files have no state index");
        lists = &plan->lists;
      }
    }
    if (!index) b.ranks = rescale_plan(*plan, dir, l, world_size, num_workers, first, b.end);
    // A list dealt to the next batch too is read again then.
    std::vector<int> last_use(lists->size(), -1);
    for (int r = first; r < b.end; ++r)
      for (const auto& st : b.ranks[static_cast<std::size_t>(r - first)].states)
        for (const auto& f : st.fields)
          for (const auto& range : f.elements.ranges)
            if (range.list < last_use.size()) last_use[range.list] = r - first;
    for (std::size_t i = 0; i < last_use.size(); ++i)
      if (last_use[i] >= 0 && (*lists)[i].stored) b.done_after[static_cast<std::size_t>(last_use[i])].push_back(i);
    return b;
  };
  Batch next = plan_batch(0);  // the first before anything is created: a refused rescale leaves nothing

  // Written into a directory beside `out`, then made durable and renamed into place: `out` holds the
  // whole new set or nothing.
  const fs::path target = fs::absolute(fs::path(out)).lexically_normal();
  const fs::path parent = target.has_filename() ? target.parent_path() : target.parent_path().parent_path();
  const std::string name = (target.has_filename() ? target : target.parent_path()).filename().string();
  create_set_dir(parent.string());
  const std::string staging_prefix = "." + name + ".dpipe-rescale.";
  remove_stale_staging(parent.string(), staging_prefix);
  const fs::path staging = parent / (staging_prefix + std::to_string(::getpid()));
  fs::remove_all(staging, ec);
  create_set_dir(staging.string());
  std::optional<SetIdentity> new_set;  // every new rank's, for the manifest
  try {
    for (;;) {
      Batch b = std::move(next);
      for (int r = b.first; r < b.end; ++r) {
        Snapshot& s = b.ranks[static_cast<std::size_t>(r - b.first)];
        if (lists) load_ranges(s, *lists, dir, l);
        // Durable all at once below: one flush of the file system instead of two fsyncs per file.
        write_file_atomically((staging / file_name(s.meta)).string(), s.to_bytes(), {.durability = Durability::by_caller});
        if (on_rank) on_rank(s);
        new_set = identity_of(s.meta);
        s = Snapshot{};
        for (const std::uint64_t i : b.done_after[static_cast<std::size_t>(r - b.first)]) (*lists)[i].loaded.reset();
      }
      const int end = b.end;
      if (end == world_size) break;
      b = Batch{};  // freed before the next batch is planned
      next = plan_batch(end);
    }
    write_set_index(staging.string(), *new_set, Durability::by_caller);
    write_file_atomically((staging / kManifestName).string(), manifest_text(*new_set),
                          {.durability = Durability::by_caller});
    sync_file_system(staging.string());
    fs::rename(staging, parent / name, ec);
    if (ec) throw FileError("cannot move the rescaled set into '" + out + "': " + ec.message());
    detail::fsync_directory(parent.string(), out);
  } catch (...) {
    fs::remove_all(staging, ec);
    throw;
  }
}

// ---- rescaling ----------------------------------------------------------------------------------
// The driver is generic: it groups the records of each node across the old instances, hands them to the
// node kind's rule (dpipe/node_kind.hpp), and places what the rule returns on the new ranks. Only the
// engine's own consumer record ("run") is dealt here.

namespace {

/// The consumer's record of a Run (dpipe/detail/run_record.hpp), its elements kept encoded.
using RunRecord = detail::RunRecord<ElementBlobs>;

}  // namespace

SnapshotSet SnapshotSet::rescaled(int world_size, int num_workers) const {
  return SnapshotSet(rescale_ranks(ranks_, world_size, num_workers));
}

namespace {

std::vector<Snapshot> rescale_records(const SnapshotMeta& meta, int old_world, OldRecords& old_records, int world_size,
                                      int num_workers, int rank_begin, int rank_end) {
  if (!Layout{0, world_size, num_workers}.possible())
    throw SnapshotError("cannot rescale to world size " + std::to_string(world_size) + " with " +
                        std::to_string(num_workers) + " workers");
  const Layout from{0, old_world, meta.layout.num_workers}, to{0, world_size, num_workers};
  const auto wanted = [&](std::size_t rank) {
    return rank >= static_cast<std::size_t>(rank_begin) && (rank_end < 0 || rank < static_cast<std::size_t>(rank_end));
  };

  // Which nodes run once per rank (the prefix before dispatch, the suffix after merge) and which per
  // worker is recorded per node since the node-details section; a node without it is taken to run per
  // worker, and one that did not has too few records and is refused below.
  std::map<std::string, const GraphNodeRecord*> graph;
  for (const auto& n : meta.graph) graph[n.key] = &n;

  std::vector<std::vector<NodeState>> per_rank(static_cast<std::size_t>(world_size));

  // Hands node `key`'s records of old slots 0 … slots−1 to `in` (slot i's record is that of instance
  // instance_of(i)), from columns or records; refuses a missing or extra one. The message names what the
  // records are counted on.
  const auto gather = [&](RescaleInput& in, const std::string& key, std::size_t slots, auto instance_of, auto missing) {
    in.key = key;
    if (const OldColumns* columns = old_records.columns(key)) {
      if (columns->size() > slots)
        refuse("node '" + key + "' has " + std::to_string(columns->size()) + " records, expected " + std::to_string(slots));
      const std::uint32_t step = columns->instance_step();
      if (columns->size() < slots || slots == 0 || step == 0 || step != instance_of(1))  // else every slot is as expected
        for (std::size_t i = 0; i < slots; ++i)
          if (i >= columns->size() || columns->instance(i) != instance_of(i)) refuse(missing(columns->size()));
      if (const std::ptrdiff_t k = columns->column("deferred_failure"); k >= 0)
        for (std::size_t i = 0; i < slots; ++i)
          if (columns->has(i, std::size_t(k))) refuse("node '" + key + "' had failed: " + std::string(columns->text(i, std::size_t(k))));
      in.columns = columns;
      in.kind = old_records.kind(key);
      in.mode = columns->mode(0);
      return;
    }
    const auto& records = old_records.records(key);
    for (std::size_t i = 0; i < slots; ++i) {
      const auto it = records.find(static_cast<std::uint32_t>(instance_of(i)));
      if (it == records.end()) refuse(missing(records.size()));
      in.old.push_back(it->second);
    }
    in.kind = in.old.front()->kind;
    if (records.size() != slots)
      refuse("node '" + key + "' has " + std::to_string(records.size()) + " records, expected " + std::to_string(slots));
    for (const NodeState* st : in.old)
      for (const auto& f : st->fields)
        if (f.name == "deferred_failure") refuse("node '" + key + "' had failed: " + f.s);
    in.mode = in.old.front()->mode;
  };

  // The consumers' buffers, one record per rank (instance = rank): pooled and dealt to the new ranks.
  {
    const auto& keys = old_records.keys();
    if (std::find(keys.begin(), keys.end(), "run") == keys.end()) refuse("the snapshots do not hold one run record per rank");
    RescaleInput in{{}, from, to, true, nullptr, rank_begin, rank_end};
    gather(in, "run", static_cast<std::size_t>(from.world_size), [](std::size_t r) { return std::uint32_t(r); },
           [](std::size_t) { return std::string("the snapshots do not hold one run record per rank"); });
    in.check_fields<RunRecord>();
    const auto dealt = in.deal(&RunRecord::pending);
    auto records = in.write_slots([&](std::size_t r) { return RunRecord{.delivered = 0, .pending = dealt[r]}; });
    old_records.resolve(records);
    for (auto& record : records) per_rank[record.instance].push_back(std::move(record));
  }

  for (const auto& key : old_records.keys()) {
    if (key == "run") continue;
    const auto g = graph.find(key);
    const GraphNodeRecord* node = g == graph.end() ? nullptr : g->second;
    // A node outside the graph is the engine's own (the merge a pipeline without one ends in): once per rank.
    const bool once_per_rank = !node || node->segment == "prefix" || node->segment == "suffix";
    RescaleInput in{{}, from, to, once_per_rank, node, rank_begin, rank_end};
    const auto workers = static_cast<std::uint32_t>(from.num_workers);
    const std::size_t slots = static_cast<std::size_t>(once_per_rank ? from.world_size : from.instances());
    gather(in, key, slots,
           [&](std::size_t i) { return once_per_rank ? static_cast<std::uint32_t>(i) * workers : static_cast<std::uint32_t>(i); },
           [&](std::size_t found) {
             return "node '" + key + "' has records on " + std::to_string(found) + " of " + std::to_string(slots) +
                    (once_per_rank ? " ranks" : " instances") +
                    (node && node->segment.empty() ? " (the snapshots do not record which nodes run once per rank; they "
                                                     "were written by an older dpipe: take them again to rescale)"
                                                   : "");
           });

    std::vector<NodeState> out;
    if (in.mode == StateMode::stateless) {
      out = RescaleRule::replicated().apply(in);
    } else if (const KindInfo* kind = find_kind(in.kind)) {
      for (;;) {  // a rule that reads values a plan left in the files has them loaded, and deals again
        try {
          out = kind->rescale.apply(in);
          break;
        } catch (const ElementsNotLoaded& e) {
          if (e.key != key || !old_records.load(e.field)) throw;
        }
      }
    } else {
      in.refuse("its kind is not registered, so no rescale rule is known for it");
    }
    // The records of the wanted slots, each with its slot as instance (or every slot's, the unwanted
    // ones empty): one for each wanted slot.
    const auto [first, end] = in.wanted_slots();
    std::vector<bool> made(end - first, false);
    std::erase_if(out, [](const NodeState& s) { return s.key.empty(); });
    old_records.resolve(out);
    for (NodeState& record : out) {
      const std::size_t j = record.instance;
      if (j < first || j >= end || made[j - first])
        refuse("the rule of node '" + key + "' (" + in.kind + ") made a record for slot " + std::to_string(j) +
               " that was not asked for");
      made[j - first] = true;
      const std::size_t rank = once_per_rank ? j : j / static_cast<std::size_t>(num_workers);
      record.instance = static_cast<std::uint32_t>(once_per_rank ? j * static_cast<std::size_t>(num_workers) : j);
      per_rank[rank].push_back(std::move(record));
    }
    if (std::find(made.begin(), made.end(), false) != made.end())
      refuse("the rule of node '" + key + "' (" + in.kind + ") made no record for some of the new slots");
  }

  std::vector<Snapshot> out;
  for (int r = 0; r < world_size; ++r) {
    if (!wanted(static_cast<std::size_t>(r))) continue;
    Snapshot s;
    s.meta = meta;
    s.meta.format_version = 0;
    s.meta.layout = Layout{r, world_size, num_workers};
    s.meta.elements_delivered = 0;
    // One id for the whole new set, the same on every rank that computes it; the step stays.
    s.meta.id = mix64(meta.id ^ mix64(static_cast<std::uint64_t>(world_size) << 32 | static_cast<std::uint32_t>(num_workers))) | 1;
    s.meta.user_metadata["rescaled_from"] =
        std::to_string(from.world_size) + " ranks x " + std::to_string(from.num_workers) + " workers";
    s.states = std::move(per_rank[static_cast<std::size_t>(r)]);
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace

}  // namespace dpipe
