// Snapshot bytes and files: round trips, refusals of every kind of bad input, replay restores.
#include <atomic>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <fstream>
#include <random>

#include "dpipe/crc32c.hpp"
#include "dpipe/dpipe.hpp"
#include "../test_util.hpp"

namespace dpipe {
namespace {

namespace fs = std::filesystem;
using testing::drain;
using testing::options;

auto canonical(std::int64_t n) {
  return range(0, n) | shuffle({.buffer = 100}) | sharding_filter() | map([](std::int64_t x) { return x * 2; }) |
         batch({.size = 16});
}

std::string small_snapshot_bytes() {
  Engine e;
  auto run = e.start(canonical(1000), options(2));
  drain(run, 7);
  return run.snapshot({{"step", "7"}}).to_bytes();
}

std::string refusal(std::string_view bytes) {
  try {
    Engine e;
    auto s = Snapshot::from_bytes(bytes);
    auto run = e.resume(canonical(1000), s, options(2));
    drain(run);
  } catch (const SnapshotError& err) {
    return err.what();
  }
  return "";
}

using testing::TempDir;

/// The same snapshot file without its segment section (section id 3), as a dpipe that predates that
/// section wrote it: the table and header are rebuilt with fresh checksums.
std::string without_segment_section(const std::string& bytes) {
  auto get32 = [&](std::size_t at) {
    std::uint32_t v;
    std::memcpy(&v, bytes.data() + at, 4);
    return v;
  };
  auto get64 = [&](std::size_t at) {
    std::uint64_t v;
    std::memcpy(&v, bytes.data() + at, 8);
    return v;
  };
  auto put = [](std::string& out, auto v) { out.append(reinterpret_cast<const char*>(&v), sizeof v); };
  const std::uint32_t count = get32(12);
  std::vector<std::pair<std::uint32_t, std::string>> kept;
  for (std::uint32_t i = 0; i < count; ++i) {
    const std::size_t e = 32 + i * 24;
    // A file of format 2, written before node details (3) and the state index (5), whose offsets this
    // relayout would falsify.
    if (get32(e) != 3 && get32(e) != 5) kept.emplace_back(get32(e), bytes.substr(get64(e + 8), get64(e + 16)));
  }
  std::string table;
  std::uint64_t offset = 32 + kept.size() * 24;
  for (const auto& [id, body] : kept) {
    put(table, id);
    put(table, crc32c(body));
    put(table, offset);
    put(table, std::uint64_t{body.size()});
    offset += body.size();
  }
  std::string out = bytes.substr(0, 8);
  put(out, std::uint32_t{2});
  put(out, static_cast<std::uint32_t>(kept.size()));
  put(out, offset);
  put(out, crc32c(table));
  put(out, crc32c(out));
  out += table;
  for (const auto& kv : kept) out += kv.second;
  return out;
}

TEST(SnapshotBytes, RecordsEachNodesSegmentAndReadsFilesWithout) {
  Engine e;
  auto p = range(0, 100) | sampler() | map([](std::int64_t x) { return x; }) | merge() | batch({.size = 4});
  auto run = e.start(p, options(2));
  drain(run, 3);
  const auto s = Snapshot::from_bytes(run.snapshot().to_bytes());
  std::map<std::string, std::string> segment;
  for (const auto& n : s.meta.graph) segment[n.kind] = n.segment;
  EXPECT_EQ(segment["batch"], "suffix");
  EXPECT_EQ(segment["merge"], "suffix");
  EXPECT_EQ(segment["map"], "worker");
  EXPECT_EQ(segment["sampler"], "worker");
  for (const auto& n : s.meta.graph)
    if (n.kind == "batch") {
      EXPECT_EQ(n.params, (std::vector<std::pair<std::string, std::string>>{{"size", "4"}, {"drop_last", "false"}}));
    }
  // A file without the section still restores; it only lacks what rescaling a merge needs.
  const std::string old_bytes = without_segment_section(s.to_bytes());
  const auto old = Snapshot::from_bytes(old_bytes);
  for (const auto& n : old.meta.graph) EXPECT_TRUE(n.segment.empty() && n.params.empty()) << n.key;
  // Written back without the section (its state index laid out for its own offsets), and stable.
  const std::string again = old.to_bytes();
  EXPECT_EQ(Snapshot::from_bytes(again).to_bytes(), again);
  for (const auto& n : Snapshot::from_bytes(again).meta.graph) EXPECT_TRUE(n.segment.empty()) << n.key;
  EXPECT_NO_THROW(Snapshot::from_bytes(old.to_bytes()));
  auto resumed = e.resume(p, old, options(2));
  EXPECT_TRUE(resumed.next().has_value());
  try {
    SnapshotSet({old}).rescaled(2, 3);
    FAIL() << "a merge was rescaled without knowing which nodes follow it";
  } catch (const SnapshotError& err) {
    EXPECT_NE(std::string(err.what()).find("older dpipe"), std::string::npos) << err.what();
  }
  EXPECT_NO_THROW(SnapshotSet({s}).rescaled(2, 3));
}

TEST(SnapshotBytes, RoundTripKeepsMetadataAndStates) {
  Engine e;
  auto run = e.start(canonical(1000), options(2, 9));
  drain(run, 5);
  const auto s = run.snapshot({{"step", "5"}, {"trainer", "x"}});
  const auto back = Snapshot::from_bytes(s.to_bytes());
  EXPECT_EQ(back.meta.format_version, Snapshot::kFormatVersion);
  EXPECT_EQ(back.meta.seed, 9u);
  EXPECT_EQ(back.meta.layout, (Layout{0, 1, 2}));
  EXPECT_EQ(back.meta.elements_delivered, 5u);
  EXPECT_EQ(back.meta.user_metadata.at("step"), "5");
  EXPECT_EQ(back.meta.fingerprint, s.meta.fingerprint);
  ASSERT_EQ(back.states.size(), s.states.size());
  EXPECT_EQ(back.to_bytes(), s.to_bytes());
  // One record per node per worker, plus the run's and the merge's.
  EXPECT_EQ(back.states.size(), 2u + 2u * 5u);
  const std::string shuffle_key = Graph::build(*canonical(1000).def()).keys().at(3);
  ASSERT_TRUE(shuffle_key.starts_with("shuffle@")) << shuffle_key;
  const NodeState* shuffle = back.find(shuffle_key, 1);
  ASSERT_NE(shuffle, nullptr);
  EXPECT_EQ(shuffle->mode, StateMode::hook);
  EXPECT_EQ(shuffle->fields[0].name, "buffer");
  EXPECT_EQ(shuffle->fields[0].elements.tag, "i64");
}

TEST(SnapshotBytes, ARecycledSnapshotGivesTheSameBytesAsAFreshOne) {
  // Two runs at the same positions: one hands every snapshot back (its buffers are overwritten by the
  // next), the other never does. The bytes must not tell them apart, also when the recycled records
  // came from another pipeline (more fields, other types: the surplus is dropped).
  Engine e;
  auto recycling = e.start(canonical(3000), options(2, 5));
  auto fresh = e.start(canonical(3000), options(2, 5));
  {
    auto other = e.start(range(0, 500) | shuffle({.buffer = 300}) | batch({.size = 7}) | shuffle({.buffer = 5}), options(2, 1));
    drain(other, 20);
    recycling.recycle(other.reproducible_snapshot());
  }
  for (int step = 0; step < 6; ++step) {
    drain(recycling, 3 + step);
    drain(fresh, 3 + step);
    Snapshot a = recycling.reproducible_snapshot({}, static_cast<std::uint64_t>(step));
    const Snapshot b = fresh.reproducible_snapshot({}, static_cast<std::uint64_t>(step));
    ASSERT_EQ(a.to_bytes(), b.to_bytes()) << "step " << step;
    recycling.recycle(std::move(a));
  }
  // And the recycling run resumes like the other.
  Snapshot last = recycling.reproducible_snapshot();
  const std::string bytes = last.to_bytes();
  recycling.recycle(std::move(last));
  auto resumed = e.resume(canonical(3000), Snapshot::from_bytes(bytes), options(2, 5));
  EXPECT_EQ(drain(resumed), drain(fresh));
}

TEST(SnapshotBytes, JsonRenderingNamesKindsKeysAndFields) {
  const auto json = Snapshot::from_bytes(small_snapshot_bytes()).to_json();
  for (const char* s : {"\"kind\":\"shuffle\"", "\"key\":\"batch@", "\"partial\"", "\"mode\":\"stateless\"",
                        "\"step\":\"7\"", "\"type\":\"i64\"", "\"pending_0\""})
    EXPECT_NE(json.find(s), std::string::npos) << s;
}

TEST(SnapshotFile, WriteIsAtomicAndReadable) {
  TempDir dir;
  const auto path = dir.file("snap.bin");
  const auto s = Snapshot::from_bytes(small_snapshot_bytes());
  s.write_file(path);
  EXPECT_EQ(Snapshot::read_file(path).to_bytes(), s.to_bytes());
  // Overwriting leaves exactly one file, no temporary behind.
  s.write_file(path);
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator{}), 1);
  EXPECT_THROW(s.write_file(dir.file("missing/dir/snap.bin")), FileError);
  EXPECT_THROW(Snapshot::read_file(dir.file("nope.bin")), SnapshotError);
}

