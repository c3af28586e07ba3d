// Fuzz target: a snapshot set (every rank's bytes, set_container.hpp) → SnapshotSet → rescaled onto
// another layout; the result must be a consistent set that encodes and decodes, and each new rank is
// restored into the representative pipeline it belongs to. The custom mutator mutates one rank's decoded
// snapshot (sometimes carrying its identity and layout to every rank, so the set stays consistent and the
// mutation reaches the rescale), the new layout, or the list of ranks; checksums are always valid.
// The same bytes written as a set directory are rescaled through it too (SnapshotSet::read_rank: the
// state indexes, then only the lists dealt): that never crashes, and for files in dpipe's own encoding it
// gives each new rank the bytes the in-memory rescale gives. The snapshots written by dpipe's own
// SnapshotSet::write_rank make a set with its manifest and index, rescaled through the index the same;
// then the index with a few bytes changed (its checksums made right again, and not) is read: never a crash.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <cstring>
#include <optional>
#include <string_view>

#include "../serialize/set_index.hpp"
#include "fuzz_common.hpp"
#include "set_container.hpp"
#include "snapshot_mutator.hpp"

using namespace dpipe_fuzz;

namespace {

/// The input's rank files written into a fresh directory under their set names; false when a rank's bytes
/// do not read (nothing to name them by). `canonical` says whether every file is in dpipe's own encoding.
bool write_set_dir(const std::vector<std::string>& ranks, const std::string& dir, bool& canonical) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::remove_all(dir, ec);
  fs::create_directories(dir, ec);
  canonical = true;
  for (const auto& bytes : ranks) {
    try {
      const auto s = dpipe::Snapshot::from_bytes(bytes);
      canonical = canonical && s.to_bytes() == bytes;
      std::ofstream(fs::path(dir) / dpipe::SnapshotSet::file_name(s.meta), std::ios::binary) << bytes;
    } catch (const dpipe::Error&) {
      return false;
    }
  }
  return true;
}

/// Every new rank rescaled through the directory; compared with the in-memory rescale `expected` (when
/// there is one) for canonical files.
void rescale_through_dir(const std::vector<std::string>& ranks, const std::optional<dpipe::SnapshotSet>& expected, int w,
                         int k) {
  static const std::string dir = process_temp_dir("dpipe-fuzz-set");
  bool canonical = false;
  if (!write_set_dir(ranks, dir, canonical)) return;
  for (int r = 0; r < w && r < 8; ++r) {
    try {
      const dpipe::Snapshot got = dpipe::SnapshotSet::read_rank(dir, dpipe::Layout{r, w, k}, true);
      // On the set's own layout a rank reads its own file: nothing is dealt, nothing to compare.
      const bool dealt = expected && !(static_cast<int>(ranks.size()) == w &&
                                       dpipe::Snapshot::from_bytes(ranks.front()).meta.layout.num_workers == k);
      if (canonical && dealt && got.to_bytes() != expected->rank(r).to_bytes())
        finding("rank " + std::to_string(r) + " rescaled through a directory differs from the in-memory rescale");
    } catch (const dpipe::Error& e) {
      if (canonical && expected)
        finding(std::string("a set the in-memory rescale takes fails through a directory: ") + e.what());
    }
  }
}

