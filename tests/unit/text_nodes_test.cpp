// The LLM data nodes: parse_json, pack, padded_batch and mix from C++ (tokenize against the SentencePiece
// reference is tests/python/test_llm.py; every op resumes at every breakpoint in battery_cli), the
// structured elements' JSON, skip counts kept in state, user functions' error policy and field functions,
// and pack's exactly-once rescale.
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <map>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "dpipe/dpipe.hpp"
#include "builtins.hpp"
#include "dpipe/field_function.hpp"
#include "../test_util.hpp"

namespace dpipe {
namespace {

using I64 = std::int64_t;
using testing::drain;
using testing::options;

/// Column `name` of a record: a 1-D or 2-D int64 array, flattened.
std::vector<I64> column(const Value& row, const char* name) {
  const Value* f = find_field(row, name);
  if (!f || f->kind != Value::Kind::array) {
    ADD_FAILURE() << "no array field " << name;
    return {};
  }
  const auto& a = f->as_array();
  EXPECT_EQ(a.dtype, "<i8");
  std::vector<I64> out(a.data.size() / 8);
  std::memcpy(out.data(), a.data.data(), a.data.size());
  return out;
}
std::string json_of(const Value& v) {
  std::string out;
  append_value_json(out, v);
  return out;
}

/// Document `id`: a record of its id and `len` tokens id * 1000 + k.
Value document(I64 id, I64 len) {
  std::vector<I64> t;
  for (I64 k = 0; k < len; ++k) t.push_back(id * 1000 + k);
  Value v = make_record(2);
  set_field(v, "doc", Value::integer(id));
  set_field(v, "tokens", int64_array(t));
  return v;
}
/// Documents 0..n-1 of lengths drawn from the id (0 to 40 tokens; some empty).
auto documents(I64 n) {
  return range(0, n) | sharding_filter() | map([](I64 id) { return document(id, (id * 7919) % 41); });
}

/// Runs `p` through stages of random layouts (1–4 ranks × 1–3 workers): each rank of a stage resumes the
/// previous stage's snapshot set rescaled (the first starts), takes up to `pick(max_take)` elements
/// (the last stage: all) and snapshots; every element delivered goes to `sink`. Returns the layouts.
template <class T, class Pick, class Sink>
std::string run_stages(const Pipeline<T>& p, Pick&& pick, int stages, int max_take, Sink&& sink) {
  std::optional<SnapshotSet> set;
  std::string layouts;
  for (int s = 0; s <= stages; ++s) {
    const int world = 1 + pick(4), workers = 1 + pick(3);
    layouts += std::to_string(world) + "x" + std::to_string(workers) + " ";
    Engine e;
    std::vector<Snapshot> next;
    for (int r = 0; r < world; ++r) {
      const RunOptions o{.seed = 5, .layout = Layout{r, world, workers}};
      auto run = set ? e.resume(p, *set, o, {.rescale = true}) : e.start(p, o);
      const std::size_t take = s == stages ? std::numeric_limits<std::size_t>::max() : static_cast<std::size_t>(pick(max_take));
      for (auto& x : drain(run, take)) sink(x);
      next.push_back(run.snapshot());
    }
    set = SnapshotSet(std::move(next));
  }
  return layouts;
}

TEST(Records, ArraysPrintAsNestedListsOfNumbers) {
  EXPECT_EQ(json_of(int64_array(std::vector<I64>{3, -1, 7})), "[3, -1, 7]");
  const float f[] = {0.5f, 1.25f, -2.0f, 3.0f};
  EXPECT_EQ(json_of(numeric_array<float>(f, {2, 2})), "[[0.5, 1.25], [-2, 3]]");
  EXPECT_EQ(json_of(numeric_array<I64>(std::span<const I64>(), {0})), "[]");
  Value r = make_record();
  set_field(r, "a", Value::integer(1));
  set_field(r, "b", Value::bytes("\xff"));
  set_field(r, "a", Value::string("x"));  // replaced, not added
  EXPECT_EQ(json_of(r), "{\"a\": \"x\", \"b\": {\"base64\": \"/w==\"}}");
}

TEST(ParseJson, PicksTheNamedFieldsWithTheirTypes) {
  auto p = from_vector(std::vector<std::string>{
               R"({"doc": 7, "text": "hi", "score": 0.5, "ids": [1, 2, 3], "extra": {"x": 1}})",
               R"({"text": "no doc", "doc": 8, "score": 1, "ids": [], "ok": null})"}) |
           parse_json({.fields = {JsonField::parse("doc", "int64"), JsonField::parse("text", "string"),
                                  JsonField::parse("score", "float32"), JsonField::parse("ids", "int64[]"),
                                  JsonField::parse("ok", "bool?")}});
  Engine e;
  auto run = e.start(p, options());
  const auto rows = drain(run);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(json_of(rows[0]), R"({"doc": 7, "text": "hi", "score": 0.5, "ids": [1, 2, 3], "ok": null})");
  EXPECT_EQ(json_of(rows[1]), R"({"doc": 8, "text": "no doc", "score": 1, "ids": [], "ok": null})");
  testing::expect_throw_with<ConfigError>([] { JsonField::parse("x", "int"); }, "known: int64");
}

TEST(ParseJson, ABadLineFailsNamingItOrIsSkippedAndCountedInState) {
  const std::vector<std::string> lines = {R"({"doc": 1})", "not json", R"({"doc": "two"})", R"([1])", R"({"doc": 5})",
                                          R"({"other": 1})", R"({"doc": 7})"};
  const std::vector<JsonField> fields = {JsonField::parse("doc", "int64")};
  {
    auto p = from_vector(lines) | parse_json({.fields = fields});
    Engine e;
    auto run = e.start(p, options());
    EXPECT_EQ(json_of(*run.next()), R"({"doc": 1})");  // the line before the bad one is delivered
    testing::expect_throw_with<NodeError>([&] { run.next(); }, "element 2 read by this instance in this run: not JSON");
  }
  auto p = from_vector(lines) | parse_json({.fields = fields, .on_error = OnDataError::skip});
  Engine e;
  auto run = e.start(p, RunOptions{.seed = 1, .collect_stats = true});
  ASSERT_EQ(json_of(*run.next()), R"({"doc": 1})");
  ASSERT_EQ(json_of(*run.next()), R"({"doc": 5})");
  // The count is state: a run resumed after the first two records ends with the same total (four bad
  // lines) as the run that goes on, neither recounting the lines before the snapshot nor losing them.
  auto skipped = [](auto& r) {
    for (const auto& n : r.node_stats())
      if (n.kind == "parse_json") return n.skipped;
    return std::uint64_t{99};
  };
  const Snapshot snap = Snapshot::from_bytes(run.snapshot().to_bytes());
  auto resumed = e.resume(p, snap, RunOptions{.seed = 1, .collect_stats = true});
  EXPECT_EQ(json_of(*resumed.next()), R"({"doc": 7})");
  EXPECT_FALSE(resumed.next());
  EXPECT_EQ(skipped(resumed), 4u);
  EXPECT_EQ(json_of(*run.next()), R"({"doc": 7})");
  EXPECT_FALSE(run.next());
  EXPECT_EQ(skipped(run), 4u);
}

/// A JSON-lines file of `n` documents {"doc": i, "text": …} of 0–150 bytes of text, every 11th line bad
/// (its doc a string), every 4th ending in "\r\n", the last without a newline.
std::string json_corpus(const testing::TempDir& dir, int n) {
  std::string text;
  for (int i = 0; i < n; ++i) {
    const std::string doc = i % 11 == 5 ? "\"x\"" : std::to_string(i);
    text += R"({"doc": )" + doc + R"(, "text": ")" + std::string(static_cast<std::size_t>(i * 37 % 150), 'a' + char(i % 26)) + "\"}";
    if (i + 1 < n) text += i % 4 == 0 ? "\r\n" : "\n";
  }
  const std::string path = dir.file("docs.jsonl");
  testing::write_bytes(path, text);
  return path;
}

/// The "rest" fields of parse_json's records in `snap`: the lines of blocks not parsed yet, all instances.
std::size_t unparsed_lines(const Snapshot& snap) {
  std::size_t n = 0, records = 0;
  for (const auto& st : snap.states)
    if (st.kind == "parse_json")
      for (const auto& f : st.fields)
        if (f.name == "rest") n += f.elements.size(), ++records;
  EXPECT_GT(records, 0u) << "no parse_json record with a rest field";
  return n;
}

TEST(ParseJson, OnBlocksGivesWhatItGivesOnLinesAndResumesMidBlockExactly) {
  testing::TempDir dir;
  const std::string file = json_corpus(dir, 3000);
  const std::vector<JsonField> fields = {JsonField::parse("doc", "int64"), JsonField::parse("text", "string")};
  const ParseJsonOptions skip{.fields = fields, .on_error = OnDataError::skip};
  Engine e;
  auto on_lines = e.start(lines({file}, {.shuffle_shards = false}) | parse_json(skip), options());
  std::vector<std::string> want;
  for (const auto& r : drain(on_lines)) want.push_back(json_of(r));
  ASSERT_EQ(want.size(), 3000u - 273u);  // 273 bad lines (i % 11 == 5) skipped

  // Blocks of at most 300 bytes: most lines parsed in place, those near a block's end copied.
  const auto p = line_blocks({file}, {.shuffle_shards = false, .block_bytes = 300}) | parse_json(skip);
  auto whole = e.start(p, options());
  std::vector<std::string> got;
  for (const auto& r : drain(whole)) got.push_back(json_of(r));
  EXPECT_EQ(got, want);
  // Stopped after k records, the node holds the rest of its block (blocks of ~50 lines; a prefetch of 4
  // bounds how far the worker runs ahead); resumed, the stream goes on exactly.
  const auto q = line_blocks({file}, {.shuffle_shards = false, .block_bytes = 4000}) | parse_json(skip) | prefetch({.depth = 4});
  std::vector<std::string> want2;  // two workers interleave the shards: another order than one
  auto two_workers = e.start(q, options(2));
  for (const auto& r : drain(two_workers)) want2.push_back(json_of(r));
  ASSERT_EQ(want2.size(), want.size());
  int mid_block = 0;
  for (const std::size_t k : {1u, 2u, 17u, 100u, 1000u, 2000u, 2726u}) {
    auto run = e.start(q, options(2));
    std::vector<std::string> head;
    for (const auto& r : drain(run, k)) head.push_back(json_of(r));
    const Snapshot snap = Snapshot::from_bytes(run.reproducible_snapshot().to_bytes());
    mid_block += unparsed_lines(snap) > 0;
    auto resumed = e.resume(q, snap, options(2));
    for (const auto& r : drain(resumed)) head.push_back(json_of(r));
    EXPECT_EQ(head, want2) << "stopped after " << k;
  }
  EXPECT_GE(mid_block, 5) << "the snapshots should meet the node mid-block";

  // A bad line under fail names the line, after the good ones before it.
  auto failing = e.start(line_blocks({file}, {.shuffle_shards = false}) | parse_json({.fields = fields}), options());
  EXPECT_EQ(drain(failing, 5).size(), 5u);
  testing::expect_throw_with<NodeError>([&] { failing.next(); }, "line 6 read by this instance in this run: field 'doc'");
}

TEST(ParseJsonRescale, EveryGoodLineOfBlocksExactlyOnceAcrossRandomLayouts) {
  testing::TempDir dir;
  const std::string file = json_corpus(dir, 500);
  testing::property_trials(10, [&](std::mt19937_64& g) {
    auto pick = [&](int n) { return testing::draw(g, n); };
    const auto p = line_blocks({file}, {.logical_shards = 1 + pick(8), .block_bytes = 200 + pick(2000)}) |
                   parse_json({.fields = {JsonField::parse("doc", "int64")}, .on_error = OnDataError::skip}) |
                   prefetch({.depth = 1 + pick(6)});  // the workers stay near the consumer: snapshots meet blocks half parsed
    std::vector<I64> docs;
    const std::string layouts = run_stages(p, pick, 1 + pick(3), 40, [&](const Value& r) {
      docs.push_back(std::get<I64>(find_field(r, "doc")->data));
    });
    std::sort(docs.begin(), docs.end());
    std::vector<I64> want;
    for (I64 i = 0; i < 500; ++i)
      if (i % 11 != 5) want.push_back(i);
    ASSERT_EQ(docs, want) << "layouts " << layouts;
  });
}

/// The rows' tokens, checked row by row: every row seq_len long, segment ids 1, 2, … then 0 padding,
/// each token's position its place in its document (documents of `document`).
std::vector<I64> unpacked(const std::vector<Value>& rows, std::size_t seq_len) {
  std::vector<I64> out;
  for (const Value& row : rows) {
    const auto t = column(row, "tokens"), s = column(row, "segment_ids"), p = column(row, "positions");
    EXPECT_EQ(t.size(), seq_len);
    EXPECT_EQ(s.size(), seq_len);
    I64 last = 0;
    for (std::size_t k = 0; k < t.size(); ++k) {
      if (s[k] == 0) {
        EXPECT_EQ(t[k], 0);
        last = -1;  // padding only after this
        continue;
      }
      EXPECT_TRUE(last >= 0 && (s[k] == last || s[k] == last + 1)) << "segment ids " << last << " then " << s[k];
      last = s[k];
      EXPECT_EQ(p[k], t[k] % 1000) << "the position of token " << t[k];
      out.push_back(t[k]);
    }
    const Value* d = find_field(row, "doc");
    EXPECT_TRUE(d && d->kind == Value::Kind::list && static_cast<I64>(std::get<std::vector<Value>>(d->data).size()) ==
                                                          *std::max_element(s.begin(), s.end()));
  }
  return out;
}

std::vector<I64> all_tokens(I64 docs) {
  std::vector<I64> out;
  for (I64 id = 0; id < docs; ++id)
    for (I64 k = 0; k < (id * 7919) % 41; ++k) out.push_back(id * 1000 + k);
  return out;
}

TEST(Pack, GreedyLaysDocumentsEndToEndAndContinuesPositions) {
  auto p = from_vector(std::vector<Value>{document(1, 3), document(2, 6), document(3, 0), document(4, 2)}) |
           pack({.seq_len = 4});
  Engine e;
  auto run = e.start(p, options());
  const auto rows = drain(run);
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(json_of(rows[0]), R"({"tokens": [1000, 1001, 1002, 2000], "segment_ids": [1, 1, 1, 2], )"
                              R"("positions": [0, 1, 2, 0], "doc": [1, 2]})");
  EXPECT_EQ(json_of(rows[1]), R"({"tokens": [2001, 2002, 2003, 2004], "segment_ids": [1, 1, 1, 1], )"
                              R"("positions": [1, 2, 3, 4], "doc": [2]})");
  EXPECT_EQ(json_of(rows[2]), R"({"tokens": [2005, 4000, 4001, 0], "segment_ids": [1, 2, 2, 0], )"
                              R"("positions": [5, 0, 1, 0], "doc": [2, 4]})");
}

TEST(Pack, FirstFitPutsEachDocumentIntoTheFirstOpenRowWithRoom) {
  // seq_len 5, two open rows: 3 → row A; 4 → row B; 2 → A (full); 1 → B (full); 7 → a whole row, 2 left → C.
  auto p = from_vector(std::vector<Value>{document(1, 3), document(2, 4), document(3, 2), document(4, 1), document(5, 7)}) |
           pack({.seq_len = 5, .mode = PackMode::first_fit, .buffer = 2});
  Engine e;
  auto run = e.start(p, options());
  const auto rows = drain(run);
  ASSERT_EQ(rows.size(), 4u);
  EXPECT_EQ(column(rows[0], "tokens"), (std::vector<I64>{1000, 1001, 1002, 3000, 3001}));
  EXPECT_EQ(column(rows[1], "tokens"), (std::vector<I64>{2000, 2001, 2002, 2003, 4000}));
  EXPECT_EQ(column(rows[2], "tokens"), (std::vector<I64>{5000, 5001, 5002, 5003, 5004}));
  EXPECT_EQ(column(rows[3], "tokens"), (std::vector<I64>{5005, 5006, 0, 0, 0}));
  EXPECT_EQ(column(rows[3], "positions"), (std::vector<I64>{5, 6, 0, 0, 0}));
  EXPECT_EQ(unpacked(rows, 5).size(), 17u);
}

TEST(Pack, ASnapshotMidRowHoldsTheOpenRowAndResumesExactly) {
  for (const PackMode mode : {PackMode::greedy, PackMode::first_fit}) {
    // Enough documents that the workers, which run ahead of the consumer into bounded queues, are mid-input.
    auto p = documents(4000) | pack({.seq_len = 16, .mode = mode, .buffer = 3});
    Engine e;
    auto full = e.start(p, options(2));
    const auto want = drain(full);
    ASSERT_EQ(unpacked(want, 16).size(), all_tokens(4000).size());
    for (const std::size_t at : {1u, 7u, 400u}) {
      RunOptions o = options(2);
      o.inline_workers = true;  // workers run when the consumer pulls: the pack is mid-input, not past its end
      auto run = e.start(p, o);
      auto got = drain(run, at);
      const Snapshot snap = Snapshot::from_bytes(run.snapshot().to_bytes());
      std::size_t open_rows = 0;
      for (const auto& st : snap.states)
        if (st.kind == "pack") {
          PackState<ElementBlobs> s;
          StateReader r(st);
          r.read(s);
          open_rows += s.open.size();
        }
      EXPECT_GT(open_rows, 0u) << "the snapshot at " << at << " holds no open row";
      auto rest = e.resume(p, snap, options(2));
      for (auto& row : drain(rest)) got.push_back(std::move(row));
      EXPECT_EQ(got, want) << "mode " << int(mode) << ", breakpoint " << at;
    }
  }
}

TEST(Pack, RefusesWhatIsNotADocumentNamingTheField) {
  auto p = range(0, 3) | map([](I64) { return Value::integer(1); }) | pack({.seq_len = 4});
  Engine e;
  auto run = e.start(p, options());
  testing::expect_throw_with<DataError>([&] { run.next(); }, "an element is not a record");
  testing::expect_throw_with<ConfigError>([] { range(0, 1) | map([](I64) { return Value(); }) | pack({.seq_len = 0}); },
                                          "seq_len must be positive");
  // Sizes that memory follows are bounded where they are given, not found out in bad_alloc.
  for (const std::int64_t huge : {(std::int64_t{1} << 24) + 1, std::int64_t{1} << 31, std::int64_t{1} << 62})
    testing::expect_throw_with<ConfigError>(
        [&] { range(0, 1) | map([](I64) { return Value(); }) | pack({.seq_len = huge}); }, "seq_len must be at most 2^24");
  for (const std::int64_t huge : {(std::int64_t{1} << 24) * 2, std::int64_t{1} << 61}) {
    testing::expect_throw_with<ConfigError>(
        [&] { range(0, 1) | map([](I64) { return Value(); }) | padded_batch({.size = 2, .multiple = huge}); },
        "multiple must be at most 2^24");
    testing::expect_throw_with<ConfigError>(
        [&] { range(0, 1) | map([](I64) { return Value(); }) | padded_batch({.size = 2, .length = huge * 2}); },
        "length must be at most 2^24");
  }
  (void)(range(0, 1) | map([](I64) { return Value(); }) | pack({.seq_len = std::int64_t{1} << 24}));  // the bound itself
}

TEST(PackRescale, EveryTokenExactlyOnceWithItsPositionAcrossRandomLayouts) {
  testing::property_trials(12, [&](std::mt19937_64& g) {
    auto pick = [&](int n) { return testing::draw(g, n); };
    const I64 docs = 50 + pick(150);
    const auto seq_len = static_cast<std::size_t>(4 + pick(40));
    const PackMode mode = pick(2) ? PackMode::greedy : PackMode::first_fit;
    Pipeline<Value> p = range(0, docs) | sampler({.shuffle = pick(2) ? SamplerShuffle::global : SamplerShuffle::none}) |
                        map([](I64 id) { return document(id, (id * 7919) % 41); });
    if (pick(2)) p = p | shuffle({.buffer = 1 + pick(20)});
    p = p | pack({.seq_len = static_cast<I64>(seq_len), .mode = mode, .buffer = 1 + pick(6)});
    std::vector<Value> rows;
    const std::string layouts = run_stages(p, pick, 1 + pick(3), 12, [&](Value& row) { rows.push_back(std::move(row)); });
    auto got = unpacked(rows, seq_len);
    auto want = all_tokens(docs);
    std::sort(got.begin(), got.end());
    ASSERT_EQ(got, want) << "layouts " << layouts << (mode == PackMode::greedy ? "greedy" : "first_fit");
  });
}

TEST(PaddedBatch, PadsArrayFieldsToTheLongestRoundedUpAndStacksScalars) {
  auto p = from_vector(std::vector<Value>{document(1, 3), document(2, 0), document(3, 5)}) |
           padded_batch({.size = 2, .multiple = 4, .pad = -1});
  Engine e;
  auto run = e.start(p, options());
  const auto batches = drain(run);
  ASSERT_EQ(batches.size(), 2u);
  EXPECT_EQ(json_of(batches[0]), R"({"doc": [1, 2], "tokens": [[1000, 1001, 1002, -1], [-1, -1, -1, -1]], "lengths": [3, 0]})");
  EXPECT_EQ(json_of(batches[1]), R"({"doc": [3], "tokens": [[3000, 3001, 3002, 3003, 3004, -1, -1, -1]], "lengths": [5]})");
  auto fixed = from_vector(std::vector<Value>{document(1, 3), document(3, 5)}) | padded_batch({.size = 2, .length = 4});
  auto run2 = e.start(fixed, options());
  testing::expect_throw_with<DataError>([&] { run2.next(); }, "an element holds 5 items, above length 4");
}

/// The document ids of a padded batch (its `doc` column) and its padded length.
std::pair<std::vector<I64>, std::size_t> batch_docs(const Value& b) {
  const auto& tokens = find_field(b, "tokens")->as_array();
  return {column(b, "doc"), static_cast<std::size_t>(tokens.shape[1])};
}

TEST(BucketByLength, BatchesSimilarLengthsPerBucketAndFlushesInBucketOrder) {
  // Lengths (id * 7919) % 41: buckets [0, 10), [10, 25), [25, ∞) with batch sizes 4, 3, 2.
  auto p = range(0, 40) | map([](I64 id) { return document(id, (id * 7919) % 41); }) |
           bucket_by_length({.boundaries = {10, 25}, .batch_sizes = {4, 3, 2}});
  Engine e;
  auto run = e.start(p, options());
  const auto batches = drain(run);
  std::vector<I64> all;
  for (const auto& b : batches) {
    const auto [docs, len] = batch_docs(b);
    I64 lo = 1000, hi = -1;
    for (const I64 d : docs) {
      const I64 n = (d * 7919) % 41;
      lo = std::min(lo, n), hi = std::max(hi, n);
      all.push_back(d);
    }
    const int bucket = hi < 10 ? 0 : hi < 25 ? 1 : 2;
    EXPECT_EQ(bucket, lo < 10 ? 0 : lo < 25 ? 1 : 2) << "a batch mixes buckets";
    EXPECT_EQ(len, static_cast<std::size_t>(hi)) << "padded to its longest";
  }
  std::sort(all.begin(), all.end());
  ASSERT_EQ(all.size(), 40u);
  for (I64 i = 0; i < 40; ++i) EXPECT_EQ(all[static_cast<std::size_t>(i)], i);
}

TEST(BucketByLength, MaxTokensBoundsEachPaddedBatch) {
  auto p = range(0, 200) | map([](I64 id) { return document(id, 1 + (id * 7919) % 41); }) |
           bucket_by_length({.max_tokens = 100});
  Engine e;
  auto run = e.start(p, options());
  std::size_t docs = 0;
  for (const auto& b : drain(run)) {
    const auto [ids, len] = batch_docs(b);
    EXPECT_LE(ids.size() * len, 100u);
    docs += ids.size();
  }
  EXPECT_EQ(docs, 200u);
  testing::expect_throw_with<ConfigError>([] { range(0, 1) | map([](I64) { return Value(); }) | bucket_by_length({.boundaries = {5}, .batch_sizes = {1}}); },
                                          "1 batch_sizes for 2 buckets");
}

TEST(BucketByLengthRescale, EveryDocumentExactlyOnceAcrossRandomLayouts) {
  testing::property_trials(10, [&](std::mt19937_64& g) {
    auto pick = [&](int n) { return testing::draw(g, n); };
    const I64 docs = 60 + pick(200);
    Pipeline<Value> p = range(0, docs) | sampler({.shuffle = SamplerShuffle::global}) |
                        map([](I64 id) { return document(id, 1 + (id * 7919) % 41); });
    p = pick(2) ? p | bucket_by_length({.boundaries = {8, 20}, .batch_sizes = {1 + pick(6), 1 + pick(4), 1 + pick(3)}})
                : p | bucket_by_length({.boundaries = {15}, .max_tokens = 40 + pick(100)});
    std::vector<I64> got;
    run_stages(p, pick, 1 + pick(3), 8, [&](const Value& b) {
      for (const I64 d : batch_docs(b).first) got.push_back(d);
    });
    std::sort(got.begin(), got.end());
    ASSERT_EQ(got.size(), static_cast<std::size_t>(docs));
    for (I64 i = 0; i < docs; ++i) ASSERT_EQ(got[static_cast<std::size_t>(i)], i);
  });
}

TEST(Mix, DrawsByWeightAndDeliversEveryElementOfEveryInputInOrder) {
  auto p = mix(std::vector<Pipeline<I64>>{range(0, 7000), range(100'000, 103'000)}, {.weights = {0.7, 0.3}});
  Engine e;
  auto run = e.start(p, options());
  const auto all = drain(run);
  ASSERT_EQ(all.size(), 10'000u);
  std::size_t first = 0;
  for (std::size_t i = 0; i < 2000; ++i) first += all[i] < 100'000;
  EXPECT_GT(first, 1300u) << "of the first 2000, from the input weighted 0.7";
  EXPECT_LT(first, 1500u);
  std::vector<I64> a, b;
  for (const I64 x : all) (x < 100'000 ? a : b).push_back(x);
  EXPECT_TRUE(std::is_sorted(a.begin(), a.end()) && std::is_sorted(b.begin(), b.end()));
  EXPECT_EQ(a.size(), 7000u);
  // The same seed gives the same interleave; another seed another one.
  auto again = e.start(p, options());
  EXPECT_EQ(drain(again), all);
  auto other = e.start(p, options(1, 8));
  EXPECT_NE(drain(other), all);
}

TEST(Mix, FirstExhaustedEndsAtTheFirstEndedDrawAndNeverRestartsInputsAsNewEpochs) {
  Engine e;
  auto first = mix(std::vector<Pipeline<I64>>{range(0, 5), range(100, 1000)}, {.weights = {1, 1}, .stop = MixStop::first_exhausted});
  auto run = e.start(first, options());
  const auto got = drain(run);
  std::size_t small = 0;
  for (const I64 x : got) small += x < 5;
  EXPECT_EQ(small, 5u);
  EXPECT_LT(got.size(), 40u);
  // never: a shuffled input restarts with a new order each pass; every pass holds each element once.
  auto never = mix(std::vector<Pipeline<I64>>{range(0, 4) | shuffle({.buffer = 4}), range(10, 13)},
                   {.weights = {2, 1}, .stop = MixStop::never}) | take(300);
  auto run2 = e.start(never, options());
  const auto cycled = drain(run2);
  ASSERT_EQ(cycled.size(), 300u);
  std::vector<I64> small_ones;
  for (const I64 x : cycled)
    if (x < 4) small_ones.push_back(x);
  std::set<std::vector<I64>> orders;
  for (std::size_t pass = 0; pass + 1 < small_ones.size() / 4; ++pass) {
    std::vector<I64> one(small_ones.begin() + std::ptrdiff_t(4 * pass), small_ones.begin() + std::ptrdiff_t(4 * pass + 4));
    orders.insert(one);
    std::sort(one.begin(), one.end());
    ASSERT_EQ(one, (std::vector<I64>{0, 1, 2, 3})) << "pass " << pass;
  }
  EXPECT_GT(orders.size(), 3u) << "the passes were not reshuffled";
  testing::expect_throw_with<ConfigError>([] { mix(std::vector<Pipeline<I64>>{range(0, 1), range(0, 1)}, {.weights = {1}}); },
                                          "1 weights for 2 inputs");
  testing::expect_throw_with<ConfigError>([] { mix(std::vector<Pipeline<I64>>{range(0, 1)}, {.weights = {0}}); },
                                          "must not all be 0");
  // Finite weights whose sum is not: refused, not every draw from the last input.
  testing::expect_throw_with<ConfigError>(
      [] { mix(std::vector<Pipeline<I64>>{range(0, 1), range(0, 1)}, {.weights = {1e308, 1e308}}); },
      "add up beyond the largest number");
  // Large but summable weights draw by their ratio (here 1 : 3).
  auto large = e.start(mix(std::vector<Pipeline<I64>>{range(0, 4000), range(10'000, 14'000)}, {.weights = {4e307, 1.2e308}}) |
                           take(2000),
                       {.seed = 3});
  std::size_t second = 0;
  while (auto x = large.next()) second += *x >= 10'000;
  EXPECT_GT(second, 1350u);
  EXPECT_LT(second, 1650u);
}

TEST(Mix, WeightsChangeAtResumeOnlyWhenOverriddenKeepingEveryBufferedElement) {
  auto make = [](std::vector<double> w) {
    return mix(std::vector<Pipeline<I64>>{range(0, 300) | sampler({.shuffle = SamplerShuffle::global}) | shuffle({.buffer = 16}),
                                          range(1000, 1300) | sampler({.shuffle = SamplerShuffle::none})},
               {.weights = std::move(w)}) |
           prefetch({.depth = 4});  // a few elements in flight at a snapshot, not the whole stream
  };
  Engine e;
  std::vector<I64> head;
  std::vector<Snapshot> snaps;
  for (int r = 0; r < 2; ++r) {
    auto run = e.start(make({0.7, 0.3}), options(1, 7, r, 2));
    for (I64 x : drain(run, 40)) head.push_back(x);
    snaps.push_back(Snapshot::from_bytes(run.snapshot().to_bytes()));
  }
  // New weights without the override: refused, naming the parameter and the way to change it.
  testing::expect_throw_with<SnapshotError>([&] { e.resume(make({1, 0}), snaps[0], options(1, 7, 0, 2)); },
                                            "(resume with the override 'weights' to change it)");
  testing::expect_throw_with<ConfigError>(
      [&] { e.resume(make({1, 0}), snaps[0], options(1, 7, 0, 2), {.overrides = {"weight"}}); },
      "override 'weight': no node of this pipeline has an overridable parameter");
  // Overridden on a rescale to 3 ranks: input 1 gets weight 0. The elements produced before the snapshot
  // (in flight in the worker queues: state) still come, each once; from there on only input 0 is drawn,
  // so all of it arrives, those in the shuffle buffers included, and input 1 stops short. The change is
  // recorded in the new snapshots.
  const SnapshotSet set(std::move(snaps));
  std::string mix_key;  // KEY.PARAM overrides one node
  const auto make_one_zero = make({1, 0});
  const Graph graph = Graph::build(*make_one_zero.def());
  for (const auto& n : graph.nodes())
    if (n.kind == "mix") mix_key = n.key;
  std::vector<I64> all = head;
  for (int r = 0; r < 3; ++r) {
    auto run = e.resume(make({1, 0}), set, options(1, 7, r, 3), {.rescale = true, .overrides = {mix_key + ".weights"}});
    if (r == 0) {
      for (I64 x : drain(run, 2)) all.push_back(x);
      const auto& meta = run.snapshot().meta.user_metadata;
      ASSERT_TRUE(meta.count("dpipe.overrides"));
      EXPECT_EQ(meta.at("dpipe.overrides"), mix_key + ".weights: 0.7, 0.3 → 1, 0 at the rescale from 2 ranks x 1 workers");
    }
    for (I64 x : drain(run)) all.push_back(x);
  }
  std::sort(all.begin(), all.end());
  EXPECT_EQ(std::adjacent_find(all.begin(), all.end()), all.end()) << "an element delivered twice";
  const auto first_of_input1 = std::lower_bound(all.begin(), all.end(), I64{1000});
  std::vector<I64> want(300);
  std::iota(want.begin(), want.end(), 0);
  EXPECT_EQ(std::vector<I64>(all.begin(), first_of_input1), want);
  const auto from_input1 = all.end() - first_of_input1;
  EXPECT_GT(from_input1, 0);
  EXPECT_LT(from_input1, 300) << "input 1 drawn after the override made its weight 0";
  // Without the override a run with the old weights delivers all of input 1: the override changed the draws.
  std::vector<I64> unchanged = head;
  for (int r = 0; r < 3; ++r) {
    auto run = e.resume(make({0.7, 0.3}), set, options(1, 7, r, 3), {.rescale = true});
    for (I64 x : drain(run)) unchanged.push_back(x);
  }
  EXPECT_EQ(unchanged.size(), 600u);
}

TEST(MixRescale, EveryElementOfEveryInputExactlyOnceAcrossRandomLayouts) {
  testing::property_trials(12, [&](std::mt19937_64& g) {
    auto pick = [&](int n) { return testing::draw(g, n); };
    const I64 na = 100 + pick(400), nb = 50 + pick(300);
    auto a = range(0, na) | sampler({.shuffle = SamplerShuffle::global});
    auto b = range(100'000, 100'000 + nb) | sampler({.shuffle = SamplerShuffle::none});
    Pipeline<I64> p = mix(std::vector<Pipeline<I64>>{a, b}, {.weights = {1.0 + pick(5), 1.0 + pick(5)}});
    if (pick(2)) p = p | shuffle({.buffer = 1 + pick(20)});
    std::vector<I64> got;
    const std::string layouts = run_stages(p, pick, 1 + pick(3), 60, [&](I64 x) { got.push_back(x); });
    std::vector<I64> want;
    for (I64 x = 0; x < na; ++x) want.push_back(x);
    for (I64 x = 0; x < nb; ++x) want.push_back(100'000 + x);
    std::sort(got.begin(), got.end());
    ASSERT_EQ(got, want) << "layouts " << layouts;
  });
}

/// The skip counts of the runs' nodes of `kind`, summed.
template <class Runs>
std::uint64_t skipped_by(Runs& runs, const std::string& kind) {
  std::uint64_t n = 0;
  for (auto& run : runs)
    for (const auto& s : run.node_stats())
      if (s.kind == kind) n += s.skipped;
  return n;
}

TEST(UserFunctions, OnErrorSkipDropsWhatTheFunctionThrowsOnAndKeepsTheCountAcrossRescale) {
  // map throws on multiples of 3, filter on multiples of 7, flat_map on multiples of 11 (of the input x).
  const I64 n = 400;
  auto p = range(0, n) | sampler({.shuffle = SamplerShuffle::global}) |
           map([](I64 x) { return x % 3 == 0 ? throw std::runtime_error("third") : x * 10; }, {.on_error = OnDataError::skip}) |
           filter([](I64 y) { return y % 70 == 0 ? throw std::invalid_argument("seventh") : true; }, {.on_error = OnDataError::skip}) |
           flat_map([](I64 y) { return y % 110 == 0 ? throw std::runtime_error("eleventh") : std::vector<I64>{y, -y}; },
                    {.on_error = OnDataError::skip});
  std::vector<I64> want;
  std::uint64_t thirds = 0, sevenths = 0, elevenths = 0;
  for (I64 x = 0; x < n; ++x) {
    if (x % 3 == 0) ++thirds;
    else if (x % 7 == 0) ++sevenths;
    else if (x % 11 == 0) ++elevenths;
    else want.insert(want.end(), {x * 10, -x * 10});
  }
  // 2 ranks × 2 workers, stopped mid-stream; rescaled to 3 ranks × 1 worker and drained.
  Engine e;
  std::vector<I64> got;
  std::vector<Snapshot> snaps;
  std::vector<dpipe::Run<I64>> first;
  for (int r = 0; r < 2; ++r) {
    first.push_back(e.start(p, RunOptions{.seed = 3, .layout = Layout{r, 2, 2}, .collect_stats = true}));
    for (I64 x : drain(first.back(), 41)) got.push_back(x);
    snaps.push_back(Snapshot::from_bytes(first.back().snapshot().to_bytes()));
  }
  EXPECT_GT(skipped_by(first, "map"), 0u) << "the snapshot is taken with counts to keep";
  const SnapshotSet set(std::move(snaps));
  std::vector<dpipe::Run<I64>> runs;
  for (int r = 0; r < 3; ++r) {
    runs.push_back(e.resume(p, set, RunOptions{.seed = 3, .layout = Layout{r, 3, 1}, .collect_stats = true}, {.rescale = true}));
    for (I64 x : drain(runs.back())) got.push_back(x);
  }
  std::sort(got.begin(), got.end());
  std::sort(want.begin(), want.end());
  EXPECT_EQ(got, want);
  EXPECT_EQ(skipped_by(runs, "map"), thirds);
  EXPECT_EQ(skipped_by(runs, "filter"), sevenths);
  EXPECT_EQ(skipped_by(runs, "flat_map"), elevenths);
}

TEST(UserFunctions, FailIsTheDefaultAndSkipNeverDropsAnEngineError) {
  auto failing = range(0, 10) | map([](I64 x) { return x == 4 ? throw std::runtime_error("four") : x; });
  Engine e;
  auto run = e.start(failing, options());
  EXPECT_EQ(drain(run, 4), (std::vector<I64>{0, 1, 2, 3}));  // the elements before the failing one come first
  testing::expect_throw_with<NodeError>([&] { run.next(); }, "four");
  // A map without a skip policy saves no state: its record is stateless, as before on_error existed.
  auto plain = range(0, 10) | map([](I64 x) { return x; });
  auto r2 = e.start(plain, options());
  r2.next();
  int maps = 0;
  for (const NodeState& st : r2.snapshot().states)
    if (st.kind == "map") {
      ++maps;
      EXPECT_EQ(st.mode, StateMode::stateless);
      EXPECT_TRUE(st.fields.empty());
    }
  EXPECT_EQ(maps, 1);
  // …and its fingerprint is that of the same map before on_error existed: no parameter added.
  const Graph graph = Graph::build(*plain.def());
  for (const auto& n : graph.nodes()) {
    if (n.kind == "map") {
      EXPECT_TRUE(n.params.empty()) << n.params.size() << " parameters";
    }
  }
  auto refusing = range(0, 10) | map([](I64 x) { return x == 2 ? throw ConfigError("not the element's fault") : x; },
                                     {.on_error = OnDataError::skip});
  auto r3 = e.start(refusing, options());
  EXPECT_EQ(drain(r3, 2), (std::vector<I64>{0, 1}));
  testing::expect_throw_with<ConfigError>([&] { r3.next(); }, "not the element's fault");
}

TEST(FieldFunctions, MapFilterAndFlatMapReadOneFieldAndWriteAnother) {
  auto p = range(0, 6) | map([](I64 id) { return document(id, id % 3); }) |
           map(field_map<I64>([](I64 d) { return d * 100; }, "doc", "hundreds")) |
           filter(field_filter<I64>([](I64 d) { return d % 2 == 0; }, "doc")) |
           flat_map(field_flat_map<Value>([](const Value& t) { return std::vector<Value>{t, Value::string("x")}; }, "tokens"));
  Engine e;
  auto run = e.start(p, options());
  std::vector<std::string> got;
  for (const Value& v : drain(run)) got.push_back(json_of(v));
  EXPECT_EQ(got, (std::vector<std::string>{
                     R"({"doc": 0, "tokens": [], "hundreds": 0})", R"({"doc": 0, "tokens": "x", "hundreds": 0})",
                     R"({"doc": 2, "tokens": [2000, 2001], "hundreds": 200})", R"({"doc": 2, "tokens": "x", "hundreds": 200})",
                     R"({"doc": 4, "tokens": [4000], "hundreds": 400})", R"({"doc": 4, "tokens": "x", "hundreds": 400})"}));
  // The builtin range on a field streams: a snapshot inside an expansion of 2^40 holds the record and the
  // range's remainder, and the resume continues it exactly.
  Value huge = make_record(1);
  set_field(huge, "n", Value::integer(I64{1} << 40));
  auto streamed = from_vector(std::vector<Value>{huge}) | flat_map(field_flat_map<I64>(builtins::Iota{}, "n", "k")) |
                  prefetch({.depth = 1});  // few outputs in flight: the snapshot is the expansion's
  auto r1 = e.start(streamed, options());
  EXPECT_EQ(json_of(drain(r1, 3).back()), R"({"n": 1099511627776, "k": 2})");
  const Snapshot mid = Snapshot::from_bytes(r1.snapshot().to_bytes());
  EXPECT_LT(mid.to_bytes().size(), 4096u);
  auto r1b = e.resume(streamed, mid, options());
  EXPECT_EQ(json_of(*r1b.next()), R"({"n": 1099511627776, "k": 3})");
  // A record without the field, or with another type in it, is the element's error: it fails naming the
  // field, or is skipped and counted.
  auto missing = range(0, 3) | map([](I64 id) { return document(id, 1); }) |
                 map(field_map<I64>([](I64 d) { return d; }, "score"));
  auto r2 = e.start(missing, options());
  testing::expect_throw_with<NodeError>([&] { r2.next(); }, "the record has no field 'score'");
  auto wrong = range(0, 3) | map([](I64 id) { return document(id, 1); }) |
               map(field_map<I64>([](I64 d) { return d; }, "tokens"), {.on_error = OnDataError::skip});
  auto r3 = e.start(wrong, RunOptions{.seed = 1, .collect_stats = true});
  EXPECT_FALSE(r3.next());
  std::vector<dpipe::Run<Value>> runs;
  runs.push_back(std::move(r3));
  EXPECT_EQ(skipped_by(runs, "map"), 3u);
  auto r4 = e.start(range(0, 3) | map([](I64 id) { return document(id, 1); }) |
                        map(field_map<I64>([](I64 d) { return d; }, "tokens")),
                    options());
  testing::expect_throw_with<NodeError>([&] { r4.next(); }, "field 'tokens' holds an array, the function takes an integer");
}

}  // namespace
}  // namespace dpipe