TEST(SnapshotRefusals, EveryTruncationIsASnapshotError) {
  const auto bytes = small_snapshot_bytes();
  ASSERT_GT(bytes.size(), 1000u);
  ASSERT_LT(bytes.size(), 16000u);
  for (std::size_t len = 0; len < bytes.size(); ++len) {
    const auto msg = refusal(std::string_view(bytes).substr(0, len));
    ASSERT_FALSE(msg.empty()) << "truncation to " << len << " bytes was accepted";
  }
  EXPECT_NE(refusal(std::string_view(bytes).substr(0, 100)).find("truncated"), std::string::npos);
  EXPECT_NE(refusal(bytes + "x").find("unexpected bytes"), std::string::npos);
}

TEST(SnapshotRefusals, RandomBitFlipsAreSnapshotErrors) {
  const auto bytes = small_snapshot_bytes();
  std::mt19937_64 rng(12345);
  for (int i = 0; i < 400; ++i) {
    std::string b = bytes;
    const std::size_t pos = rng() % b.size();
    b[pos] = static_cast<char>(b[pos] ^ (1 << (rng() % 8)));
    ASSERT_FALSE(refusal(b).empty()) << "flip at byte " << pos << " (seed 12345, round " << i << ") was accepted";
  }
}

TEST(SnapshotRefusals, WrongMagicAndNewerVersion) {
  auto bytes = small_snapshot_bytes();
  auto bad = bytes;
  bad[0] = 'X';
  EXPECT_NE(refusal(bad).find("wrong magic"), std::string::npos);
  // A well-formed header of a future version: the message says newer, not corrupt.
  auto newer = bytes;
  const std::uint32_t v = Snapshot::kFormatVersion + 1;
  std::memcpy(newer.data() + 8, &v, 4);
  const std::uint32_t crc = crc32c_raw(newer.data(), 28);
  std::memcpy(newer.data() + 28, &crc, 4);
  EXPECT_NE(refusal(newer).find("newer than this build"), std::string::npos);
  // A flipped payload byte fails the section checksum.
  auto flipped = bytes;
  flipped[bytes.size() - 3] ^= 0x10;
  EXPECT_NE(refusal(flipped).find("checksum mismatch"), std::string::npos);
}

