// The dataflow ops beyond chains: nodes of several outputs (fork, demux, unzip) and the `from` branches
// that read them (what each output gets, exact resume with held elements, the graph's checks, specs and
// lengths); enumerate, zip_longest and zip of inputs of several types.
#include <gtest/gtest.h>

#include <numeric>

#include "dpipe/dpipe.hpp"
#include "dpipe/kinds.hpp"
#include "json_spec.hpp"
#include "../test_util.hpp"

using namespace dpipe;
using dpipe::testing::collect;
using dpipe::testing::expect_throw_with;
using dpipe::testing::options;
using dpipe::testing::stop_and_resume;

namespace {

std::vector<std::int64_t> iota(std::int64_t from, std::int64_t to) {
  std::vector<std::int64_t> v(static_cast<std::size_t>(to - from));
  std::iota(v.begin(), v.end(), from);
  return v;
}

/// The elements node `key` holds for its outputs, summed over the records of every instance.
std::uint64_t held_by(const Snapshot& s, const std::string& key) {
  std::uint64_t held = 0;
  for (const auto& st : s.states) {
    if (st.key != key) continue;
    SplitState<std::vector<std::int64_t>> split;
    StateReader r(st);
    r.read(split);
    held += split.held.size();
  }
  return held;
}

/// Every breakpoint from 0 to the end, with 1 and 2 workers: prefix + resumed rest is the whole stream.
/// Returns the largest number of elements node `key` held at a breakpoint's snapshot.
template <class T>
std::uint64_t expect_exact_resume_everywhere(const Pipeline<T>& p, const std::string& key) {
  std::uint64_t most_held = 0;
  for (int workers : {1, 2}) {
    const auto o = options(workers);
    const auto want = collect(p, o);
    EXPECT_FALSE(want.empty());
    for (std::size_t at = 0; at <= want.size(); ++at) {
      Engine e;
      auto run = e.start(p, o);
      auto got = dpipe::testing::drain(run, at);
      const Snapshot s = Snapshot::from_bytes(run.snapshot().to_bytes());
      most_held = std::max(most_held, held_by(s, key));
      auto resumed = e.resume(p, s, o);
      auto rest = dpipe::testing::drain(resumed);
      got.insert(got.end(), rest.begin(), rest.end());
      if (got != want) {
        ADD_FAILURE() << workers << " workers, breakpoint " << at << ": the resumed stream differs";
        return most_held;
      }
    }
  }
  return most_held;
}

/// A shallow worker queue: the workers stay a few elements ahead of the consumer, so a snapshot meets the
/// node under test mid-stream instead of after its whole stream drained into the queue.
auto near_the_consumer() { return prefetch({.depth = 2}); }

auto twice = [](std::int64_t x) { return 2 * x; };
auto plus_1000 = [](std::int64_t x) { return x + 1000; };
auto mod3 = [](std::int64_t x) { return x % 3; };

}  // namespace

TEST(Fork, EveryOutputSeesEveryElement) {
  auto [a, b] = range(0, 10) | fork<2>();
  const auto rows = collect(zip(a | map(twice), b), options());
  ASSERT_EQ(rows.size(), 10u);
  for (std::int64_t i = 0; i < 10; ++i) EXPECT_EQ(rows[static_cast<std::size_t>(i)], std::make_tuple(2 * i, i));

  const auto v = range(0, 5) | fork({.count = 3});
  ASSERT_EQ(v.size(), 3u);
  EXPECT_EQ(collect(concat(v[0], v[1], v[2]), options()), (std::vector<std::int64_t>{0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 1, 2, 3, 4}));
}

TEST(Fork, ResumesExactlyAtEveryBreakpointWithItsQueuesSaved) {
  // concat reads output 0 to its end before output 1: the fork holds output 1's elements meanwhile.
  auto [a, b] = range(0, 120) | sharding_filter() | shuffle({.buffer = 7}) | fork<2>({.name = "f"});
  const auto p = concat(a, b | map(plus_1000)) | near_the_consumer();
  EXPECT_GT(expect_exact_resume_everywhere(p, "f"), 10u);
  // A zip reads the outputs in step: the fork holds at most a chunk.
  auto [c, d] = range(0, 90) | shuffle({.buffer = 5}) | fork<2>({.name = "g"});
  expect_exact_resume_everywhere(zip(c | map(twice), d) | near_the_consumer(), "g");
}

