// Snapshot sets (one file per rank) and their rescaling to another layout, on records alone.
#include "dpipe/snapshot_set.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>

#include "dpipe/codec.hpp"
#include "dpipe/error.hpp"
#include "dpipe/node_kind.hpp"
#include "dpipe/rng.hpp"

namespace dpipe {
namespace fs = std::filesystem;
namespace {
std::string hex_id(std::uint64_t id) {
  char b[19];
  std::snprintf(b, sizeof b, "0x%016llx", static_cast<unsigned long long>(id));
  return b;
}
}  // namespace

SnapshotSet::SnapshotSet(std::vector<Snapshot> ranks) : ranks_(std::move(ranks)) {
  if (ranks_.empty()) throw SnapshotError("a snapshot set needs at least one rank's snapshot");
  const auto& m0 = ranks_.front().meta;
  const int world = static_cast<int>(ranks_.size());
  for (int r = 0; r < world; ++r) {
    const auto& m = ranks_[static_cast<std::size_t>(r)].meta;
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
      auto step = [](const SnapshotMeta& x) { return x.step ? "step " + std::to_string(*x.step) : std::string("no step"); };
      throw SnapshotError("snapshot set: rank " + std::to_string(r) + "'s snapshot (id " + hex_id(m.id) + ") names " + step(m) +
                          ", rank 0's (id " + hex_id(m0.id) + ") " + step(m0) +
                          "; a set holds the snapshots of one step, so these come from different snapshots");
    }
    if (m.layout.num_workers != m0.layout.num_workers)
      throw SnapshotError(who + " has " + std::to_string(m.layout.num_workers) + " workers, rank 0's has " +
                          std::to_string(m0.layout.num_workers));
  }
}

std::string SnapshotSet::file_name(int rank, int world_size) {
  return "rank-" + std::to_string(rank) + "-of-" + std::to_string(world_size) + ".dpipe";
}

void SnapshotSet::write_rank(const std::string& dir, const Snapshot& s) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw SnapshotError("cannot create snapshot directory '" + dir + "': " + ec.message());
  s.write_file((fs::path(dir) / file_name(s.meta.layout.rank, s.meta.layout.world_size)).string());
}

void SnapshotSet::write_dir(const std::string& dir) const {
  for (const auto& s : ranks_) write_rank(dir, s);
}

const Snapshot& SnapshotSet::rank(int r) const {
  if (r < 0 || r >= world_size())
    throw SnapshotError("snapshot set has ranks 0 to " + std::to_string(world_size() - 1) + ", not rank " +
                        std::to_string(r));
  return ranks_[static_cast<std::size_t>(r)];
}

SnapshotSet SnapshotSet::read_dir(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw SnapshotError("snapshot set '" + dir + "' is not a directory");
  std::map<int, std::set<int>> by_world;  // world size → ranks found
  std::string odd;                         // .dpipe files that are no rank of a set
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    int r = -1, w = -1;
    char tail[8] = {};
    if (std::sscanf(name.c_str(), "rank-%d-of-%d.%7s", &r, &w, tail) == 3 && std::strcmp(tail, "dpipe") == 0 &&
        name == file_name(r, w) && r >= 0 && r < w)
      by_world[w].insert(r);
    else if (entry.path().extension() == ".dpipe")
      odd += (odd.empty() ? "'" : ", '") + name + "'";
  }
  if (ec) throw SnapshotError("cannot list snapshot set '" + dir + "': " + ec.message());
  // A file that looks like a rank's but is not one (rank-1-of-02, rank-5-of-2) is refused, not skipped:
  // it may be the very rank that is missing, written by other tools.
  if (!odd.empty())
    throw SnapshotError("snapshot set '" + dir + "' holds " + odd +
                        ", which no rank of a set is named (rank-R-of-W.dpipe, 0 <= R < W)");
  if (by_world.empty()) throw SnapshotError("snapshot set '" + dir + "' holds no rank files (rank-R-of-W.dpipe)");
  if (by_world.size() > 1) {
    // Named by two of their files: the world sizes the file names disagree on.
    std::string sizes;
    for (const auto& [w, rs] : by_world)
      sizes += (sizes.empty() ? "" : ", ") + std::to_string(w) + " ('" + file_name(*rs.begin(), w) + "')";
    throw SnapshotError("snapshot set '" + dir + "' mixes files of " + std::to_string(by_world.size()) +
                        " different world sizes: " + sizes + "; a set holds one run's ranks only");
  }
  const int world = by_world.begin()->first;
  const auto& found = by_world.begin()->second;
  // The work is bounded by the files present, never by the world size a file name claims: the missing
  // ranks are counted, and only the first few named.
  if (found.size() != static_cast<std::size_t>(world)) {
    constexpr int kNamed = 5;
    std::string missing;
    int named = 0, r = 0;
    for (auto it = found.begin(); named < kNamed && r < world; ++r) {
      if (it != found.end() && *it == r) ++it;
      else missing += (named++ ? ", " : "") + std::to_string(r);
    }
    const std::size_t absent = static_cast<std::size_t>(world) - found.size();
    if (absent > static_cast<std::size_t>(named)) missing += ", …";
    throw SnapshotError("snapshot set '" + dir + "' is incomplete: ranks present: " + std::to_string(found.size()) +
                        " of " + std::to_string(world) + "; first missing: " + missing);
  }
  std::vector<Snapshot> ranks;
  for (int r = 0; r < world; ++r) {
    const std::string path = (fs::path(dir) / file_name(r, world)).string();
    try {
      ranks.push_back(Snapshot::read_file(path));
    } catch (const SnapshotError& e) {
      throw SnapshotError("snapshot set '" + dir + "', rank " + std::to_string(r) + ": " + e.what());
    }
  }
  return SnapshotSet(std::move(ranks));
}

