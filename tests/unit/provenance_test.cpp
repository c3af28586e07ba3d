// Sample provenance (provenance.hpp): every element of a traced run names the source positions it was made
// from, through shuffle, batch, filter, flat_map, unbatch, take, skip, sharding and the worker lanes, on
// every layout; map_with_rng's draws depend on the sample only, not on the layout or a resume; a kind that
// does not carry provenance is refused by name.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>

#include "dpipe/dpipe.hpp"
#include "../test_util.hpp"

using namespace dpipe;
using dpipe::testing::expect_throw_with;

namespace {

using I64 = std::int64_t;

RunOptions traced(int workers, bool inline_workers = false, int rank = 0, int world = 1) {
  RunOptions o;
  o.seed = 7;
  o.layout = Layout{rank, world, workers};
  o.inline_workers = inline_workers;
  o.trace = true;
  return o;
}

/// Every element of a run with its provenance.
template <class T>
std::vector<std::pair<T, Provenance>> traced_run(const Pipeline<T>& p, const RunOptions& o, std::size_t at = SIZE_MAX) {
  Engine e;
  auto run = e.start(p, o);
  std::vector<std::pair<T, Provenance>> out;
  while (out.size() < at) {
    auto x = run.next();
    if (!x) break;
    EXPECT_NE(run.provenance(), nullptr);
    out.emplace_back(std::move(*x), *run.provenance());
  }
  return out;
}

std::vector<std::uint64_t> positions(const Provenance& p) {
  std::vector<std::uint64_t> v;
  for (const SourcePos& s : p) v.push_back(s.position);
  return v;
}

struct Layouts {
  int workers;
  bool inline_workers;
};
const Layouts kLayouts[] = {{1, true}, {1, false}, {2, false}, {3, true}, {3, false}};

}  // namespace

TEST(Provenance, UntracedRunsHaveNone) {
  Engine e;
  auto run = e.start(range(0, 4), RunOptions{.layout = Layout{0, 1, 1}});
  ASSERT_TRUE(run.next());
  EXPECT_EQ(run.provenance(), nullptr);
}

// range's position i is its element i: each batch's sources are the elements it holds, in order, after a
// shuffle that moved them and through the workers' lanes.
TEST(Provenance, ShuffleAndBatchNameTheirElements) {
  const auto p = range(0, 300) | sharding_filter() | shuffle({.buffer = 16}) | batch({.size = 5});
  for (const auto& l : kLayouts) {
    const auto got = traced_run(p, traced(l.workers, l.inline_workers));
    std::size_t elements = 0;
    for (const auto& [b, prov] : got) {
      ASSERT_EQ(prov.size(), b.size()) << l.workers;
      for (std::size_t i = 0; i < b.size(); ++i) {
        EXPECT_EQ(prov[i].position, static_cast<std::uint64_t>(b[i]));
        EXPECT_EQ(prov[i].epoch, 0u);
        EXPECT_TRUE(prov[i].offsets.empty());
      }
      elements += b.size();
    }
    EXPECT_EQ(elements, 300u) << l.workers;
    // The source is named: range is the pipeline's first node, pre-order last.
    const Graph graph = Graph::build(*p.def(), KeyScheme::stable);
    EXPECT_EQ(graph.nodes()[got.front().second.front().source].kind, "range");
  }
}

// A sampler names the dataset index it drew and the epoch it drew it in; a filter keeps the provenance of
// the elements that pass; take and skip cut it with the stream.
TEST(Provenance, SamplerEpochsFilterTakeSkip) {
  // (skip and take run in each worker's chain: each worker skips 4 and takes up to 70 of its share)
  const auto p = range(100, 150) | sampler({.epochs = 3}) | filter([](I64 x) { return x % 3 != 0; }) | skip(4) | take(70);
  for (const auto& l : kLayouts) {
    const auto got = traced_run(p, traced(l.workers, l.inline_workers));
    RunOptions plain = traced(l.workers, l.inline_workers);
    plain.trace = false;
    ASSERT_EQ(got.size(), dpipe::testing::collect(p, plain).size());
    ASSERT_GE(got.size(), 70u);
    std::map<std::uint64_t, int> epochs;
    for (const auto& [x, prov] : got) {
      ASSERT_EQ(prov.size(), 1u);
      EXPECT_EQ(static_cast<I64>(prov[0].position) + 100, x);  // index i of range(100, 150) is 100 + i
      ++epochs[prov[0].epoch];
    }
    EXPECT_EQ(epochs.size(), 3u) << "70 or more of 3 × 33 passing elements span the three epochs";
  }
}