TEST(Fork, AnOutputTooFarBehindIsAnErrorNamingTheFork) {
  auto [a, b] = range(0, 100) | fork<2>({.buffer = 10, .name = "f"});
  expect_throw_with<Error>([&] { collect(concat(a, b), options()); },
                           "pipeline[1] (fork 'f'): output 0 is 11 elements ahead of output 1, more than its buffer (10) allows");
  // Room for the whole stream: output 0 reaches the end with the buffer full, which is no error.
  auto [c, d] = range(0, 100) | fork<2>({.buffer = 100, .name = "f"});
  EXPECT_EQ(collect(concat(c, d), options()).size(), 200u);
}

TEST(Demux, EachElementGoesToTheOutputItsFunctionPicks) {
  auto [a, b, c] = range(0, 30) | demux<3>(mod3);
  EXPECT_EQ(collect(mux(a, b, c), options()), iota(0, 30));
  const auto v = range(0, 9) | demux(mod3, {.count = 3});
  EXPECT_EQ(collect(concat(v[2], v[0], v[1]), options()), (std::vector<std::int64_t>{2, 5, 8, 0, 3, 6, 1, 4, 7}));
}

TEST(Demux, ResumesExactlyAtEveryBreakpointWithItsQueuesSaved) {
  auto [a, b, c] = range(0, 150) | sharding_filter() | shuffle({.buffer = 9}) | demux<3>(mod3, {.name = "d"});
  EXPECT_GT(expect_exact_resume_everywhere(concat(b, a | map(plus_1000), c) | near_the_consumer(), "d"), 10u);
}

