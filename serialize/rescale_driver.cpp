// The rescale driver: a snapshot set's records (snapshots in memory, the rank files' state indexes, or the
// set index) grouped per node, dealt to another layout by each node kind's rule, and the reads and the
// offline rescale built on it (SnapshotSet::rescaled, read_rank, rescale_dir).
#include "dpipe/detail/run_record.hpp"
#include "dpipe/snapshot_set.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <filesystem>
#include <limits>
#include <map>
#include <unordered_map>

#include "dpipe/atomic_file.hpp"
#include "dpipe/kit/codec.hpp"
#include "dpipe/error.hpp"
#include "dpipe/kit/node_kind.hpp"
#include "dpipe/rng.hpp"
#include "durable_dir.hpp"
#include "set_index.hpp"
#include "snapshot_plan.hpp"
#include "snapshot_set_internal.hpp"

namespace dpipe {
namespace fs = std::filesystem;
using namespace set_internal;  // the set directory, as the driver reads it (snapshot_set_internal.hpp)

namespace {

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

/// A node's records saved by two modes: every instance runs the same node, so one of them is forged.
[[noreturn]] void refuse_mixed_modes(const std::string& key, StateMode first, StateMode other) {
  refuse("node '" + key + "' has records saved by " + to_string(first) + " and by " + to_string(other) +
         ", which no run writes");
}

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
/// The first rescale of a set builds its index (build_index_once; the write that completes a set does not).
/// nullopt when the set has no index naming it, or rank 0's file is not there (the set is then listed).
std::optional<Snapshot> read_rescaled_by_index(const std::string& dir, const SetIdentity& set, const Layout& to) {
  auto index = read_set_index(dir, set);
  if (!index && build_index_once(dir, set)) index = read_set_index(dir, set);
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
// node kind's rule (dpipe/kit/node_kind.hpp), and places what the rule returns on the new ranks. Only the
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
  std::map<std::string, std::size_t> graph;  // key → place in the graph's pre-order
  for (std::size_t i = 0; i < meta.graph.size(); ++i) graph[meta.graph[i].key] = i;

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
        for (std::size_t i = 0; i < slots; ++i) {
          if (i >= columns->size()) refuse(missing(columns->size()));
          if (const std::uint32_t got = columns->instance(i), want = instance_of(i); got != want)
            refuse("node '" + key + "' has a record of instance " + std::to_string(got) + " where instance " +
                   std::to_string(want) + "'s belongs (" +
                   (got < want ? "instance " + std::to_string(got) + " is listed twice"
                               : "instance " + std::to_string(want) + " has none") + ")");
        }
      if (const std::ptrdiff_t k = columns->column("deferred_failure"); k >= 0)
        for (std::size_t i = 0; i < slots; ++i)
          if (columns->has(i, std::size_t(k))) refuse("node '" + key + "' had failed: " + std::string(columns->text(i, std::size_t(k))));
      in.columns = columns;
      in.kind = old_records.kind(key);
      in.mode = columns->mode(0);
      for (std::size_t i = 1; i < slots; ++i)
        if (columns->mode(i) != in.mode) refuse_mixed_modes(key, in.mode, columns->mode(i));
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
    for (const NodeState* st : in.old)
      if (st->mode != in.mode) refuse_mixed_modes(key, in.mode, st->mode);
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
    const GraphNodeRecord* node = g == graph.end() ? nullptr : &meta.graph[g->second];
    const GraphNodeRecord* first_input = g == graph.end() ? nullptr : first_input_record(meta.graph, g->second);
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

    // A node's input count (IterBase::input_taken) says where one instance was in its own input, which no
    // instance of another layout has: the rules read the records without it, and the new records have none
    // (their nodes count from the resume, and say so). A set index leaves it out of its columns.
    const std::vector<const NodeState*> read_records = in.old;
    std::vector<NodeState> without_counts;
    const auto drop_input_counts = [&] {
      without_counts.clear();
      without_counts.reserve(read_records.size());
      for (std::size_t i = 0; i < read_records.size(); ++i) {
        const auto& fields = read_records[i]->fields;
        if (std::none_of(fields.begin(), fields.end(), [](const Field& f) { return f.name == kInputTakenField; })) {
          in.old[i] = read_records[i];
          continue;
        }
        NodeState& copy = without_counts.emplace_back(*read_records[i]);
        std::erase_if(copy.fields, [](const Field& f) { return f.name == kInputTakenField; });
        in.old[i] = &copy;
      }
    };
    drop_input_counts();

    // The invariants a resume checks before any node runs (KindInfo::check_state), on the records read
    // (the whole records, when the set is read so) and on those the rule made: a record no resume would
    // take is refused here, naming the old instance, before anything is written.
    const KindInfo* kind_info = find_kind(in.kind);
    const auto check = [&](const NodeState& st, const char* which) {
      if (!kind_info || !kind_info->check_state) return;
      try {
        kind_info->check_state(st, node ? *node : GraphNodeRecord{}, first_input);  // the engine's merge has no graph node
      } catch (const ElementsNotLoaded&) {
        // A list the plan left in the file: the kind's rule checks what it reads of it, the resume the rest.
      } catch (const SnapshotError& e) {
        refuse(std::string(which) + " record of node '" + key + "' (instance " + std::to_string(st.instance) + "): " + e.what());
      }
    };
    for (const NodeState* st : in.old) check(*st, "the old");
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
          drop_input_counts();  // copies of the records as loaded now
        }
      }
    } else {
      in.refuse("its kind is not registered, so no rescale rule is known for it");
    }
    // A record restored by replay says nothing another layout could use (a generator's rule refuses it);
    // a kind whose rule dealt such records was saved by hook, which resume would insist on.
    if (in.mode == StateMode::replay)
      in.refuse("its records are replay records, which no rescale can deal (a " + in.kind.substr(0, 64) +
                "'s resume would refuse them too)");
    // The records of the wanted slots, each with its slot as instance (or every slot's, the unwanted
    // ones empty): one for each wanted slot.
    const auto [first, end] = in.wanted_slots();
    std::vector<bool> made(end - first, false);
    std::erase_if(out, [](const NodeState& s) { return s.key.empty(); });
    old_records.resolve(out);
    for (const NodeState& record : out) check(record, "the rescaled");
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
