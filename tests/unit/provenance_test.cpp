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
  auto run = e.start(range(0, 10) | enumerate(), traced(1, true));
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

// map_with_rng after a node whose snapshots would hold elements as data (its chain cannot make them again)
// would draw anew for them on a resume: refused when the run is built, naming the node. After a shuffle, a
// batch or the workers' lanes over a recomputable chain it is accepted: their snapshots hold restore keys.
TEST(Provenance, MapWithRngAfterABufferOfDataIsRefused) {
  Engine e;
  RunOptions o;
  o.layout = Layout{0, 1, 2};
  // A flat_map whose function counts its calls (a Python callable does: its count is saved) is not
  // expanded again: the shuffle after it would hold data.
  struct Counting {
    std::uint64_t calls = 0;
    bool counted_from_resume = false;
    std::vector<I64> operator()(I64 x) const { return {x, x + 1}; }
  };
  expect_throw_with<ConfigError>(
      [&] { e.start(range(0, 40) | flat_map(Counting{}) | shuffle({.buffer = 4}) | map_with_rng(kDraw), o); },
      "(shuffle), whose snapshots hold elements as data");
  // A batch of batches marks where each inner batch starts: it splits again, its unbatch is recomputable.
  EXPECT_NO_THROW(
      e.start(range(0, 40) | batch({.size = 2}) | batch({.size = 2}) | unbatch() | unbatch() | map_with_rng(kDraw), o));
  EXPECT_NO_THROW(e.start(range(0, 10) | sampler() | filter([](I64 x) { return x > 2; }) | map_with_rng(kDraw) |
                              shuffle({.buffer = 4}) | batch({.size = 2}),
                          o));
  EXPECT_NO_THROW(e.start(range(0, 10) | shuffle({.buffer = 4}) | batch({.size = 2}) | unbatch() | map_with_rng(kDraw), o));
}

// After a shuffle on the workers, a sample's draw is the same across a resume: the shuffle's buffer and the
// workers' queues resume from restore keys with their provenance.
TEST(Provenance, MapWithRngAfterAShuffleDrawsTheSameAcrossAResume) {
  const auto p = range(0, 3000) | sampler() | shuffle({.buffer = 64}) | map_with_rng(kDraw);
  RunOptions two;
  two.seed = 7;
  two.layout = Layout{0, 1, 2};
  const auto reference = draws(dpipe::testing::collect(p, two));
  ASSERT_EQ(reference.size(), 3000u);
  for (std::size_t at : {1, 57, 700, 2500}) EXPECT_EQ(draws(dpipe::testing::stop_and_resume(p, two, at)), reference) << at;
  // Whatever the layout: the same draw for each sample.
  RunOptions one = two;
  one.layout = Layout{0, 1, 1};
  EXPECT_EQ(draws(dpipe::testing::collect(p, one)), reference);
}