// ---- rescaling ----------------------------------------------------------------------------------
// The driver is generic: it groups the records of each node across the old instances, hands them to the
// node kind's rule (dpipe/node_kind.hpp), and places what the rule returns on the new ranks. Only the
// engine's own consumer record ("run") is dealt here.

namespace {

[[noreturn]] void refuse(const std::string& msg) { throw SnapshotError("cannot rescale: " + msg); }

/// The consumer's record of a Run: what it delivered and the elements it pulled and has not handed out.
struct RunRecord {
  std::uint64_t delivered = 0;
  ElementBlobs pending;
  template <class A>
  void fields(A& a) {
    a("delivered", delivered);
    a("pending", pending);
  }
};

}  // namespace

SnapshotSet SnapshotSet::rescaled(int world_size, int num_workers) const {
  if (!Layout{0, world_size, num_workers}.possible())
    throw SnapshotError("cannot rescale to world size " + std::to_string(world_size) + " with " +
                        std::to_string(num_workers) + " workers");
  const SnapshotMeta& meta = ranks_.front().meta;
  const Layout from{0, this->world_size(), this->num_workers()}, to{0, world_size, num_workers};

  // Which nodes run once per rank (the prefix before dispatch, the suffix after merge) and which per
  // worker is recorded per node since the node-details section; a node without it is taken to run per
  // worker, and one that did not has too few records and is refused below.
  std::map<std::string, const GraphNodeRecord*> graph;
  for (const auto& n : meta.graph) graph[n.key] = &n;

  // Every record of every rank, grouped by node key in the order the nodes were saved.
  std::vector<std::string> order;
  std::map<std::string, std::map<std::uint32_t, const NodeState*>> by_key;
  for (const auto& snap : ranks_)
    for (const auto& st : snap.states) {
      auto& slot = by_key[st.key];
      if (slot.empty()) order.push_back(st.key);
      if (!slot.emplace(st.instance, &st).second)
        refuse("node '" + st.key + "' has two records for instance " + std::to_string(st.instance));
    }

  std::vector<std::vector<NodeState>> per_rank(static_cast<std::size_t>(world_size));

  // The consumers' buffers, one record per rank (instance = rank): pooled and dealt to the new ranks.
  {
    const auto it = by_key.find("run");
    if (it == by_key.end() || it->second.size() != static_cast<std::size_t>(from.world_size))
      refuse("the snapshots do not hold one run record per rank");
    RescaleInput in{{}, from, to, true, nullptr};
    for (const auto& [instance, st] : it->second) in.old.push_back(st);
    const auto old = in.read<RunRecord>();
    const auto dealt = rescale::deal(rescale::lists(old, &RunRecord::pending), in.new_slots());
    std::vector<RunRecord> out(dealt.size());
    for (std::size_t r = 0; r < out.size(); ++r) out[r].pending = dealt[r];
    auto records = in.write(out);
    for (std::size_t r = 0; r < records.size(); ++r) per_rank[r].push_back(std::move(records[r]));
  }

  for (const auto& key : order) {
    if (key == "run") continue;
    const auto& records = by_key[key];
    const NodeState& first = *records.begin()->second;
    const auto g = graph.find(key);
    const GraphNodeRecord* node = g == graph.end() ? nullptr : g->second;
    // A node outside the graph is the engine's own (the merge a pipeline without one ends in): once per rank.
    const bool once_per_rank = !node || node->segment == "prefix" || node->segment == "suffix";
    RescaleInput in{{}, from, to, once_per_rank, node};
    const auto workers = static_cast<std::uint32_t>(from.num_workers);
    const std::size_t slots = static_cast<std::size_t>(once_per_rank ? from.world_size : from.instances());
    for (std::size_t i = 0; i < slots; ++i) {
      const std::uint32_t instance = once_per_rank ? static_cast<std::uint32_t>(i) * workers : static_cast<std::uint32_t>(i);
      const auto it = records.find(instance);
      if (it == records.end())
        refuse("node '" + key + "' has records on " + std::to_string(records.size()) + " of " + std::to_string(slots) +
               (once_per_rank ? " ranks" : " instances") +
               (node && node->segment.empty() ? " (the snapshots do not record which nodes run once per rank; they "
                                                "were written by an older dpipe: take them again to rescale)"
                                              : ""));
      in.old.push_back(it->second);
    }
    if (records.size() != slots)
      refuse("node '" + key + "' has " + std::to_string(records.size()) + " records, expected " + std::to_string(slots));
    for (const NodeState* s : in.old)
      for (const auto& f : s->fields)
        if (f.name == "deferred_failure") refuse("node '" + key + "' had failed: " + f.s);

    std::vector<NodeState> out;
    if (first.mode == StateMode::stateless) {
      out = RescaleRule::replicated().apply(in);
    } else if (const KindInfo* kind = find_kind(first.kind)) {
      out = kind->rescale.apply(in);
    } else {
      in.refuse("its kind is not registered, so no rescale rule is known for it");
    }
    if (out.size() != in.new_slots())
      refuse("the rule of node '" + key + "' (" + first.kind + ") made " + std::to_string(out.size()) +
             " records for " + std::to_string(in.new_slots()) + " new slots");
    for (std::size_t j = 0; j < out.size(); ++j) {
      const std::size_t rank = once_per_rank ? j : j / static_cast<std::size_t>(num_workers);
      out[j].instance = static_cast<std::uint32_t>(once_per_rank ? j * static_cast<std::size_t>(num_workers) : j);
      per_rank[rank].push_back(std::move(out[j]));
    }
  }

  std::vector<Snapshot> out;
  for (int r = 0; r < world_size; ++r) {
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
  return SnapshotSet(std::move(out));
}

}  // namespace dpipe