TEST(SnapshotRefusals, DifferentGraphSeedEpochOrLayout) {
  Engine e;
  auto run = e.start(canonical(1000), options(2, 7));
  drain(run, 3);
  const auto s = run.snapshot();
  auto msg = [&](auto&& f) {
    try {
      f();
    } catch (const SnapshotError& err) {
      return std::string(err.what());
    }
    return std::string();
  };
  EXPECT_NE(msg([&] { e.resume(canonical(1001), s, options(2, 7)); }).find("different pipeline"), std::string::npos);
  EXPECT_NE(msg([&] { e.resume(range(0, 5) | batch({.size = 16}), s, options(2, 7)); }).find("nodes"), std::string::npos);
  EXPECT_NE(msg([&] { e.resume(canonical(1000), s, options(2, 8)); }).find("seed 7"), std::string::npos);
  EXPECT_NE(msg([&] { e.resume(canonical(1000), s, options(3, 7)); }).find("layout"), std::string::npos);
  auto other_epoch = options(2, 7);
  other_epoch.epoch = 1;
  EXPECT_NE(msg([&] { e.resume(canonical(1000), s, other_epoch); }).find("epoch"), std::string::npos);
}

// A refusal names the first node and parameter that differ, and tuning parameters do not block.
TEST(SnapshotRefusals, SayWhatDiffers) {
  Engine e;
  auto pipeline = [](std::int64_t size, std::int64_t depth) {
    return range(0, 1000) | shuffle({.buffer = 100}) | batch({.size = size}) | prefetch({.depth = depth});
  };
  auto run = e.start(pipeline(16, 4), options(2, 7));
  drain(run, 5);
  const auto s = run.snapshot();
  const std::string batch_key = Graph::build(*pipeline(16, 4).def()).labels().at(1);  // pipeline[2] (batch)
  testing::expect_throw_with<SnapshotError>([&] { e.resume(pipeline(32, 4), s, options(2, 7)); },
                                            batch_key + ": size is 32, the snapshot has 16");
  // The prefetch depth changes no element: the resumed stream is the uninterrupted one.
  auto resumed = e.resume(pipeline(16, 2), s, options(2, 7));
  auto straight = e.start(pipeline(16, 4), options(2, 7));
  drain(straight, 5);
  EXPECT_EQ(drain(resumed, 1000), drain(straight, 1000));
  // A forged fingerprint field does not make another pipeline's snapshot acceptable.
  auto forged = s;
  forged.meta.fingerprint = Graph::build(*(range(0, 1000) | shuffle({.buffer = 100}) | batch({.size = 32}) |
                                           prefetch({.depth = 4})).def())
                                .fingerprint();
  testing::expect_throw_with<SnapshotError>([&] { e.resume(pipeline(32, 4), forged, options(2, 7)); },
                                            batch_key + ": size is 32, the snapshot has 16");
}

