// Two-level sharding on a climate-style dataset: each month is one large file (here simulated), far
// too large to hand to every worker as a copy. Months are shuffled and sharded across ranks in the
// main prefix, each month is loaded once per rank, broadcast to the rank's workers as one shared object,
// and every worker crops its own subset of the month's windows:
//
//   months → shuffle → shard by rank → load month → dispatch(broadcast)
//          → window indices → shard by worker → crop windows → batch → merge
//
// The program checks what the pipeline promises and exits non-zero otherwise: each month of this rank
// is loaded exactly once (not once per worker), every window of those months arrives exactly once,
// and a run stopped half-way and resumed from a snapshot yields exactly the same batches.
//   climate_windows [RANK WORLD_SIZE WORKERS]
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <set>

#include "dpipe/dpipe.hpp"

namespace {

constexpr std::int64_t kMonths = 24;
constexpr std::int64_t kSteps = 120;            // time steps per month
constexpr std::int64_t kCells = 32 * 64;        // grid cells per time step
constexpr std::int64_t kWindow = 8;             // time steps per training window
constexpr std::int64_t kWindowsPerMonth = kSteps - kWindow + 1;

std::atomic<int> loads{0};

/// One month of gridded data (about 1 MB here; gigabytes in real life).
struct Month {
  std::int64_t id = 0;
  std::vector<float> values;  // kSteps × kCells
};

/// The "file read": deterministic simulated values.
Month load_month(std::int64_t id) {
  ++loads;
  Month m{id, std::vector<float>(static_cast<std::size_t>(kSteps * kCells))};
  for (std::size_t i = 0; i < m.values.size(); ++i) m.values[i] = static_cast<float>(id * 1000 + (i % 997));
  return m;
}

using SharedMonth = std::shared_ptr<const Month>;
using WindowRef = std::pair<SharedMonth, std::int64_t>;  // a month and the first step of a window

/// A window: the month id, its first step, and the cropped values.
using Window = std::vector<float>;

}  // namespace

// A month is cheaper to load again than to store: snapshots keep only its id, and a restore reloads it
// (once per month, shared by every reference to it).
namespace dpipe {
template <>
struct Codec<Month> {
  static constexpr std::size_t kMinBytes = 8;
  static void encode(ByteWriter& w, const Month& m) { w.put<std::int64_t>(m.id); }
  static Month decode(ByteReader& r) { return load_month(r.get<std::int64_t>()); }
  static std::string tag() { return "month_id"; }
};
template <>
struct Codec<SharedMonth> {
  static constexpr std::size_t kMinBytes = 8;
  static void encode(ByteWriter& w, const SharedMonth& m) { w.put<std::int64_t>(m->id); }
  static SharedMonth decode(ByteReader& r) {
    static std::mutex mu;
    static std::map<std::int64_t, std::weak_ptr<const Month>> cache;
    const auto id = r.get<std::int64_t>();
    std::lock_guard lock(mu);
    if (auto m = cache[id].lock()) return m;
    SharedMonth m = std::make_shared<const Month>(load_month(id));
    cache[id] = m;
    return m;
  }
  static std::string tag() { return "month_id"; }
};
}  // namespace dpipe

int main(int argc, char** argv) {
  dpipe::Layout layout{0, 1, 3};
  if (argc == 4) layout = {std::atoi(argv[1]), std::atoi(argv[2]), std::atoi(argv[3])};

  auto pipeline =
      dpipe::range(0, kMonths) | dpipe::shuffle({.buffer = kMonths, .name = "months"}) |
      dpipe::sharding_filter({.level = dpipe::ShardLevel::rank, .name = "rank_months"}) |
      dpipe::map(load_month, {.name = "load"}) | dpipe::dispatch(dpipe::broadcast, {.name = "to_workers"}) |
      dpipe::flat_map(
          [](const SharedMonth& m) {
            std::vector<WindowRef> refs;
            for (std::int64_t s = 0; s < kWindowsPerMonth; ++s) refs.emplace_back(m, s);
            return refs;
          },
          {.name = "window_indices"}) |
      dpipe::sharding_filter({.level = dpipe::ShardLevel::worker, .name = "worker_windows"}) |
      dpipe::map(
          [](const WindowRef& w) {
            const auto& v = w.first->values;
            Window out{static_cast<float>(w.first->id), static_cast<float>(w.second)};
            out.insert(out.end(), v.begin() + w.second * kCells, v.begin() + (w.second + kWindow) * kCells);
            return out;
          },
          {.name = "crop"}) |
      dpipe::batch({.size = 16, .name = "batches"}) | dpipe::prefetch({.depth = 4}) | dpipe::merge();

  const dpipe::RunOptions options{.seed = 2024, .layout = layout};
  dpipe::Engine engine;

  // 1. The whole epoch of this rank.
  std::vector<std::vector<Window>> reference;
  auto run = engine.start(pipeline, options);
  while (auto b = run.next()) reference.push_back(std::move(*b));
  const int loads_in_run = loads.load();

  std::set<std::pair<int, int>> windows;
  std::set<int> months;
  std::size_t count = 0;
  for (const auto& b : reference)
    for (const auto& w : b) {
      windows.emplace(static_cast<int>(w[0]), static_cast<int>(w[1]));
      months.insert(static_cast<int>(w[0]));
      ++count;
    }
  const std::size_t expected_months = static_cast<std::size_t>(
      (kMonths - layout.rank + layout.world_size - 1) / layout.world_size);
  std::printf("rank %d of %d, %d workers: %zu months, each loaded once (%d loads); %zu windows in %zu batches\n",
              layout.rank, layout.world_size, layout.num_workers, months.size(), loads_in_run, count,
              reference.size());
  bool ok = months.size() == expected_months && loads_in_run == static_cast<int>(expected_months) &&
            count == windows.size() && count == expected_months * static_cast<std::size_t>(kWindowsPerMonth);

  // 2. Stop half-way, snapshot, resume in a fresh run: the same batches follow.
  auto first = engine.start(pipeline, options);
  std::vector<std::vector<Window>> resumed;
  for (std::size_t i = 0; i < reference.size() / 2; ++i) resumed.push_back(*first.next());
  const std::string bytes = first.snapshot().to_bytes();
  auto second = engine.resume(pipeline, dpipe::Snapshot::from_bytes(bytes), options);
  while (auto b = second.next()) resumed.push_back(std::move(*b));
  const bool same = resumed == reference;
  std::printf("snapshot at batch %zu: %zu bytes (months stored as ids); resumed stream %s\n", reference.size() / 2,
              bytes.size(), same ? "matches" : "DIFFERS");
  ok = ok && same;
  if (!ok) std::printf("FAILED: expected %zu months loaded once each\n", expected_months);
  return ok ? 0 : 1;
}