TEST(Fork, ARunDestroyedMidStreamTakesTheForkAndItsUpstreamWithIt) {
  // The fork stands after the merge and the Run is the only owner of the pipeline: destroying it mid-stream
  // must stop the workers below the fork before the graph and definitions go (AddressSanitizer checks).
  Engine e;
  for (int round = 0; round < 3; ++round) {
    auto run = [&] {
      auto [a, b] = range(0, 100'000) | sharding_filter() | batch({.size = 4}) | merge() | fork<2>();
      return e.start(zip(a, b), options(2));
    }();
    const auto head = dpipe::testing::drain(run, 10);
    ASSERT_EQ(head.size(), 10u);
    EXPECT_EQ(std::get<0>(head[3]), std::get<1>(head[3]));
  }
  auto [c, d] = range(0, 10) | demux<2>([](std::int64_t x) { return x >= 5; });  // a bool picks output 0 or 1
  EXPECT_EQ(collect(concat(d, c), options()), (std::vector<std::int64_t>{5, 6, 7, 8, 9, 0, 1, 2, 3, 4}));
}

TEST(Demux, AnOutputOutsideTheCountFailsTheRunNamingTheDemux) {
  auto [a, b] = range(0, 10) | demux<2>([](std::int64_t x) { return x == 4 ? 7 : x % 2; }, {.name = "d"});
  expect_throw_with<Error>([&] { collect(mux(a, b), options()); }, "(demux 'd') failed (worker 0): its function returned 7 for an element; the outputs are 0 to 1");
  auto [c, d] = range(0, 100) | demux<2>([](std::int64_t) { return 1; }, {.buffer = 20, .name = "d"});
  expect_throw_with<Error>([&] { collect(mux(c, d), options()); },
                           "(demux 'd'): it holds 21 elements for outputs other than output 0, more than its buffer (20)");
  // torch's buffer cases: the first five elements all go to output 1. A buffer of 4 fails at output 0's
  // first element; a buffer of 5 holds them, and output 0 gets its element.
  auto high_first = [](std::int64_t x) { return x >= 5 ? 0 : 1; };
  auto [e, f] = range(0, 10) | demux<2>(high_first, {.buffer = 4, .name = "d"});
  expect_throw_with<Error>([&] { collect(concat(e, f), options()); }, "it holds 5 elements for outputs other than output 0");
  auto [g, h] = range(0, 10) | demux<2>(high_first, {.buffer = 5});
  EXPECT_EQ(collect(concat(g, h), options()), (std::vector<std::int64_t>{5, 6, 7, 8, 9, 0, 1, 2, 3, 4}));
}

TEST(Unzip, RowsToColumns) {
  auto [a, b] = range(0, 20) | batch({.size = 2}) | unzip<2>({.name = "u"});
  const auto rows = collect(zip(a, b), options());
  ASSERT_EQ(rows.size(), 10u);
  for (std::int64_t i = 0; i < 10; ++i) EXPECT_EQ(rows[static_cast<std::size_t>(i)], std::make_tuple(2 * i, 2 * i + 1));
  auto [c, d] = range(0, 60) | sharding_filter() | batch({.size = 2, .drop_last = true}) | unzip<2>({.name = "u"});
  EXPECT_GT(expect_exact_resume_everywhere(concat(d, c) | near_the_consumer(), "u"), 5u);
  auto [e, f] = range(0, 5) | batch({.size = 2}) | unzip<2>({.name = "u"});
  expect_throw_with<Error>([&] { collect(concat(e, f), options()); }, "pipeline[2] (unzip 'u') failed (worker 0): a row of 1 values; it splits rows of 2");
}

TEST(Branches, TheGraphRefusesAnOutputNeverReadOrReadTwiceAndAReaderWithoutItsNode) {
  const auto v = range(0, 10) | fork({.count = 3, .name = "f"});
  expect_throw_with<ConfigError>([&] { Graph::build(*zip(v[0], v[1]).def()); }, "pipeline[1] (fork 'f'): output 2 is never read");
  expect_throw_with<ConfigError>([&] { Graph::build(*zip(v[0], v[1], v[2], v[1]).def()); }, "output 1 of pipeline[1] (fork 'f') is read twice");
  expect_throw_with<ConfigError>([&] { Graph::build(*zip(v[0], v[1], v[2], v[0]).def()); }, "output 0 of pipeline[1] (fork 'f') is read twice");
  expect_throw_with<ConfigError>([&] { Graph::build(*zip(v[0], v[1], v[2], output(v[0], 1)).def()); },
                                 "output 1 of pipeline[1] (fork 'f') is read twice");
  expect_throw_with<ConfigError>([&] { Graph::build(*zip(v[1], v[2]).def()); },
                    "output 1 of fork 'f' is read, but fork 'f' itself is not in the pipeline");
  // A branch read after the merge while its fork runs on the workers.
  expect_throw_with<ConfigError>([&] { Graph::build(*zip(v[0] | merge(), v[1], v[2]).def()); }, "read every output of a node on the same side");
  expect_throw_with<ConfigError>([&] { Graph::build(*(zip(v[0], v[1], v[2]) | cycle({.count = 2})).def()); },
                    "it rebuilds its upstream every pass, so it cannot contain");
  expect_throw_with<ConfigError>([&] { output(range(0, 3), 1); }, "from: range has one output");
  expect_throw_with<ConfigError>([&] { output(v[0], 3); }, "has outputs 1 to 2 to read");
}

TEST(Branches, TheGraphDrawsTheBranchesAndAdditionsElsewhereKeepTheKeys) {
  auto [a, b] = range(0, 10) | fork<2>();
  const Graph g = Graph::build(*zip(a, b | shuffle({.buffer = 3})).def());
  std::size_t fork_at = 0, from_at = 0;
  for (std::size_t i = 0; i < g.nodes().size(); ++i) {
    if (g.nodes()[i].kind == "fork") fork_at = i;
    if (g.nodes()[i].kind == "from") from_at = i;
  }
  EXPECT_EQ(g.nodes()[from_at].reads, fork_at);
  EXPECT_NE(g.to_dot().find(std::to_string(fork_at) + "->" + std::to_string(from_at)), std::string::npos);
  // A map added on output 0 leaves the shuffle of output 1 (and its key) as it was.
  const Graph h = Graph::build(*zip(a | map(twice), b | shuffle({.buffer = 3})).def());
  auto key_of = [](const Graph& graph, const std::string& kind) {
    for (const auto& n : graph.nodes())
      if (n.kind == kind) return n.key;
    return std::string();
  };
  EXPECT_EQ(key_of(g, "shuffle"), key_of(h, "shuffle"));
  EXPECT_EQ(key_of(g, "fork"), key_of(h, "fork"));
  const auto first = collect(zip(a, b | shuffle({.buffer = 3})), options());
  const auto second = collect(zip(a | map(twice), b | shuffle({.buffer = 3})), options());
  ASSERT_EQ(first.size(), second.size());
  for (std::size_t i = 0; i < first.size(); ++i) EXPECT_EQ(std::get<1>(first[i]), std::get<1>(second[i]));
}

TEST(Branches, LengthIsTheNodeReadsLengthAndADemuxCannotSay) {
  auto [a, b] = range(0, 10) | fork<2>();
  EXPECT_EQ(Graph::build(*concat(a, b).def()).length(Layout{}), 20u);
  auto [c, d] = range(0, 10) | demux<2>(mod3, {.name = "d"});
  std::string why;
  EXPECT_EQ(Graph::build(*concat(c, d).def()).length(Layout{}, &why), std::nullopt);
  EXPECT_EQ(why, "pipeline[1] (demux 'd') cannot say how many elements it gives");
}

TEST(BranchSpecs, TheIssuesExampleAndWhatASpecMayGetWrong) {
  const Spec s = parse_spec(R"({"pipeline": [{"op": "range", "stop": 10}, {"op": "fork", "name": "f"},
      {"op": "map", "fn": "affine", "mul": 2}, {"op": "zip", "with": [[{"op": "from", "name": "f", "output": 1}]]}]})");
  const auto rows = collect(s.pipeline.get<std::vector<std::int64_t>>(), options());
  ASSERT_EQ(rows.size(), 10u);
  for (std::int64_t i = 0; i < 10; ++i) EXPECT_EQ(rows[static_cast<std::size_t>(i)], (std::vector<std::int64_t>{2 * i, i}));

  const Spec m = parse_spec(R"({"pipeline": [{"op": "range", "stop": 12}, {"op": "demux", "name": "d", "fn": "mod"},
      {"op": "mux", "with": [[{"op": "from", "name": "d", "output": 1}], [{"op": "from", "name": "d", "output": 2}]]}]})");
  EXPECT_EQ(collect(m.pipeline.get<std::int64_t>(), options()), iota(0, 12));
  const Spec u = parse_spec(R"({"pipeline": [{"op": "range", "stop": 6}, {"op": "batch", "size": 3}, {"op": "unzip", "name": "u"},
      {"op": "concat", "with": [[{"op": "from", "name": "u", "output": 1}], [{"op": "from", "name": "u", "output": 2}]]}]})");
  EXPECT_EQ(collect(u.pipeline.get<std::int64_t>(), options()), (std::vector<std::int64_t>{0, 3, 1, 4, 2, 5}));
  // Without a count, an unzip has as many outputs as are read: here 3, of which output 1 is not.
  const Spec gap = parse_spec(R"({"pipeline": [{"op": "range", "stop": 6}, {"op": "batch", "size": 3}, {"op": "unzip", "name": "u"},
      {"op": "concat", "with": [[{"op": "from", "name": "u", "output": 2}]]}]})");
  expect_throw_with<ConfigError>([&] { Graph::build(gap.pipeline.def()); }, "(unzip 'u'): output 1 is never read");

  expect_throw_with<ConfigError>([] { parse_spec(R"({"pipeline": [{"op": "from", "name": "f", "output": 1}]})"); },
                    "pipeline[0] (from 'f'): no node of the spec is named 'f'");
  // A branch listed before the chain with its fork: that chain is built ahead, up to the fork.
  const Spec ahead = parse_spec(R"({"pipeline": [{"op": "from", "name": "f", "output": 1}, {"op": "map", "fn": "affine", "add": 10},
      {"op": "zip", "with": [[{"op": "range", "stop": 3}, {"op": "fork", "name": "f"}, {"op": "map", "fn": "affine", "mul": 3}]]}]})");
  EXPECT_EQ(collect(ahead.pipeline.get<std::vector<std::int64_t>>(), options()),
            (std::vector<std::vector<std::int64_t>>{{10, 0}, {11, 3}, {12, 6}}));
  expect_throw_with<ConfigError>([] { parse_spec(R"({"pipeline": [{"op": "range", "stop": 3},
      {"op": "zip", "with": [[{"op": "from", "name": "f", "output": 1}]]}, {"op": "fork", "name": "f"}]})"); },
                    "'f' stands downstream of a branch it feeds");
  expect_throw_with<ConfigError>([] { parse_spec(R"({"pipeline": [{"op": "range", "stop": 3}, {"op": "fork", "name": "f"},
      {"op": "zip", "with": [[{"op": "from", "name": "f", "output": 1}], [{"op": "from", "name": "f", "output": 1}]]}]})"); },
                    "output 1 of 'f' is read twice");
  expect_throw_with<ConfigError>([] { parse_spec(R"({"pipeline": [{"op": "range", "stop": 3}, {"op": "fork", "name": "f"},
      {"op": "zip", "with": [[{"op": "from", "name": "f", "output": 0}]]}]})"); },
                    "output must be 1 or more");
  expect_throw_with<ConfigError>([] { parse_spec(R"({"pipeline": [{"op": "range", "stop": 3}, {"op": "fork"}]})"); }, "(fork): name it");
  expect_throw_with<ConfigError>([] { parse_spec(R"({"pipeline": [{"op": "range", "stop": 3}, {"op": "map", "fn": "identity", "name": "m"},
      {"op": "zip", "with": [[{"op": "from", "name": "m", "output": 1}]]}]})"); },
                    "from: map 'm' has one output");
  const Spec three = parse_spec(R"({"pipeline": [{"op": "range", "stop": 3}, {"op": "fork", "name": "f", "count": 3},
      {"op": "zip", "with": [[{"op": "from", "name": "f", "output": 1}]]}]})");
  expect_throw_with<ConfigError>([&] { Graph::build(three.pipeline.def()); }, "(fork 'f'): output 2 is never read");
}