/// The snapshots written into a fresh directory by SnapshotSet::write_rank (the manifest with them; the set
/// index as the first rescale writes it), each new rank rescaled through the index and compared with `expected`; then the index with
/// bytes changed (chosen by `seed`), under right checksums and under a wrong one, read by a rescale that
/// may refuse but never crashes or hangs.
void rescale_through_index(const std::vector<dpipe::Snapshot>& snapshots, const std::optional<dpipe::SnapshotSet>& expected,
                           int w, int k, std::uint32_t seed) {
  namespace fs = std::filesystem;
  static const std::string dir = process_temp_dir("dpipe-fuzz-index");
  std::error_code ec;
  fs::remove_all(dir, ec);
  try {
    for (const auto& s : snapshots) dpipe::SnapshotSet::write_rank(dir, s);
  } catch (const dpipe::Error&) {
    return;
  }
  // The index the first rescale of the set would write (write_rank leaves it out).
  dpipe::SnapshotSet::write_index(dir);
  const fs::path index = fs::path(dir) / "set.dpipe-index";
  if (!fs::exists(index)) return;
  const bool dealt = expected && !(static_cast<int>(snapshots.size()) == w && snapshots.front().meta.layout.num_workers == k);
  for (int r = 0; r < w && r < 8; ++r) {
    try {
      const dpipe::Snapshot got = dpipe::SnapshotSet::read_rank(dir, dpipe::Layout{r, w, k}, true);
      if (dealt && got.to_bytes() != expected->rank(r).to_bytes())
        finding("rank " + std::to_string(r) + " rescaled through the set index differs from the in-memory rescale");
    } catch (const dpipe::Error& e) {
      if (expected) finding(std::string("a set the in-memory rescale takes fails through its index: ") + e.what());
    }
  }
  std::string bytes;
  {
    std::ifstream f(index, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(f), {});
  }
  // Two bytes of the directory and one of its parts changed, every checksum made right again (the
  // decoders' checks are what stand); then one byte of the parts changed under a wrong checksum (a part that
  // does not match: the rank files are read).
  constexpr std::size_t kHead = 20;
  if (bytes.size() <= kHead) return;
  std::uint32_t directory = 0;
  std::memcpy(&directory, bytes.data() + 12, sizeof directory);
  if (directory == 0 || directory > bytes.size() - kHead) return;
  const std::size_t parts = bytes.size() - kHead - directory;
  const auto read_every_rank = [&] {
    for (int r = 0; r < w && r < 8; ++r) {
      try {
        (void)dpipe::SnapshotSet::read_rank(dir, dpipe::Layout{r, w, k}, true);
      } catch (const dpipe::Error&) {
      }
    }
  };
  std::string changed = bytes;
  for (std::uint32_t t = 0; t < 2; ++t) {
    const std::size_t at = kHead + (seed * 2654435761u + t * 40503u) % directory;
    changed[at] = static_cast<char>(changed[at] ^ (1u << ((seed + t) % 8)));
  }
  if (parts) changed[kHead + directory + (seed * 40503u) % parts] ^= static_cast<char>(1u << (seed % 7));
  dpipe::detail::recompute_set_index_checksums(changed);
  std::ofstream(index, std::ios::binary | std::ios::trunc) << changed;
  read_every_rank();
  if (!parts) return;
  changed = bytes;
  changed[kHead + directory + (seed * 2654435761u) % parts] ^= 0x10;
  std::ofstream(index, std::ios::binary | std::ios::trunc) << changed;
  read_every_rank();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  SetInput in;
  if (!SetInput::parse(std::string_view(reinterpret_cast<const char*>(data), size), in) || in.ranks.empty()) return 0;
  std::vector<dpipe::Snapshot> ranks;
  try {
    for (const auto& b : in.ranks) ranks.push_back(dpipe::Snapshot::from_bytes(b));
  } catch (const dpipe::SnapshotError&) {
    return 0;
  }
  std::optional<dpipe::SnapshotSet> out;
  const int w = in.new_world_size(), k = in.new_workers();
  const std::vector<dpipe::Snapshot> snapshots = ranks;
  try {
    const dpipe::SnapshotSet set(std::move(ranks));
    out.emplace(set.rescaled(w, k));
  } catch (const dpipe::Error&) {
  }
  rescale_through_dir(in.ranks, out, w, k);
  rescale_through_index(snapshots, out, w, k, static_cast<std::uint32_t>(size * 31 + in.world * 7 + in.workers));
  if (!out) return 0;
  if (out->world_size() != w || out->num_workers() != k)
    finding("a rescale to " + std::to_string(w) + " ranks of " + std::to_string(k) + " workers gave " +
            std::to_string(out->world_size()) + " ranks of " + std::to_string(out->num_workers()));
  std::vector<dpipe::Snapshot> again;
  try {
    for (const auto& r : out->ranks()) again.push_back(dpipe::Snapshot::from_bytes(r.to_bytes()));
    const dpipe::SnapshotSet check(std::move(again));
  } catch (const dpipe::Error& e) {
    finding(std::string("a rescaled set is not a consistent set: ") + e.what());
  }
  for (const auto& p : built_pipelines()) {
    if (p.fingerprint != out->rank(0).meta.fingerprint) continue;
    for (int r = 0; r < out->world_size(); ++r) resume_and_pull(p, out->rank(r), out->rank(r).meta.layout);
  }
  return 0;
}

extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size, unsigned int seed) {
  SetInput in;
  if (!SetInput::parse(std::string_view(reinterpret_cast<const char*>(data), size), in) || in.ranks.empty())
    return LLVMFuzzerMutate(data, size, max_size);
  Rand r{seed};
  switch (r.below(10)) {
    case 0: in.world = static_cast<std::uint8_t>(r.next()); break;
    case 1: in.workers = static_cast<std::uint8_t>(r.next()); break;
    case 2: in.ranks.erase(in.ranks.begin() + std::ptrdiff_t(r.below(in.ranks.size()))); break;
    case 3: in.ranks.push_back(in.ranks[r.below(in.ranks.size())]); break;
    default: {
      const std::size_t i = r.below(in.ranks.size());
      try {
        auto s = dpipe::Snapshot::from_bytes(in.ranks[i]);
        if (r.one_in(6)) {
          std::string b = in.ranks[i];
          mutate_sections(b, r);
          in.ranks[i] = b;
          break;
        }
        mutate_snapshot(s, r);
        in.ranks[i] = s.to_bytes();
        if (r.one_in(2)) {  // the same identity and layout size on every rank
          for (auto& other : in.ranks) {
            try {
              auto o = dpipe::Snapshot::from_bytes(other);
              o.meta.fingerprint = s.meta.fingerprint;
              o.meta.seed = s.meta.seed;
              o.meta.epoch = s.meta.epoch;
              o.meta.layout.world_size = s.meta.layout.world_size;
              o.meta.layout.num_workers = s.meta.layout.num_workers;
              other = o.to_bytes();
            } catch (const dpipe::Error&) {
            }
          }
        }
      } catch (const dpipe::Error&) {
        std::string b = in.ranks[i];
        mutate_string(b, 32);
        in.ranks[i] = b;
      }
    }
  }
  const std::string out = in.encode();
  if (out.size() > max_size || out.empty()) return LLVMFuzzerMutate(data, size, max_size);
  std::memcpy(data, out.data(), out.size());
  return out.size();
}