// Impossible contents with valid checksums are SnapshotErrors naming the node, field and value.
TEST(SnapshotRefusals, ImpossibleContentsAreRefusedBeforeAnyNodeRuns) {
  Engine e;
  auto run = e.start(canonical(1000), options(2, 7));
  drain(run, 3);
  const auto s = run.snapshot();
  auto with_field = [&](std::string_view kind, std::string_view field, auto edit) {
    auto t = s;
    for (auto& st : t.states)
      if (st.kind == kind)
        for (auto& f : st.fields)
          if (f.name == field) edit(f);
    return Snapshot::from_bytes(t.to_bytes());  // checksums recomputed: only the contents are wrong
  };
  // An all-zero generator state would make every bounded draw loop forever.
  const auto zero_rng = with_field("shuffle", "rng", [](Field& f) {
    f.elements = ElementBlobs{};
    f.elements.tag = "u64";
    for (int i = 0; i < 4; ++i) f.elements.append(std::string(8, '\0'));
  });
  testing::expect_throw_with<SnapshotError>([&] { e.resume(canonical(1000), zero_rng, options(2, 7)); },
                                            "all-zero generator state");
  // A layout with no workers is refused when the bytes are read, before anything divides by it.
  auto no_workers = s;
  no_workers.meta.layout.num_workers = 0;
  testing::expect_throw_with<SnapshotError>([&] { Snapshot::from_bytes(no_workers.to_bytes()); }, "impossible");
  auto negative = s;
  negative.meta.layout.num_workers = -3;
  testing::expect_throw_with<SnapshotError>([&] { Snapshot::from_bytes(negative.to_bytes()); }, "impossible");
}

// A replay count beyond max_replay is refused before anything runs, instead of replaying for hours.
TEST(Replay, ACountBeyondMaxReplayIsRefusedBeforeAnythingRuns) {
  Engine e;
  const auto p = generator([](const GeneratorContext&) {
    return [i = std::int64_t{0}]() mutable -> std::optional<std::int64_t> { return i++; };
  });
  auto run = e.start(p, options(1, 3));
  drain(run, 10);
  auto s = run.snapshot();
  for (auto& st : s.states)
    if (st.mode == StateMode::replay)
      for (auto& f : st.fields)
        if (f.name == "count") f.u = std::uint64_t{1} << 40;
  testing::expect_throw_with<SnapshotError>([&] { e.resume(p, s, options(1, 3)); }, "would replay 1099511627776 elements");
  EXPECT_NO_THROW(e.resume(p, run.snapshot(), options(1, 3), {.max_replay = 1'000'000}));
}

// A replay checks its digest at each power of two from 2^16 elements: a record claiming a long replay with
// a wrong digest is refused after 2^16 elements, not after all it claims (a 4 KB file could otherwise
// keep a resume busy for max_replay elements).
TEST(Replay, AForgedLongReplayIsRefusedAtItsFirstDigestStep) {
  auto calls = std::make_shared<std::atomic<std::uint64_t>>(0);
  const auto p = generator([calls](const GeneratorContext&) {
    return [calls, i = std::int64_t{0}]() mutable -> std::optional<std::int64_t> {
      ++*calls;
      return i++;
    };
  });
  Engine e;
  Snapshot s;
  {
    auto run = e.start(p, options(1, 3));
    drain(run, 10);
    s = run.snapshot();
  }  // its worker stopped: the calls counted below are the replay's
  const std::uint64_t claimed = std::uint64_t{1} << 30;
  for (auto& st : s.states)
    if (st.mode == StateMode::replay)
      for (auto& f : st.fields) {
        if (f.name == "count") f.u = claimed;
        if (f.name == "digest_steps") {
          ASSERT_EQ(f.elements.size(), 0u);  // 10 elements: no step yet
          f.elements = ElementBlobs{};
          f.elements.tag = "u64";
          for (std::size_t k = 0; k < replay_steps_for(claimed); ++k) f.elements.append(std::string(8, '\x5a'));
        }
      }
  const auto forged = Snapshot::from_bytes(s.to_bytes());  // checksums valid: only the contents lie
  calls->store(0);
  testing::expect_throw_with<SnapshotError>([&] { e.resume(p, forged, options(1, 3)); },
                                            "replay departed from the recorded stream within its first 65536 of 1073741824");
  EXPECT_LE(calls->load(), (std::uint64_t{1} << 16) + kChunk);

  // Steps of the wrong number are never written (a file holding them is refused when read: the reader test
  // snapshot_reader_test.py crafts one, "v5/zip-generator: a replay record's digest steps …").
  for (auto& st : s.states)
    if (st.mode == StateMode::replay)
      for (auto& f : st.fields)
        if (f.name == "count") f.u = claimed * 2;
  testing::expect_throw_with<SnapshotError>(
      [&] { (void)s.to_bytes(); }, "snapshot not written: the record of 'generator@");
  testing::expect_throw_with<SnapshotError>([&] { (void)s.to_bytes(); },
                                            "replays 2147483648 elements with 15 u64 digest steps, not 16 u64");
  // Nor is a replay record without its steps (format 5 on).
  for (auto& st : s.states)
    if (st.mode == StateMode::replay) st.fields.pop_back();
  testing::expect_throw_with<SnapshotError>([&] { (void)s.to_bytes(); }, "does not begin with count, digest and digest_steps");
}