// flat_map and unbatch give each output its input's provenance and its offset within the expansion (a map
// between batch and unbatch may reorder a batch, so its elements are not matched to its base elements).
TEST(Provenance, ExpansionsHaveOffsetsAndUnbatchInverts) {
  const auto expanded = range(0, 20) | flat_map([](I64 x) { return std::vector<I64>(static_cast<std::size_t>(x % 4), x); });
  for (const auto& l : kLayouts) {
    const auto got = traced_run(expanded | sharding_filter(), traced(l.workers, l.inline_workers));
    std::map<I64, std::vector<std::uint64_t>> offsets;
    for (const auto& [x, prov] : got) {
      ASSERT_EQ(prov.size(), 1u);
      EXPECT_EQ(static_cast<I64>(prov[0].position), x);
      ASSERT_EQ(prov[0].offsets.size(), 1u);
      offsets[x].push_back(prov[0].offsets[0]);
    }
    for (const auto& [x, o] : offsets) {
      std::vector<std::uint64_t> want(o.size());
      std::iota(want.begin(), want.end(), 0);
      EXPECT_EQ(o, want) << x;
      EXPECT_EQ(o.size(), static_cast<std::size_t>(x % 4));
    }
  }
  const auto reversed = [](std::vector<I64> b) {
    std::reverse(b.begin(), b.end());
    return b;
  };
  const auto round_trip =
      traced_run(range(0, 50) | shuffle({.buffer = 8}) | batch({.size = 4}) | map(reversed) | unbatch(), traced(1, true));
  ASSERT_EQ(round_trip.size(), 50u);
  for (const auto& [x, prov] : round_trip) {
    ASSERT_FALSE(prov.empty());
    bool among = false;  // x is one of its batch's base elements, and each names its offset in the batch
    for (const SourcePos& s : prov) {
      among = among || static_cast<I64>(s.position) == x;
      ASSERT_EQ(s.offsets.size(), 1u);
      EXPECT_EQ(s.offsets[0], prov.front().offsets[0]);
    }
    EXPECT_TRUE(among) << x;
  }
}

// Traced or not, the stream is the same.
TEST(Provenance, TracingDoesNotChangeTheStream) {
  const auto p = range(0, 500) | sharding_filter() | shuffle({.buffer = 32}) |
                 filter([](I64 x) { return x % 5 != 1; }) | batch({.size = 7});
  for (const auto& l : kLayouts) {
    RunOptions plain = traced(l.workers, l.inline_workers);
    plain.trace = false;
    std::vector<std::vector<I64>> want = dpipe::testing::collect(p, plain), got;
    for (auto& [b, prov] : traced_run(p, traced(l.workers, l.inline_workers))) got.push_back(b);
    EXPECT_EQ(got, want) << l.workers;
  }
}

// A kind that does not carry provenance yet is refused by name, not run with provenance missing.
TEST(Provenance, AKindWithoutProvenanceIsRefused) {
  Engine e;
  auto run = e.start(zip(range(0, 10), range(0, 10)), traced(1, true));
  expect_throw_with<ConfigError>([&] { run.next(); }, "does not carry provenance yet");
}

namespace {
/// map_with_rng's function: the element and a draw from its generator.
const auto kDraw = [](I64 x, Rng& rng) { return std::pair<I64, std::uint64_t>{x, rng()}; };

std::map<I64, std::uint64_t> draws(const std::vector<std::pair<I64, std::uint64_t>>& v) {
  std::map<I64, std::uint64_t> m;
  for (const auto& [x, d] : v) EXPECT_TRUE(m.emplace(x, d).second) << x;
  return m;
}
}  // namespace