TEST(Enumerate, GivesEachElementItsIndexAndResumesAtEveryBreakpoint) {
  EXPECT_EQ(collect(range(5, 8) | enumerate(), options()),
            (std::vector<std::tuple<std::int64_t, std::int64_t>>{{0, 5}, {1, 6}, {2, 7}}));
  const auto p = range(0, 40) | sharding_filter() | enumerate({.start = 10, .name = "e"}) | near_the_consumer();
  for (int workers : {1, 2}) {
    const auto whole = collect(p, options(workers));
    ASSERT_EQ(whole.size(), 40u);
    for (std::size_t at = 0; at <= whole.size(); ++at) EXPECT_EQ(stop_and_resume(p, options(workers), at), whole) << at;
  }
  // Mid-stream, the saved index is past the start.
  Engine e;
  auto run = e.start(p, options(1));
  dpipe::testing::drain(run, 7);
  const Snapshot s = run.snapshot();
  bool met = false;
  for (const auto& st : s.states)
    if (st.key == "e") {
      EnumerateState es;
      StateReader r(st);
      r.read(es);
      met = es.next > 10;
    }
  EXPECT_TRUE(met);
}

TEST(ZipLongest, FillsForEndedInputsUntilEveryInputEnded) {
  const auto p = zip_longest_all(std::vector{range(0, 3), range(10, 15)}, std::int64_t{-1}, {.name = "z"});
  EXPECT_EQ(collect(p, options()),
            (std::vector<std::vector<std::int64_t>>{{0, 10}, {1, 11}, {2, 12}, {-1, 13}, {-1, 14}}));
  const auto q = zip_longest_all(std::vector{range(0, 300) | shuffle({.buffer = 5}), range(0, 410)}, std::int64_t{-1});
  const auto whole = collect(q, options());
  ASSERT_EQ(whole.size(), 410u);
  for (std::size_t at : {0, 1, 150, 299, 300, 301, 409, 410}) EXPECT_EQ(stop_and_resume(q, options(), at), whole) << at;
  EXPECT_EQ(Graph::build(*q.def()).length(Layout{}), 410u);
}

