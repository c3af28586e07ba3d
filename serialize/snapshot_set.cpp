// Snapshot sets (one file per rank) and their rescaling to another layout, on records alone.
#include "dpipe/snapshot_set.hpp"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>

#include "dpipe/codec.hpp"
#include "dpipe/error.hpp"
#include "dpipe/rng.hpp"

namespace dpipe {
namespace fs = std::filesystem;

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
  if (by_world.size() > 1)
    throw SnapshotError("snapshot set '" + dir + "' mixes files of " + std::to_string(by_world.size()) +
                        " different world sizes; a set holds one run's ranks only");
  const int world = by_world.begin()->first;
  const auto& found = by_world.begin()->second;
  std::string missing;
  for (int r = 0; r < world; ++r)
    if (!found.count(r)) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
  if (!missing.empty())
    throw SnapshotError("snapshot set '" + dir + "' is incomplete: rank(s) " + missing + " of " +
                        std::to_string(world) + " have no file yet");
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

// ---- rescaling ---------------------------------------------------------------------------------

namespace {

[[noreturn]] void refuse(const std::string& msg) { throw SnapshotError("cannot rescale: " + msg); }

const Field& field(const NodeState& s, const std::string& name, FieldType type) {
  for (const auto& f : s.fields)
    if (f.name == name) {
      if (f.type != type) refuse("node '" + s.key + "' field '" + name + "' has an unexpected type");
      return f;
    }
  refuse("node '" + s.key + "' (" + s.kind + ") has no field '" + name + "'");
}

Field& field(NodeState& s, const std::string& name) {
  for (auto& f : s.fields)
    if (f.name == name) return f;
  refuse("node '" + s.key + "' has no field '" + name + "'");
}

std::vector<std::uint64_t> u64s(const Field& f) {
  if (f.elements.tag != "u64") refuse("field '" + f.name + "' does not hold positions");
  std::vector<std::uint64_t> v(f.elements.size());
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = decode_from_string<std::uint64_t>(f.elements.at(i));
  return v;
}

ElementBlobs blobs_of(const std::vector<std::uint64_t>& v) {
  ElementBlobs b;
  b.tag = "u64";
  for (auto x : v) b.append(encode_to_string(x));
  return b;
}

/// Deals the elements of `pool` round-robin to `n` lists of the same type tag.
std::vector<ElementBlobs> deal(const ElementBlobs& pool, std::size_t n) {
  std::vector<ElementBlobs> out(n);
  for (auto& b : out) b.tag = pool.tag;
  for (std::size_t i = 0; i < pool.size(); ++i) out[i % n].append(pool.at(i));
  return out;
}

void append_all(ElementBlobs& pool, const ElementBlobs& more) {
  if (pool.size() == 0 && pool.tag.empty()) pool.tag = more.tag;
  if (more.tag != pool.tag) refuse("elements of types " + pool.tag + " and " + more.tag + " in one field");
  for (std::size_t i = 0; i < more.size(); ++i) pool.append(more.at(i));
}

struct Shape {
  int world, workers;
  std::size_t instances() const { return static_cast<std::size_t>(world) * static_cast<std::size_t>(workers); }
};

/// Every old instance's record of one worker-segment node, in instance order.
using Records = std::vector<const NodeState*>;

/// Nodes that deal positions of one global sequence to the instances (sampler: element positions;
/// lines: shard work items): re-slice from the slowest instance's position, skipping what faster
/// instances took; `started_lists` name parallel lists of work begun and not finished, dealt whole.
std::vector<NodeState> rescale_positions(const Records& old, Shape to, const std::vector<std::string>& started_lists) {
  const std::size_t n_old = old.size();
  std::uint64_t base = 0, min_next = ~std::uint64_t{0};
  std::vector<bool> offsets(n_old, false);
  for (std::size_t i = 0; i < n_old; ++i) {
    const NodeState& s = *old[i];
    const std::uint64_t b = field(s, "base", FieldType::u64).u, stride = field(s, "stride", FieldType::u64).u;
    const std::uint64_t off = field(s, "offset", FieldType::u64).u, next = field(s, "next", FieldType::u64).u;
    if (i == 0) base = b;
    if (b != base || stride != n_old || off >= n_old || offsets[off])
      refuse(s.kind + " '" + s.key + "': its instances do not deal one position sequence between them");
    offsets[off] = true;
    min_next = std::min(min_next, next);
  }
  // Every position below the frontier was taken by someone; above it, the ones in `taken` were.
  const std::uint64_t frontier = base + min_next * n_old;
  std::vector<std::uint64_t> taken;
  for (const NodeState* s : old) {
    const std::uint64_t off = field(*s, "offset", FieldType::u64).u, next = field(*s, "next", FieldType::u64).u;
    const auto skip = u64s(field(*s, "skip", FieldType::elements));
    for (std::uint64_t k = min_next; k < next; ++k) {
      const std::uint64_t q = base + off + k * n_old;
      if (!std::binary_search(skip.begin(), skip.end(), q)) taken.push_back(q);
    }
    for (auto q : skip)
      if (q >= frontier) taken.push_back(q);
  }
  std::sort(taken.begin(), taken.end());
  taken.erase(std::unique(taken.begin(), taken.end()), taken.end());
  const std::size_t n_new = to.instances();
  std::vector<std::vector<std::uint64_t>> skips(n_new);
  for (auto q : taken) skips[(q - frontier) % n_new].push_back(q);
  // Work a node started and did not finish (a `lines` shard part-read): parallel lists, dealt whole.
  std::vector<std::vector<std::vector<std::uint64_t>>> started(started_lists.size(),
                                                               std::vector<std::vector<std::uint64_t>>(n_new));
  std::size_t dealt = 0;
  for (const NodeState* s : old) {
    std::vector<std::vector<std::uint64_t>> lists;
    for (const auto& name : started_lists) lists.push_back(u64s(field(*s, name, FieldType::elements)));
    for (std::size_t k = 0; !lists.empty() && k < lists[0].size(); ++k, ++dealt)
      for (std::size_t l = 0; l < lists.size(); ++l) {
        if (lists[l].size() != lists[0].size()) refuse("node '" + s->key + "': its started work is inconsistent");
        started[l][dealt % n_new].push_back(lists[l][k]);
      }
  }
  std::vector<NodeState> out;
  for (std::size_t j = 0; j < n_new; ++j) {
    NodeState s = *old[0];
    s.instance = static_cast<std::uint32_t>(j);
    field(s, "base").u = frontier;
    field(s, "stride").u = n_new;
    field(s, "offset").u = j;
    field(s, "next").u = 0;
    field(s, "skip").elements = blobs_of(skips[j]);
    for (std::size_t l = 0; l < started_lists.size(); ++l) field(s, started_lists[l]).elements = blobs_of(started[l][j]);
    out.push_back(std::move(s));
  }
  return out;
}

/// Nodes whose state is a list of elements (plus flags): the elements of all old instances are dealt to
/// the new ones. `flags` are reset to false (the node looks at its input again).
std::vector<NodeState> deal_elements(const Records& old, Shape to, const std::string& list,
                                     const std::vector<std::string>& flags, bool reseed_rng) {
  ElementBlobs pool;
  for (const NodeState* s : old) append_all(pool, field(*s, list, FieldType::elements).elements);
  bool all_done = true;
  for (const NodeState* s : old)
    for (const auto& f : flags) all_done = all_done && field(*s, f, FieldType::u64).u != 0;
  const auto dealt = deal(pool, to.instances());
  std::vector<NodeState> out;
  for (std::size_t j = 0; j < dealt.size(); ++j) {
    NodeState s = *old[j % old.size()];
    s.instance = static_cast<std::uint32_t>(j);
    field(s, list).elements = dealt[j];
    // A shuffle whose every old instance saw its input end keeps that (its new sampler slices are empty
    // too); anything else looks at its input again (a batch flushes its partial batch only then).
    for (const auto& f : flags) field(s, f).u = reseed_rng && all_done ? 1 : 0;
    if (reseed_rng && j >= old.size()) {  // a new instance beyond the old count: its own stream
      ElementBlobs& words = field(s, "rng").elements;
      ElementBlobs mixed;
      mixed.tag = words.tag;
      for (std::size_t w = 0; w < words.size(); ++w)
        mixed.append(encode_to_string(decode_from_string<std::uint64_t>(words.at(w)) ^ mix64(j * 4 + w + 1)));
      words = mixed;
    }
    out.push_back(std::move(s));
  }
  return out;
}

/// Fields of records the rescale writes itself (merge queues, dispatchers).
Field new_field(std::string name, FieldType type) {
  Field f;
  f.name = std::move(name);
  f.type = type;
  return f;
}
Field u64_field(std::string name, std::uint64_t v) {
  Field f = new_field(std::move(name), FieldType::u64);
  f.u = v;
  return f;
}
Field blobs_field(std::string name, ElementBlobs elements) {
  Field f = new_field(std::move(name), FieldType::elements);
  f.elements = std::move(elements);
  return f;
}

/// The merge's records, one per rank: each lane's queued elements (plus whether it ended or failed).
/// The queues of all ranks are pooled and dealt to the new lanes; a failed worker refuses the rescale.
std::vector<NodeState> deal_merge_queues(const Records& merges, Shape from, Shape to) {
  ElementBlobs pool;
  for (const NodeState* s : merges)
    for (int w = 0; w < from.workers; ++w) {
      const std::string n = std::to_string(w);
      const std::string& failure = field(*s, "failure_" + n, FieldType::str).s;
      if (!failure.empty())
        refuse("worker " + n + " of rank " + std::to_string(s->instance / static_cast<std::uint32_t>(from.workers)) +
               " had failed: " + failure);
      append_all(pool, field(*s, "pending_" + n, FieldType::elements).elements);
    }
  const auto dealt = deal(pool, to.instances());
  std::vector<NodeState> out;
  for (int r = 0; r < to.world; ++r) {
    NodeState s;
    s.key = merges[0]->key;
    s.kind = "merge";
    s.mode = StateMode::hook;
    s.instance = static_cast<std::uint32_t>(r * to.workers);
    s.fields.push_back(u64_field("cursor", 0));
    for (int w = 0; w < to.workers; ++w) {
      const std::string n = std::to_string(w);
      s.fields.push_back(blobs_field("pending_" + n, dealt[static_cast<std::size_t>(r * to.workers + w)]));
      s.fields.push_back(u64_field("done_" + n, 0));
      s.fields.push_back(new_field("failure_" + n, FieldType::str));
      s.fields.push_back(new_field("failed_node_" + n, FieldType::str));
      Field worker = new_field("failed_worker_" + n, FieldType::i64);
      worker.i = -1;
      s.fields.push_back(std::move(worker));
    }
    out.push_back(std::move(s));
  }
  return out;
}

/// dispatch(round_robin): worker 0's record on each rank owns the dispatcher, with a backlog per worker
/// of elements the prefix dealt and the worker has not taken. The backlogs of all ranks are pooled and
/// dealt to the new workers; the prefix (re-sliced over the new ranks) goes on filling them.
std::vector<NodeState> deal_dispatch(const Records& old, Shape from, Shape to) {
  ElementBlobs pool;
  for (std::size_t i = 0; i < old.size(); ++i) {
    const NodeState& s = *old[i];
    const bool owner = field(s, "owner", FieldType::u64).u != 0;
    if (owner != (i % static_cast<std::size_t>(from.workers) == 0))
      refuse("dispatch '" + s.key + "': the dispatcher's record is not on worker 0 of instance " + std::to_string(i));
    if (!owner) continue;
    for (int w = 0; w < from.workers; ++w)
      append_all(pool, field(s, "backlog_" + std::to_string(w), FieldType::elements).elements);
  }
  const auto dealt = deal(pool, to.instances());
  std::vector<NodeState> out;
  for (std::size_t j = 0; j < to.instances(); ++j) {
    NodeState s;
    s.key = old[0]->key;
    s.kind = old[0]->kind;
    s.mode = old[0]->mode;
    s.instance = static_cast<std::uint32_t>(j);
    const bool owner = j % static_cast<std::size_t>(to.workers) == 0;
    s.fields.push_back(u64_field("owner", owner));
    if (owner) {
      s.fields.push_back(u64_field("next_worker", 0));
      s.fields.push_back(u64_field("prefix_done", 0));  // the dispatcher asks its prefix again
      for (int w = 0; w < to.workers; ++w)
        s.fields.push_back(blobs_field("backlog_" + std::to_string(w), dealt[j + static_cast<std::size_t>(w)]));
    }
    out.push_back(std::move(s));
  }
  return out;
}

std::vector<NodeState> replicate_stateless(const Records& old, Shape to) {
  std::vector<NodeState> out;
  for (std::size_t j = 0; j < to.instances(); ++j) {
    NodeState s = *old[0];
    s.instance = static_cast<std::uint32_t>(j);
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace

SnapshotSet SnapshotSet::rescaled(int world_size, int num_workers) const {
  if (world_size < 1 || num_workers < 1)
    throw SnapshotError("cannot rescale to world size " + std::to_string(world_size) + " with " +
                        std::to_string(num_workers) + " workers");
  const Shape from{this->world_size(), this->num_workers()}, to{world_size, num_workers};
  const SnapshotMeta& meta = ranks_.front().meta;
  // Which nodes run once per rank (the prefix before dispatch, the suffix after merge) and which per
  // worker: recorded per node since the node-details section; without it, only pipelines with neither.
  std::string merge_key = "merge@out";  // the implicit merge's record
  for (const auto& n : meta.graph) {
    if (n.kind != "merge" && n.kind != "dispatch") continue;
    if (n.kind == "merge") merge_key = n.key;
    for (const auto& m : meta.graph)
      if (m.segment.empty())
        refuse("the snapshots do not record which nodes run once per rank around " + n.kind + " ('" + n.key +
               "'); they were written by an older dpipe: take them again to rescale");
    for (const auto& [k, v] : n.params)
      if (n.kind == "dispatch" && k == "mode" && v == "broadcast")
        refuse("dispatch '" + n.key + "' broadcasts every element to all workers of a rank, and which part of it "
               "each worker has taken is not recorded, so it cannot be dealt to another number of workers");
  }

  std::map<std::pair<std::string, std::uint32_t>, const NodeState*> index;
  for (const auto& s : ranks_)
    for (const auto& st : s.states) index[{st.key, st.instance}] = &st;
  auto records_of = [&](const std::string& key, std::size_t count) {
    Records v;
    for (std::size_t i = 0; i < count; ++i) {
      auto it = index.find({key, static_cast<std::uint32_t>(i)});
      if (it != index.end()) v.push_back(it->second);
    }
    if (!v.empty() && v.size() != count)
      refuse("node '" + key + "' has records for " + std::to_string(v.size()) + " of " + std::to_string(count) +
             " instances");
    return v;
  };

  // The records of a node that runs once per rank (prefix, merge, suffix): on worker 0's instance.
  // None at all: the node is not run itself (a source read through a sampler).
  auto records_per_rank = [&](const std::string& key) {
    Records v;
    for (int r = 0; r < from.world; ++r) {
      auto it = index.find({key, static_cast<std::uint32_t>(r * from.workers)});
      if (it != index.end()) v.push_back(it->second);
    }
    if (!v.empty() && v.size() != static_cast<std::size_t>(from.world))
      refuse("node '" + key + "' has records on " + std::to_string(v.size()) + " of " + std::to_string(from.world) +
             " ranks");
    return v;
  };

  // New records per new instance (worker-segment nodes) and per new rank (run, prefix, merge, suffix).
  std::vector<std::vector<NodeState>> per_rank(static_cast<std::size_t>(world_size));
  auto place = [&](std::vector<NodeState> records, bool by_rank) {
    for (auto& s : records) {
      const std::size_t r = by_rank ? s.instance : s.instance / static_cast<std::size_t>(num_workers);
      if (by_rank) s.instance = static_cast<std::uint32_t>(r);
      per_rank[r].push_back(std::move(s));
    }
  };
  // Records made for Shape{world_size, 1} (instance = rank) of a node that runs once per rank.
  auto place_per_rank = [&](std::vector<NodeState> records) {
    for (auto& s : records) {
      const std::size_t r = s.instance;
      s.instance = static_cast<std::uint32_t>(r * static_cast<std::size_t>(num_workers));
      per_rank[r].push_back(std::move(s));
    }
  };

  // The consumers' buffers, per rank.
  {
    const Records run = records_of("run", from.world);
    if (run.empty()) refuse("the snapshots have no run records");
    ElementBlobs pool;
    for (const NodeState* s : run) append_all(pool, field(*s, "pending", FieldType::elements).elements);
    const auto dealt = deal(pool, static_cast<std::size_t>(world_size));
    std::vector<NodeState> out;
    for (int r = 0; r < world_size; ++r) {
      NodeState s = *run[0];
      s.instance = static_cast<std::uint32_t>(r);
      field(s, "delivered").u = 0;
      field(s, "pending").elements = dealt[static_cast<std::size_t>(r)];
      out.push_back(std::move(s));
    }
    place(std::move(out), true);
  }
  // The worker queues of the merge, per rank: every lane's elements, dealt to the new lanes.
  {
    const Records merges = records_per_rank(merge_key);
    if (merges.empty()) refuse("the snapshots have no record of the worker queues");
    place(deal_merge_queues(merges, from, to), false);  // on worker 0's instance of each rank
  }
  // Every other node of the graph: per instance in the worker segment, per rank in the prefix and suffix.
  for (const auto& n : meta.graph) {
    if (n.key == merge_key) continue;
    const bool once_per_rank = n.segment == "suffix" || n.segment == "prefix";
    const Records old = once_per_rank ? records_per_rank(n.key) : records_of(n.key, from.instances());
    if (old.empty()) {
      if (n.kind == "dispatch") refuse("dispatch '" + n.key + "' has no records");
      continue;  // not run itself (a source read through a sampler)
    }
    for (const NodeState* s : old)
      for (const auto& f : s->fields)
        if (f.name == "deferred_failure") refuse("node '" + n.key + "' had failed: " + f.s);
    if (n.kind == "dispatch") {
      place(deal_dispatch(old, from, to), false);
      continue;
    }
    const Shape shape = once_per_rank ? Shape{world_size, 1} : to;
    auto put = [&](std::vector<NodeState> records) {
      if (once_per_rank) place_per_rank(std::move(records));
      else place(std::move(records), false);
    };
    const std::string& kind = old[0]->kind;
    if (old[0]->mode == StateMode::stateless) put(replicate_stateless(old, shape));
    else if (kind == "sampler") put(rescale_positions(old, shape, {}));
    else if (kind == "lines" || kind == "line_blocks")
      put(rescale_positions(old, shape, {"started_items", "started_segments", "started_offsets"}));
    else if (kind == "shuffle") put(deal_elements(old, shape, "buffer", {"input_done"}, true));
    else if (kind == "batch") put(deal_elements(old, shape, "partial", {"input_done"}, false));
    else if (kind == "flat_map") put(deal_elements(old, shape, "pending", {}, false));
    else if (kind == "sharding_filter")
      refuse("sharding_filter '" + n.key + "' keeps positions in a stream that every instance reads in full, so "
             "its instances' states are not parts of one whole; read the data through sampler() instead");
    else
      refuse("node '" + n.key + "' (" + kind + ") keeps state that cannot be dealt to another layout; rescalable "
             "pipelines read through a sampler and use shuffle, batch, flat_map and stateless nodes");
  }

  std::vector<Snapshot> out;
  for (int r = 0; r < world_size; ++r) {
    Snapshot s;
    s.meta = meta;
    s.meta.format_version = 0;
    s.meta.layout = Layout{r, world_size, num_workers};
    s.meta.elements_delivered = 0;
    s.meta.user_metadata["rescaled_from"] =
        std::to_string(from.world) + " ranks x " + std::to_string(from.workers) + " workers";
    s.states = std::move(per_rank[static_cast<std::size_t>(r)]);
    out.push_back(std::move(s));
  }
  return SnapshotSet(std::move(out));
}

}  // namespace dpipe