// A sample's draw depends on the sample: the same on every layout, for every worker count and rank, and
// across a resume; two map_with_rng nodes draw apart; another seed draws anew.
TEST(Provenance, MapWithRngDrawsPerSampleWhateverTheLayout) {
  const auto p = range(0, 240) | sampler() | map_with_rng(kDraw);
  RunOptions plain;
  plain.seed = 7;
  plain.layout = Layout{0, 1, 1};
  const auto reference = draws(dpipe::testing::collect(p, plain));
  ASSERT_EQ(reference.size(), 240u);
  std::set<std::uint64_t> distinct;
  for (const auto& [x, d] : reference) distinct.insert(d);
  EXPECT_EQ(distinct.size(), 240u);
  for (const auto& l : kLayouts)
    for (int world : {1, 2, 3}) {
      std::map<I64, std::uint64_t> all;
      for (int rank = 0; rank < world; ++rank) {
        RunOptions o = traced(l.workers, l.inline_workers, rank, world);
        o.trace = false;  // map_with_rng traces its input on its own
        for (const auto& [x, d] : draws(dpipe::testing::collect(p, o))) all.emplace(x, d);
      }
      EXPECT_EQ(all, reference) << l.workers << " workers, world " << world;
    }
  // Resumed mid-stream (buffers of the workers' lanes full) the draws are the same.
  RunOptions two = plain;
  two.layout = Layout{0, 1, 2};
  for (std::size_t at : {0, 1, 57, 200})
    EXPECT_EQ(draws(dpipe::testing::stop_and_resume(p, two, at)), reference) << at;
  // Another seed, another epoch, another node: other draws.
  RunOptions other = plain;
  other.seed = 8;
  EXPECT_NE(draws(dpipe::testing::collect(p, other)), reference);
  RunOptions next_epoch = plain;
  next_epoch.epoch = 1;
  const auto epoch1 = draws(dpipe::testing::collect(p, next_epoch));
  std::size_t same = 0;
  for (const auto& [x, d] : epoch1) same += reference.at(x) == d;
  EXPECT_EQ(same, 0u) << "a sample draws anew in the next epoch";
  const auto twice = range(0, 240) | sampler() | map_with_rng(kDraw) |
                     map_with_rng([](std::pair<I64, std::uint64_t> x, Rng& rng) { return std::pair<I64, std::uint64_t>{x.first, rng()}; });
  EXPECT_NE(draws(dpipe::testing::collect(twice, plain)), reference);
}

// map_with_rng after a node whose snapshots hold elements would draw anew for them on a resume: refused
// when the run is built, naming the node.
TEST(Provenance, MapWithRngAfterABufferIsRefused) {
  Engine e;
  RunOptions o;
  o.layout = Layout{0, 1, 2};
  expect_throw_with<ConfigError>([&] { e.start(range(0, 10) | shuffle({.buffer = 4}) | map_with_rng(kDraw), o); },
                                 "(shuffle), whose snapshots hold elements");
  expect_throw_with<ConfigError>(
      [&] { e.start(range(0, 10) | batch({.size = 2}) | unbatch() | map_with_rng(kDraw), o); }, "(unbatch)");
  EXPECT_NO_THROW(e.start(range(0, 10) | sampler() | filter([](I64 x) { return x > 2; }) | map_with_rng(kDraw) |
                              shuffle({.buffer = 4}) | batch({.size = 2}),
                          o));
}

// Resumed, a traced run names what it reads anew and marks unknown what the snapshot held (the shuffle's
// full buffer, the workers' queues, the run's hands): never a wrong source position.
TEST(Provenance, AResumeMarksWhatTheSnapshotHeldUnknown) {
  constexpr std::size_t kElements = 30'000;  // beyond what the workers' queues and the run's hands hold
  const auto p = range(0, static_cast<I64>(kElements)) | sharding_filter() | shuffle({.buffer = 24}) | batch({.size = 3});
  for (const auto& l : kLayouts) {
    Engine e;
    auto run = e.start(p, traced(l.workers, l.inline_workers));
    for (int i = 0; i < 20; ++i) ASSERT_TRUE(run.next());
    const Snapshot s = run.snapshot();
    auto resumed = e.resume(p, s, traced(l.workers, l.inline_workers));
    std::size_t unknown = 0, known = 0;
    while (auto b = resumed.next()) {
      const Provenance& prov = *resumed.provenance();
      if (is_unknown_element(prov)) {  // the batch itself was held (the workers' queues, the run's hands)
        unknown += b->size();
        continue;
      }
      ASSERT_EQ(prov.size(), b->size());
      for (std::size_t i = 0; i < b->size(); ++i) {
        if (prov[i].source == SourcePos::kUnknown) ++unknown;
        else {
          ++known;
          EXPECT_EQ(prov[i].position, static_cast<std::uint64_t>((*b)[i]));
        }
      }
    }
    EXPECT_GE(unknown, static_cast<std::size_t>(24 * l.workers)) << "every worker's shuffle buffer was full";
    EXPECT_EQ(unknown + known, kElements - 60u);
    EXPECT_GT(known, unknown);
  }
}