// A genuine replay past several steps records them, checks them, and resumes exactly.
TEST(Replay, AReplayPastSeveralDigestStepsResumesExactly) {
  const auto p = generator([](const GeneratorContext& ctx) {
    return [rng = ctx.rng, i = 0]() mutable -> std::optional<std::int64_t> {
      if (i++ >= 300'000) return std::nullopt;
      return static_cast<std::int64_t>(rng.below(1'000'000));
    };
  }) | batch({.size = 1000});
  auto o = options(1, 3);
  o.inline_workers = true;  // the generator has yielded exactly what was delivered
  Engine e;
  auto run = e.start(p, o);
  auto got = drain(run, 140);  // 140,000 elements: past steps 2^16 and 2^17
  const auto bytes = run.snapshot().to_bytes();
  const auto snap = Snapshot::from_bytes(bytes);
  for (const auto& st : snap.states)
    if (st.mode == StateMode::replay) {
      ASSERT_EQ(st.fields.at(2).name, "digest_steps");
      EXPECT_EQ(st.fields.at(2).elements.size(), 2u);
    }
  auto resumed = e.resume(p, snap, o);
  EXPECT_EQ(resumed.restore_report().replayed_elements(), 140'000u);
  auto rest = drain(resumed);
  got.insert(got.end(), rest.begin(), rest.end());
  EXPECT_EQ(got, testing::collect(p, o));
}

// A function that counts its calls as a Python callable does (kit/call_count.hpp) and names the element it
// fails on by that count: the node keeps the count in its record (`input_taken`), so the index runs on
// across a resume; a record without it (an older file, a rescaled set) starts the count at the resume.
struct CountingFn {
  std::int64_t fail_at = 150000;
  mutable std::uint64_t calls = 0;
  bool counted_from_resume = false;
  void check(std::int64_t x) const {
    const std::uint64_t index = calls++;
    if (x == fail_at)
      throw std::runtime_error("fails on element " + std::to_string(index) + (counted_from_resume ? " from the resume" : " from the start"));
  }
};
struct CountingPredicate : CountingFn {
  bool operator()(std::int64_t x) const { return check(x), x % 3 != 0; }
};
struct CountingExpansion : CountingFn {
  std::vector<std::int64_t> operator()(std::int64_t x) const { return check(x), std::vector<std::int64_t>{x, x}; }
};
struct CountingRoute : CountingFn {
  std::int64_t operator()(std::int64_t x) const { return check(x), 0; }
};

TEST(InputCount, ANodeCallingACountingFunctionSavesItsCountAndTheIndexRunsOnAcrossAResume) {
  const std::vector<std::pair<std::string, Pipeline<std::int64_t>>> pipelines = {
      {"filter", range(0, 200000) | filter(CountingPredicate{})},
      {"flat_map", range(0, 200000) | flat_map(CountingExpansion{})},
      {"demux", (range(0, 200000) | demux<1>(CountingRoute{}))[0]},
  };
  const auto failure = [](auto&& f) -> std::string {
    try {
      f();
    } catch (const NodeError& e) {
      return e.what();
    }
    return "no failure";
  };
  for (const auto& [kind, p] : pipelines) {
    SCOPED_TRACE(kind);
    for (const bool inline_workers : {true, false}) {
      auto o = options(1, 1);
      o.inline_workers = inline_workers;
      Engine e;
      auto run = e.start(p, o);
      drain(run, 300);
      // The settled snapshot: on the engine's threads, where the node is depends on the consumer only.
      const Snapshot snap = Snapshot::from_bytes(run.reproducible_snapshot().to_bytes());
      // Mid-stream: the node has taken some of its input, not yet the failing element.
      const NodeState* record = nullptr;
      for (const auto& st : snap.states)
        if (st.kind == kind) record = &st;
      ASSERT_NE(record, nullptr);
      ASSERT_FALSE(record->fields.empty());
      const Field* taken = nullptr;
      for (const auto& f : record->fields)
        if (f.name == kInputTakenField) taken = &f;
      ASSERT_NE(taken, nullptr);
      EXPECT_EQ(taken->type, FieldType::u64);
      EXPECT_GE(taken->u, kind == "flat_map" ? 150u : 200u);  // a filter drops a third; flat_map doubles
      EXPECT_LT(taken->u, 150000u);
      // Uninterrupted and resumed, the failure names element 150000 of the node's input.
      EXPECT_NE(failure([&] { auto whole = e.start(p, o); drain(whole); }).find("fails on element 150000 from the start"), std::string::npos);
      EXPECT_NE(failure([&] { auto resumed = e.resume(p, snap, o); drain(resumed); }).find("fails on element 150000 from the start"),
                std::string::npos);
      // Without the count (a file of format 5, a rescaled set) the node counts from the resume, and says so.
      Snapshot without = snap;
      for (auto& st : without.states) std::erase_if(st.fields, [](const Field& f) { return f.name == kInputTakenField; });
      EXPECT_NE(failure([&] { auto resumed = e.resume(p, without, o); drain(resumed); })
                    .find("fails on element " + std::to_string(150000 - taken->u) + " from the resume"),
                std::string::npos);
    }
  }
}

TEST(InputCount, ACountIsRefusedWhereNoNodeKeepsOneOrInAFileBeforeFormat6) {
  const auto p = range(0, 2000) | filter(CountingPredicate{}) | batch({.size = 4});
  Engine e;
  auto run = e.start(p, options(1, 1));
  drain(run, 20);
  Snapshot snap = Snapshot::from_bytes(run.snapshot().to_bytes());
  Snapshot forged = snap;
  for (auto& st : forged.states)
    if (st.kind == "batch") st.fields.push_back(Field{.name = kInputTakenField, .type = FieldType::u64, .u = 3});
  try {
    auto resumed = e.resume(p, forged, options(1, 1));
    ADD_FAILURE() << "a batch record with an input count was restored";
  } catch (const SnapshotError& err) {
    EXPECT_NE(std::string(err.what()).find("which this node does not keep"), std::string::npos) << err.what();
  }
  // The count in a file that says version 5 is refused when the file is read.
  std::string bytes = snap.to_bytes();
  const std::uint32_t v = 5;
  std::memcpy(bytes.data() + 8, &v, 4);
  const std::uint32_t crc = crc32c_raw(bytes.data(), 28);
  std::memcpy(bytes.data() + 28, &crc, 4);
  try {
    (void)Snapshot::from_bytes(bytes);
    ADD_FAILURE() << "a version 5 file with an input count was read";
  } catch (const SnapshotError& err) {
    EXPECT_NE(std::string(err.what()).find("'input_taken' in a file of version 5 (6 on)"), std::string::npos) << err.what();
  }
}

// A shuffle's restore holds what the snapshot holds, not the buffer size it declares.
TEST(SnapshotRestore, AHugeShuffleBufferSizeRestores) {
  Engine e;
  const auto p = range(0, 10) | shuffle({.buffer = std::int64_t{1} << 40});
  auto run = e.start(p, options(1, 3));
  drain(run, 4);
  const auto s = run.snapshot();
  auto resumed = e.resume(p, s, options(1, 3));
  auto straight = e.start(p, options(1, 3));
  drain(straight, 4);
  EXPECT_EQ(drain(resumed, 100), drain(straight, 100));
}

TEST(SnapshotRestore, CostAndSizeDoNotGrowWithThePosition) {
  // The state is the shuffle buffer, positions and the partial batch: the same size at any point.
  // (Inline workers: with threads, how many finished batches wait in the queue depends on timing.)
  auto p = canonical(2'000'000);
  Engine e;
  std::vector<std::size_t> sizes;
  auto o = options();
  o.inline_workers = true;
  for (std::size_t at : {1'000u, 10'000u, 100'000u}) {  // output batches; inputs are 16 times more
    auto run = e.start(p, o);
    drain(run, at);
    const auto bytes = run.snapshot().to_bytes();
    sizes.push_back(bytes.size());
    auto resumed = e.resume(p, Snapshot::from_bytes(bytes), o);
    EXPECT_EQ(resumed.restore_report().replayed_elements(), 0u);
    EXPECT_EQ(resumed.delivered(), at);
  }
  EXPECT_EQ(sizes[0], sizes[1]);
  EXPECT_EQ(sizes[1], sizes[2]);
}

auto counting_generator(std::shared_ptr<int> calls_made, bool deterministic) {
  return generator([calls_made, deterministic](const GeneratorContext& ctx) {
    return [rng = ctx.rng, calls_made, deterministic, i = 0]() mutable -> std::optional<std::int64_t> {
      if (i++ >= 200) return std::nullopt;
      ++*calls_made;
      // A non-deterministic generator draws from state outside its seed: the call counter.
      return deterministic ? static_cast<std::int64_t>(rng.below(1'000'000)) : *calls_made;
    };
  });
}

TEST(Replay, GeneratorIsRebuiltFromItsSeedAndTheRestUsesHooks) {
  auto calls = std::make_shared<int>(0);
  auto p = counting_generator(calls, true) | shuffle({.buffer = 10}) | batch({.size = 4});
  auto o = options();
  o.inline_workers = true;  // exact counts: nothing produced ahead of the consumer
  const auto full = testing::collect(p, o);
  Engine e;
  auto run = e.start(p, o);
  auto got = drain(run, 20);
  const auto snap = Snapshot::from_bytes(run.snapshot().to_bytes());
  auto resumed = e.resume(p, snap, o);
  const auto& report = resumed.restore_report();
  ASSERT_EQ(report.nodes.size(), 4u);
  EXPECT_EQ(report.nodes[0].kind, "merge");
  EXPECT_EQ(report.nodes[1].mode, StateMode::hook);       // batch
  EXPECT_EQ(report.nodes[2].mode, StateMode::hook);       // shuffle
  EXPECT_EQ(report.nodes[3].mode, StateMode::replay);     // generator
  EXPECT_EQ(report.nodes[3].replayed_elements, 20u * 4u + 10u);  // 80 batched, 10 buffered in the shuffle
  EXPECT_EQ(report.replayed_elements(), 90u);
  auto rest = drain(resumed);
  got.insert(got.end(), rest.begin(), rest.end());
  EXPECT_EQ(got, full);
}

TEST(Replay, ANonDeterministicGeneratorFailsLoudly) {
  auto calls = std::make_shared<int>(0);
  auto p = counting_generator(calls, false) | batch({.size = 4});
  Engine e;
  auto run = e.start(p, options());
  drain(run, 5);
  const auto snap = run.snapshot();
  try {
    e.resume(p, snap, options());
    FAIL() << "replay was accepted";
  } catch (const SnapshotError& err) {
    EXPECT_NE(std::string(err.what()).find("different stream"), std::string::npos) << err.what();
  }
}

TEST(Replay, AGeneratorThatEndsEarlyOnReplayFailsLoudly) {
  auto limit = std::make_shared<int>(100);
  auto p = generator([limit](const GeneratorContext&) {
    return [limit, i = 0]() mutable -> std::optional<int> {
      if (i >= *limit) return std::nullopt;
      return i++;
    };
  });
  Engine e;
  auto run = e.start(p, options());
  drain(run, 50);
  const auto snap = run.snapshot();
  *limit = 10;  // the world changed under the generator
  try {
    e.resume(p, snap, options());
    FAIL() << "replay was accepted";
  } catch (const SnapshotError& err) {
    EXPECT_NE(std::string(err.what()).find("replay ended after 10"), std::string::npos) << err.what();
  }
}

TEST(SnapshotRestore, StatesAreRefusedWhenTheyDoNotFitTheNode) {
  Engine e;
  auto p = range(0, 100) | batch({.size = 10});
  auto run = e.start(p, options());
  drain(run, 2);
  auto s = run.snapshot();
  // Tamper with a field the way a buggy writer could, then re-encode with valid checksums.
  for (auto& st : s.states)
    if (st.kind == "range") st.fields[0].u = 1000;
  try {
    e.resume(p, Snapshot::from_bytes(s.to_bytes()), options());
    FAIL();
  } catch (const SnapshotError& err) {
    EXPECT_NE(std::string(err.what()).find("past the range's end"), std::string::npos) << err.what();
  }
  for (auto& st : s.states)
    if (st.kind == "range") st.fields[0].name = "idx";
  EXPECT_THROW(e.resume(p, s, options()), SnapshotError);
}


// ---- Value: the dynamic element of Python callables ---------------------------------------------

Value sample_value(std::int64_t i) {
  ValueArray a{"<f4", {2, 3}, std::string(24, '\0')};
  for (int k = 0; k < 6; ++k) {
    const float f = static_cast<float>(i) + 0.5f * static_cast<float>(k);
    std::memcpy(a.data.data() + 4 * k, &f, 4);
  }
  return Value::dict({Value::string("id"), Value::integer(i), Value::string("score"), Value::real(static_cast<double>(i) / 3.0),
                      Value::string("tags"), Value::list({Value::string("a\n\"b\""), Value::bytes(std::string("\0\xff", 2))}),
                      Value::string("pair"), Value::tuple({Value::boolean(i % 2 == 0), Value::none()}),
                      Value::integer(7), Value::string("a key that is not a string"), Value::string("x"), Value::array(a)});
}

std::string encoded(const Value& v) {
  ByteWriter w;
  Codec<Value>::encode(w, v);
  return w.take();
}

Value decoded(const std::string& bytes) {
  ByteReader r(bytes);
  Value v = Codec<Value>::decode(r);
  if (!r.done()) throw SnapshotError("bytes left over");
  return v;
}

TEST(ValueCodec, RoundTripsEveryKind) {
  for (std::int64_t i : {0, 1, -5, 1'000'000'007}) {
    const Value v = sample_value(i);
    EXPECT_EQ(decoded(encoded(v)), v);
  }
  EXPECT_EQ(decoded(encoded(Value::none())), Value::none());
  EXPECT_NE(decoded(encoded(Value::bytes("ab"))), Value::string("ab"));
  EXPECT_NE(decoded(encoded(Value::tuple({}))), Value::list({}));
}

// An array is held behind a pointer (so it does not size every Value), yet copies and compares as a value.
TEST(ValueCodec, AnArrayCopiesDeeplyAndComparesByContent) {
  static_assert(sizeof(Value) <= 48, "a Value is as small as a string and its kind");
  Value a = sample_value(3);
  Value b = a;  // a deep copy
  EXPECT_EQ(a, b);
  std::get<std::vector<Value>>(b.data).back().as_array().data[0] ^= 1;
  EXPECT_NE(a, b);  // the copy's array is its own
  EXPECT_EQ(encoded(a), encoded(sample_value(3)));
  Value moved = std::move(b);
  b = a;  // a moved-from Value is assigned to again
  EXPECT_EQ(b, a);
  EXPECT_NE(moved, a);
  // An array Value moved from reads as an empty array: it compares, encodes and copies without a fault.
  Value array = Value::array(ValueArray{"<i8", {1}, std::string(8, '\1')});
  Value taken = std::move(array);
  EXPECT_EQ(taken.as_array().shape, std::vector<std::uint64_t>{1});
  EXPECT_TRUE(array.as_array().data.empty());
  EXPECT_NE(array, taken);
  const Value copy = array;
  EXPECT_EQ(copy, array);
  EXPECT_FALSE(encoded(array).empty());
}

TEST(ValueCodec, JsonTextNamesEveryKind) {
  std::string out;
  append_value_json(out, sample_value(3));
  EXPECT_EQ(out,
            "[[\"id\", 3], [\"score\", 1], [\"tags\", [\"a\\n\\\"b\\\"\", {\"base64\": \"AP8=\"}]], "
            "[\"pair\", [false, null]], [7, \"a key that is not a string\"], "
            "[\"x\", [[3, 3.5, 4], [4.5, 5, 5.5]]]]");
  out.clear();
  // Arrays with no list form keep their type, shape and bytes: complex, big-endian, half floats.
  append_value_json(out, Value::array(ValueArray{.dtype = ">i2", .shape = {1}, .data = std::string("\x01\x02", 2)}));
  EXPECT_EQ(out, "{\"dtype\": \">i2\", \"shape\": [1], \"base64\": \"AQI=\"}");
  out.clear();
  append_value_json(out, Value::dict({Value::string("a"), Value::real(0.1), Value::string("b"), Value::real(-INFINITY)}));
  EXPECT_EQ(out, "{\"a\": 0.1, \"b\": \"-inf\"}");
}

TEST(ValueCodec, RefusesCorruptBytes) {
  const std::string good = encoded(sample_value(4));
  for (std::size_t n = 0; n < good.size(); ++n) EXPECT_THROW(decoded(good.substr(0, n)), SnapshotError) << n;
  auto refused = [](const std::string& bytes, const std::string& part) {
    testing::expect_throw_with<SnapshotError>([&] { decoded(bytes); }, part);
  };
  refused(std::string(1, '\x0b'), "unknown value kind 11");
  refused(std::string("\x01\x02", 2), "a boolean value of 2");
  refused(std::string(1, '\x08') + testing::le(1, 8) + std::string(1, '\0'), "odd count");
  ValueArray bad{"<i3", {1}, "abc"};
  refused(encoded(Value::array(bad)), "not one of numbers");
  bad = {"<i4", {2, 2}, std::string(12, 'x')};
  refused(encoded(Value::array(bad)), "4 items of 4 bytes holds 12 bytes");
  std::string deep;
  for (int i = 0; i <= kValueMaxDepth + 1; ++i) deep += std::string(1, '\x06') + testing::le(1, 8);
  deep += std::string(1, '\0');
  refused(deep, "nests deeper than");
}

TEST(ValueCodec, APipelineOfValuesResumesExactly) {
  std::vector<Value> values;
  for (std::int64_t i = 0; i < 300; ++i) values.push_back(sample_value(i));
  const auto p = from_vector(values) | sharding_filter() | shuffle({.buffer = 40}) | batch({.size = 8});
  const auto whole = testing::collect(p, options(2));
  ASSERT_EQ(whole.size(), 300u / 8 + 1);
  for (const std::size_t at : {0u, 3u, 17u, 37u}) EXPECT_EQ(testing::stop_and_resume(p, options(2), at), whole) << at;
}

}  // namespace
}  // namespace dpipe
