// Codec, checksum, generator, graph and option checks.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <iterator>
#include <map>
#include <numeric>
#include <random>
#include <ranges>
#include <set>

#include "builtins.hpp"
#include "dpipe/crc32c.hpp"
#include "dpipe/dpipe.hpp"
#include "dpipe/kinds.hpp"
#include "json_spec.hpp"
#include "../test_util.hpp"

namespace dpipe {
namespace {

struct UserPoint {  // a user type serialised by cereal
  int x = 0;
  std::string label;
  template <class A>
  void serialize(A& a) { a(x, label); }
  friend bool operator==(const UserPoint&, const UserPoint&) = default;
};

template <class T>
void expect_round_trip(const T& v, const std::string& tag) {
  EXPECT_EQ(Codec<T>::tag(), tag);
  EXPECT_EQ(decode_from_string<T>(encode_to_string(v)), v);
}

TEST(Codec, BuiltinTypesRoundTripWithReadableTags) {
  expect_round_trip<std::int64_t>(-5, "i64");
  expect_round_trip<std::uint8_t>(200, "u8");
  expect_round_trip<double>(2.5, "f64");
  expect_round_trip<bool>(true, "bool");
  expect_round_trip<std::string>("hé\n", "str");
  expect_round_trip<std::vector<std::int64_t>>({1, -2, 3}, "vec<i64>");
  expect_round_trip<std::vector<std::vector<std::string>>>({{"a"}, {}, {"b", "c"}}, "vec<vec<str>>");
  expect_round_trip<std::tuple<std::int64_t, std::string>>({4, "x"}, "tup<i64,str>");
  expect_round_trip<std::pair<int, double>>({1, 0.5}, "tup<i32,f64>");
  expect_round_trip<std::optional<int>>(std::nullopt, "opt<i32>");
  expect_round_trip<std::array<std::int16_t, 3>>({1, 2, 3}, "tup<i16,i16,i16>");
}

TEST(Codec, CerealTypesRoundTripAsOpaqueBlobs) {
  static_assert(Snapshottable<UserPoint>);
  const UserPoint p{3, "three"};
  EXPECT_EQ(decode_from_string<UserPoint>(encode_to_string(p)), p);
  EXPECT_EQ(Codec<UserPoint>::tag().rfind("cereal:", 0), 0u);
}

TEST(Codec, CorruptLengthsAreRefusedWithoutAllocating) {
  std::string bytes = encode_to_string(std::vector<std::int64_t>{1, 2, 3});
  bytes[7] = 0x7f;  // count becomes enormous
  EXPECT_THROW(decode_from_string<std::vector<std::int64_t>>(bytes), SnapshotError);
  EXPECT_THROW(decode_from_string<std::string>(std::string(3, '\0')), SnapshotError);
  std::string opt = encode_to_string(std::optional<int>(1));
  opt[0] = 7;
  EXPECT_THROW(decode_from_string<std::optional<int>>(opt), SnapshotError);
}

TEST(Codec, NativeElementsRenderAsJsonFromTheirTag) {
  std::string out;
  ASSERT_TRUE(element_to_json("vec<tup<i64,str>>", encode_to_string(std::vector<std::tuple<std::int64_t, std::string>>{{1, "a"}}), out));
  EXPECT_EQ(out, "[[1,\"a\"]]");
  EXPECT_FALSE(element_to_json("vec<i64>", "abc", out));
  EXPECT_FALSE(element_to_json("cereal:X", "abc", out));
  EXPECT_FALSE(element_to_json("vec<", "", out));
  // line_blocks' elements render as the list of their lines; inconsistent ones do not render.
  ASSERT_TRUE(element_to_json("vec<text_block>", encode_to_string(std::vector<TextBlock>{TextBlock({"a", "b\r"})}), out));
  EXPECT_EQ(out, "[[\"a\",\"b\"]]");
  std::string bad = encode_to_string(TextBlock({"a"}));
  bad[bad.size() - 1] = 9;  // the line's end, past the text
  EXPECT_FALSE(element_to_json("text_block", bad, out));
}

TEST(Crc32c, MatchesPublishedTestVectors) {
  // RFC 3720 (iSCSI) appendix B.4 vectors.
  EXPECT_EQ(crc32c("123456789"), 0xe3069283u);
  EXPECT_EQ(crc32c(std::string(32, '\0')), 0x8a9136aau);
  EXPECT_EQ(crc32c(std::string(32, '\xff')), 0x62a8ab43u);
  std::string inc;
  for (int i = 0; i < 32; ++i) inc += static_cast<char>(i);
  EXPECT_EQ(crc32c(inc), 0x46dd794eu);
  EXPECT_EQ(crc32c("6789", crc32c("12345")), crc32c("123456789"));  // continues across calls
}

TEST(Crc32c, LongBuffersAgreeWithTheirPiecesContinued) {
  // Buffers of three 4 KiB blocks and more take the three-stream path; pieces of 1000 bytes do not.
  std::mt19937_64 g(5);
  std::string s(100'003, '\0');
  for (auto& ch : s) ch = static_cast<char>(g());
  const std::string_view v(s);
  for (const std::size_t n : {0u, 7u, 12'287u, 12'288u, 12'289u, 36'869u, 100'003u}) {
    std::uint32_t pieces = 0;
    for (std::size_t i = 0; i < n; i += 1000) pieces = crc32c(v.substr(i, std::min<std::size_t>(1000, n - i)), pieces);
    EXPECT_EQ(crc32c(v.substr(0, n)), pieces) << n;
  }
  EXPECT_EQ(crc32c(std::string(12'288, '\0')), crc32c(std::string(6'144, '\0'), crc32c(std::string(6'144, '\0'))));
}

TEST(Rng, DerivedStreamsAreReproducibleAndDistinct) {
  EXPECT_EQ(Rng::derive(1, "shuffle@1", 0), Rng::derive(1, "shuffle@1", 0));
  EXPECT_NE(Rng::derive(1, "shuffle@1", 0)(), Rng::derive(1, "shuffle@1", 1)());
  EXPECT_NE(Rng::derive(1, "shuffle@1", 0)(), Rng::derive(2, "shuffle@1", 0)());
  EXPECT_NE(Rng::derive(1, "shuffle@1", 0)(), Rng::derive(1, "shuffle@2", 0)());
}

TEST(Rng, BelowIsUniformEnough) {
  Rng r(3);
  std::map<std::uint64_t, int> counts;
  for (int i = 0; i < 60000; ++i) counts[r.below(6)]++;
  ASSERT_EQ(counts.size(), 6u);
  for (auto [k, c] : counts) EXPECT_NEAR(c, 10000, 500) << k;
}

TEST(Graph, KeysAreNamesOrKindAndADigestOfWhatIsUpstream) {
  auto p = range(0, 10, {.name = "src"}) | shuffle({.buffer = 4}) | batch({.size = 2, .name = "b"});
  auto g = Graph::build(*p.def());
  ASSERT_EQ(g.keys().size(), 3u);
  EXPECT_EQ(g.keys()[0], "b");
  EXPECT_EQ(g.keys()[2], "src");
  const std::string& shuffled = g.keys()[1];
  EXPECT_TRUE(shuffled.starts_with("shuffle@") && shuffled.size() == 16) << shuffled;
  EXPECT_EQ(g.topological_order(), (std::vector<std::size_t>{2, 1, 0}));
  EXPECT_NE(g.to_dot().find(shuffled), std::string::npos);
  EXPECT_NE(g.to_dot().find("->"), std::string::npos);
  // Versions 1 to 3 of the format keyed by pre-order position; that scheme stays for their snapshots.
  EXPECT_EQ(Graph::build(*p.def(), KeyScheme::pre_order).keys(), (std::vector<std::string>{"b", "shuffle@1", "src"}));
}

// The keys of every node of `kind` in `p`, in pre-order.
template <class T>
std::vector<std::string> keys_of(const Pipeline<T>& p, std::string_view kind) {
  const Graph g = Graph::build(*p.def());
  std::vector<std::string> out;
  for (const auto& n : g.nodes())
    if (n.kind == kind) out.push_back(n.key);
  return out;
}

TEST(Graph, AnUnnamedKeyStaysWhenNodesAreAddedDownstreamOrInAnotherBranch) {
  const auto identity = [](std::int64_t x) { return x; };
  const auto base = range(0, 10) | shuffle({.buffer = 4});
  const std::string key = keys_of(base, "shuffle").at(0);
  EXPECT_EQ(keys_of(base | map(identity) | batch({.size = 2}) | prefetch({.depth = 3}), "shuffle"),
            std::vector<std::string>{key});
  EXPECT_EQ(keys_of(zip(base, range(0, 5)), "shuffle"), std::vector<std::string>{key});
  EXPECT_EQ(keys_of(zip(range(0, 5) | map(identity) | filter([](std::int64_t x) { return x > 1; }), base), "shuffle"),
            std::vector<std::string>{key});
  // Parameters are not part of a key (a changed one is refused by name on resume); what lies upstream is.
  EXPECT_EQ(keys_of(range(3, 99) | shuffle({.buffer = 7}), "shuffle"), std::vector<std::string>{key});
  EXPECT_NE(keys_of(range(0, 10) | map(identity) | shuffle({.buffer = 4}), "shuffle").at(0), key);
  // A name upstream stands for everything above it.
  EXPECT_EQ(keys_of(range(0, 10, {.name = "src"}) | shuffle(), "shuffle"),
            keys_of(range(0, 10) | map(identity, {.name = "src"}) | shuffle(), "shuffle"));
  // Subgraphs of one shape are numbered in pre-order; the first keeps the plain key.
  EXPECT_EQ(keys_of(zip(base, base | map(identity)), "shuffle"), (std::vector<std::string>{key, key + ".2"}));
  EXPECT_EQ(keys_of(zip(base | map(identity), base), "shuffle"), (std::vector<std::string>{key, key + ".2"}));
}

TEST(Graph, FingerprintCoversParametersNamesAndEdges) {
  auto fp = [](const auto& p) { return Graph::build(*p.def()).fingerprint(); };
  const auto base = fp(range(0, 10) | shuffle({.buffer = 4}));
  EXPECT_EQ(base, fp(range(0, 10) | shuffle({.buffer = 4})));
  EXPECT_NE(base, fp(range(0, 11) | shuffle({.buffer = 4})));
  EXPECT_NE(base, fp(range(0, 10) | shuffle({.buffer = 5})));
  EXPECT_NE(base, fp(range(0, 10) | shuffle({.buffer = 4, .name = "s"})));
  EXPECT_NE(fp(concat(range(0, 3), range(0, 4))), fp(concat(range(0, 4), range(0, 3))));
  EXPECT_NE(fp(range(0, 3) | map(builtins::Affine{2, 0})), fp(range(0, 3) | map(builtins::Affine{3, 0})));
}

TEST(Graph, DuplicateOrMalformedNamesAreConfigErrors) {
  EXPECT_THROW(Graph::build(*(range(0, 3, {.name = "a"}) | take(1, {.name = "a"})).def()), ConfigError);
  EXPECT_THROW(Graph::build(*range(0, 3, {.name = "bad name"}).def()), ConfigError);
  EXPECT_THROW(Graph::build(*(range(0, 3, {.name = "take@0"}) | take(1)).def()), ConfigError);
  // "run" is the key of the engine's own snapshot record: a node of that name could never resume.
  EXPECT_THROW(Graph::build(*(range(0, 3) | batch({.size = 2, .name = "run"})).def()), ConfigError);
  EXPECT_NO_THROW(Graph::build(*(range(0, 3) | batch({.size = 2, .name = "runs"})).def()));
}

TEST(Graph, DoubleParametersAreWrittenShortestRoundTrip) {
  EXPECT_EQ(param_text(0.1), "0.1");
  EXPECT_EQ(param_text(1e-300), "1e-300");
  // Values that differ in the 7th significant digit (and beyond) write differently, so fingerprints differ.
  EXPECT_NE(param_text(0.30000001), param_text(0.30000002));
  EXPECT_NE(param_text(1.0), param_text(1.0000000000000002));
  EXPECT_EQ(std::stod(param_text(2.0 / 3.0)), 2.0 / 3.0);
}

TEST(Kinds, EveryKindOfTheListIsRegisteredOnceWithItsRule) {
  const auto& kinds = registered_kinds();
  std::set<std::string_view> names;
  for (const auto& k : kinds) EXPECT_TRUE(names.insert(k.name).second) << k.name;
  EXPECT_EQ(kinds.size(), 40u);
  ASSERT_NE(find_kind("batch"), nullptr);
  EXPECT_FALSE(find_kind("batch")->rescale.refuses());
  ASSERT_NE(find_kind("sharding_filter"), nullptr);
  EXPECT_NE(find_kind("sharding_filter")->rescale.reason().find("sampler()"), std::string::npos);
  EXPECT_EQ(find_kind("run"), nullptr);  // the engine's consumer record is no node kind
  // Every kind has a spec op of the same name, in the same order.
  std::vector<std::string> kind_names;
  for (const auto& k : kinds) kind_names.emplace_back(k.name);
  EXPECT_EQ(spec_ops(), kind_names);
}

TEST(Kinds, EachKindsSchemaDeclaresItsParametersStateAndRole) {
  for (const auto& k : registered_kinds()) {
    EXPECT_FALSE(k.doc.empty()) << k.name;
    std::set<std::string_view> names{"name"};
    for (const auto& p : k.params) {
      EXPECT_TRUE(names.insert(p.name).second) << k.name << "." << p.name << " is declared twice";
      EXPECT_FALSE(p.doc.empty()) << k.name << "." << p.name;
      EXPECT_EQ(p.type == ParamType::choice, !p.choices.empty()) << k.name << "." << p.name;
      if (p.type == ParamType::choice && !p.required()) {  // the default is one of the choices
        const std::string_view fallback = p.fallback.substr(1, p.fallback.size() - 2);
        EXPECT_TRUE(p.is_choice(fallback)) << k.name << "." << p.name;
      }
    }
  }
  // Tuning parameters come from the schema, not a list of their own.
  EXPECT_TRUE(find_kind("prefetch")->is_tuning("depth"));
  EXPECT_TRUE(find_kind("parallel_map")->is_tuning("max_in_flight"));
  EXPECT_FALSE(find_kind("batch")->is_tuning("size"));
  EXPECT_FALSE(find_kind("batch")->is_tuning("no_such_parameter"));
  // State fields come from the kind's State visitor.
  EXPECT_EQ(find_kind("take")->state_fields, (std::vector<std::string>{"taken"}));
  EXPECT_EQ(find_kind("shuffle")->state_fields, (std::vector<std::string>{"buffer", "rng", "input_done"}));
  EXPECT_EQ(find_kind("mux")->state_fields, (std::vector<std::string>{"pending", "live"}));
  EXPECT_EQ(find_kind("map")->state_fields, (std::vector<std::string>{"skipped"}));  // with on_error = skip
  // Graph roles are declared on the kinds, and read from their parameters by the kinds themselves.
  EXPECT_EQ(find_kind("merge")->segment, SegmentRole::ends_workers);
  EXPECT_EQ(find_kind("dispatch")->segment, SegmentRole::starts_workers);
  EXPECT_EQ(find_kind("prefetch")->segment, SegmentRole::worker_depth);
  EXPECT_TRUE(find_kind("cycle")->restarts_upstream);
  const Split by_rank = find_kind("sharding_filter")->split({{"level", "rank"}, {"num_shards", "0"}});
  EXPECT_EQ(by_rank.shards, Split::kRank);
  EXPECT_TRUE(find_kind("sharding_filter")->split({{"level", "all"}, {"num_shards", "4"}}).by_hand);
  EXPECT_EQ(find_kind("dispatch")->split({{"mode", "round_robin"}}).deals, Split::kWorker);
  EXPECT_EQ(find_kind("dispatch")->split({{"mode", "broadcast"}}).deals, 0u);
}

TEST(Spec, RefusalsNameWhatIsKnown) {
  auto message = [](const std::string& spec) {
    try {
      parse_spec(spec);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message(R"({"pipeline": [{"op": "nope"}]})").find("unknown op 'nope' (known: range, from_vector,"),
            std::string::npos);
  EXPECT_NE(message(R"({"pipeline": [{"op": "range", "stop": 3}, {"op": "batch", "sise": 2}]})")
                .find("missing parameter 'size' (it was given 'sise', which batch does not take; it takes size, drop_last, name)"),
            std::string::npos);
  // shuffle's buffer has a default (10,000): a misspelt one is an unknown parameter, not the default.
  EXPECT_NE(message(R"({"pipeline": [{"op": "range", "stop": 3}, {"op": "shuffle", "buffer_size": 2}]})")
                .find("unknown parameter 'buffer_size' (shuffle takes buffer, enabled, name)"),
            std::string::npos);
  EXPECT_NE(message(R"({"pipeline": [{"op": "range", "stop": 3}, {"op": "batch", "size": 2, "drop": true}]})")
                .find("unknown parameter 'drop' (batch takes size, drop_last, name)"),
            std::string::npos);
  EXPECT_NE(message(R"({"pipeline": [{"op": "range", "stop": 3}, {"op": "map", "fn": "affine", "mull": 2}]})")
                .find("its function 'affine' takes mul, add"),
            std::string::npos);
  EXPECT_NE(message(R"({"pipeline": [{"op": "range", "stop": 3}, {"op": "filter", "fn": "odd"}]})")
                .find("unknown filter function 'odd' (known: mod_eq)"),
            std::string::npos);
}

TEST(Spec, TheCatalogueListsEveryOpWithItsSchema) {
  const auto all = nlohmann::json::parse(spec_ops_json());
  ASSERT_EQ(all.size(), registered_kinds().size());
  for (const auto& op : all) {
    for (const char* key : {"op", "doc", "params", "rescales", "state"}) EXPECT_TRUE(op.contains(key)) << op["op"] << key;
    for (const auto& p : op["params"])
      for (const char* key : {"name", "type", "default", "required", "positional", "doc"})
        EXPECT_TRUE(p.contains(key)) << op["op"] << key;
  }
  const auto batch = nlohmann::json::parse(spec_ops_json("batch"))[0];
  EXPECT_EQ(batch["params"][0]["name"], "size");
  EXPECT_EQ(batch["params"][0]["required"], true);
  EXPECT_EQ(batch["params"][1]["default"], false);
  EXPECT_EQ(batch["rescales"], true);
  EXPECT_EQ(batch["state"], nlohmann::json::array({"partial", "input_done"}));
  EXPECT_THROW(spec_ops_json("nope"), ConfigError);
}

/// The record and the graph node of node `key` in a snapshot (the first instance's record).
std::pair<NodeState*, const GraphNodeRecord*> record_of(Snapshot& s, const std::string& key) {
  NodeState* record = nullptr;
  const GraphNodeRecord* node = nullptr;
  for (auto& st : s.states)
    if (st.key == key && !record) record = &st;
  for (const auto& n : s.meta.graph)
    if (n.key == key) node = &n;
  return {record, node};
}

TEST(Kinds, TakeChecksItsRecordAgainstItsCountBeforeAnyNodeRuns) {
  auto p = range(0, 100) | take(50, {.name = "head"});
  Engine e;
  auto run = e.start(p, {.layout = Layout{}});
  for (int i = 0; i < 10; ++i) run.next();
  Snapshot s = run.snapshot();
  auto [head, node] = record_of(s, "head");
  ASSERT_TRUE(head && node);
  EXPECT_NO_THROW(find_kind("take")->check_state(*head, *node, nullptr));
  head->fields.at(0).u = 60;
  try {
    find_kind("take")->check_state(*head, *node, nullptr);
    ADD_FAILURE() << "a take record past its count was accepted";
  } catch (const SnapshotError& err) {
    EXPECT_NE(std::string(err.what()).find("taken 60 exceeds count 50"), std::string::npos) << err.what();
  }
  EXPECT_THROW(e.resume(p, s, {.layout = Layout{}}), SnapshotError);
}

TEST(Kinds, ABatchSizeFarAboveTheStreamAllocatesOnlyWhatItHolds) {
  // A declared size of 2^33 elements reserved up front would be 64 GiB.
  Engine e;
  auto run = e.start(range(0, 10) | batch({.size = std::int64_t{1} << 33}), {.layout = Layout{}});
  const auto batches = testing::drain(run);
  ASSERT_EQ(batches.size(), 1u);
  EXPECT_EQ(batches[0].size(), 10u);
}

TEST(Spec, ADuplicateKeyIsRefusedNamingIt) {
  EXPECT_THROW(parse_spec(R"({"pipeline": [{"op": "range", "stop": 3, "stop": 5}]})"), ConfigError);
  try {
    parse_spec(R"({"pipeline": [{"op": "range", "stop": 3}, {"op": "batch", "size": 2, "size": 3}]})");
    ADD_FAILURE() << "a duplicate key was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("key 'size' twice"), std::string::npos) << e.what();
  }
  // The same key in two objects is no duplicate.
  EXPECT_NO_THROW(parse_spec(R"({"pipeline": [{"op": "range", "stop": 3}, {"op": "concat", "with": [[{"op": "range", "stop": 2}]]}]})"));
}

TEST(Kinds, SkipDropsItsCountKeepsItInItsStateAndChecksIt) {
  auto p = range(0, 100) | skip(30, {.name = "drop"});
  Engine e;
  auto run = e.start(p, {.layout = Layout{}});
  EXPECT_EQ(run.next(), 30);
  for (int i = 0; i < 9; ++i) run.next();
  Snapshot s = run.snapshot();
  auto [drop, node] = record_of(s, "drop");
  ASSERT_TRUE(drop && node);
  ASSERT_EQ(drop->fields.size(), 1u);
  EXPECT_EQ(drop->fields[0].name, "skipped");
  EXPECT_EQ(drop->fields[0].u, 30u);  // the whole count, mid-stream
  EXPECT_EQ(find_kind("skip")->summary(*drop, *node), "30 of 30 skipped");
  auto resumed = e.resume(p, s, {.layout = Layout{}});
  EXPECT_EQ(resumed.next(), 40);
  drop->fields[0].u = 31;
  EXPECT_THROW(find_kind("skip")->check_state(*drop, *node, nullptr), SnapshotError);
  EXPECT_THROW(e.resume(p, s, {.layout = Layout{}}), SnapshotError);
  EXPECT_THROW(range(0, 3) | skip(-1), ConfigError);
  // From a spec, with the kind's own check.
  const Spec spec = parse_spec(R"({"pipeline": [{"op": "range", "stop": 6}, {"op": "skip", "count": 4}]})");
  auto from_spec = e.start(spec.pipeline.get<SpecInt>(), {.layout = Layout{}});
  EXPECT_EQ(testing::drain(from_spec), (std::vector<std::int64_t>{4, 5}));
}

TEST(Kinds, CycleChecksItsPassAgainstItsCountBeforeAnyNodeRuns) {
  auto p = range(0, 10) | cycle({.count = 3, .name = "loop"});
  Engine e;
  auto run = e.start(p, {.layout = Layout{}});
  for (int i = 0; i < 15; ++i) run.next();
  Snapshot s = run.snapshot();
  auto [loop, node] = record_of(s, "loop");
  ASSERT_TRUE(loop && node);
  EXPECT_NO_THROW(find_kind("cycle")->check_state(*loop, *node, nullptr));
  EXPECT_EQ(loop->fields.at(0).name, "pass");
  loop->fields.at(0).u = 4;
  try {
    find_kind("cycle")->check_state(*loop, *node, nullptr);
    ADD_FAILURE() << "a cycle record past its count was accepted";
  } catch (const SnapshotError& err) {
    EXPECT_NE(std::string(err.what()).find("pass 4 is beyond count 3"), std::string::npos) << err.what();
  }
  EXPECT_THROW(e.resume(p, s, {.layout = Layout{}}), SnapshotError);
}

TEST(Spec, ANodesOwnConfigErrorIsWrappedWithItsPosition) {
  auto message = [](const char* spec) {
    try {
      parse_spec(spec);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_EQ(message(R"({"pipeline": [{"op": "range", "stop": 5}, {"op": "batch", "size": 0}]})"),
            "pipeline[1] (batch): size must be positive, got 0");
  EXPECT_EQ(message(R"({"pipeline": [{"op": "range", "stop": 5}, {"op": "shuffle", "buffer": 0, "name": "s"}]})"),
            "pipeline[1] (shuffle 's'): buffer must be positive, got 0");
  EXPECT_EQ(message(R"({"pipeline": [{"op": "range", "stop": 5},
                                     {"op": "concat", "with": [[{"op": "range", "stop": 2}, {"op": "take", "count": -1}]]}]})"),
            "pipeline[1].with[0][1] (take): count must not be negative, got -1");
  EXPECT_EQ(message(R"({"pipeline": [{"op": "range", "stop": 5}, {"op": "unbatch"}]})"),
            "pipeline[1] (unbatch): unbatch takes batches, but its input yields integers");
}

TEST(Options, BadValuesAreConfigErrorsNamingTheNode) {
  auto message = [](auto&& f) {
    try {
      f();
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message([] { (void)(range(0, 3) | batch({.size = 0, .name = "b"})); }), "batch 'b': size must be positive, got 0");
  EXPECT_NE(message([] { (void)(range(0, 3) | shuffle({.buffer = 0})); }).find("buffer must be positive"), std::string::npos);
  EXPECT_NE(message([] { (void)(range(0, 3) | sharding_filter({.num_shards = 2, .shard_id = 2})); }).find("shard_id 2"),
            std::string::npos);
  EXPECT_NE(message([] { (void)(range(0, 3) | take(-1)); }).find("count must not be negative"), std::string::npos);
  {  // take(std::nullopt): no limit and no node
    auto unlimited = range(0, 4) | take(std::nullopt);
    EXPECT_EQ(unlimited.def()->kind(), "range");
    Engine e;
    auto run = e.start(unlimited, RunOptions{});
    EXPECT_EQ(testing::drain(run).size(), 4u);
  }
  EXPECT_NE(message([] { (void)(range(0, 3) | repeat(0)); }).find("times must be at least 1"), std::string::npos);
  EXPECT_NE(message([] { (void)(range(0, 3) | cycle({.count = -2})); }).find("count must not be negative"), std::string::npos);
  EXPECT_NE(message([] { (void)range(0, 3, {.step = 0}); }).find("step must not be 0"), std::string::npos);
  // Layout problems surface when the run starts.
  Engine e;
  EXPECT_NE(message([&] { e.start(range(0, 3), {.layout = Layout{2, 2, 1}}); }).find("rank 2"), std::string::npos);
  EXPECT_NE(message([&] { e.start(range(0, 3), {.layout = Layout{0, 1, 0}}); }).find("num_workers"), std::string::npos);
}

TEST(Layout, ComesFromTorchrunOrOpenMpiVariables) {
  ::setenv("OMPI_COMM_WORLD_RANK", "1", 1);
  ::setenv("OMPI_COMM_WORLD_SIZE", "3", 1);
  EXPECT_EQ(layout_from_environment(2), (Layout{1, 3, 2}));
  ::setenv("RANK", "0", 1);
  ::setenv("WORLD_SIZE", "2", 1);
  EXPECT_EQ(layout_from_environment(1), (Layout{0, 2, 1}));  // torchrun's variables win
  ::setenv("RANK", "5", 1);
  EXPECT_THROW(layout_from_environment(1), ConfigError);
  ::setenv("RANK", "x", 1);
  EXPECT_THROW(layout_from_environment(1), ConfigError);
  for (auto v : {"RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"}) ::unsetenv(v);
  EXPECT_EQ(layout_from_environment(1), (Layout{0, 1, 1}));
}

TEST(Sharding, LevelsComposeIntoExactPartitions) {
  // Every element lands on exactly one instance, for `all` and for rank-then-worker composition.
  for (int world : {1, 2, 3}) {
    for (int workers : {1, 2, 4}) {
      for (int variant = 0; variant < 2; ++variant) {
        auto p = variant == 0 ? range(0, 97) | sharding_filter()
                              : range(0, 97) | sharding_filter({.level = ShardLevel::rank}) |
                                    sharding_filter({.level = ShardLevel::worker});
        std::multiset<std::int64_t> seen;
        for (int rank = 0; rank < world; ++rank)
          for (auto x : testing::collect(p, testing::options(workers, 1, rank, world))) seen.insert(x);
        ASSERT_EQ(seen.size(), 97u);
        for (std::int64_t i = 0; i < 97; ++i) ASSERT_EQ(seen.count(i), 1u) << "world " << world << " workers " << workers;
      }
    }
  }
}

TEST(Sharding, WorkerIsTheFastDigit) {
  // Element i goes to worker i mod W of rank (i div W) mod R.
  const auto got = testing::collect(range(0, 24) | sharding_filter(), testing::options(2, 0, 1, 3));
  // rank 1 of 3, 2 workers: instances 2 and 3 → elements 2,3,8,9,14,15,20,21 merged round-robin.
  EXPECT_EQ(got, (std::vector<std::int64_t>{2, 3, 8, 9, 14, 15, 20, 21}));
}

TEST(Sharding, InstanceKHoldsExactlyTheElementsIModNEqualToK) {
  // Pinned, not only a partition: a shifted assignment ((i + 1) mod N == k) partitions too.
  const auto mod = [](std::int64_t n, std::int64_t k, std::int64_t stop) {
    std::vector<std::int64_t> v;
    for (std::int64_t i = 0; i < stop; ++i)
      if (i % n == k) v.push_back(i);
    return v;
  };
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_EQ(testing::collect(range(0, 50) | sharding_filter(), testing::options(1, 0, rank, 4)), mod(4, rank, 50));
    EXPECT_EQ(testing::collect(range(0, 50) | sharding_filter({.level = ShardLevel::rank}), testing::options(1, 0, rank, 4)),
              mod(4, rank, 50));
  }
  for (std::int64_t k = 0; k < 3; ++k)
    EXPECT_EQ(testing::collect(range(0, 50) | sharding_filter({.num_shards = 3, .shard_id = k}), testing::options(1)),
              mod(3, k, 50));
}

TEST(Shuffle, IsAPermutationThatChangesWithSeedAndEpoch) {
  auto p = range(0, 1000) | shuffle({.buffer = 100});
  auto a = testing::collect(p, testing::options(1, 1));
  auto b = testing::collect(p, testing::options(1, 2));
  RunOptions e1 = testing::options(1, 1);
  e1.epoch = 1;
  auto c = testing::collect(p, e1);
  EXPECT_NE(a, b);
  EXPECT_NE(a, c);
  std::sort(a.begin(), a.end());
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(a[i], i);
}

// The order of an unnamed shuffle is a function of what lies upstream of it: appending nodes after it,
// or growing another branch of a zip, leaves it as it was (torch's graph-snapshot tests expect this).
TEST(Shuffle, AnOrderStaysWhenNodesAreAddedAfterItOrInAnotherBranch) {
  const auto identity = [](std::int64_t x) { return x; };
  const auto base = range(0, 300) | shuffle({.buffer = 50});
  const auto order = testing::collect(base, testing::options(1, 7));
  ASSERT_EQ(order.size(), 300u);
  EXPECT_EQ(testing::collect(base | map(identity) | prefetch({.depth = 4}), testing::options(1, 7)), order);
  std::vector<std::int64_t> unbatched;
  for (const auto& b : testing::collect(base | batch({.size = 7}), testing::options(1, 7)))
    unbatched.insert(unbatched.end(), b.begin(), b.end());
  EXPECT_EQ(unbatched, order);
  for (const auto& other : {range(0, 300), range(0, 300) | map(identity) | shuffle({.buffer = 9})}) {
    std::vector<std::int64_t> left;
    for (const auto& [x, y] : testing::collect(zip(base, other), testing::options(1, 7))) left.push_back(x);
    EXPECT_EQ(left, order);
  }
}

TEST(Shuffle, EmitsNothingUntilTheBufferIsFull) {
  // With a buffer as large as the stream, the first element comes only after the whole input: the
  // drain phase. Observable through take: take(1) of a 10-element stream with buffer 10 still
  // pulls all 10 inputs from upstream.
  int pulled = 0;
  auto p = generator([&pulled](const GeneratorContext&) {
             return [&pulled, i = 0]() mutable -> std::optional<int> {
               if (i >= 10) return std::nullopt;
               ++pulled;
               return i++;
             };
           }) |
           shuffle({.buffer = 10}) | take(1);
  testing::collect(p, testing::options());
  EXPECT_EQ(pulled, 10);
}

TEST(Take, PullsNoElementPastItsCount) {
  int pulled = 0;
  auto p = generator([&pulled](const GeneratorContext&) {
             return [&pulled, i = 0]() mutable -> std::optional<int> {
               ++pulled;
               return i++;
             };
           }) |
           take(5);
  EXPECT_EQ(testing::collect(p, testing::options()).size(), 5u);
  EXPECT_EQ(pulled, 5);
}

TEST(Cycle, EmptyUpstreamEndsInsteadOfSpinning) {
  EXPECT_TRUE(testing::collect(range(0, 0) | cycle(), testing::options()).empty());
  EXPECT_TRUE(testing::collect(range(0, 5) | cycle({.count = 0}), testing::options()).empty());
}

TEST(Cycle, EachPassReshuffles) {
  auto out = testing::collect(range(0, 50) | shuffle({.buffer = 50}) | cycle({.count = 2}), testing::options());
  ASSERT_EQ(out.size(), 100u);
  EXPECT_NE(std::vector(out.begin(), out.begin() + 50), std::vector(out.begin() + 50, out.end()));
}

TEST(Mux, EndsWithTheShortestAndDropsThePartialRound) {
  EXPECT_EQ(testing::collect(mux(range(0, 5), range(10, 12)), testing::options()),
            (std::vector<std::int64_t>{0, 10, 1, 11}));
  EXPECT_EQ(testing::collect(mux_longest(range(0, 5), range(10, 12)), testing::options()),
            (std::vector<std::int64_t>{0, 10, 1, 11, 2, 3, 4}));
}

/// The NodeError a run of `p` ends with (a copy keeps the nested cause).
template <class P>
NodeError node_error_of(const P& p) {
  Engine e;
  auto run = e.start(p, testing::options());
  try {
    testing::drain(run);
  } catch (const NodeError& err) {
    return err;
  }
  ADD_FAILURE() << "the run ended without a NodeError";
  return NodeError("", 0, "none");
}

TEST(NodeErrors, UserFunctionExceptionsNameTheNodeAndNestTheCause) {
  const NodeError err = node_error_of(range(0, 10) | map([](std::int64_t x) {
                                        if (x == 4) throw std::invalid_argument("bad four");
                                        return x;
                                      }, {.name = "decode"}));
  EXPECT_EQ(err.node_key(), "decode");
  EXPECT_EQ(err.worker(), 0);
  EXPECT_NE(std::string(err.what()).find("bad four"), std::string::npos);
  EXPECT_THROW(std::rethrow_if_nested(err), std::invalid_argument);
}

// One naming scheme: a node is its place counted from the source, its kind and its name, in a graph's
// ConfigError, a NodeError and a refused resume alike; a spec's places are the ones it was written with.
TEST(NodeErrors, EveryMessageNamesANodeByItsPlaceKindAndName) {
  const auto three = [](std::int64_t x) {
    if (x == 3) throw std::invalid_argument("bad three");
    return x;
  };
  auto p = zip(range(0, 10) | map([](std::int64_t x) { return x; }, {.name = "decode"}), range(0, 10) | map(three));
  const Graph g = Graph::build(*p.def());
  EXPECT_EQ(g.labels(), (std::vector<std::string>{"pipeline[2] (zip)", "pipeline[1] (map 'decode')", "pipeline[0] (range)",
                                                   "pipeline[2].with[0][1] (map)", "pipeline[2].with[0][0] (range)"}));
  const NodeError err = node_error_of(p);
  EXPECT_EQ(err.label(), "pipeline[2].with[0][1] (map)");
  EXPECT_EQ(std::string(err.what()).rfind("pipeline[2].with[0][1] (map) failed (worker 0): bad three", 0), 0u) << err.what();
  EXPECT_EQ(err.node_key().rfind("map@", 0), 0u) << err.node_key();
  Engine e;
  // A spec's places, and the nodes an op makes below itself (unbatch of every level) share its place.
  const Spec spec = parse_spec(R"({"pipeline": [{"op": "range", "stop": 8}, {"op": "batch", "size": 2},
      {"op": "batch", "size": 2}, {"op": "unbatch", "level": -1},
      {"op": "concat", "with": [[{"op": "range", "stop": 2}, {"op": "take", "count": 1, "name": "one"}]]}]})");
  const Graph sg = Graph::build(spec.pipeline.def());
  std::multiset<std::string> labels(sg.labels().begin(), sg.labels().end());
  EXPECT_EQ(labels, (std::multiset<std::string>{"pipeline[0] (range)", "pipeline[1] (batch)", "pipeline[2] (batch)",
                                                 "pipeline[3] (unbatch)", "pipeline[3] (unbatch)", "pipeline[4] (concat)",
                                                 "pipeline[4].with[0][0] (range)", "pipeline[4].with[0][1] (take 'one')"}));
  // A resume refused for a node that differs names it the same way.
  auto four = range(0, 20) | shuffle({.buffer = 4});
  auto started = e.start(four, testing::options());
  started.next();
  testing::expect_throw_with<SnapshotError>([&] { e.resume(range(0, 20) | shuffle({.buffer = 5}), started.snapshot(), testing::options()); },
                                            "pipeline[1] (shuffle): buffer is 5, the snapshot has 4");
}

TEST(NodeErrors, AFailureRestoredFromASnapshotStillNestsItsCause) {
  // A snapshot keeps a failure as text; the NodeError rebuilt from it must nest something, or
  // std::rethrow_if_nested would end the process.
  const FailureRecord recorded{"bad four", "decode", 1};
  try {
    std::rethrow_exception(recorded.to_exception());
  } catch (const NodeError& err) {
    EXPECT_EQ(err.node_key(), "decode");
    EXPECT_EQ(err.worker(), 1);
    try {
      std::rethrow_if_nested(err);
      FAIL() << "nothing nested";
    } catch (const std::runtime_error& inner) {
      EXPECT_STREQ(inner.what(), "bad four");
    }
  }
  EXPECT_EQ(FailureRecord{}.to_exception(), nullptr);
}


// A Run is an input range: the loop yields what next() yields, each element owned by the iterator until
// it moves on, and a break leaves the run just after the element the body saw.
static_assert(std::input_iterator<Run<std::vector<std::int64_t>>::iterator>);
static_assert(std::ranges::input_range<Run<std::vector<std::int64_t>>>);
static_assert(std::sentinel_for<std::default_sentinel_t, Run<std::int64_t>::iterator>);

TEST(Run, IsARangeOverTheSameStreamAsNext) {
  const auto p = range(0, 1000) | shuffle({.buffer = 64}) | sharding_filter() | batch({.size = 7});
  const auto o = testing::options(3);
  const auto expected = testing::collect(p, o);
  Engine e;
  auto run = e.start(p, o);
  std::vector<std::vector<std::int64_t>> seen;
  for (auto&& b : run) {
    const std::int64_t* data = b.data();
    seen.push_back(b);  // a copy: `b` is still the iterator's own element, unchanged
    ASSERT_EQ(b.data(), data);
    ASSERT_EQ(seen.back(), b);
  }
  EXPECT_EQ(seen, expected);
  EXPECT_EQ(run.delivered(), expected.size());
  EXPECT_FALSE(run.next());
  EXPECT_TRUE(run.begin() == run.end());  // an ended run stays ended
}

TEST(Run, ALoopContinuesFromNextAndABreakLosesNothing) {
  const auto p = range(0, 500) | shuffle({.buffer = 32}) | sharding_filter() | map([](std::int64_t x) { return x * 3; });
  const auto o = testing::options(2);
  const auto expected = testing::collect(p, o);
  Engine e;
  auto run = e.start(p, o);
  std::vector<std::int64_t> seen;
  for (int i = 0; i < 10; ++i) seen.push_back(*run.next());
  for (auto&& x : run) {
    seen.push_back(x);
    if (seen.size() == 100) break;
  }
  EXPECT_EQ(run.delivered(), 100u);
  const std::string bytes = run.snapshot().to_bytes();
  for (auto x : run) {  // by value works too
    seen.push_back(x);
    if (seen.size() == 200) break;
  }
  auto resumed = e.resume(p, Snapshot::from_bytes(bytes), o);
  std::vector<std::int64_t> rest(seen.begin(), seen.begin() + 100);
  for (auto&& x : resumed) rest.push_back(x);
  EXPECT_EQ(rest, expected);
  EXPECT_EQ(std::vector<std::int64_t>(seen.begin(), seen.end()),
            std::vector<std::int64_t>(expected.begin(), expected.begin() + 200));
}

TEST(Run, ALoopRethrowsAWorkerFailure) {
  const auto p = range(0, 100) | map([](std::int64_t x) {
                   if (x == 40) throw std::runtime_error("boom");
                   return x;
                 });
  Engine e;
  auto run = e.start(p, testing::options(1));
  std::int64_t count = 0;
  EXPECT_THROW(
      {
        for (auto&& x : run) {
          EXPECT_EQ(x, count);
          ++count;
        }
      },
      NodeError);
  EXPECT_EQ(count, 40);
}

TEST(FlatMap, BuiltinRangeStreamsAHugeExpansionAndResumesInsideItExactly) {
  using I64 = std::int64_t;
  constexpr I64 kHuge = I64{1} << 62;
  const auto p = from_vector<I64>({kHuge, 3}) | flat_map(builtins::Iota{}) | take(1000);
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<I64> expected(1000);
  std::iota(expected.begin(), expected.end(), I64{0});
  EXPECT_EQ(testing::collect(p, testing::options()), expected);
  // In the middle of the expansion: the snapshot holds its remainder (two integers), not its outputs.
  Engine e;
  auto run = e.start(p, testing::options());
  EXPECT_EQ(testing::drain(run, 600).back(), 599);
  const std::string bytes = run.snapshot().to_bytes();
  EXPECT_LT(bytes.size(), 1u << 16);  // the engine's queues hold a few hundred elements at most
  const std::string shown = Snapshot::from_bytes(bytes).to_json();
  EXPECT_NE(shown.find("\"rests\":{\"type\":\"tup<i64,i64>\",\"count\":1"), std::string::npos) << shown;
  // (next, end): the worker may have run ahead of the 600 delivered, into the queues.
  EXPECT_NE(shown.find(",4611686018427387904]]"), std::string::npos) << shown;
  auto resumed = e.resume(p, Snapshot::from_bytes(bytes), testing::options());
  const auto rest = testing::drain(resumed);
  EXPECT_EQ(rest, std::vector<I64>(expected.begin() + 600, expected.end()));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
}

TEST(FlatMap, StreamedExpansionsRescaleWithEveryOutputOnce) {
  using I64 = std::int64_t;
  const std::vector<I64> inputs{40, 50, 60, 70, 5, 0, 33};
  const auto p = from_vector<I64>(inputs) | sampler() | flat_map(builtins::Iota{});
  std::multiset<I64> expected, got;
  for (I64 x : inputs)
    for (I64 i = 0; i < x; ++i) expected.insert(i);
  Engine e;
  std::vector<Snapshot> ranks;
  for (int r = 0; r < 2; ++r) {
    auto run = e.start(p, testing::options(2, 7, r, 2));
    for (I64 x : testing::drain(run, 45 + static_cast<std::size_t>(r) * 20)) got.insert(x);
    ranks.push_back(run.snapshot());
  }
  const auto set = SnapshotSet(std::move(ranks)).rescaled(1, 3);
  auto resumed = e.resume(p, set, testing::options(3, 7, 0, 1));
  for (I64 x : testing::drain(resumed)) got.insert(x);
  EXPECT_EQ(got, expected);
}

}  // namespace
}  // namespace dpipe

namespace dpipe {

// No silent misuse: a level-based sharding_filter after a node that already deals its stream over that
// level is refused naming both nodes; a source read in full by several instances with nothing splitting
// it is a warning, silenced by replicate().
TEST(Sharding, ASecondShardingOfADealtStreamIsRefusedNamingBothNodes) {
  Engine e;
  const RunOptions two_workers{.layout = Layout{0, 1, 2}};
  testing::expect_throw_with<ConfigError>(
      [&] { e.start(range(0, 100) | sampler() | sharding_filter(), two_workers); },
      "pipeline[2] (sharding_filter) shards over every rank and worker, but pipeline[1] (sampler) already deals");
  testing::expect_throw_with<ConfigError>(
      [&] { e.start(range(0, 100) | sampler() | map([](std::int64_t x) { return x; }) | sharding_filter({.level = ShardLevel::worker}), two_workers); },
      "Remove the sharding_filter");
  // Dealt to the ranks before dispatch, then round-robin to the workers: sharding the workers again loses data.
  testing::expect_throw_with<ConfigError>(
      [&] { e.start(range(0, 100) | sharding_filter({.level = ShardLevel::rank}) | dispatch() | sharding_filter({.level = ShardLevel::worker}) | merge(), two_workers); },
      "pipeline[3] (sharding_filter) shards over the workers, but pipeline[2] (dispatch) already deals");
  // Legitimate: the ranks' share broadcast to every worker, then split by worker; explicit shards.
  auto split = e.start(range(0, 100) | sharding_filter({.level = ShardLevel::rank}) | dispatch(broadcast) |
                           sharding_filter({.level = ShardLevel::worker}) | merge(),
                       two_workers);
  EXPECT_EQ(testing::drain(split).size(), 100u);
  EXPECT_NO_THROW(e.start(range(0, 100) | sampler() | sharding_filter({.num_shards = 2, .shard_id = 0}), two_workers));
}

TEST(Sharding, AReplicatedSourceWarnsUnlessMarked) {
  Engine e;
  const RunOptions two_workers{.layout = Layout{0, 1, 2}};
  auto copied = e.start(range(0, 10) | map([](std::int64_t x) { return x; }), two_workers);
  ASSERT_EQ(copied.warnings().size(), 1u);
  EXPECT_NE(copied.warnings()[0].find("pipeline[0] (range) is read in full by the workers"), std::string::npos)
      << copied.warnings()[0];
  EXPECT_NE(copied.warnings()[0].find("delivered 2 times"), std::string::npos) << copied.warnings()[0];
  EXPECT_EQ(testing::drain(copied).size(), 20u);  // torch's semantics: every worker delivers every element
  EXPECT_TRUE(e.start(range(0, 10) | replicate() | map([](std::int64_t x) { return x; }), two_workers).warnings().empty());
  EXPECT_TRUE(e.start(range(0, 10) | sharding_filter(), two_workers).warnings().empty());
  EXPECT_TRUE(e.start(range(0, 10) | sampler(), two_workers).warnings().empty());
  EXPECT_TRUE(e.start(range(0, 10), RunOptions{.layout = Layout{0, 1, 1}}).warnings().empty());
  // Two ranks: a zip of a split and an unsplit stream still copies the unsplit one.
  auto zipped = e.start(zip(range(0, 10) | sharding_filter(), range(0, 10)), RunOptions{.layout = Layout{0, 2, 1}});
  ASSERT_EQ(zipped.warnings().size(), 1u);
  EXPECT_NE(zipped.warnings()[0].find("the ranks"), std::string::npos) << zipped.warnings()[0];
}

}  // namespace dpipe

namespace dpipe {

// len(loader): what a rank delivers in an epoch, from the kinds' `length`, equals what it drains; a node
// that cannot say makes it unknown, named.
TEST(Graph, LengthIsWhatARankDeliversWhenEveryNodeCanSay) {
  const auto identity = [](std::int64_t x) { return x; };
  const std::vector<Pipeline<std::int64_t>> scalars = {
      range(0, 103) | sharding_filter(),
      range(7, -50, {.step = -3}) | sampler({.epochs = 2}) | take(9) | map(identity),
      range(0, 40) | sharding_filter({.level = ShardLevel::rank}) | sharding_filter({.level = ShardLevel::worker}) |
          shuffle({.buffer = 5}) | repeat(2) | skip(3),
      range(0, 31) | sharding_filter({.num_shards = 4, .shard_id = 3}) | cycle({.count = 3}),
      concat(range(0, 10) | sampler(), range(0, 7) | sampler()),
      range(0, 77) | sampler() | merge() | take(30),
  };
  const std::vector<Pipeline<std::vector<std::int64_t>>> batches = {
      range(0, 103) | sharding_filter() | batch({.size = 8}),
      range(0, 103) | sharding_filter() | batch({.size = 8, .drop_last = true}),
  };
  Engine e;
  for (const Layout& l : {Layout{0, 1, 1}, Layout{1, 3, 2}, Layout{2, 3, 2}, Layout{0, 2, 3}}) {
    const RunOptions o{.seed = 5, .layout = l};
    for (std::size_t i = 0; i < scalars.size(); ++i) {
      const auto n = Graph::build(*scalars[i].def()).length(l);
      ASSERT_TRUE(n.has_value()) << i;
      auto run = e.start(scalars[i], o);
      EXPECT_EQ(*n, testing::drain(run).size()) << i << " on " << l.to_string();
    }
    for (std::size_t i = 0; i < batches.size(); ++i) {
      auto run = e.start(batches[i], o);
      EXPECT_EQ(Graph::build(*batches[i].def()).length(l), testing::drain(run).size()) << i << " on " << l.to_string();
    }
  }
  std::string why;
  const auto odd = range(0, 10) | filter([](std::int64_t x) { return x % 2 == 1; }) | batch({.size = 2});
  EXPECT_EQ(Graph::build(*odd.def()).length(Layout{0, 1, 1}, &why), std::nullopt);
  EXPECT_EQ(why, "pipeline[1] (filter) cannot say how many elements it gives");
  EXPECT_EQ(Graph::build(*(range(0, 3) | cycle()).def()).length(Layout{0, 1, 1}, &why), std::nullopt);
  EXPECT_NE(why.find("(cycle)"), std::string::npos) << why;
}

}  // namespace dpipe