TEST(RowSpecs, ZipOfSeveralTypesZipLongestAndEnumerateGiveRowsOfValues) {
  const Spec zip_mixed = parse_spec(R"({"pipeline": [{"op": "range", "stop": 2},
      {"op": "zip", "with": [[{"op": "from_vector", "values": ["a", "b", "c"]}]]}]})");
  const auto rows = collect(zip_mixed.pipeline.get<std::vector<Value>>(), options());
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[1], (std::vector<Value>{Value::integer(1), Value::string("b")}));
  const Spec longest = parse_spec(R"({"pipeline": [{"op": "range", "stop": 1},
      {"op": "zip_longest", "with": [[{"op": "from_vector", "values": ["a", "b"]}]]}]})");
  const auto filled = collect(longest.pipeline.get<std::vector<Value>>(), options());
  ASSERT_EQ(filled.size(), 2u);
  EXPECT_EQ(filled[1], (std::vector<Value>{Value::none(), Value::string("b")}));
  const Spec counted = parse_spec(R"({"pipeline": [{"op": "from_vector", "values": ["x", "y"]}, {"op": "enumerate", "start": 1}]})");
  EXPECT_EQ(collect(counted.pipeline.get<std::vector<Value>>(), options())[1],
            (std::vector<Value>{Value::integer(2), Value::string("y")}));
  const Spec ints = parse_spec(R"({"pipeline": [{"op": "range", "start": 4, "stop": 6}, {"op": "enumerate"}]})");
  EXPECT_EQ(collect(ints.pipeline.get<std::vector<std::int64_t>>(), options()),
            (std::vector<std::vector<std::int64_t>>{{0, 4}, {1, 5}}));
}
