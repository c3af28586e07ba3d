// The sampler, snapshot sets and rescaling: every element of an epoch exactly once over all instances,
// across any sequence of snapshot → restore on another layout.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <limits>
#include <numeric>
#include <optional>
#include <set>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <random>

#include "dpipe/detail/position_deal.hpp"
#include "dpipe/detail/removal_log.hpp"
#include "dpipe/dpipe.hpp"
#include "../test_util.hpp"

namespace dpipe {
namespace {

using I64 = std::int64_t;
namespace fs = std::filesystem;

RunOptions at(int rank, int world, int workers, std::uint64_t seed = 99) {
  return RunOptions{.seed = seed, .layout = Layout{rank, world, workers}};
}

std::string temp_dir(const std::string& name) {
  const auto dir = fs::temp_directory_path() / ("dpipe-rescale-" + name + "-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  return dir.string();
}

std::map<I64, int> counts(const std::vector<I64>& v) {
  std::map<I64, int> c;
  for (auto x : v) ++c[x];
  return c;
}

TEST(Sampler, DealsEveryPositionOnceOverAllInstances) {
  auto p = range(0, 1000) | sampler({.shuffle = SamplerShuffle::global});
  for (auto [world, workers] : {std::pair{1, 1}, {2, 3}, {3, 2}, {5, 1}}) {
    std::vector<I64> all;
    for (int r = 0; r < world; ++r) {
      auto part = testing::collect(p, at(r, world, workers));
      all.insert(all.end(), part.begin(), part.end());
    }
    std::sort(all.begin(), all.end());
    std::vector<I64> expected(1000);
    std::iota(expected.begin(), expected.end(), 0);
    EXPECT_EQ(all, expected) << world << " x " << workers;
  }
}

TEST(Sampler, GlobalOrderDoesNotDependOnTheLayoutAndChangesPerEpoch) {
  auto p = range(0, 500) | sampler({.shuffle = SamplerShuffle::global, .epochs = 2});
  const auto one = testing::collect(p, at(0, 1, 1));
  ASSERT_EQ(one.size(), 1000u);
  EXPECT_NE(std::vector<I64>(one.begin(), one.begin() + 500), std::vector<I64>(one.begin() + 500, one.end()));
  auto sorted_epoch = std::vector<I64>(one.begin(), one.begin() + 500);
  std::sort(sorted_epoch.begin(), sorted_epoch.end());
  EXPECT_EQ(sorted_epoch.front(), 0);
  EXPECT_EQ(sorted_epoch.back(), 499);
  EXPECT_EQ(std::adjacent_find(sorted_epoch.begin(), sorted_epoch.end()), sorted_epoch.end());
  // Four instances, merged round-robin within each rank: instance i holds global positions i mod 4.
  auto r0 = testing::collect(p, at(0, 2, 2)), r1 = testing::collect(p, at(1, 2, 2));
  for (std::size_t q = 0; q < one.size(); ++q) {
    const std::size_t inst = q % 4, k = q / 4;
    const auto& rank = inst < 2 ? r0 : r1;
    ASSERT_EQ(rank[k * 2 + inst % 2], one[q]) << "position " << q;
  }
  EXPECT_EQ(testing::collect(range(0, 5) | sampler({.shuffle = SamplerShuffle::none}), at(0, 1, 1)),
            (std::vector<I64>{0, 1, 2, 3, 4}));
}

// The sampler looks one position ahead to prefetch its element: peek must name what next takes,
// skipped positions (a rescale's) included, and take nothing itself.
TEST(PositionDeal, PeekShowsWhatNextTakesWithoutTakingIt) {
  using U64 = std::uint64_t;
  NodeState saved;
  {
    StateWriter w(saved);
    w("base", U64{6});
    w("stride", U64{3});
    w("offset", U64{1});
    w("next", U64{0});
    w("skip", std::vector<U64>{7, 10, 13});
  }
  detail::PositionDeal deal(3, 1);
  StateReader r(saved);
  deal.restore(r, "positions", 22);
  std::vector<U64> taken;
  for (;;) {
    const auto peeked = deal.peek(22);
    EXPECT_EQ(peeked, deal.peek(22));  // peeking twice takes nothing
    const auto q = deal.next(22);
    ASSERT_EQ(peeked, q);
    if (!q) break;
    taken.push_back(*q);
  }
  EXPECT_EQ(taken, (std::vector<U64>{16, 19}));  // 7, 10, 13 were taken elsewhere; 22 is past the end
}

// A record with positions outside the sequence is refused on restore, naming the field and the value,
// before any arithmetic on it can wrap (next near 2^63 times a stride).
TEST(PositionDeal, RefusesPositionsOutsideTheSequence) {
  using U64 = std::uint64_t;
  auto restore = [](U64 base, U64 stride, U64 offset, U64 next, std::vector<U64> skip) {
    NodeState saved;
    saved.key = "sampler@0";
    StateWriter w(saved);
    w("base", base);
    w("stride", stride);
    w("offset", offset);
    w("next", next);
    w("skip", skip);
    detail::PositionDeal deal(stride ? stride : 1, 0);
    StateReader r(saved);
    deal.restore(r, "positions", 100);
  };
  EXPECT_NO_THROW(restore(0, 2, 1, 50, {}));  // 1 + 50 × 2 = 101: one past the end, nothing left to take
  testing::expect_throw_with<SnapshotError>([&] { restore(0, 2, 1, U64{1} << 62, {}); }, "next 4611686018427387904");
  testing::expect_throw_with<SnapshotError>([&] { restore(0, 2, 1, 52, {}); }, "next 52 is past the 100 positions");
  testing::expect_throw_with<SnapshotError>([&] { restore(200, 2, 1, 0, {}); }, "base 200");
  testing::expect_throw_with<SnapshotError>([&] { restore(0, 0, 0, 0, {}); }, "stride 0");
  testing::expect_throw_with<SnapshotError>([&] { restore(0, 2, 2, 0, {}); }, "offset 2");
  testing::expect_throw_with<SnapshotError>([&] { restore(10, 2, 0, 0, {4}); }, "skipped position");
  testing::expect_throw_with<SnapshotError>([&] { restore(0, 2, 0, 0, {5, 3}); }, "not in order");
}

// The position redeal (sampler's and the line sources' rule) checked against the definition on random
// old deals: a wanted new slot j is dealt every position from the frontier (the slowest old instance's
// position) in its residue class, and skips exactly those some old instance took: k < next of the
// position's owner, or one the owner skipped. The cases cover both ways the rule finds them (walking a
// slot's own positions, or listing every position taken above the frontier), old offsets in and out of
// slot order, columns of one value or an even step, and old deals that skip positions.
std::uint64_t slowest_of(const std::vector<detail::DealState>& deals) {
  std::uint64_t out = ~std::uint64_t{0};
  for (const auto& d : deals) out = std::min(out, d.next);
  return out;
}

TEST(PositionRedeal, EveryWantedSlotSkipsExactlyThePositionsOldInstancesTook) {
  using U64 = std::uint64_t;
  std::mt19937_64 rng(20261128);
  const auto pick = [&](U64 n) { return U64(rng() % n); };
  for (int trial = 0; trial < 400; ++trial) {
    const std::size_t n_old = 1 + pick(40);
    const U64 base = pick(3) ? pick(1000) : 0, min_next = pick(50);
    const int shape = static_cast<int>(pick(4));  // 0 even, 1 small spread, 2 one far ahead, 3 with skips
    std::vector<detail::DealState> old(n_old);
    std::vector<std::size_t> offsets(n_old);
    std::iota(offsets.begin(), offsets.end(), 0);
    const bool permuted = pick(4) == 0;
    if (permuted) std::shuffle(offsets.begin(), offsets.end(), rng);
    for (std::size_t i = 0; i < n_old; ++i) {
      U64 next = min_next;
      if (shape == 1 || shape == 3) next += pick(8);
      if (shape == 2 && i == n_old / 2) next += 200 + pick(300);
      old[i] = {base, n_old, offsets[i], next, {}};
    }
    if (shape == 3)  // positions of instance i's own class that others took before
      for (std::size_t i = 0; i < n_old; ++i)
        for (U64 k = old[i].next; k < old[i].next + 12; ++k)
          if (pick(3) == 0) old[i].skip.push_back(base + old[i].offset + k * n_old);
    const auto taken = [&](U64 q) {
      const U64 offset = (q - base) % n_old, k = (q - base) / n_old;
      for (const auto& d : old)
        if (d.offset == offset)
          return k < d.next || std::binary_search(d.skip.begin(), d.skip.end(), q);
      return false;
    };
    U64 slowest = ~U64{0}, reach = 0;
    for (const auto& d : old) {
      slowest = std::min(slowest, d.next);
      reach = std::max(reach, base + (d.next + 13) * n_old);
    }
    const U64 frontier = base + slowest * n_old;
    const int ranks = 1 + static_cast<int>(pick(10)), workers = 1 + static_cast<int>(pick(4));
    RescaleInput in;
    in.key = "sampler@0";
    in.kind = "sampler";
    in.from = Layout{0, static_cast<int>(n_old), 1};
    in.to = Layout{0, ranks, workers};
    in.wanted_begin = static_cast<int>(pick(static_cast<U64>(ranks)));
    in.wanted_end = pick(2) ? -1 : in.wanted_begin + 1 + static_cast<int>(pick(static_cast<U64>(ranks - in.wanted_begin)));
    detail::OldDeals deals = detail::OldDeals::of(old);
    if (!permuted && pick(2)) {  // columns as a set index gives them: computed from their form
      deals.base = rescale::Numbers(n_old, base, 0);
      deals.stride = rescale::Numbers(n_old, n_old, 0);
      deals.offset = rescale::Numbers(n_old, 0, 1);
      if (shape == 0) deals.next = rescale::Numbers(n_old, min_next, 0);
    }
    // `next` as a set index gives a chunked column: read one at a time, its least and greatest stated.
    std::size_t next_reads = 0;
    const bool on_demand = shape != 0 && pick(2);
    U64 max_next = 0;
    for (const auto& d : old) max_next = std::max(max_next, d.next);
    if (on_demand) {
      std::vector<U64> nexts;
      for (const auto& d : old) nexts.push_back(d.next);
      deals.next = rescale::Numbers(n_old, [nexts, &next_reads](std::size_t i) { return ++next_reads, nexts[i]; }, slowest_of(old),
                                    max_next);
    }
    const auto got = detail::redeal_positions(in, deals);
    {
      // A walk (no old skips, no more asks than old instances) reads only the `next` of the owners it asks.
      const std::size_t n_new = static_cast<std::size_t>(ranks * workers);
      const auto [first, end] = in.wanted_slots();
      const U64 walked = (base + max_next * n_old - frontier) / n_new + 1, wanted = std::max<U64>(end - first, 1);
      if (on_demand && shape != 3 && walked <= n_old / wanted) {
        EXPECT_LE(next_reads, walked * wanted) << "trial " << trial << ": a walk read the whole column";
      }
    }
    const std::size_t n_new = static_cast<std::size_t>(ranks * workers);
    const auto [first, end] = in.wanted_slots();
    ASSERT_EQ(got.size(), end - first) << "trial " << trial;
    for (std::size_t j = first; j < end; ++j) {
      const auto& d = got[j - first];
      std::vector<U64> expected;
      for (U64 q = frontier + j; q < reach; q += n_new)
        if (taken(q)) expected.push_back(q);
      EXPECT_EQ(d.base, frontier) << "trial " << trial;
      EXPECT_EQ(d.stride, n_new);
      EXPECT_EQ(d.offset, j);
      EXPECT_EQ(d.next, 0u);
      ASSERT_EQ(d.skip, expected) << "trial " << trial << ", slot " << j << " of " << n_new << ", shape " << shape;
    }
  }
}

// The numbers of a column given by its form: least and greatest without a pass, also where the column
// passes 2^64 (its values are modulo 2^64) and then by its values.
TEST(RescaleNumbers, BoundsAndStepsOfAColumnByItsForm) {
  using U64 = std::uint64_t;
  const rescale::Numbers up(4, 10, 3), same(5, 7, 0), wrapped(3, ~U64{0}, 1), held(std::vector<U64>{5, 2, 9});
  EXPECT_EQ(up.min(), 10u);
  EXPECT_EQ(up.max(), 19u);
  EXPECT_EQ(same.min(), 7u);
  EXPECT_EQ(same.max(), 7u);
  EXPECT_EQ(wrapped.min(), 0u);
  EXPECT_EQ(wrapped.max(), ~U64{0});
  EXPECT_EQ(held.min(), 2u);
  EXPECT_EQ(held.max(), 9u);
  EXPECT_TRUE(up.steps(10, 3));
  EXPECT_FALSE(up.steps(10, 2));
  EXPECT_TRUE(same.steps(7, 0));
  EXPECT_TRUE(rescale::Numbers(std::vector<U64>{0, 1, 2}).steps(0, 1));
  EXPECT_FALSE(held.steps(5, 0));
  EXPECT_EQ(rescale::Numbers().max(), 0u);
  // Read on demand (a set index's chunked column): bounds as stated, without a read; each number read once
  // when held.
  std::size_t reads = 0;
  const std::vector<U64> values{4, 8, 6, 5};
  const rescale::Numbers lazy(values.size(), [&](std::size_t i) { return ++reads, values[i]; }, 4, 8);
  EXPECT_EQ(lazy.min(), 4u);
  EXPECT_EQ(lazy.max(), 8u);
  EXPECT_FALSE(lazy.all_equal(9));
  EXPECT_EQ(reads, 0u);
  EXPECT_EQ(lazy[2], 6u);
  EXPECT_EQ(reads, 1u);
  const rescale::Numbers all = lazy.held();
  EXPECT_EQ(reads, 5u);
  EXPECT_EQ(all[3], 5u);
  EXPECT_EQ(all.max(), 8u);
  EXPECT_EQ(reads, 5u);
  EXPECT_TRUE(rescale::Numbers(3, [](std::size_t) { return U64{7}; }, 7, 7).all_equal(7));
}

// A rescale checks the records it deals before it lists positions: instances that claim to be 2^40
// positions apart are refused instead of listing them all.
TEST(SamplerRescale, RefusesInstancesFarApartInsteadOfListingThem) {
  Engine engine;
  // A source long enough that the forged position lies inside it (one past it is refused sooner).
  const auto p = range(0, std::int64_t{1} << 42) | sampler({.shuffle = SamplerShuffle::none});
  auto run = engine.start(p, {.layout = Layout{0, 1, 2}, .inline_workers = true});
  run.next();
  SnapshotSet set({run.snapshot()});
  Snapshot& s = const_cast<Snapshot&>(set.rank(0));
  for (auto& st : s.states)
    if (st.kind == "sampler" && st.instance == 1)
      for (auto& f : st.fields)
        if (f.name == "next") f.u = std::uint64_t{1} << 40;
  testing::expect_throw_with<SnapshotError>([&] { set.rescaled(1, 3); }, "positions apart");
}

TEST(Sampler, FollowsOnlyRandomAccessSources) {
  testing::expect_throw_with<ConfigError>([] { range(0, 5) | map([](I64 x) { return x; }) | sampler(); },
                                         "must follow a random-access source (range, from_vector), not map");
  testing::expect_throw_with<ConfigError>([] { range(0, 5) | sampler({.epochs = 0}); },
                                         "epochs must be between 1 and 4294967296, got 0");
  // Both wrong: the input is the mistake to name first (the epochs are checked for the sampler it can be).
  testing::expect_throw_with<ConfigError>([] { range(0, 5) | map([](I64 x) { return x; }) | sampler({.epochs = 0}); },
                                         "not map");
}

/// Runs every rank of `layout` from `set` (or from the start), delivering `take(rank)` elements each,
/// and returns the new set; everything delivered is appended to `out` (batches flattened).
/// `trace`: the runs are traced, so their snapshots hold restore keys; `reproducible`: settled snapshots.
template <class T, class Take>
SnapshotSet stage(const Pipeline<T>& p, const std::optional<SnapshotSet>& set, int world, int workers, Take take,
                  std::vector<I64>& out, bool trace = false, bool reproducible = false) {
  Engine e;
  std::vector<Snapshot> next;
  for (int r = 0; r < world; ++r) {
    auto o = at(r, world, workers);
    o.trace = trace;
    auto run = set ? e.resume(p, *set, o, {.rescale = true}) : e.start(p, o);
    const std::size_t n = take(r);
    for (std::size_t i = 0; i < n; ++i) {
      auto x = run.next();
      if (!x) break;
      if constexpr (std::is_same_v<T, I64>) out.push_back(*x);
      else out.insert(out.end(), x->begin(), x->end());
    }
    next.push_back(reproducible ? run.reproducible_snapshot() : run.snapshot());
  }
  return SnapshotSet(std::move(next));
}

TEST(RescaleProperty, EveryElementExactlyOnceAcrossRandomLayoutSequences) {
  testing::property_trials(40, [&](std::mt19937_64& g) {
    auto pick = [&](int n) { return testing::draw(g, n); };
    const I64 n = 200 + pick(3000);
    const int epochs = 1 + pick(2);
    Pipeline<I64> p = range(0, n) | sampler({.shuffle = pick(2) ? SamplerShuffle::global : SamplerShuffle::none,
                                             .epochs = epochs});
    if (pick(2)) p = p | shuffle({.buffer = 1 + pick(100)});
    // A dispatch: the sampler (and shuffle) before it run once per rank and deal to the ranks; the
    // dispatcher's backlogs are dealt to the new workers.
    const bool dispatched = pick(3) == 0;
    if (dispatched) p = p | dispatch();
    if (pick(2)) p = p | map([](I64 x) { return x; });
    if (dispatched && pick(2)) p = p | shuffle({.buffer = 1 + pick(30)});
    // An explicit merge: what follows runs once per rank, and its state is dealt per rank.
    const int merged = pick(3);
    if (merged == 1) p = p | merge();
    if (merged == 2) p = p | prefetch({.depth = 1 + pick(8)}) | merge() | shuffle({.buffer = 1 + pick(50)});
    const bool batched = pick(2);
    const I64 batch_size = 1 + pick(16);
    std::vector<I64> delivered;
    std::optional<SnapshotSet> set;
    std::string layouts = std::string(dispatched ? "(dispatch) " : "") + (merged ? "(merge) " : "");
    const int stages = 1 + pick(4);
    for (int s = 0; s < stages; ++s) {
      const int world = 1 + pick(6), workers = 1 + pick(4);
      layouts += std::to_string(world) + "x" + std::to_string(workers) + " ";
      auto take = [&](int) { return static_cast<std::size_t>(pick(static_cast<int>(n) / (batched ? 8 : 2) + 1)); };
      set = batched ? stage(p | batch({.size = batch_size}), set, world, workers, take, delivered)
                    : stage(p, set, world, workers, take, delivered);
    }
    // Last layout: everyone runs to the end.
    const int world = 1 + pick(6), workers = 1 + pick(4);
    layouts += std::to_string(world) + "x" + std::to_string(workers);
    auto all = [](int) { return std::numeric_limits<std::size_t>::max(); };
    if (batched) stage(p | batch({.size = batch_size}), set, world, workers, all, delivered);
    else stage(p, set, world, workers, all, delivered);
    const auto c = counts(delivered);
    ASSERT_EQ(static_cast<I64>(c.size()), n) << "layouts " << layouts;
    for (const auto& [x, k] : c) ASSERT_EQ(k, epochs) << "element " << x << ", layouts " << layouts;
  });
}

// Random pipelines that carry provenance, resumed and rescaled through random layouts with reproducible
// snapshots: the traced runs' snapshots hold restore keys, the untraced runs' data, and both deliver the
// very same streams (settled snapshots make them a pure function of the plan), every element once per
// epoch.
TEST(RescaleProperty, KeysResumeAndRescaleAsDataDo) {
  std::size_t keyed_entries = 0;  // over every trial: the sets met non-empty
  testing::property_trials(16, [&](std::mt19937_64& g) {
    auto pick = [&](int n) { return testing::draw(g, n); };
    const I64 n = 200 + pick(2000);
    const int epochs = 1 + pick(2);
    Pipeline<I64> p = range(0, n) | sampler({.shuffle = pick(2) ? SamplerShuffle::global : SamplerShuffle::none,
                                             .epochs = epochs});
    if (pick(2)) p = p | map([](I64 x) { return x * 7 + 1; });
    if (pick(2)) p = p | shuffle({.buffer = 1 + pick(100)});
    const bool filtered = pick(3) == 0;
    if (filtered) p = p | filter([](I64 x) { return x % 5 != 3; });
    const int merged = pick(3);
    if (merged == 1) p = p | merge();
    if (merged == 2) p = p | prefetch({.depth = 1 + pick(8)}) | merge() | shuffle({.buffer = 1 + pick(50)});
    const I64 batch_size = 1 + pick(16);
    const bool batched = pick(2);
    const bool expanded = pick(3) == 0;  // a flat_map: keys with offsets
    if (expanded) p = p | flat_map([](I64 x) { return std::vector<I64>{x, -x - 1}; });
    std::vector<std::array<int, 2>> plan;  // layouts, the last one run to the end
    std::vector<std::vector<std::size_t>> takes;
    for (int s = 0, stages = 2 + pick(3); s < stages; ++s) {
      plan.push_back({1 + pick(5), 1 + pick(3)});
      takes.emplace_back();
      for (int r = 0; r < plan.back()[0]; ++r)
        takes.back().push_back(s + 1 == stages ? std::numeric_limits<std::size_t>::max()
                                               : static_cast<std::size_t>(pick(static_cast<int>(n) / (batched ? 8 : 2) + 1)));
    }
    auto deliver = [&](bool keys) {
      std::vector<I64> delivered;
      std::optional<SnapshotSet> set;
      for (std::size_t s = 0; s < plan.size(); ++s) {
        auto take = [&](int r) { return takes[s][static_cast<std::size_t>(r)]; };
        const auto [world, workers] = plan[s];
        if (batched) set = stage(p | batch({.size = batch_size}), set, world, workers, take, delivered, keys, true);
        else set = stage(p, set, world, workers, take, delivered, keys, true);
        if (keys && s + 1 < plan.size()) {  // the set holds keys, none of the elements as data
          for (int r = 0; r < set->world_size(); ++r)
            for (const NodeState& st : set->rank(r).states)
              for (const Field& f : st.fields)
                if (f.type == FieldType::elements && f.elements.tag != "u64" && f.elements.size() > 0) {
                  EXPECT_TRUE(f.elements.tag.starts_with("keys:")) << st.kind << " " << f.name << " " << f.elements.tag;
                  keyed_entries += f.elements.size();
                }
        }
      }
      return delivered;
    };
    const auto with_keys = deliver(true), with_data = deliver(false);
    EXPECT_EQ(with_keys, with_data);
    if (!filtered)
      EXPECT_EQ(with_keys.size(), static_cast<std::size_t>(n) * static_cast<std::size_t>(epochs) * (expanded ? 2 : 1));
    std::map<I64, int> c;
    for (I64 x : with_keys) ++c[x];
    for (const auto& [x, k] : c) ASSERT_EQ(k, epochs) << "element " << x;
  });
  EXPECT_GT(keyed_entries, 1000u);
}

/// The name of rank r's file in a set directory.
std::string name_of(const std::string& dir, int r) {
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (const auto f = SnapshotSet::parse_file_name(name); f && f->rank == r) return name;
  }
  ADD_FAILURE() << "no file of rank " << r << " in " << dir;
  return "";
}

/// The same name with another tag (its last hex digit changed).
std::string retagged(std::string name) {
  char& c = name[name.size() - std::string(".dpipe").size() - 1];
  c = c == '0' ? '1' : '0';
  return name;
}

TEST(SnapshotSetFiles, RoundTripAndRefuseIncompleteOrMixedSets) {
  auto p = range(0, 100) | sampler() | batch({.size = 4});
  const auto dir = temp_dir("files");
  Engine e;
  for (int r = 0; r < 3; ++r) {
    auto run = e.start(p, at(r, 3, 2));
    run.next();
    SnapshotSet::write_rank(dir, run.snapshot());
    if (r == 1) {
      try {
        SnapshotSet::read_dir(dir);
        FAIL() << "an incomplete set was accepted";
      } catch (const SnapshotError& err) {
        EXPECT_NE(std::string(err.what()).find("ranks present: 2 of 3; first missing: 2"), std::string::npos) << err.what();
      }
    }
  }
  // A file named like a rank's but no rank of this set is refused, naming it.
  for (const char* odd : {"rank-1-of-03.dpipe", "rank-5-of-3.dpipe", "rank--1-of-3.dpipe"}) {
    fs::copy_file(fs::path(dir) / name_of(dir, 1), fs::path(dir) / odd);
    try {
      SnapshotSet::read_dir(dir);
      ADD_FAILURE() << "a set with " << odd << " was accepted";
    } catch (const SnapshotError& err) {
      EXPECT_NE(std::string(err.what()).find(odd), std::string::npos) << err.what();
    }
    fs::remove(fs::path(dir) / odd);
  }
  const auto set = SnapshotSet::read_dir(dir);
  EXPECT_EQ(set.world_size(), 3);
  EXPECT_EQ(set.num_workers(), 2);
  // The same layout resumes without a rescale; another one only when asked.
  EXPECT_NO_THROW(e.resume(p, set, at(1, 3, 2)));
  try {
    e.resume(p, set, at(0, 2, 2));
    FAIL() << "a layout change was accepted without asking for a rescale";
  } catch (const SnapshotError& err) {
    EXPECT_NE(std::string(err.what()).find("rescale"), std::string::npos) << err.what();
  }
  EXPECT_NO_THROW(e.resume(p, set, at(0, 2, 2), {.rescale = true}));
  // A rank file from another run does not join the set.
  auto other = e.start(p, at(0, 3, 2, /*seed=*/5));
  auto bad = set.ranks();
  bad[0] = other.snapshot();
  EXPECT_THROW(SnapshotSet{bad}, SnapshotError);
  fs::remove_all(dir);
}

// ---- set directories: names that let a rank resume from its own file ----------------------------

/// Writes the set of `p` at its `taken`-th element on {world, workers}, each rank at `step(r)`.
template <class P, class Step>
void write_set(const P& p, const std::string& dir, int world, int workers, int taken, Step step) {
  Engine e;
  for (int r = 0; r < world; ++r) {
    auto run = e.start(p, at(r, world, workers));
    for (int i = 0; i < taken; ++i) run.next();
    SnapshotSet::write_rank(dir, run.reproducible_snapshot({}, step(r)));
  }
}

constexpr const char* kManifest = "set.dpipe-manifest";
constexpr const char* kIndex = "set.dpipe-index";

/// The names in `dir`, but for the set's manifest.
std::vector<std::string> names_in(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (const auto n = e.path().filename().string(); n != kManifest && n != kIndex && !n.starts_with(".")) out.push_back(n);
  std::sort(out.begin(), out.end());
  return out;
}

TEST(SnapshotSetFiles, NamesCarryTheSetsIdentityAndParseBack) {
  Engine e;
  auto run = e.start(range(0, 100) | sampler() | batch({.size = 4}), at(2, 5, 3));
  run.next();
  const Snapshot s = run.reproducible_snapshot({}, 1200);
  const std::string name = SnapshotSet::file_name(s.meta);
  EXPECT_TRUE(name.starts_with("rank-2-of-5.w3.s1200.")) << name;
  const auto f = SnapshotSet::parse_file_name(name);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->rank, 2);
  EXPECT_EQ(f->world_size, 5);
  EXPECT_EQ(f->workers, 3);
  EXPECT_EQ(f->step, std::optional<std::uint64_t>(1200));
  EXPECT_TRUE(f->tagged);
  // Another rank of the same snapshot: the same tag. Another seed or step: another.
  auto other_rank = e.start(range(0, 100) | sampler() | batch({.size = 4}), at(4, 5, 3));
  other_rank.next();
  EXPECT_EQ(SnapshotSet::parse_file_name(SnapshotSet::file_name(other_rank.reproducible_snapshot({}, 1200).meta))->tag, f->tag);
  auto other_seed = e.start(range(0, 100) | sampler() | batch({.size = 4}), at(2, 5, 3, 1));
  other_seed.next();
  EXPECT_NE(SnapshotSet::parse_file_name(SnapshotSet::file_name(other_seed.reproducible_snapshot({}, 1200).meta))->tag, f->tag);
  EXPECT_NE(SnapshotSet::parse_file_name(SnapshotSet::file_name(run.reproducible_snapshot({}, 1201).meta))->tag, f->tag);
  // No step: no s-part. Names of before parse, untagged. Anything else is no rank file.
  EXPECT_TRUE(SnapshotSet::file_name(run.reproducible_snapshot().meta).starts_with("rank-2-of-5.w3."));
  EXPECT_FALSE(SnapshotSet::parse_file_name(SnapshotSet::file_name(run.reproducible_snapshot().meta))->step);
  const auto old = SnapshotSet::parse_file_name("rank-1-of-4.dpipe");
  ASSERT_TRUE(old);
  EXPECT_FALSE(old->tagged);
  for (const char* bad : {"rank-1-of-04.dpipe", "rank-4-of-4.dpipe", "rank-1-of-4.w0.0123456789abcdef.dpipe",
                          "rank-1-of-4.w2.s01.0123456789abcdef.dpipe", "rank-1-of-4.w2.0123456789ABCDEF.dpipe",
                          "rank-1-of-4.w2.s5.x.0123456789abcdef.dpipe", "rank-1-of-4.w2.0123456789abcdef.dpip",
                          "rank-1-of-4.w2.s5.0123456789abcde.dpipe", "rank-1-of-99999999999.dpipe"})
    EXPECT_FALSE(SnapshotSet::parse_file_name(bad)) << bad;
}

TEST(SnapshotSetFiles, ASameLayoutResumeReadsOnlyItsOwnFile) {
  const auto p = range(0, 400) | sampler() | shuffle({.buffer = 7}) | batch({.size = 4});
  testing::TempDir d;
  const std::string dir = d.path().string();
  write_set(p, dir, 4, 2, 5, [](int) { return 300; });
  // Every other rank's file is garbage now: read_dir refuses the set, a same-layout read_rank never
  // opens them.
  for (int r : {0, 2, 3}) {
    std::ofstream(fs::path(dir) / name_of(dir, r), std::ios::trunc) << "not a snapshot";
  }
  testing::expect_throw_with<SnapshotError>([&] { SnapshotSet::read_dir(dir); }, "rank 0 (");
  const Snapshot mine = SnapshotSet::read_rank(dir, Layout{1, 4, 2}, false);
  EXPECT_EQ(mine.meta.layout, (Layout{1, 4, 2}));
  EXPECT_EQ(mine.meta.step, std::optional<std::uint64_t>(300));
  // And it continues the stream exactly.
  Engine e;
  auto fresh = e.start(p, at(1, 4, 2));
  for (int i = 0; i < 5; ++i) fresh.next();
  auto resumed = e.resume(p, SnapshotDir{dir}, at(1, 4, 2));
  EXPECT_EQ(testing::drain(resumed), testing::drain(fresh));
  // Another layout reads every file: refused without a rescale before reading any, and the garbage
  // is found with one.
  testing::expect_throw_with<SnapshotError>([&] { SnapshotSet::read_rank(dir, Layout{0, 3, 2}, false); },
                                            "ask for a rescale");
  EXPECT_THROW(SnapshotSet::read_rank(dir, Layout{0, 3, 2}, true), SnapshotError);
}

TEST(SnapshotSetFiles, AsyncWritesLandInTheOrderAskedAndTheLastResumesExactly) {
  // Workers' queues and a shuffle buffer full: the snapshots hold elements in flight.
  const auto p = range(0, 5000) | sampler() | shuffle({.buffer = 64}) | batch({.size = 4});
  testing::TempDir d;
  const std::string dir = d.path().string();
  Engine e;
  auto run = e.start(p, at(0, 1, 2));
  std::vector<std::future<void>> writes;
  std::vector<std::vector<std::vector<I64>>> rest_at;  // what a fresh run gives after each step
  for (std::uint64_t step = 1; step <= 6; ++step) {
    for (int i = 0; i < 7; ++i) ASSERT_TRUE(run.next());
    writes.push_back(SnapshotSet::write_rank_async(dir, run.snapshot({}, step)));
  }
  for (auto& w : writes) w.get();  // every write done, none failed
  // One file: the last step's (an earlier write that landed after it would have removed it as older).
  const auto names = names_in(dir);
  ASSERT_EQ(names.size(), 1u);
  EXPECT_NE(names[0].find(".s6."), std::string::npos) << names[0];
  const Snapshot mine = SnapshotSet::read_rank(dir, Layout{0, 1, 2}, false);
  EXPECT_EQ(mine.meta.step, std::optional<std::uint64_t>(6));
  EXPECT_EQ(mine.meta.elements_delivered, 42u);
  auto resumed = e.resume(p, SnapshotDir{dir}, at(0, 1, 2));
  EXPECT_EQ(testing::drain(resumed), testing::drain(run));
  // A write that fails gives its error through its future, and the writer goes on with the next.
  const std::string file = (d.path() / "a-file").string();
  std::ofstream(file) << "x";
  auto again = e.start(p, at(0, 1, 2));
  again.next();
  auto failed = SnapshotSet::write_rank_async(file, again.snapshot({}, 1));
  EXPECT_THROW(failed.get(), Error);
  const std::string other = (d.path() / "other").string();
  SnapshotSet::write_rank_async(other, again.snapshot({}, 2)).get();
  EXPECT_EQ(SnapshotSet::read_rank(other, Layout{0, 1, 2}, false).meta.step, std::optional<std::uint64_t>(2));
  // A child forked after the writer started has a writer of its own: its write is done, not waited on
  // forever (the snapshot is taken before the fork: the child has none of the engine's threads).
  Snapshot before_fork = again.snapshot({}, 3);
  const std::string child_dir = (d.path() / "child").string();
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    auto w = SnapshotSet::write_rank_async(child_dir, std::move(before_fork));
    const bool done = w.wait_for(std::chrono::seconds(20)) == std::future_status::ready;
    ::_exit(done ? 0 : 3);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_EQ(SnapshotSet::read_rank(child_dir, Layout{0, 1, 2}, false).meta.step, std::optional<std::uint64_t>(3));
}

TEST(SnapshotSetFiles, AMixedSetIsRefusedFromTheNamesNamingRanksAndSteps) {
  const auto p = range(0, 400) | sampler() | batch({.size = 4});
  testing::TempDir d;
  const std::string dir = d.path().string();
  write_set(p, dir, 6, 1, 3, [](int r) { return r == 4 ? 1300 : 1200; });
  testing::expect_throw_with<SnapshotError>([&] { SnapshotSet::read_rank(dir, Layout{0, 6, 1}, false); },
                                            "mixes the snapshots of different steps: step 1200 on ranks 0, 1, 2, 3, 5; "
                                            "step 1300 on rank 4; a set holds the snapshots of one step");
  // One step, but rank 2 from another seed: the tags differ.
  testing::TempDir d2;
  write_set(p, d2.path().string(), 3, 1, 3, [](int) { return 7; });
  Engine e;
  auto other = e.start(p, at(2, 3, 1, /*seed=*/1));
  other.next();
  // Written there, the other run's file is refused before anything of the set changes...
  const auto before = name_of(d2.path().string(), 2);
  testing::expect_throw_with<SnapshotError>([&] { SnapshotSet::write_rank(d2.path().string(), other.reproducible_snapshot({}, 7)); },
                                            "holds the set of another run");
  EXPECT_EQ(name_of(d2.path().string(), 2), before);
  EXPECT_NO_THROW(SnapshotSet::read_rank(d2.path().string(), Layout{2, 3, 1}, false));
  // ...and copied in by hand in place of rank 2's, it is refused when the set is read.
  testing::TempDir elsewhere;
  SnapshotSet::write_rank(elsewhere.path().string(), other.reproducible_snapshot({}, 7));
  fs::remove(fs::path(d2.path()) / before);
  fs::remove(fs::path(d2.path()) / "set.dpipe-manifest");  // a copy by hand leaves no manifest naming it
  fs::remove(fs::path(d2.path()) / "set.dpipe-index");
  const auto copied = name_of(elsewhere.path().string(), 2);
  fs::copy_file(fs::path(elsewhere.path()) / copied, fs::path(d2.path()) / copied);
  testing::expect_throw_with<SnapshotError>([&] { SnapshotSet::read_rank(d2.path().string(), Layout{0, 3, 1}, false); },
                                            "the tags of their file names differ");
  // A file renamed to another rank's tag is caught when its rank reads it.
  testing::TempDir d3;
  const std::string dir3 = d3.path().string();
  write_set(p, dir3, 2, 1, 3, [](int) { return 9; });
  for (int r : {0, 1}) fs::rename(fs::path(dir3) / name_of(dir3, r), fs::path(dir3) / retagged(name_of(dir3, r)));
  testing::expect_throw_with<SnapshotError>([&] { SnapshotSet::read_rank(dir3, Layout{0, 2, 1}, false); },
                                            "must keep the name its rank gave it");
}

TEST(SnapshotSetFiles, TheRemovalLogTellsACompletingRankWhetherAFileOfItsSetWasRemovedSinceItsListing) {
  using detail::RemovalLog;
  constexpr std::uint64_t kMine = 0x5c0b2e9d4a7f1360, kOlder = 0x1111, kOther = 0x2222;
  testing::TempDir d;
  const std::string dir = d.path().string();
  const auto log_size = [&] { return fs::file_size(fs::path(dir) / RemovalLog::kName); };
  // The log is created by its first reader; nothing appended, nothing removed.
  const RemovalLog quiet(dir);
  EXPECT_EQ(log_size(), 0u);
  EXPECT_TRUE(quiet.saw_no_removal_of(kMine));
  // Removals of other sets' files (ranks removing their older snapshots at the same moment) are no reason
  // to list again; a removal of a file of this set, or of a file of no known set, is.
  const RemovalLog completer(dir);
  RemovalLog::record(dir, {kOlder});
  RemovalLog::record(dir, {kOther, kOlder});
  EXPECT_EQ(log_size(), 24u);
  EXPECT_TRUE(completer.saw_no_removal_of(kMine));
  EXPECT_FALSE(completer.saw_no_removal_of(kOther));
  RemovalLog::record(dir, {kMine});
  EXPECT_FALSE(completer.saw_no_removal_of(kMine));
  const RemovalLog later(dir);  // what was appended before its state was read is not its concern
  EXPECT_TRUE(later.saw_no_removal_of(kMine));
  RemovalLog::record(dir, {0});
  EXPECT_FALSE(later.saw_no_removal_of(kMine));
  // Past the cap the appender removes the log; a reader holding the old one sees it removed, then replaced.
  const RemovalLog before_cap(dir);
  fs::resize_file(fs::path(dir) / RemovalLog::kName, RemovalLog::kCap - 8);
  const RemovalLog near_cap(dir);
  RemovalLog::record(dir, {kOlder});
  EXPECT_FALSE(fs::exists(fs::path(dir) / RemovalLog::kName));
  EXPECT_FALSE(near_cap.saw_no_removal_of(kMine));
  RemovalLog::record(dir, {kOlder});
  EXPECT_EQ(log_size(), 8u);
  EXPECT_FALSE(near_cap.saw_no_removal_of(kMine));  // a new file in its place
  EXPECT_FALSE(before_cap.saw_no_removal_of(kMine));
  // A log cut short, or one that is no file (here a directory), tells nothing: taken as changed.
  const RemovalLog whole(dir);
  fs::resize_file(fs::path(dir) / RemovalLog::kName, 4);
  EXPECT_FALSE(whole.saw_no_removal_of(kMine));
  testing::TempDir blocked;
  fs::create_directory(fs::path(blocked.path()) / RemovalLog::kName);
  const RemovalLog cannot(blocked.path().string());
  RemovalLog::record(blocked.path().string(), {kOlder});
  EXPECT_FALSE(cannot.saw_no_removal_of(kMine));
}

// Ranks writing step after step into one directory at once, each at its own pace (threads, no barrier):
// no write fails, and once all are done the directory holds the last step's set, whole, with its manifest.
TEST(SnapshotSetFiles, RanksWritingStepsAtOnceLeaveTheLastSetWholeWithItsManifest) {
  constexpr int kWorld = 4, kSteps = 12;
  const auto p = range(0, 400) | sampler() | batch({.size = 4});
  std::vector<std::vector<Snapshot>> snapshots(kWorld);
  {
    Engine e;
    for (int r = 0; r < kWorld; ++r) {
      auto run = e.start(p, at(r, kWorld, 1));
      for (int k = 1; k <= kSteps; ++k) {
        run.next();
        snapshots[static_cast<std::size_t>(r)].push_back(run.reproducible_snapshot({}, std::uint64_t(k)));
      }
    }
  }
  testing::TempDir d;
  const std::string dir = d.path().string();
  std::vector<std::string> errors(kWorld);
  std::vector<std::thread> ranks;
  for (int r = 0; r < kWorld; ++r)
    ranks.emplace_back([&, r] {
      try {
        for (const Snapshot& s : snapshots[static_cast<std::size_t>(r)]) {
          SnapshotSet::write_rank(dir, s);
          std::this_thread::sleep_for(std::chrono::microseconds(200 * r));  // ranks drift apart
        }
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
  for (auto& t : ranks) t.join();
  for (const auto& e : errors) EXPECT_EQ(e, "");
  const auto names = names_in(dir);
  ASSERT_EQ(names.size(), std::size_t(kWorld));
  for (const auto& n : names) EXPECT_NE(n.find(".s" + std::to_string(kSteps) + "."), std::string::npos) << n;
  ASSERT_TRUE(fs::exists(fs::path(dir) / kManifest));
  std::ifstream in(fs::path(dir) / kManifest);
  std::string manifest;
  std::getline(in, manifest);
  EXPECT_NE(manifest.find(" step=" + std::to_string(kSteps) + " "), std::string::npos) << manifest;
  for (int r = 0; r < kWorld; ++r)
    EXPECT_EQ(SnapshotSet::read_rank(dir, Layout{r, kWorld, 1}, false).to_bytes(),
              snapshots[static_cast<std::size_t>(r)].back().to_bytes());
  // Every rank removed its older file at each of its later steps: 8 bytes each in the removal log.
  EXPECT_EQ(fs::file_size(fs::path(dir) / detail::RemovalLog::kName), std::uintmax_t(kWorld * (kSteps - 1) * 8));
}

TEST(SnapshotSetFiles, WritingARankAgainReplacesItsOlderFileAndOldNamesStayReadable) {
  const auto p = range(0, 400) | sampler() | batch({.size = 4});
  testing::TempDir d;
  const std::string dir = d.path().string();
  write_set(p, dir, 3, 2, 2, [](int) { return 10; });
  write_set(p, dir, 3, 2, 4, [](int) { return 20; });
  const auto names = names_in(dir);
  ASSERT_EQ(names.size(), 3u);
  for (const auto& n : names) EXPECT_NE(n.find(".s20."), std::string::npos) << n;
  // Each rank's removal of its older file is recorded in the removal log: its set's TAG, 8 bytes each.
  EXPECT_EQ(fs::file_size(fs::path(dir) / detail::RemovalLog::kName), 3u * 8);
  EXPECT_EQ(SnapshotSet::read_rank(dir, Layout{2, 3, 2}, false).meta.step, std::optional<std::uint64_t>(20));
  // A set of names of before (rank-R-of-W.dpipe) is read whole and resumes as before.
  testing::TempDir old;
  for (int r = 0; r < 3; ++r)
    fs::copy_file(fs::path(dir) / name_of(dir, r), fs::path(old.path()) / SnapshotSet::file_name(r, 3));
  const Snapshot back = SnapshotSet::read_rank(old.path().string(), Layout{2, 3, 2}, false);
  EXPECT_EQ(back.to_bytes(), SnapshotSet::read_rank(dir, Layout{2, 3, 2}, false).to_bytes());
  // Writing into it again replaces the old names too; two files of one rank are refused by name.
  write_set(p, old.path().string(), 3, 2, 4, [](int) { return 20; });
  EXPECT_EQ(names_in(old.path().string()), names);
  fs::copy_file(fs::path(dir) / names[0], fs::path(dir) / SnapshotSet::file_name(0, 3));
  fs::remove(fs::path(dir) / kManifest);  // which vouched for the set as written: now the listing checks it
  testing::expect_throw_with<SnapshotError>([&] { SnapshotSet::read_rank(dir, Layout{0, 3, 2}, false); },
                                            "holds 2 files for rank 0");
  // Rescaling through a directory gives what rescaling the set gives.
  fs::remove(fs::path(dir) / SnapshotSet::file_name(0, 3));
  // A whole set written over another of the same world size replaces every rank's file.
  testing::TempDir over;
  for (int r = 0; r < 3; ++r) fs::copy_file(fs::path(dir) / name_of(dir, r), fs::path(over.path()) / SnapshotSet::file_name(r, 3));
  write_set(p, over.path().string(), 3, 2, 4, [](int) { return 30; });
  SnapshotSet::read_dir(dir).write_dir(over.path().string());
  EXPECT_EQ(names_in(over.path().string()), names);
  EXPECT_EQ(SnapshotSet::read_rank(dir, Layout{1, 2, 3}, true).to_bytes(),
            SnapshotSet::read_dir(dir).rescaled(2, 3).rank(1).to_bytes());
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

TEST(SnapshotSetFiles, TheWriteThatCompletesASetWritesAManifestThatSparesTheListing) {
  const auto p = range(0, 400) | sampler() | shuffle({.buffer = 5}) | batch({.size = 4});
  testing::TempDir d;
  const std::string dir = d.path().string();
  const fs::path manifest = fs::path(dir) / kManifest;
  Engine e;
  const auto write = [&](int r, std::uint64_t step) {
    auto run = e.start(p, at(r, 3, 2));
    for (int i = 0; i < 3; ++i) run.next();
    SnapshotSet::write_rank(dir, run.reproducible_snapshot({}, step));
  };
  write(0, 10);
  write(1, 10);
  EXPECT_FALSE(fs::exists(manifest));
  write(2, 10);
  ASSERT_TRUE(fs::exists(manifest));
  const std::string name0 = name_of(dir, 0), tag = name0.substr(name0.size() - 22, 16);
  const std::string text = read_text(manifest);
  EXPECT_TRUE(text.starts_with("dpipe-set 1 world=3 workers=2 step=10 tag=" + tag + " crc32c=")) << text;
  // With the manifest a rank opens its own file by name: a stray file the listing refuses is not seen.
  fs::copy_file(fs::path(dir) / name0, fs::path(dir) / "rank-1-of-03.dpipe");
  EXPECT_EQ(SnapshotSet::read_rank(dir, Layout{1, 3, 2}, false).meta.step, std::optional<std::uint64_t>(10));
  testing::expect_throw_with<SnapshotError>([&] { SnapshotSet::read_dir(dir); }, "rank-1-of-03.dpipe");
  // A damaged manifest (its checksum's last digit changed) is not trusted: the set is listed.
  std::string damaged = text;
  damaged[damaged.size() - 2] = damaged[damaged.size() - 2] == '0' ? '1' : '0';
  std::ofstream(manifest, std::ios::binary | std::ios::trunc) << damaged;
  testing::expect_throw_with<SnapshotError>([&] { SnapshotSet::read_rank(dir, Layout{1, 3, 2}, false); },
                                            "rank-1-of-03.dpipe");
  fs::remove(fs::path(dir) / "rank-1-of-03.dpipe");
  std::ofstream(manifest, std::ios::binary | std::ios::trunc) << text;
  // A rank writing its next snapshot removes the manifest before its file changes: the mixed set is
  // found by the listing.
  write(0, 20);
  EXPECT_FALSE(fs::exists(manifest));
  testing::expect_throw_with<SnapshotError>([&] { SnapshotSet::read_rank(dir, Layout{1, 3, 2}, false); },
                                            "mixes the snapshots of different steps");
  // A manifest of the old step put back (as a rank that had found that set complete could write it
  // late) is removed by the next rank that writes, before its file changes; the write completing the
  // new set writes its own.
  std::ofstream(manifest, std::ios::binary | std::ios::trunc) << text;
  write(1, 20);
  EXPECT_FALSE(fs::exists(manifest));
  write(2, 20);
  EXPECT_TRUE(read_text(manifest).starts_with("dpipe-set 1 world=3 workers=2 step=20 ")) << read_text(manifest);
  // A manifest whose rank file is gone: that rank lists the set and finds it incomplete.
  fs::remove(fs::path(dir) / name_of(dir, 2));
  testing::expect_throw_with<SnapshotError>([&] { SnapshotSet::read_rank(dir, Layout{2, 3, 2}, false); },
                                            "ranks present: 2 of 3");
  write(2, 20);
  // A whole set written, or rescaled offline, comes with its manifest.
  testing::TempDir copy, out;
  SnapshotSet::read_dir(dir).write_dir(copy.path().string());
  EXPECT_EQ(read_text(copy.path() / kManifest), read_text(manifest));
  fs::remove(out.path());
  SnapshotSet::rescale_dir(dir, out.path().string(), 2, 1);
  EXPECT_TRUE(read_text(out.path() / kManifest).starts_with("dpipe-set 1 world=2 workers=1 step=20 "));
  EXPECT_EQ(SnapshotSet::read_rank(out.path().string(), Layout{1, 2, 1}, false).to_bytes(),
            SnapshotSet::read_dir(dir).rescaled(2, 1).rank(1).to_bytes());
}

// ---- a rescale through a directory reads the state indexes and the element lists it deals ----------

/// Where section `id` of the snapshot file `path` lies (docs/snapshot-format.md: a 32-byte header, then
/// 24-byte entries of id, checksum, offset and length).
std::pair<std::uint64_t, std::uint64_t> section_of(const std::string& path, std::uint32_t id) {
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::uint32_t count = 0;
  std::memcpy(&count, bytes.data() + 12, 4);
  for (std::uint32_t i = 0; i < count; ++i) {
    const char* e = bytes.data() + 32 + 24 * i;
    std::uint32_t sid = 0;
    std::uint64_t off = 0, len = 0;
    std::memcpy(&sid, e, 4);
    std::memcpy(&off, e + 8, 8);
    std::memcpy(&len, e + 16, 8);
    if (sid == id) return {off, len};
  }
  ADD_FAILURE() << path << " has no section " << id;
  return {0, 0};
}

/// Overwrites section `id` of the snapshot file at `path` with garbage of the same length; returns the length.
std::uint64_t garble_section(const std::string& path, std::uint32_t id) {
  const auto [offset, length] = section_of(path, id);
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(static_cast<std::streamoff>(offset));
  const std::string garbage(static_cast<std::size_t>(length), 'x');
  f.write(garbage.data(), static_cast<std::streamsize>(garbage.size()));
  return length;
}

/// A predicate that counts its calls as a Python callable does (kit/call_count.hpp): its filter saves the count.
struct CountingKeep {
  mutable std::uint64_t calls = 0;
  bool counted_from_resume = false;
  bool operator()(I64 x) const { return ++calls, x % 7 != 0; }
};

/// Whether any record of `s` holds an input count.
bool holds_input_count(const Snapshot& s) {
  for (const auto& st : s.states)
    for (const auto& f : st.fields)
      if (f.name == kInputTakenField) return true;
  return false;
}

TEST(SnapshotSetFiles, ARescaleThroughADirectoryGivesWhatRescalingTheSetGives) {
  const auto sampled = range(0, 3000) | sampler({.shuffle = SamplerShuffle::global});
  // Shuffle buffers of 60 (stored apart in the state index) and of 3 (inline), batches, queues; a
  // dispatch; a merge with a suffix.
  const std::vector<std::pair<std::string, Pipeline<std::vector<I64>>>> pipelines = {
      {"shuffle(60) → batch(4)", sampled | shuffle({.buffer = 60}) | batch({.size = 4})},
      {"shuffle(3) → batch(5)", sampled | shuffle({.buffer = 3}) | batch({.size = 5})},
      {"dispatch → shuffle(40) → batch(3)", sampled | dispatch() | shuffle({.buffer = 40}) | batch({.size = 3})},
      {"merge → shuffle(70) → batch(2)", sampled | prefetch({.depth = 3}) | merge() | shuffle({.buffer = 70}) | batch({.size = 2})},
      // A filter whose records hold its input count, which the index leaves out and every rescale drops.
      {"counting filter → batch(4)", sampled | filter(CountingKeep{}) | batch({.size = 4})},
  };
  for (const auto& [what, p] : pipelines) {
    SCOPED_TRACE(what);
    testing::TempDir d;
    const std::string dir = d.path().string();
    write_set(p, dir, 4, 2, 9, [](int) { return 50; });
    ASSERT_FALSE(fs::exists(fs::path(dir) / kIndex));  // left to the first rescale, which writes it
    const SnapshotSet whole = SnapshotSet::read_dir(dir);
    const bool counts = what.starts_with("counting");
    EXPECT_EQ(holds_input_count(whole.rank(0)), counts);
    EXPECT_FALSE(holds_input_count(whole.rescaled(3, 2).rank(0)));
    // Through the set index, then (index and manifest removed: the set is listed) through every rank's
    // state index.
    for (const bool index : {true, false}) {
      if (!index) {
        ASSERT_TRUE(fs::exists(fs::path(dir) / kIndex));
        fs::remove(fs::path(dir) / kIndex);
        fs::remove(fs::path(dir) / kManifest);
      }
      for (const auto& [world, workers] : {std::pair{3, 2}, {2, 3}, {5, 1}, {1, 4}, {4, 2}}) {
        if (world == 4 && workers == 2) continue;  // the set's own layout reads one file
        const SnapshotSet expected = whole.rescaled(world, workers);
        for (int r = 0; r < world; ++r)
          EXPECT_EQ(SnapshotSet::read_rank(dir, Layout{r, world, workers}, true).to_bytes(), expected.rank(r).to_bytes())
              << "rank " << r << " of " << world << " x " << workers << (index ? " through the index" : "");
        // The rescaled records resume (each filter counting from the resume, as none has a count).
        if (counts && world == 3) {
          Engine e;
          auto resumed = e.resume(p, SnapshotSet::read_rank(dir, Layout{1, 3, 2}, true), at(1, 3, 2));
          EXPECT_FALSE(testing::drain(resumed).empty());
        }
      }
    }
  }
}

// The set index: one file a rescale reads instead of every rank's state index.
TEST(SnapshotSetIndex, ARescaleThroughTheIndexReadsNoOtherRanksStateIndex) {
  const auto p = range(0, 3000) | sampler() | shuffle({.buffer = 60}) | batch({.size = 4});
  testing::TempDir d;
  const std::string dir = d.path().string();
  write_set(p, dir, 4, 2, 9, [](int) { return 50; });
  const SnapshotSet expected = SnapshotSet::read_dir(dir).rescaled(3, 2);
  // The first rescale (new rank 2's) writes the index, reading every rank's state index once.
  EXPECT_EQ(SnapshotSet::read_rank(dir, Layout{2, 3, 2}, true).to_bytes(), expected.rank(2).to_bytes());
  ASSERT_TRUE(fs::exists(fs::path(dir) / kIndex));
  // Old rank 3's state index is garbage now: its elements are dealt to the last new rank only, and its
  // numbers are in the set index, so new rank 0 never opens its state index.
  garble_section((fs::path(dir) / name_of(dir, 3)).string(), 5);
  EXPECT_EQ(SnapshotSet::read_rank(dir, Layout{0, 3, 2}, true).to_bytes(), expected.rank(0).to_bytes());
  // Without the index, none can be written from the damaged set: every rank's state index is read, and
  // the damage is found.
  fs::remove(fs::path(dir) / kIndex);
  testing::expect_throw_with<SnapshotError>([&] { SnapshotSet::read_rank(dir, Layout{0, 3, 2}, true); }, "rank 3");
  EXPECT_FALSE(fs::exists(fs::path(dir) / kIndex));
}

// The write that completes a set leaves the index to the first rescale: it creates the directory's lock
// and writes the index; a reader that finds the lock waits for the index and reads through it; one
// whose builder gave up reads the rank files; a lock a killed builder left (old) is taken over.
TEST(SnapshotSetIndex, TheFirstRescaleWritesTheIndexAndOthersWaitForIt) {
  const auto p = range(0, 3000) | sampler() | shuffle({.buffer = 60}) | batch({.size = 4});
  testing::TempDir d;
  const std::string dir = d.path().string();
  const fs::path index = fs::path(dir) / kIndex, lock = fs::path(dir) / ".set.dpipe-index.building";
  write_set(p, dir, 4, 2, 9, [](int) { return 50; });
  ASSERT_TRUE(fs::exists(fs::path(dir) / kManifest));
  ASSERT_FALSE(fs::exists(index));
  const SnapshotSet expected = SnapshotSet::read_dir(dir).rescaled(3, 2);
  ASSERT_TRUE(SnapshotSet::write_index(dir));
  std::string built;
  {
    std::ifstream in(index, std::ios::binary);
    built.assign(std::istreambuf_iterator<char>(in), {});
  }
  fs::remove(index);
  // Old rank 3's state index garbage: a reader that read the rank files would fail naming it.
  garble_section((fs::path(dir) / name_of(dir, 3)).string(), 5);
  testing::write_bytes(lock.string(), "");
  std::thread builder([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    testing::write_bytes(index.string() + ".tmp", built);
    fs::rename(index.string() + ".tmp", index);
    fs::remove(lock);
  });
  EXPECT_EQ(SnapshotSet::read_rank(dir, Layout{0, 3, 2}, true).to_bytes(), expected.rank(0).to_bytes());
  builder.join();
  // A builder that gives up (its lock gone, no index): the reader reads the rank files.
  fs::remove(index);
  testing::write_bytes(lock.string(), "");
  std::thread quitter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    fs::remove(lock);
  });
  testing::expect_throw_with<SnapshotError>([&] { SnapshotSet::read_rank(dir, Layout{0, 3, 2}, true); }, "rank 3");
  quitter.join();
  // A lock an hour old, on an intact set: taken over, the index written, the lock removed.
  testing::TempDir d2;
  const std::string dir2 = d2.path().string();
  write_set(p, dir2, 4, 2, 9, [](int) { return 50; });
  const fs::path lock2 = fs::path(dir2) / ".set.dpipe-index.building";
  testing::write_bytes(lock2.string(), "");
  fs::last_write_time(lock2, fs::file_time_type::clock::now() - std::chrono::hours(1));
  EXPECT_EQ(SnapshotSet::read_rank(dir2, Layout{1, 3, 2}, true).to_bytes(), expected.rank(1).to_bytes());
  EXPECT_TRUE(fs::exists(fs::path(dir2) / kIndex));
  EXPECT_FALSE(fs::exists(lock2));
}

TEST(SnapshotSetIndex, ADamagedOrForeignIndexIsPassedOverAndTheRankFilesAreRead) {
  const auto p = range(0, 2000) | sampler() | shuffle({.buffer = 30}) | batch({.size = 3});
  testing::TempDir d, other;
  const std::string dir = d.path().string();
  write_set(p, dir, 3, 2, 7, [](int) { return 5; });
  write_set(p, other.path().string(), 3, 2, 8, [](int) { return 6; });
  ASSERT_TRUE(SnapshotSet::write_index(other.path().string()));
  const SnapshotSet expected = SnapshotSet::read_dir(dir).rescaled(2, 2);
  const auto check = [&](const std::string& what) {
    for (int r = 0; r < 2; ++r)
      EXPECT_EQ(SnapshotSet::read_rank(dir, Layout{r, 2, 2}, true).to_bytes(), expected.rank(r).to_bytes()) << what;
  };
  check("the index the first rescale wrote");
  const fs::path index = fs::path(dir) / kIndex;
  std::string bytes;
  {
    std::ifstream in(index, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  for (const std::size_t at : {std::size_t{3}, std::size_t{12}, bytes.size() / 2, bytes.size() - 1}) {
    std::string flipped = bytes;
    flipped[at] = static_cast<char>(flipped[at] ^ 0x20);
    testing::write_bytes(index.string(), flipped);
    check("a byte flipped at " + std::to_string(at));
  }
  testing::write_bytes(index.string(), bytes.substr(0, bytes.size() / 3));
  check("a truncated index");
  fs::copy_file(fs::path(other.path()) / kIndex, index, fs::copy_options::overwrite_existing);
  check("the index of another set (another step)");
}

/// Where the chunks of one sequence of a set index lie (read from its directory as docs/snapshot-format.md
/// lays it out): file offsets and lengths, in order.
struct IndexChunks {
  std::vector<std::pair<std::uint64_t, std::uint64_t>> chunks;
};
/// The chunks of the list sequence of column `column` of the node whose key starts with `node`.
IndexChunks list_chunks_of(const std::string& bytes, const std::string& node, const std::string& column) {
  std::size_t at = 12;
  const auto u32 = [&] {
    std::uint32_t v = 0;
    std::memcpy(&v, bytes.data() + at, 4);
    at += 4;
    return v;
  };
  const std::uint32_t directory = u32();
  u32();  // its CRC
  const std::uint64_t parts = 20 + std::uint64_t(directory);
  const auto varint = [&] {
    std::uint64_t v = 0;
    for (int shift = 0;; shift += 7) {
      const auto b = static_cast<std::uint8_t>(bytes.at(at++));
      v |= std::uint64_t(b & 0x7f) << shift;
      if (!(b & 0x80)) return v;
    }
  };
  const auto text = [&] {
    const auto n = static_cast<std::size_t>(varint());
    at += n;
    return bytes.substr(at - n, n);
  };
  const auto part = [&] { varint(), varint(), u32(); };
  IndexChunks found;
  const auto sequence = [&](bool wanted) {
    const auto form = static_cast<std::uint8_t>(bytes.at(at++));
    if (form == 0) {
      text();
    } else if (form == 1) {
      varint(), varint();
    } else {
      varint();  // values per chunk
      std::uint64_t offset = parts + varint();
      for (std::uint64_t m = varint(); m > 0; --m) {
        const std::uint64_t length = varint();
        u32();
        if (wanted) found.chunks.emplace_back(offset, length);
        offset += length;
      }
    }
  };
  text(), varint(), varint();  // identity, W, K
  for (std::uint64_t n = varint(); n > 0; --n) {
    const std::uint64_t length = varint(), end = at + length;
    const std::string key = text();
    text();  // kind
    varint();  // rows
    if (bytes.at(at++) == 0) part(), part();
    if (bytes.at(at++) == 0) part();
    for (std::uint64_t c = varint(); c > 0; --c) {
      const std::string name = text();
      const auto type = bytes.at(at++);
      if (type == 4) text();
      if (bytes.at(at++) == 0) part();
      sequence(false);
      if (type == 4) sequence(key.rfind(node, 0) == 0 && name == column);
    }
    EXPECT_EQ(at, end) << key;
    at = static_cast<std::size_t>(end);
  }
  return found;
}

TEST(SnapshotSetIndex, ARankReadsOnlyTheChunksOfTheRowsItTakesElementsFrom) {
  // 72 ranks of 4 workers: 288 shuffle buffers, whose places lie in two chunks (rows 0–255, 256–287).
  const auto p = range(0, 72 * 4 * 2000) | sampler() | shuffle({.buffer = 10}) | batch({.size = 2});
  testing::TempDir d;
  const std::string dir = d.path().string();
  write_set(p, dir, 72, 4, 20, [](int) { return 3; });
  const SnapshotSet expected = SnapshotSet::read_dir(dir).rescaled(54, 4);
  ASSERT_TRUE(SnapshotSet::write_index(dir));
  // Old rank 35's state index is garbage now: new ranks 0 and 53 take no elements from it, so through the
  // index they never read it; without the index every rank reads every state index.
  garble_section((fs::path(dir) / name_of(dir, 35)).string(), 5);
  EXPECT_EQ(SnapshotSet::read_rank(dir, Layout{53, 54, 4}, true).to_bytes(), expected.rank(53).to_bytes());
  const fs::path index = fs::path(dir) / kIndex;
  std::string bytes;
  {
    std::ifstream in(index, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  const auto buffers = list_chunks_of(bytes, "shuffle", "buffer");
  ASSERT_EQ(buffers.chunks.size(), 2u);
  // The second chunk damaged: new rank 0 takes elements from the first old buffers only, reads the first
  // chunk only, and rescales through the index.
  const auto [offset, length] = buffers.chunks[1];
  bytes[static_cast<std::size_t>(offset + length / 2)] ^= 0x40;
  testing::write_bytes(index.string(), bytes);
  EXPECT_EQ(SnapshotSet::read_rank(dir, Layout{0, 54, 4}, true).to_bytes(), expected.rank(0).to_bytes());
  // New rank 53 takes elements from the last: it finds the chunk damaged, passes the index over and reads
  // every rank's state index, old rank 35's too.
  testing::expect_throw_with<SnapshotError>([&] { SnapshotSet::read_rank(dir, Layout{53, 54, 4}, true); }, "rank 35");
}

TEST(SnapshotSetIndex, ARankWritingItsStepAgainRebuildsTheIndex) {
  const auto p = range(0, 2000) | sampler() | shuffle({.buffer = 30}) | batch({.size = 3});
  testing::TempDir d;
  const std::string dir = d.path().string();
  write_set(p, dir, 2, 2, 7, [](int) { return 5; });
  ASSERT_TRUE(SnapshotSet::write_index(dir));
  // Rank 1 writes step 5 again from another position (a job restarted from before step 5): the index of
  // its older file goes, and the first rescale writes it again.
  Engine e;
  auto run = e.start(p, at(1, 2, 2));
  for (int i = 0; i < 19; ++i) run.next();
  SnapshotSet::write_rank(dir, run.reproducible_snapshot({}, 5));
  ASSERT_FALSE(fs::exists(fs::path(dir) / kIndex));
  const SnapshotSet expected = SnapshotSet::read_dir(dir).rescaled(3, 1);
  for (int r = 0; r < 3; ++r)
    EXPECT_EQ(SnapshotSet::read_rank(dir, Layout{r, 3, 1}, true).to_bytes(), expected.rank(r).to_bytes()) << r;
}

TEST(SnapshotSetIndex, AnOfflineRescaleWritesTheNewSetsIndex) {
  const auto p = range(0, 3000) | sampler() | dispatch() | shuffle({.buffer = 20}) | batch({.size = 4});
  testing::TempDir d, out;
  const std::string dir = d.path().string(), to = (out.path() / "new").string();
  write_set(p, dir, 3, 2, 6, [](int) { return 9; });
  SnapshotSet::rescale_dir(dir, to, 2, 3);
  ASSERT_TRUE(fs::exists(fs::path(to) / kIndex));
  const SnapshotSet rescaled = SnapshotSet::read_dir(to);
  const SnapshotSet expected = rescaled.rescaled(4, 1);
  for (int r = 0; r < 4; ++r)
    EXPECT_EQ(SnapshotSet::read_rank(to, Layout{r, 4, 1}, true).to_bytes(), expected.rank(r).to_bytes()) << r;
}

TEST(SnapshotSetFiles, ARescaleThroughADirectoryReadsOnlyTheElementListsDealtToItsRank) {
  const auto p = range(0, 3000) | sampler() | shuffle({.buffer = 60}) | batch({.size = 4});
  testing::TempDir d;
  const std::string dir = d.path().string();
  write_set(p, dir, 4, 2, 9, [](int) { return 50; });
  const SnapshotSet expected = SnapshotSet::read_dir(dir).rescaled(3, 2);
  // Old rank 3's node states are garbage now; its state index (where the lists lie) is intact. Its
  // elements are dealt to the last new rank only: the first reads around them.
  ASSERT_GT(garble_section((fs::path(dir) / name_of(dir, 3)).string(), 2), 1000u);
  testing::expect_throw_with<SnapshotError>([&] { SnapshotSet::read_dir(dir); }, "checksum mismatch");
  EXPECT_EQ(SnapshotSet::read_rank(dir, Layout{0, 3, 2}, true).to_bytes(), expected.rank(0).to_bytes());
  testing::expect_throw_with<SnapshotError>([&] { SnapshotSet::read_rank(dir, Layout{2, 3, 2}, true); },
                                            "does not match its checksum in the state index");
}

// A sampler's rule reads its skipped positions: when a rescale left many (an instance that ran far ahead
// because a filter dropped all it read), they are stored apart, and the plan loads them to deal again.
TEST(SnapshotSetFiles, ARescaleThroughADirectoryLoadsTheListsARuleReads) {
  const auto p = range(0, 4000) | sampler({.shuffle = SamplerShuffle::none}) | filter([](I64 x) { return x % 4 != 0; }) |
                 batch({.size = 3});
  Engine e;
  std::vector<I64> delivered;
  auto take = [&](dpipe::Run<std::vector<I64>>& run, int n) {
    for (int i = 0; i < n; ++i)
      if (auto b = run.next()) delivered.insert(delivered.end(), b->begin(), b->end());
    return SnapshotSet(std::vector<Snapshot>{run.reproducible_snapshot()});
  };
  // 1 rank × 4 workers: instance 0 reads positions ≡ 0 mod 4 and drops them all, running ahead.
  auto run4 = e.start(p, at(0, 1, 4));
  const SnapshotSet first = take(run4, 30);
  // Onto 1 × 1: the positions taken above the frontier become the new instance's skip list.
  auto run1 = e.resume(p, first, at(0, 1, 1), {.rescale = true});
  const SnapshotSet second = take(run1, 2);
  // The premise: the skip list is long enough to be stored apart (more than 256 bytes: 16 positions).
  const NodeState* sampler_record = nullptr;
  for (const auto& st : second.rank(0).states)
    if (st.kind == "sampler") sampler_record = &st;
  ASSERT_NE(sampler_record, nullptr);
  const auto skip = std::find_if(sampler_record->fields.begin(), sampler_record->fields.end(),
                                 [](const Field& f) { return f.name == "skip"; });
  ASSERT_NE(skip, sampler_record->fields.end());
  EXPECT_GT(skip->elements.size(), 16u);
  testing::TempDir d;
  const std::string dir = d.path().string();
  second.write_dir(dir);
  for (const auto& [world, workers] : {std::pair{2, 1}, {1, 3}})
    for (int r = 0; r < world; ++r)
      EXPECT_EQ(SnapshotSet::read_rank(dir, Layout{r, world, workers}, true).to_bytes(),
                second.rescaled(world, workers).rank(r).to_bytes());
  // And every element still comes once, resumed through the directory.
  auto run = e.resume(p, SnapshotDir{dir}, at(0, 1, 3), {.rescale = true});
  for (auto&& b : run) delivered.insert(delivered.end(), b.begin(), b.end());
  const auto c = counts(delivered);
  EXPECT_EQ(c.size(), 3000u);
  EXPECT_TRUE(std::all_of(c.begin(), c.end(), [](const auto& kv) { return kv.second == 1; }));
}

// The offline rescale streams one new rank at a time into a directory beside the target, renamed into
// place once every file is durable: the target holds the whole new set, or nothing.
TEST(SnapshotSetFiles, AnOfflineRescaleWritesTheWholeNewSetOrNothing) {
  const auto p = range(0, 3000) | sampler() | shuffle({.buffer = 60}) | batch({.size = 4});
  testing::TempDir d;
  const std::string dir = (d.path() / "old").string(), out = (d.path() / "new").string();
  write_set(p, dir, 4, 2, 9, [](int) { return 50; });
  const SnapshotSet expected = SnapshotSet::read_dir(dir).rescaled(3, 2);
  std::vector<int> seen;
  SnapshotSet::rescale_dir(dir, out, 3, 2, [&](const Snapshot& s) { seen.push_back(s.meta.layout.rank); });
  EXPECT_EQ(seen, (std::vector<int>{0, 1, 2}));
  const SnapshotSet written = SnapshotSet::read_dir(out);
  ASSERT_EQ(written.world_size(), 3);
  for (int r = 0; r < 3; ++r) EXPECT_EQ(written.rank(r).to_bytes(), expected.rank(r).to_bytes()) << "rank " << r;
  // Into an empty directory too; a directory with anything in it is refused, untouched.
  const std::string empty = (d.path() / "empty").string();
  fs::create_directory(empty);
  SnapshotSet::rescale_dir(dir, empty, 2, 1);
  EXPECT_EQ(SnapshotSet::read_dir(empty).world_size(), 2);
  testing::expect_throw_with<FileError>([&] { SnapshotSet::rescale_dir(dir, empty, 5, 1); }, "not an empty directory");
  EXPECT_EQ(SnapshotSet::read_dir(empty).world_size(), 2);
  // A damaged old file stops the rescale: no target, and nothing left beside it.
  garble_section((fs::path(dir) / name_of(dir, 3)).string(), 2);
  const std::string failed = (d.path() / "failed").string();
  testing::expect_throw_with<SnapshotError>([&] { SnapshotSet::rescale_dir(dir, failed, 3, 2); }, "checksum");
  EXPECT_FALSE(fs::exists(failed));
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(d.path())) left.push_back(e.path().filename().string());
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{"empty", "new", "old"}));
}

// Sets written before format 3 have no state index: a rescale reads them whole, as before, whether
// their files carry the names of before or today's.
// An offline rescale to many ranks plans them in batches (at least 512 new ranks each), dealing the old
// records again for each: the files are those of the whole rescale, lists dealt across a batch boundary
// included.
TEST(SnapshotSetFiles, AnOfflineRescaleToManyRanksPlansThemInBatches) {
  const auto p = range(0, 3000) | sampler() | shuffle({.buffer = 60}) | batch({.size = 4});
  testing::TempDir d;
  const std::string dir = (d.path() / "old").string(), out = (d.path() / "new").string();
  write_set(p, dir, 4, 2, 9, [](int) { return 50; });
  constexpr int kWorld = 1100;  // batches of 512, 512 and 76 new ranks
  const SnapshotSet expected = SnapshotSet::read_dir(dir).rescaled(kWorld, 1);
  int next = 0;
  bool in_order = true;
  SnapshotSet::rescale_dir(dir, out, kWorld, 1, [&](const Snapshot& s) {
    in_order = in_order && s.meta.layout.rank == next;
    ++next;
  });
  EXPECT_TRUE(in_order);
  EXPECT_EQ(next, kWorld);
  const SnapshotSet written = SnapshotSet::read_dir(out);
  ASSERT_EQ(written.world_size(), kWorld);
  std::size_t differing = 0;
  for (int r = 0; r < kWorld; ++r) differing += written.rank(r).to_bytes() != expected.rank(r).to_bytes();
  EXPECT_EQ(differing, 0u);
}

TEST(SnapshotSetFiles, ASetOfFormatTwoIsRescaledWhole) {
  const char* root = std::getenv("DPIPE_SOURCE_ROOT");
  if (!root) GTEST_SKIP() << "DPIPE_SOURCE_ROOT is not set (meson test sets it)";
  const std::string old_names = std::string(root) + "/tests/data/snapshots/v2/set-sampled";
  const SnapshotSet whole = SnapshotSet::read_dir(old_names);
  EXPECT_EQ(whole.rank(0).meta.format_version, 2u);
  testing::TempDir d;
  for (int r = 0; r < 2; ++r)
    fs::copy_file(fs::path(old_names) / SnapshotSet::file_name(r, 2),
                  d.path() / SnapshotSet::file_name(whole.rank(r).meta));
  for (const std::string& dir : {old_names, d.path().string()})
    for (int r = 0; r < 3; ++r)
      EXPECT_EQ(SnapshotSet::read_rank(dir, Layout{r, 3, 1}, true).to_bytes(), whole.rescaled(3, 1).rank(r).to_bytes())
          << dir;
}

// A rank that rescales for itself computes every new slot but builds only its own records and lists: the
// ones it builds are those of the whole rescale, the others stay empty.
TEST(Rescale, ARankRescalingForItselfBuildsOnlyItsOwnSlots) {
  std::vector<ElementBlobs> lists(3);
  for (int i = 0; i < 5; ++i) lists[0].append("a" + std::to_string(i));
  for (int i = 0; i < 7; ++i) lists[2].append("c" + std::to_string(i));
  const std::vector<const ElementBlobs*> pool = {&lists[0], &lists[1], &lists[2]};
  NodeState old;
  old.key = "batch@1";
  old.kind = "batch";
  // Per worker: 3 ranks × 2 workers; rank 1 wants slots 2 and 3.
  const RescaleInput mine{{&old}, Layout{0, 2, 2}, Layout{0, 3, 2}, false, nullptr, 1, 2};
  const RescaleInput every{{&old}, Layout{0, 2, 2}, Layout{0, 3, 2}, false, nullptr};
  const auto all = every.deal(pool), own = mine.deal(pool);
  ASSERT_EQ(all.size(), 6u);
  ASSERT_EQ(own.size(), 6u);
  std::size_t dealt = 0;
  for (std::size_t j = 0; j < 6; ++j) {
    dealt += all[j].size();
    EXPECT_EQ(mine.wanted(j), j == 2 || j == 3) << j;
    if (mine.wanted(j)) {
      EXPECT_EQ(own[j].data, all[j].data) << j;
      EXPECT_EQ(own[j].offsets, all[j].offsets) << j;
      EXPECT_GT(own[j].size(), 0u) << j;
    } else {
      EXPECT_EQ(own[j].size(), 0u) << j;
    }
  }
  EXPECT_EQ(dealt, 12u);
  const auto records = mine.write(std::vector<BatchState<ElementBlobs>>(6));
  ASSERT_EQ(records.size(), 6u);
  for (std::size_t j = 0; j < 6; ++j) {
    EXPECT_EQ(records[j].key, mine.wanted(j) ? "batch@1" : "") << j;
    EXPECT_EQ(records[j].fields.empty(), !mine.wanted(j)) << j;
  }
  // Once per rank (merge deals to every worker of a rank): rank 2 of 3 wants parts 4 and 5 of 6.
  const RescaleInput merge_mine{{&old}, Layout{0, 2, 2}, Layout{0, 3, 2}, true, nullptr, 2};
  const RescaleInput merge_every{{&old}, Layout{0, 2, 2}, Layout{0, 3, 2}, true, nullptr};
  const auto parts = merge_mine.deal(pool, 2), all_parts = merge_every.deal(pool, 2);
  ASSERT_EQ(parts.size(), 6u);
  for (std::size_t k = 0; k < 6; ++k) EXPECT_EQ(parts[k].data, k >= 4 ? all_parts[k].data : "") << k;
  EXPECT_EQ(parts[5].at(parts[5].size() - 1), "c6");
}

// The registered rules themselves, on records built by hand with elements held (a running pipeline's
// batch snapshot holds no partial batch, so only a hand-built state meets the rule with one): every held
// element reaches exactly one new instance, and again through a second rescale taken before any drained.
namespace {
template <class State>
std::multiset<std::string> held_after(const char* kind, const std::vector<NodeState>& records, Layout from, Layout to,
                                      ElementBlobs State::*list, std::vector<NodeState>* out = nullptr) {
  std::vector<const NodeState*> old;
  for (const auto& r : records) old.push_back(&r);
  const RescaleInput in{old, from, to, false, nullptr};
  const std::vector<NodeState> made = find_kind(kind)->rescale.apply(in);
  EXPECT_EQ(made.size(), static_cast<std::size_t>(to.instances())) << kind;
  std::multiset<std::string> held;
  for (const auto& record : made) {
    State st;
    StateReader r(record);
    r.read(st);
    r.finish();
    for (std::size_t i = 0; i < (st.*list).size(); ++i) held.insert(std::string((st.*list).at(i)));
  }
  if (out) *out = made;
  return held;
}
}  // namespace

TEST(Rescale, TheRegisteredRulesDealEveryHeldElementOnceThroughTwoRescales) {
  using B = BatchState<ElementBlobs>;
  using S = ShuffleState<ElementBlobs>;
  std::vector<NodeState> batches(2), shuffles(2);
  std::multiset<std::string> all;
  for (std::uint32_t i = 0; i < 2; ++i) {
    B b;
    S sh;
    sh.rng = Rng::derive(1, "s", i);
    for (int k = 0; k < 3 + static_cast<int>(i); ++k) {
      const std::string x = "e" + std::to_string(i) + "." + std::to_string(k);
      b.partial.append(x);
      sh.buffer.append(x);
      all.insert(x);
    }
    batches[i] = {"batch@1", "batch", i, StateMode::hook, {}};
    StateWriter(batches[i]).write(b);
    shuffles[i] = {"shuffle@1", "shuffle", i, StateMode::hook, {}};
    StateWriter(shuffles[i]).write(sh);
  }
  std::vector<NodeState> once;
  EXPECT_EQ(held_after("batch", batches, Layout{0, 2, 1}, Layout{0, 3, 1}, &B::partial, &once), all);
  EXPECT_EQ(held_after("batch", once, Layout{0, 3, 1}, Layout{0, 2, 2}, &B::partial), all);
  EXPECT_EQ(held_after("shuffle", shuffles, Layout{0, 2, 1}, Layout{0, 3, 1}, &S::buffer, &once), all);
  EXPECT_EQ(held_after("shuffle", once, Layout{0, 3, 1}, Layout{0, 1, 1}, &S::buffer), all);
}

/// The snapshots of every rank of `world` × `workers` after `taken(rank)` elements of `p`.
template <class P, class Taken>
std::vector<Snapshot> rank_snapshots(const P& p, int world, int workers, Taken taken) {
  Engine e;
  std::vector<Snapshot> out;
  for (int r = 0; r < world; ++r) {
    auto run = e.start(p, at(r, world, workers));
    for (int i = 0; i < taken(r); ++i) run.next();
    out.push_back(run.reproducible_snapshot({}, 7));
  }
  return out;
}

// An offline rescale checks what a resume checks before any node runs, on the records it reads and on
// those it makes, and refuses before anything is written, naming the old record that is wrong.
TEST(Rescale, ARecordNoResumeWouldTakeIsRefusedNamingItsInstance) {
  const auto p = range(0, 400) | sampler() | batch({.size = 4});
  Engine e;
  std::vector<Snapshot> ranks = rank_snapshots(p, 2, 2, [](int) { return 10; });
  EXPECT_NO_THROW(SnapshotSet(ranks).rescaled(3, 1));
  for (auto& st : ranks[1].states)
    if (st.key == "merge@out")
      for (auto& f : st.fields)
        if (f.name == "cursor") f.u = 5;
  testing::expect_throw_with<SnapshotError>([&] { e.resume(p, ranks[1], at(1, 2, 2)); }, "is not one of the 2 workers");
  testing::expect_throw_with<SnapshotError>([&] { SnapshotSet(ranks).rescaled(3, 1); },
                                            "the old record of node 'merge@out' (instance 2): ");
  testing::expect_throw_with<SnapshotError>([&] { SnapshotSet(ranks).rescaled(3, 1); }, "cursor 5 is not one of its 2 workers");
}

// A sampler's position is checked against its source's size (read from the source's graph record) by
// the offline rescale as by a resume: a `next` past the end is refused, naming the old record.
TEST(Rescale, ASamplerPositionPastItsSourceIsRefusedOfflineAsAtResume) {
  const auto p = range(0, 400) | sampler({.epochs = 2}) | batch({.size = 4});
  Engine e;
  std::vector<Snapshot> ranks = rank_snapshots(p, 2, 2, [](int) { return 10; });
  std::string sampler_key;
  for (auto& st : ranks[1].states)
    if (st.kind == "sampler" && st.instance == 3) {
      sampler_key = st.key;
      for (auto& f : st.fields)
        if (f.name == "next") {
          ASSERT_GT(f.u, 0u);  // mid-stream: this instance has taken positions
          f.u = 800 / 4 + 5;   // 800 positions (400 × 2 epochs) over 4 instances: 200 each, this one past them
        }
    }
  ASSERT_FALSE(sampler_key.empty());
  testing::expect_throw_with<SnapshotError>([&] { e.resume(p, ranks[1], at(1, 2, 2)); }, "is past the 800 positions");
  testing::expect_throw_with<SnapshotError>([&] { SnapshotSet(ranks).rescaled(3, 1); },
                                            "the old record of node '" + sampler_key + "' (instance 3): ");
  testing::expect_throw_with<SnapshotError>([&] { SnapshotSet(ranks).rescaled(3, 1); }, "is past the 800 positions");
  // One position short of the bound is what an instance holds at its end: accepted by both.
  for (auto& st : ranks[1].states)
    if (st.key == sampler_key)
      for (auto& f : st.fields)
        if (f.name == "next") f.u = 800 / 4;
  EXPECT_NO_THROW(SnapshotSet(ranks).rescaled(3, 1));
}

// Read through its rank files (no set index), a rescale leaves long lists in the files until a rule deals
// them: the sampler's check of its old records then sees its skipped positions unloaded, and checks the
// rest instead of refusing the set.
TEST(Rescale, ASamplerWhoseSkippedPositionsStayInTheFilesIsCheckedAndRescaled) {
  const auto p = range(0, 3000) | sampler({.shuffle = SamplerShuffle::none}) | batch({.size = 4});
  // Rank 1 far ahead of rank 0: a rescale leaves the positions it took to be skipped.
  const std::vector<Snapshot> ranks = rank_snapshots(p, 2, 1, [](int r) { return r == 0 ? 5 : 80; });
  const SnapshotSet once = SnapshotSet(ranks).rescaled(3, 1);
  std::size_t most_skipped = 0;
  for (int r = 0; r < 3; ++r)
    for (const auto& st : once.rank(r).states)
      for (const auto& f : st.fields)
        if (st.kind == "sampler" && f.name == "skip") most_skipped = std::max(most_skipped, f.elements.size());
  ASSERT_GT(most_skipped, 32u);  // more than 256 bytes: stored apart, not loaded by a plan
  testing::TempDir d;
  const std::string dir = d.path().string();
  for (int r = 0; r < 3; ++r) SnapshotSet::write_rank(dir, once.rank(r));
  fs::remove(fs::path(dir) / kManifest);  // no manifest, no index: the rescale plans from the rank files
  fs::remove(fs::path(dir) / kIndex);
  const SnapshotSet expected = once.rescaled(2, 1);
  for (int r = 0; r < 2; ++r)
    EXPECT_EQ(SnapshotSet::read_rank(dir, Layout{r, 2, 1}, true).to_bytes(), expected.rank(r).to_bytes());
}

// Records saved by a mode no run writes for the node are refused as a resume refuses them: a hooked
// sampler's records forged as replay records (which no rule may deal), or one instance's alone.
TEST(Rescale, RecordsOfAModeNoRunWritesAreRefused) {
  const auto p = range(0, 400) | sampler() | batch({.size = 4});
  const std::vector<Snapshot> ranks = rank_snapshots(p, 2, 2, [](int) { return 10; });
  EXPECT_NO_THROW(SnapshotSet(ranks).rescaled(3, 1));
  auto forge = [&](bool every) {
    auto forged = ranks;
    for (auto& s : forged)
      for (auto& st : s.states)
        if (st.kind == "sampler" && (every || st.instance == 3)) st.mode = StateMode::replay;
    return forged;
  };
  testing::expect_throw_with<SnapshotError>([&] { SnapshotSet(forge(true)).rescaled(3, 1); },
                                            "are replay records, which no rescale can deal");
  testing::expect_throw_with<SnapshotError>([&] { SnapshotSet(forge(false)).rescaled(3, 1); },
                                            "has records saved by hook and by replay");
}

TEST(Rescale, RulesNameFieldsThroughTheStateAndAMisspelledNameIsRefused) {
  using S = BatchState<ElementBlobs>;
  // Two old instances, 6 buffered elements between them.
  std::vector<NodeState> old(2);
  for (std::size_t i = 0; i < old.size(); ++i) {
    old[i].key = "batch@1";
    old[i].kind = "batch";
    old[i].instance = static_cast<std::uint32_t>(i);
    S st;
    for (int k = 0; k < 3; ++k) st.partial.append("e" + std::to_string(i) + std::to_string(k));
    StateWriter w(old[i]);
    w.write(st);
  }
  const RescaleInput in{{&old[0], &old[1]}, Layout{0, 2, 1}, Layout{0, 3, 1}, false, nullptr};
  auto message = [](auto f) {
    try {
      f();
    } catch (const SnapshotError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  // Before the rule names its state, no field is read by name.
  EXPECT_NE(message([&] { in.numbers("input_done"); }).find("before check_fields"), std::string::npos);
  in.check_fields<S>();
  // Through the state type: every buffered element is dealt.
  const auto dealt = in.deal(&S::partial);
  std::size_t total = 0;
  for (std::size_t j = 0; j < dealt.size(); ++j) total += dealt[j].size();
  EXPECT_EQ(total, 6u);
  EXPECT_EQ(rescale::field_name(&S::input_done), "input_done");
  // By name, a field the state does not have refuses the rescale naming it (it would deal nothing).
  const std::string typo = message([&] { in.deal_fields({"partail"}); });
  EXPECT_NE(typo.find("'partail', which its state has not (it has partial, input_done)"), std::string::npos) << typo;
  EXPECT_NE(typo.find("batch@1"), std::string::npos) << typo;
  EXPECT_NE(message([&] { in.numbers("skiped"); }).find("'skiped'"), std::string::npos);
  EXPECT_NE(message([&] { in.first_text("failure"); }).find("'failure'"), std::string::npos);
  EXPECT_EQ(message([&] { in.numbers("input_done"); }), "no error");
}

TEST(Rescale, RefusesNodesItCannotRedistributeNamingThem) {
  auto refused = [](auto p) {
    Engine e;
    std::vector<Snapshot> ranks;
    for (int r = 0; r < 2; ++r) {
      auto run = e.start(p, at(r, 2, 1));
      run.next();
      ranks.push_back(run.snapshot());
    }
    try {
      SnapshotSet(ranks).rescaled(3, 1);
    } catch (const SnapshotError& err) {
      return std::string(err.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(refused(range(0, 100) | sharding_filter({.name = "shard"})).find("'shard' (sharding_filter)"),
            std::string::npos);
  EXPECT_NE(refused(range(0, 100) | sampler() | take(50, {.name = "head"})).find("'head' (take)"), std::string::npos);
  auto deref = [](const std::shared_ptr<const I64>& x) { return *x; };
  EXPECT_NE(refused(range(0, 100) | sampler() | dispatch(broadcast, {.name = "b"}) | map(deref))
                .find("'b' (dispatch): it broadcasts"),
            std::string::npos);
  EXPECT_NE(refused(range(0, 100) | dispatch() | map([](I64 x) { return x; }, {.name = "m"})).find("range"),
            std::string::npos);
  EXPECT_EQ(refused(range(0, 100) | sampler() | dispatch() | batch({.size = 3})), "accepted");
  EXPECT_EQ(refused(range(0, 100) | sampler() | merge({.name = "m"}) | batch({.size = 3})), "accepted");
}

}  // namespace
}  // namespace dpipe

namespace dpipe {

// Every snapshot carries an id and the user's step, readable from the start of its file; a set whose
// ranks come from different steps is refused naming the ranks, their ids and steps.
TEST(SnapshotIdentity, ASetOfDifferentStepsIsRefusedNamingRanksIdsAndSteps) {
  Engine e;
  const auto p = range(0, 100) | sampler() | batch({.size = 4});
  std::vector<Snapshot> at_1200, mixed;
  for (int r = 0; r < 2; ++r) {
    auto run = e.start(p, {.layout = Layout{r, 2, 1}});
    run.next();
    at_1200.push_back(run.snapshot({}, 1200));
    mixed.push_back(run.snapshot({}, r == 0 ? 1200 : 1300));
  }
  EXPECT_NE(at_1200[0].meta.id, 0u);
  EXPECT_NE(at_1200[0].meta.id, at_1200[1].meta.id);  // other ranks
  EXPECT_NE(at_1200[1].meta.id, mixed[1].meta.id);     // another step
  EXPECT_NO_THROW(SnapshotSet{at_1200});
  testing::expect_throw_with<SnapshotError>([&] { SnapshotSet{mixed}; }, "names step 1300, rank 0's (id 0x");
  testing::expect_throw_with<SnapshotError>([&] { SnapshotSet{mixed}; }, "step 1200; a set holds the snapshots of one step");

  testing::TempDir dir;
  const std::string path = dir.file("s.dpipe");
  at_1200[1].write_file(path);
  const SnapshotIdentity id = Snapshot::read_identity(path);
  EXPECT_EQ(id.format_version, Snapshot::kFormatVersion);
  EXPECT_EQ(id.id, at_1200[1].meta.id);
  EXPECT_EQ(id.step, std::optional<std::uint64_t>(1200));
  const Snapshot back = Snapshot::read_file(path);
  EXPECT_EQ(back.meta.id, at_1200[1].meta.id);
  EXPECT_EQ(back.meta.step, std::optional<std::uint64_t>(1200));
  // A rescaled set keeps the step; every rank of it carries one id.
  const SnapshotSet rescaled = SnapshotSet(at_1200).rescaled(3, 1);
  EXPECT_EQ(rescaled.rank(2).meta.step, std::optional<std::uint64_t>(1200));
  EXPECT_EQ(rescaled.rank(0).meta.id, rescaled.rank(2).meta.id);
}

}  // namespace dpipe

namespace dpipe {
namespace {

// Sleeps up to 200 µs now and then on the thread that runs it: how far each worker runs ahead of the
// consumer differs from run to run, the elements do not.
I64 jitter(I64 x) {
  thread_local std::mt19937 g(std::random_device{}());
  if (g() % 8 == 0) std::this_thread::sleep_for(std::chrono::microseconds(g() % 200));
  return x;
}

struct Timing {
  int threads;
  bool inline_workers;
  int consumer_sleep_ms;  // before the snapshot: lets the workers fill their queues
};

template <class T>
std::vector<T> drain(Run<T>& run) {
  std::vector<T> out;
  while (auto x = run.next()) out.push_back(std::move(*x));
  return out;
}

/// One layout of a rescaled_streams sequence: `take` elements per rank before the snapshot.
struct Stage {
  int world, workers;
  std::size_t take;
};
constexpr std::size_t kToTheEnd = std::numeric_limits<std::size_t>::max();

// Each stage's ranks consume their `take` elements and take a reproducible snapshot (step 7), and the next
// stage resumes that set rescaled to its layout; the last stage runs to the end. By default 2 ranks × 3
// workers take `before` each, then 3 × 2 take `before / 2`, then 1 × 3. Returns every rank's stream, stage
// by stage. Also checks that a snapshot resumes on its own layout into exactly what the run delivers next.
template <class T>
std::vector<std::vector<T>> rescaled_streams(const Pipeline<T>& p, Timing t, std::size_t before,
                                             std::vector<Stage> stages = {}) {
  Engine e({.threads = t.threads});
  if (stages.empty()) stages = {{2, 3, before}, {3, 2, before / 2}, {1, 3, kToTheEnd}};
  std::vector<std::vector<T>> out;
  std::optional<SnapshotSet> set;
  for (const Stage& st : stages) {
    std::vector<Snapshot> ranks;
    for (int r = 0; r < st.world; ++r) {
      RunOptions o = at(r, st.world, st.workers);
      o.inline_workers = t.inline_workers;
      auto run = set ? e.resume(p, *set, o, {.rescale = true}) : e.start(p, o);
      auto& got = out.emplace_back();
      for (std::size_t i = 0; i < st.take; ++i) {
        auto x = run.next();
        if (!x) break;
        got.push_back(std::move(*x));
      }
      if (st.take == kToTheEnd) continue;
      if (t.consumer_sleep_ms) std::this_thread::sleep_for(std::chrono::milliseconds(t.consumer_sleep_ms));
      ranks.push_back(run.reproducible_snapshot({}, 7));
      if (r == 0) {
        auto resumed = e.resume(p, ranks.back(), o);
        EXPECT_EQ(drain(resumed), drain(run)) << "the same layout resumed into another stream";
      }
    }
    if (!ranks.empty()) set = SnapshotSet(ranks);
  }
  return out;
}

// Three runs with other thread counts and timing (one on the consumer's thread, one whose workers fill
// their queues before each snapshot, one with jittered workers) snapshot at the same steps and rescale
// to the same layouts, twice: every rank's stream is identical, and every element comes exactly once.
TEST(ReproducibleRescale, TheSameSetRescaledGivesTheSameStreamsWhateverTheTiming) {
  const std::vector<Timing> timings = {{1, true, 0}, {2, false, 30}, {4, false, 0}};
  auto check = [&](const auto& p, std::size_t before, auto flatten, std::size_t n, const char* what,
                   std::vector<Stage> stages = {}) {
    SCOPED_TRACE(what);
    const auto first = rescaled_streams(p, timings[0], before, stages);
    std::vector<I64> all;
    for (const auto& stream : first) flatten(stream, all);
    const auto c = counts(all);
    EXPECT_EQ(c.size(), n);
    EXPECT_TRUE(std::all_of(c.begin(), c.end(), [](const auto& kv) { return kv.second == 1; }));
    EXPECT_GE(c.begin()->first, 0);
    for (std::size_t i = 1; i < timings.size(); ++i) {
      const auto again = rescaled_streams(p, timings[i], before, stages);
      ASSERT_EQ(again.size(), first.size());
      for (std::size_t r = 0; r < first.size(); ++r)
        EXPECT_EQ(again[r], first[r]) << "stream " << r << " differs with timing " << i;
    }
  };
  auto scalars = [](const std::vector<I64>& s, std::vector<I64>& all) { all.insert(all.end(), s.begin(), s.end()); };
  auto batches = [](const std::vector<std::vector<I64>>& s, std::vector<I64>& all) {
    for (const auto& b : s) all.insert(all.end(), b.begin(), b.end());
  };
  const auto keep = [](I64 x) { return x % 3 != 0; };
  // The worker segment reads the sampler itself: its positions, a filter, a shuffle buffer and the queues.
  check(range(0, 6000) | sampler({.shuffle = SamplerShuffle::global}) | filter(keep) |
            shuffle({.buffer = 50}) | map(jitter),
        300, scalars, 4000, "sampler → filter → shuffle → map");
  // A dispatch: the prefix runs once per rank; its backlogs and the batches in the queues are dealt.
  check(range(0, 6000) | sampler() | filter(keep) | shuffle({.buffer = 40}) | dispatch() | map(jitter) |
            batch({.size = 3}) | prefetch({.depth = 4}),
        100, batches, 4000, "sampler → dispatch → map → batch → prefetch(4)");
  // An explicit merge with a suffix in the consumer's thread.
  check(range(0, 6000) | sampler() | map(jitter) | prefetch({.depth = 2}) | merge() | shuffle({.buffer = 30}),
        500, scalars, 6000, "sampler → map → prefetch(2) → merge → shuffle");
  // One worker per rank: the merge hands the consumer the runs of elements its worker has ready, and
  // how many the run holds (saved as its pending elements, dealt per rank) must not depend on that.
  check(range(0, 6000) | sampler() | map(jitter) | shuffle({.buffer = 20}), 300, scalars, 6000,
        "one worker per rank: sampler → map → shuffle", {{2, 1, 300}, {3, 1, 150}, {2, 2, 100}, {1, 1, kToTheEnd}});
}

}  // namespace
}  // namespace dpipe