// Resumed from a snapshot of data (an untraced run's), a traced run names what it reads anew and marks
// unknown what the snapshot held (the shuffle's full buffer, the workers' queues, the run's hands): never
// a wrong source position.
TEST(Provenance, AResumeOfDataMarksWhatTheSnapshotHeldUnknown) {
  constexpr std::size_t kElements = 30'000;  // beyond what the workers' queues and the run's hands hold
  const auto p = range(0, static_cast<I64>(kElements)) | sharding_filter() | shuffle({.buffer = 24}) | batch({.size = 3});
  for (const auto& l : kLayouts) {
    Engine e;
    RunOptions untraced = traced(l.workers, l.inline_workers);
    untraced.trace = false;
    auto run = e.start(p, untraced);
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

// ---- restore keys (kit/restore_keys.hpp) ----------------------------------------------------------

namespace {

using Row = std::vector<I64>;
/// A 1 KiB row made from a sample: what a decoder or an augmentation gives, a pure function of its input.
const auto kRow = [](I64 x) { return Row(128, x * 3 + 1); };

/// The element lists of a snapshot's records of `kind`: (field, tag, entries), the empty ones left out.
std::vector<std::tuple<std::string, std::string, std::size_t>> lists_of(const Snapshot& s, const std::string& kind) {
  std::vector<std::tuple<std::string, std::string, std::size_t>> out;
  for (const NodeState& st : s.states)
    if (st.kind == kind)
      for (const Field& f : st.fields)
        if (f.type == FieldType::elements && f.elements.size() > 0 && f.elements.tag != "u64")
          out.emplace_back(f.name, f.elements.tag, f.elements.size());
  return out;
}
std::size_t held(const Snapshot& s, const std::string& kind, bool keyed) {
  std::size_t n = 0;
  for (const auto& [name, tag, size] : lists_of(s, kind)) n += tag.starts_with("keys:") == keyed ? size : 0;
  return n;
}

/// A planted bug: the first key of list `field` of a record of `kind` that `edit` changes (it returns
/// whether it did) is written back changed, its checksum kept. Whether a key was changed.
template <class Edit>
bool plant_in_a_key(Snapshot& s, const std::string& kind, const std::string& field, Edit edit) {
  for (NodeState& st : s.states)
    for (Field& f : st.fields) {
      if (st.kind != kind || f.name != field || !f.elements.tag.starts_with("keys:")) continue;
      ElementBlobs edited;
      edited.tag = f.elements.tag;
      bool changed = false;
      for (std::size_t i = 0; i < f.elements.size(); ++i) {
        std::string entry(f.elements.at(i));
        if (changed || entry.empty() || entry[0] != kKeyEntry) {  // data entries are kept as they are
          edited.append(entry);
          continue;
        }
        ByteReader r(std::string_view(entry).substr(1));
        std::uint32_t checksum = 0;
        Provenance key = decode_key(r, checksum);
        if (edit(key)) {
          ByteWriter w;
          w.put<char>(kKeyEntry);
          encode_key(w, key, checksum);
          entry = w.take();
          changed = true;
        }
        edited.append(entry);
      }
      f.elements = edited;
      if (changed) return true;
    }
  return false;
}

/// Runs `p` to `at` elements under `o`, snapshots through bytes (its size to `bytes`), resumes under
/// `resume_options` and returns prefix + rest, with the resume's report.
template <class T>
std::vector<T> resumed_stream(const Pipeline<T>& p, const RunOptions& o, const RunOptions& resume_options, std::size_t at,
                              std::size_t* bytes = nullptr, RestoreReport* report = nullptr, Snapshot* taken = nullptr) {
  Engine e;
  auto run = e.start(p, o);
  auto out = dpipe::testing::drain(run, at);
  const Snapshot s = run.snapshot();
  const std::string b = s.to_bytes();
  if (bytes) *bytes = b.size();
  if (taken) *taken = s;
  auto resumed = e.resume(p, Snapshot::from_bytes(b), resume_options);
  if (report) *report = resumed.restore_report();
  auto rest = dpipe::testing::drain(resumed);
  out.insert(out.end(), rest.begin(), rest.end());
  return out;
}

}  // namespace

// A traced run's snapshot holds the shuffle's buffer, the workers' queues and the run's hands as keys of
// a few dozen bytes each, not 1 KiB rows; the resume makes them again and delivers the uninterrupted
// stream, traced or not, on every layout; the same snapshot taken untraced holds the rows.
TEST(RestoreKeys, BuffersAreSavedAsKeysAndResumeTheSameStream) {
  // Long enough that no worker has read all of its share by the last snapshot (its queue holds 64 batches).
  const auto p = range(0, 6000) | sampler() | map(kRow) | shuffle({.buffer = 64}) | batch({.size = 8});
  for (const auto& l : kLayouts) {
    RunOptions plain = traced(l.workers, l.inline_workers);
    plain.trace = false;
    const auto reference = dpipe::testing::collect(p, plain);
    std::size_t total = 0;
    for (const auto& b : reference) total += b.size();
    ASSERT_EQ(total, 6000u) << reference.size() << " batches, the first of " << reference.front().size();
    for (std::size_t at : {1, 40, 120}) {
      std::size_t key_bytes = 0, data_bytes = 0;
      RestoreReport report;
      Snapshot keyed;
      EXPECT_EQ(resumed_stream(p, traced(l.workers, l.inline_workers), plain, at, &key_bytes, &report, &keyed), reference)
          << l.workers << " workers at " << at;
      EXPECT_EQ(resumed_stream(p, traced(l.workers, l.inline_workers), traced(l.workers, l.inline_workers), at), reference);
      EXPECT_EQ(resumed_stream(p, plain, plain, at, &data_bytes), reference);
      // Met full: a shuffle buffer holds 64 keys (a busy worker lends its state as of a chunk it published,
      // which may be its first), none of them data; a key of one base element below position 2^14 is at
      // most 11 bytes, whatever the row's size.
      if (at >= 40) EXPECT_GE(held(keyed, "shuffle", true), 64u);
      EXPECT_EQ(held(keyed, "shuffle", false), 0u);
      for (const NodeState& st : keyed.states)
        for (const Field& f : st.fields)
          if (st.kind == "shuffle" && f.name == "buffer") EXPECT_LE(f.elements.data.size(), 11 * f.elements.size());
      EXPECT_EQ(report.recomputed_elements(), held(keyed, "shuffle", true) + held(keyed, "batch", true) +
                                                  held(keyed, "merge", true) + held(keyed, "run", true));
      if (at >= 40) EXPECT_LT(key_bytes * 5, data_bytes) << key_bytes << " bytes of keys against " << data_bytes << " of data";
    }
  }
}

// Each buffering kind, met non-empty: the workers' queues of a merge and the run's hands (scalars move in
// chunks: they hold hundreds), the rest of a batch in unbatch, the rest of an expansion in flat_map; each
// resumed from its keys delivers the uninterrupted stream.
TEST(RestoreKeys, EveryBufferingKindHoldsKeys) {
  // Beyond what the two workers' queues take in (64 chunks of 256 each), so their shuffles stay full.
  const auto scalars = range(0, 200'000) | sampler() | map([](I64 x) { return x * 5; }) | shuffle({.buffer = 32});
  {
    Engine e;
    auto run = e.start(scalars, traced(2, false));
    for (int i = 0; i < 300; ++i) ASSERT_TRUE(run.next());
    const Snapshot s = run.snapshot();
    EXPECT_GT(held(s, "merge", true), 0u);
    EXPECT_GT(held(s, "run", true), 0u);
    EXPECT_EQ(held(s, "merge", false) + held(s, "run", false), 0u);
    EXPECT_EQ(held(s, "shuffle", true), 64u);
  }
  const auto rests = range(0, 2000) | map(kRow) | batch({.size = 7}) | unbatch() |
                     flat_map([](Row r) { return std::vector<Row>{r, Row(3, r[0]), Row(1, -r[0])}; }) | shuffle({.buffer = 5});
  for (const auto& l : kLayouts) {
    RunOptions plain = traced(l.workers, l.inline_workers);
    plain.trace = false;
    const auto reference = dpipe::testing::collect(rests, plain);
    std::size_t unbatch_keys = 0, flat_map_keys = 0;
    for (std::size_t at : {1, 2, 3, 50, 51, 52, 301, 302, 303}) {
      Snapshot keyed;
      EXPECT_EQ(resumed_stream(rests, traced(l.workers, l.inline_workers), traced(l.workers, l.inline_workers), at, nullptr,
                               nullptr, &keyed),
                reference)
          << l.workers << " workers at " << at;
      EXPECT_EQ(held(keyed, "unbatch", false) + held(keyed, "flat_map", false), 0u);
      unbatch_keys += held(keyed, "unbatch", true);
      flat_map_keys += held(keyed, "flat_map", true);
    }
    EXPECT_GT(unbatch_keys, 0u) << l.workers;
    EXPECT_GT(flat_map_keys, 0u) << l.workers;
  }
}

// A recomputed element that differs from the one saved is refused, never delivered: the function changed
// under the same fingerprint (a C++ lambda's body is not in it), or a key's offset is off by one (a planted
// bug in a flat_map expansion); the same snapshot of data resumes the old elements silently.
TEST(RestoreKeys, AnElementThatComesOutDifferentIsRefused) {
  const auto times = [](I64 k) { return range(0, 500) | sampler() | map([k](I64 x) { return x * k; }) | shuffle({.buffer = 16}); };
  Engine e;
  auto run = e.start(times(2), traced(1, true));
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(run.next());
  const Snapshot s = run.snapshot();
  expect_throw_with<SnapshotError>([&] { e.resume(times(3), s, traced(1, true)); }, "came out different from the one saved");
  EXPECT_NO_THROW(e.resume(times(2), s, traced(1, true)));

  // An offset moved by one in a flat_map's restore key: another output of the expansion, refused.
  const auto expanded = range(0, 100) | flat_map([](I64 x) { return std::vector<I64>{x * 10, x * 10 + 1, x * 10 + 2}; }) |
                        shuffle({.buffer = 8});
  auto second = e.start(expanded, traced(1, true));
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(second.next());
  Snapshot planted = second.snapshot();
  ASSERT_TRUE(plant_in_a_key(planted, "shuffle", "buffer", [](Provenance& p) {
    if (p[0].offsets.at(0) >= 2) return false;
    ++p[0].offsets[0];
    return true;
  }));
  expect_throw_with<SnapshotError>([&] { e.resume(expanded, planted, traced(1, true)); }, "came out different");
}

// A key dealt twice (a planted rescale bug) delivers an element twice; the exactly-once check of a resumed
// stream sees it. Keys dealt as the rescale deals them: every element exactly once, as with data.
TEST(RestoreKeys, RescaleDealsKeysExactlyOnce) {
  const auto p = range(0, 4000) | sampler() | map(kRow) | shuffle({.buffer = 40}) | batch({.size = 4});
  const auto firsts = [](const std::vector<std::vector<Row>>& batches) {
    std::vector<I64> v;
    for (const auto& b : batches)
      for (const Row& r : b) v.push_back(r[0]);
    return v;
  };
  for (bool keys : {false, true}) {
    Engine e;
    std::vector<I64> seen;
    std::vector<Snapshot> set;
    for (int r = 0; r < 2; ++r) {
      RunOptions o = traced(2, false, r, 2);
      o.trace = keys;
      auto run = e.start(p, o);
      for (const I64 x : firsts(dpipe::testing::drain(run, 100))) seen.push_back(x);
      set.push_back(run.snapshot());
      EXPECT_EQ(held(set.back(), "shuffle", keys), 80u);
    }
    const SnapshotSet rescaled = SnapshotSet(std::move(set)).rescaled(3, 1);
    for (int r = 0; r < 3; ++r) {
      RunOptions o = traced(1, false, r, 3);
      o.trace = keys;
      auto run = e.resume(p, rescaled.rank(r), o);
      for (const I64 x : firsts(dpipe::testing::drain(run))) seen.push_back(x);
    }
    std::sort(seen.begin(), seen.end());
    std::vector<I64> every(4000);
    for (I64 i = 0; i < 4000; ++i) every[static_cast<std::size_t>(i)] = i * 3 + 1;
    EXPECT_EQ(seen, every) << (keys ? "keys" : "data");
    if (!keys) continue;
    // Planted: rank 0's first shuffle key dealt twice. Its element comes twice, which the check above sees.
    Snapshot planted = rescaled.rank(0);
    for (NodeState& st : planted.states)
      for (Field& f : st.fields)
        if (st.kind == "shuffle" && f.name == "buffer" && f.elements.size() > 0) {
          const std::string first(f.elements.at(0));
          f.elements.append(first);
        }
    RunOptions o = traced(1, false, 0, 3);
    auto run = e.resume(p, planted, o);
    std::vector<I64> again = firsts(dpipe::testing::drain(run));
    std::sort(again.begin(), again.end());
    EXPECT_NE(std::adjacent_find(again.begin(), again.end()), again.end()) << "the planted key comes twice";
  }
}

namespace {
/// A corpus of `docs` JSON lines {"doc": ID, "text": ...} of 3 to 150 bytes of text, every 29th line broken
/// (parse_json skips it); `shift` changes every text's letter, not its length.
std::string corpus(int docs, I64 first_id, int shift = 0) {
  std::string out;
  for (int i = 0; i < docs; ++i) {
    if (i % 29 == 5) {
      out += "{\"doc\": " + std::to_string(first_id + i) + ", \"text\": \"unterminated\n";
      continue;
    }
    const std::size_t len = 3 + static_cast<std::size_t>((i * 7919 + first_id) % 148);
    out += "{\"doc\": " + std::to_string(first_id + i) + ", \"text\": \"" +
           std::string(len, static_cast<char>('a' + (i + first_id + shift) % 26)) + "\"}" + (i % 5 == 0 ? "\r\n" : "\n");
  }
  return out;
}

/// The documents of a corpus: lines → parse_json (skip) → tokens (a text byte each, its document id and
/// offset mixed in).
Pipeline<Value> llm_documents(const std::string& file) {
  return lines({file}, {.logical_shards = 8}) |
         parse_json({.fields = {JsonField::parse("doc", "int64"), JsonField::parse("text", "string")},
                     .on_error = OnDataError::skip}) |
         map([](Value v) {
           const I64 doc = std::get<I64>(find_field(v, "doc")->data);
           const std::string& text = std::get<std::string>(find_field(v, "text")->data);
           std::vector<I64> tokens;
           for (std::size_t k = 0; k < text.size(); ++k) tokens.push_back(doc * 1000 + static_cast<I64>(k) + text[k]);
           set_field(v, "tokens", int64_array(tokens));
           return v;
         });
}

/// Two corpora's documents mixed 70/30 and packed into rows of 64 tokens.
Pipeline<Value> llm_rows(const std::string& prose, const std::string& code, PackMode mode) {
  return mix(std::vector{llm_documents(prose), llm_documents(code)}, {.weights = {0.7, 0.3}}) |
         pack({.seq_len = 64, .mode = mode, .buffer = 3});
}

/// The LLM chain: llm_rows → batch(4) → prefetch(2).
Pipeline<std::vector<Value>> llm_chain(const std::string& prose, const std::string& code, PackMode mode) {
  return llm_rows(prose, code, mode) | batch({.size = 4}) | prefetch({.depth = 2});
}

/// The mean bytes of an entry of the element lists of pack, batch, the workers' queues and the run's hands.
double bytes_per_entry(const Snapshot& s) {
  std::size_t bytes = 0, entries = 0;
  for (const NodeState& st : s.states)
    for (const Field& f : st.fields)
      if (f.type == FieldType::elements && f.elements.tag != "u64" &&
          (st.kind == "pack" || st.kind == "batch" || st.kind == "merge" || st.kind == "run")) {
        bytes += f.elements.data.size();
        entries += f.elements.size();
      }
  return entries ? double(bytes) / double(entries) : 0;
}
}  // namespace

// Lines of several files (CRLF endings, empty lines, a file boundary) resumed from keys: a line's key is
// its first byte among the files laid end to end, read again there.
TEST(RestoreKeys, LinesAreReadAgainAtTheirByte) {
  dpipe::testing::TempDir dir;
  std::vector<std::string> a, b;
  // Long enough that no worker has read all of its share by the last snapshot (its queue holds 64 batches).
  dpipe::testing::write_bytes(dir.file("a.txt"), dpipe::testing::varied_text(1'000'000, a));
  dpipe::testing::write_bytes(dir.file("b.txt"), dpipe::testing::varied_text(600'000, b, -1, 50'000));
  const auto p = lines({dir.file("a.txt"), dir.file("b.txt")}, {.logical_shards = 7}) | shuffle({.buffer = 16}) |
                 batch({.size = 8});
  for (const auto& l : kLayouts) {
    RunOptions plain = traced(l.workers, l.inline_workers);
    plain.trace = false;
    const auto reference = dpipe::testing::collect(p, plain);
    std::size_t total = 0;
    for (const auto& batch : reference) total += batch.size();
    ASSERT_EQ(total, a.size() + b.size());
    for (std::size_t at : {1, 100, 700}) {
      Snapshot keyed;
      RestoreReport report;
      EXPECT_EQ(resumed_stream(p, traced(l.workers, l.inline_workers), plain, at, nullptr, &report, &keyed), reference)
          << l.workers << " workers at " << at;
      EXPECT_GE(held(keyed, "shuffle", true), 16u);
      EXPECT_EQ(held(keyed, "shuffle", false) + held(keyed, "batch", false) + held(keyed, "merge", false) +
                    held(keyed, "run", false),
                0u);
      EXPECT_GE(report.recomputed_elements(), 16u);
    }
  }
}

// The LLM chain (lines, parse_json skipping bad lines, a map making tokens, mix, pack, batch, prefetch)
// on 1, 2 and 3 workers, both pack modes: a traced snapshot holds pack's open and made rows, the partial
// batches, the workers' queues and the run's hands as keys, none as data, at a fifth of the bytes or less;
// resumed, it delivers the uninterrupted stream.
TEST(RestoreKeys, TheLlmChainHoldsKeysAndResumesExactly) {
  dpipe::testing::TempDir dir;
  dpipe::testing::write_bytes(dir.file("prose.jsonl"), corpus(700, 0));
  dpipe::testing::write_bytes(dir.file("code.jsonl"), corpus(300, 100'000));
  for (const PackMode mode : {PackMode::greedy, PackMode::first_fit}) {
    const auto p = llm_chain(dir.file("prose.jsonl"), dir.file("code.jsonl"), mode);
    for (const auto& l : kLayouts) {
      RunOptions plain = traced(l.workers, l.inline_workers);
      plain.trace = false;
      const auto reference = dpipe::testing::collect(p, plain);
      ASSERT_GT(reference.size(), 100u);
      std::size_t open_keys = 0;
      for (std::size_t at : {1, 9, 40}) {
        Snapshot keyed;
        RestoreReport report;
        Snapshot of_data;
        EXPECT_EQ(resumed_stream(p, traced(l.workers, l.inline_workers), traced(l.workers, l.inline_workers), at,
                                 nullptr, &report, &keyed),
                  reference)
            << "mode " << int(mode) << ", " << l.workers << " workers at " << at;
        EXPECT_EQ(resumed_stream(p, plain, plain, at, nullptr, nullptr, &of_data), reference);
        for (const char* kind : {"pack", "batch", "merge", "run"}) EXPECT_EQ(held(keyed, kind, false), 0u) << kind;
        for (const NodeState& st : keyed.states)
          for (const Field& f : st.fields)
            if (st.kind == "pack" && f.name == "open") open_keys += f.elements.size();
        const std::size_t keys = held(keyed, "pack", true) + held(keyed, "batch", true) + held(keyed, "merge", true) +
                                 held(keyed, "run", true);
        EXPECT_GT(keys, 0u);
        EXPECT_EQ(report.recomputed_elements(), keys);
        // A row of 64 tokens is 1.5 KiB of columns; its key a few bytes per segment. (The two snapshots
        // need not hold as many elements: the workers run ahead by the threads' timing.)
        const double key_entry = bytes_per_entry(keyed), data_entry = bytes_per_entry(of_data);
        EXPECT_LT(key_entry * 20, data_entry) << key_entry << " bytes a key against " << data_entry << " of data";
      }
      EXPECT_GT(open_keys, 0u) << "no snapshot met an open row";
    }
  }
}

// A row's key names its documents and token ranges; a range moved by one token (a planted bug) makes
// another row, refused; a data file changed under the snapshot (same size, other bytes) is refused with
// keys, where data would resume silently.
TEST(RestoreKeys, APackedRowOfAnotherRangeOrChangedDataIsRefused) {
  dpipe::testing::TempDir dir;
  dpipe::testing::write_bytes(dir.file("prose.jsonl"), corpus(400, 0));
  dpipe::testing::write_bytes(dir.file("code.jsonl"), corpus(200, 100'000));
  const auto p = llm_chain(dir.file("prose.jsonl"), dir.file("code.jsonl"), PackMode::greedy);
  Engine e;
  auto run = e.start(p, traced(1, true));
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(run.next());
  const Snapshot s = run.snapshot();
  Snapshot planted = s;
  ASSERT_TRUE(plant_in_a_key(planted, "pack", "open", [](Provenance& key) {
    if (!key[0].sliced() || key[0].end - key[0].begin < 2) return false;
    ++key[0].begin;  // the segment one token shorter, from one token later
    return true;
  }));
  expect_throw_with<SnapshotError>([&] { e.resume(p, planted, traced(1, true)); }, "came out different");
  EXPECT_NO_THROW(e.resume(p, s, traced(1, true)));

  // The same bytes count, another text: every line keeps its byte, its document another token.
  dpipe::testing::write_bytes(dir.file("prose.jsonl"), corpus(400, 0, 1));
  dpipe::testing::write_bytes(dir.file("code.jsonl"), corpus(200, 100'000, 1));
  expect_throw_with<SnapshotError>(
      [&] { e.resume(p, s, traced(1, true), {.allow_changed_data = true}); }, "came out different");
}

namespace {
/// A stream resumed from a traced snapshot at each of `ats` on each layout equals the uninterrupted one;
/// returns how many keys the records of `kind` held over all the snapshots (none of them data).
template <class T>
std::size_t keys_resume_alike(const Pipeline<T>& p, const std::string& kind, std::initializer_list<std::size_t> ats) {
  std::size_t keys = 0;
  for (const auto& l : kLayouts) {
    RunOptions plain = traced(l.workers, l.inline_workers);
    plain.trace = false;
    const auto reference = dpipe::testing::collect(p, plain);
    for (std::size_t at : ats) {
      Snapshot keyed;
      EXPECT_EQ(resumed_stream(p, traced(l.workers, l.inline_workers), traced(l.workers, l.inline_workers), at, nullptr,
                               nullptr, &keyed),
                reference)
          << kind << ", " << l.workers << " workers at " << at;
      EXPECT_EQ(held(keyed, kind, false), 0u) << kind;
      keys += held(keyed, kind, true);
    }
  }
  return keys;
}
}  // namespace

// zip (a row's groups are its inputs' elements), and the queues of fork, demux and unzip (an output read
// behind the others holds what the node routed to it), met non-empty: saved as keys, resumed exactly.
TEST(RestoreKeys, ZipForkDemuxAndUnzipHoldKeys) {
  const auto rows = range(0, 3000) | sampler() | map(kRow);
  // A shuffle of zipped rows: its buffer's keys are zip rows of two groups.
  EXPECT_GT(keys_resume_alike(zip(rows, range(0, 3000) | map([](I64 x) { return x * 2; })) | shuffle({.buffer = 16}),
                              "shuffle", {1, 40, 300}),
            0u);
  {  // fork: output b read 5 ahead of a, so a's queue holds 5 elements after every pull
    auto [a, b] = rows | fork<2>({.buffer = 2000});
    EXPECT_GT(keys_resume_alike(zip(a, b | skip(5)), "fork", {1, 40, 300}), 0u);
  }
  {  // demux: even rows to output 0, odd to 1; zip reads output 0 first, so output 1 holds rows
    auto [even, odd] = rows | demux<2>([](const Row& r) { return (r[0] - 1) / 3 % 2; }, {.buffer = 2000});
    EXPECT_GT(keys_resume_alike(zip(even | skip(3), odd), "demux", {1, 40, 300}), 0u);
  }
  {  // unzip: value j of a row has the row's provenance at offset j
    const auto pairs = zip_all(std::vector{rows, range(0, 3000) | map([](I64 x) { return Row(3, -x); })});
    const auto columns = pairs | unzip({.count = 2, .buffer = 2000});
    EXPECT_GT(keys_resume_alike(zip(columns[0], columns[1] | skip(4)), "unzip", {1, 40, 300}), 0u);
  }
}

// padded_batch over packed rows (each row several base elements: grouped): the padded batches the run
// holds in its hands and the workers' queues are keys, made again by padding their rows again; resumed
// exactly.
TEST(RestoreKeys, PaddedBatchesOfPackedRowsAreKeys) {
  dpipe::testing::TempDir dir;
  dpipe::testing::write_bytes(dir.file("prose.jsonl"), corpus(500, 0));
  dpipe::testing::write_bytes(dir.file("code.jsonl"), corpus(200, 100'000));
  for (const PackMode mode : {PackMode::greedy, PackMode::first_fit}) {
    const auto p = llm_rows(dir.file("prose.jsonl"), dir.file("code.jsonl"), mode) | padded_batch({.size = 4});
    EXPECT_GT(keys_resume_alike(p, "run", {1, 7, 30}), 0u) << int(mode);
  }
}
