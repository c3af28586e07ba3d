// File sources: TFRecord framing (byte-compatible with TensorFlow, checked with an independent CRC-32C),
// bad data, fuzzed bytes; token windows; both under a sampler across a rescale.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <type_traits>

#include "dpipe/dpipe.hpp"
#include "../test_util.hpp"

namespace dpipe {
namespace {

namespace fs = std::filesystem;
using I64 = std::int64_t;

using testing::counting_tokens;
using testing::le;
using testing::TempDir;
using testing::varied_text;
using testing::write_bytes;

/// A bitwise CRC-32C, independent of the library's table/SSE4.2 one.
std::uint32_t reference_crc32c(const std::string& s) {
  std::uint32_t crc = 0xffffffffu;
  for (unsigned char c : s) {
    crc ^= c;
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0x82f63b78u & (0u - (crc & 1u)));
  }
  return ~crc;
}
std::uint32_t reference_masked(const std::string& s) {
  const std::uint32_t c = reference_crc32c(s);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}
/// One TFRecord frame built by hand from the format's definition.
std::string frame(const std::string& data) {
  const std::string len = le(data.size(), 8);
  return len + le(reference_masked(len), 4) + data + le(reference_masked(data), 4);
}

TEST(Records, ReferenceCrcMatchesThePublishedVector) {
  EXPECT_EQ(reference_crc32c("123456789"), 0xe3069283u);
  EXPECT_EQ(masked_crc32c("123456789", 9), reference_masked("123456789"));
}

TEST(Records, ReadsHandBuiltFilesAndWritesTheSameBytes) {
  TempDir d;
  const std::vector<std::string> data = {"", "a", std::string("\0\xff\x10", 3), std::string(1000, 'x'), "last"};
  std::string bytes;
  for (const auto& r : data) bytes += frame(r);
  write_bytes(d.file("hand.tfrecord"), bytes);
  EXPECT_EQ(testing::collect(records({d.file("hand.tfrecord")}), testing::options()), data);
  write_records(d.file("ours.tfrecord"), data);
  std::ifstream in(d.file("ours.tfrecord"), std::ios::binary);
  const std::string ours((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(ours, bytes);  // byte for byte what TensorFlow's framing gives
}

TEST(Records, BadDataIsADataErrorNamingFileAndOffsetOrIsSkippedAndCounted) {
  TempDir d;
  std::string good = frame("alpha") + frame("beta");
  std::string corrupt = frame("gamma");
  corrupt[12] ^= 1;  // a data byte: the data checksum no longer matches
  write_bytes(d.file("bad.tfrecord"), good + corrupt + frame("delta"));
  const std::string off = std::to_string(good.size());
  try {
    testing::collect(records({d.file("bad.tfrecord")}), testing::options());
    FAIL() << "a corrupt record was read";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("bad.tfrecord"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("byte offset " + off), std::string::npos) << e.what();
  }
  auto p = records({d.file("bad.tfrecord")}, {.on_error = OnDataError::skip});
  EXPECT_EQ(testing::collect(p, testing::options()), (std::vector<std::string>{"alpha", "beta", "delta"}));
  EXPECT_EQ(Graph::build(*p.def()).skipped_records(), 1u);
  EXPECT_EQ(Graph::build(*p.def()).skipped_bytes(), corrupt.size());
  EXPECT_THROW(records({d.file("missing.tfrecord")}), DataError);
}

/// Reads `bytes` as a records file with on_error = skip: the records, and what was given up.
struct Skipped {
  std::vector<std::string> records;
  std::uint64_t skipped_records, skipped_bytes;
};
Skipped read_skipping(const TempDir& d, const std::string& bytes) {
  write_bytes(d.file("damaged.tfrecord"), bytes);
  auto p = records({d.file("damaged.tfrecord")}, {.on_error = OnDataError::skip});
  const auto g = Graph::build(*p.def());
  return {testing::collect(p, testing::options()), g.skipped_records(), g.skipped_bytes()};
}

TEST(Records, AfterABadLengthChecksumTheGoodRecordsThatFollowAreReadAndTheLossCounted) {
  TempDir d;
  const std::string before = frame("alpha") + frame("beta");
  std::string damaged = frame("gamma, whose length checksum breaks");
  damaged[9] ^= 0x20;  // the length checksum
  const std::string after = frame("delta") + frame(std::string(500, 'e')) + frame("") + frame("zeta");
  const auto s = read_skipping(d, before + damaged + after);
  EXPECT_EQ(s.records, (std::vector<std::string>{"alpha", "beta", "delta", std::string(500, 'e'), "", "zeta"}));
  EXPECT_EQ(s.skipped_records, 1u);
  EXPECT_EQ(s.skipped_bytes, damaged.size());
  // A damaged length field (its checksum intact) reads the same way.
  damaged = frame("gamma, whose length breaks");
  damaged[0] ^= 0x01;
  const auto t = read_skipping(d, before + damaged + after);
  EXPECT_EQ(t.records.size(), 6u);
  EXPECT_EQ(t.skipped_records, 1u);
  EXPECT_EQ(t.skipped_bytes, damaged.size());
  // Without skip it is still a DataError at the damaged header.
  EXPECT_THROW(records({d.file("damaged.tfrecord")}), DataError);
}

TEST(Records, GarbageBetweenRecordsAndATruncatedTailAreSkippedByteForByte) {
  TempDir d;
  std::mt19937_64 g(99);
  for (int trial = 0; trial < 200; ++trial) {
    std::string junk(1 + g() % 300, '\0');
    for (auto& c : junk) c = static_cast<char>(g());
    const std::string one = frame("one"), two = frame(std::string(g() % 100, 't')), three = frame("three");
    const std::string tail = frame("cut off").substr(0, 1 + g() % 20);
    const auto s = read_skipping(d, one + junk + two + three + tail);
    ASSERT_EQ(s.records.size(), 3u) << "trial " << trial;
    EXPECT_EQ(s.records[0], "one");
    EXPECT_EQ(s.records[2], "three");
    EXPECT_EQ(s.skipped_bytes, junk.size() + tail.size()) << "trial " << trial;
    EXPECT_EQ(s.skipped_records, 2u) << "trial " << trial;  // one per damaged stretch
  }
}

TEST(Records, ADataChecksumMismatchCountsItsBytes) {
  TempDir d;
  std::string bad = frame("payload");
  bad[13] ^= 1;
  const auto s = read_skipping(d, frame("a") + bad + bad + frame("b"));
  EXPECT_EQ(s.records, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(s.skipped_records, 2u);
  EXPECT_EQ(s.skipped_bytes, 2 * bad.size());
}

TEST(Records, EveryTruncationIsRefusedOrSkipped) {
  TempDir d;
  const std::string bytes = frame("first record") + frame("second");
  for (std::size_t cut = 1; cut < bytes.size(); ++cut) {
    if (cut == frame("first record").size()) continue;  // a whole first record: a valid file
    write_bytes(d.file("cut.tfrecord"), bytes.substr(0, cut));
    EXPECT_THROW(records({d.file("cut.tfrecord")}), DataError) << "cut at " << cut;
    auto skipping = records({d.file("cut.tfrecord")}, {.on_error = OnDataError::skip});
    EXPECT_LE(testing::collect(skipping, testing::options()).size(), 1u);
  }
}

TEST(Records, FuzzedBytesNeverCrash) {
  TempDir d;
  std::mt19937_64 g(12345);
  const std::string valid = frame("abcdefgh") + frame(std::string(300, 'z')) + frame("");
  for (int trial = 0; trial < 600; ++trial) {
    std::string bytes = valid;
    if (trial % 3 == 0) {  // random garbage of random length
      bytes.resize(g() % 200);
      for (auto& c : bytes) c = static_cast<char>(g());
    } else {  // a valid file with random byte flips
      for (int k = 0; k < 1 + static_cast<int>(g() % 4); ++k) bytes[g() % bytes.size()] ^= static_cast<char>(1 + g() % 255);
    }
    write_bytes(d.file("fuzz.tfrecord"), bytes);
    for (auto mode : {OnDataError::fail, OnDataError::skip}) {
      try {
        auto out = testing::collect(records({d.file("fuzz.tfrecord")}, {.on_error = mode}), testing::options());
        EXPECT_LE(out.size(), 3u);
      } catch (const DataError&) {
        // refusing is fine; crashing, hanging or reading out of bounds is not
      }
    }
  }
}

TEST(TokenWindows, CoverShiftedTargetsDropTheRemainderAndStayInTheirFile) {
  TempDir d;
  std::string a, b;
  for (std::uint16_t t = 0; t < 23; ++t) a += le(t, 2);          // 23 tokens, L = 5: windows at 0, 5, 10, 15
  for (std::uint16_t t = 100; t < 106; ++t) b += le(t, 2);       // 6 tokens: exactly one window
  write_bytes(d.file("a.bin"), a);
  write_bytes(d.file("b.bin"), b);
  auto p = token_windows({d.file("a.bin"), d.file("b.bin")}, {.dtype = TokenType::uint16, .seq_len = 5});
  const auto w = testing::collect(p, testing::options());
  ASSERT_EQ(w.size(), 5u);
  EXPECT_EQ(w[0], (std::vector<I64>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(w[3], (std::vector<I64>{15, 16, 17, 18, 19, 20}));
  EXPECT_EQ(w[4], (std::vector<I64>{100, 101, 102, 103, 104, 105}));
  std::string c;
  for (std::uint32_t t = 70000; t < 70009; ++t) c += le(t, 4);
  write_bytes(d.file("c.bin"), c);
  auto wide = token_windows<std::uint32_t>({d.file("c.bin")}, {.dtype = TokenType::uint32, .seq_len = 4});
  EXPECT_EQ(testing::collect(wide, testing::options()),
            (std::vector<std::vector<std::uint32_t>>{{70000, 70001, 70002, 70003, 70004},
                                                     {70004, 70005, 70006, 70007, 70008}}));
  write_bytes(d.file("odd.bin"), a + "x");
  EXPECT_THROW(token_windows({d.file("odd.bin")}, {.seq_len = 5}), DataError);
}

TEST(FileSources, FingerprintCoversTheFilesAndTheirSizes) {
  TempDir d;
  write_records(d.file("r.tfrecord"), {"one", "two"});
  const auto before = Graph::build(*records({d.file("r.tfrecord")}).def()).fingerprint();
  write_records(d.file("r.tfrecord"), {"one", "two", "three"});
  EXPECT_NE(Graph::build(*records({d.file("r.tfrecord")}).def()).fingerprint(), before);
}

// A data file rewritten in place at the same size is refused on resume, naming it, unless the resume
// accepts changed data; the fingerprint (path and size) stays, so ranks whose copies differ only in
// their times still form one set.
TEST(FileSources, AFileRewrittenAtTheSameSizeIsRefusedUnlessAccepted) {
  TempDir d;
  const std::string path = d.file("lines.txt");
  {
    std::ofstream(path) << "aa\nbb\ncc\ndd\n";
  }
  const auto before = lines({path}, {.shuffle_shards = false});
  Engine e;
  auto run = e.start(before, {.layout = Layout{0, 1, 1}});
  run.next();
  const auto s = run.snapshot();
  const auto fingerprint = run.graph().fingerprint();
  {
    std::ofstream(path) << "xx\nyy\nzz\nww\n";  // same size, other bytes
  }
  std::filesystem::last_write_time(path, std::filesystem::last_write_time(path) + std::chrono::seconds(5));
  const auto p = lines({path}, {.shuffle_shards = false});  // as a restarted job builds it
  EXPECT_EQ(Graph::build(*p.def()).fingerprint(), fingerprint);
  testing::expect_throw_with<SnapshotError>([&] { e.resume(p, s, {.layout = Layout{0, 1, 1}}); },
                                            "data changed since the snapshot");
  testing::expect_throw_with<SnapshotError>([&] { e.resume(p, s, {.layout = Layout{0, 1, 1}}); }, path);
  auto accepted = e.resume(p, s, {.layout = Layout{0, 1, 1}}, {.allow_changed_data = true});
  EXPECT_EQ(testing::drain(accepted).size(), 3u);  // lines read before the snapshot come from it, the rest from the file
}

// ---- the data root: checkpoints that move with their files ----

/// Writes the files of the data-root tests under `root`: two text files in a subfolder, a TFRecord file
/// and a token file.
void write_rooted_files(const fs::path& root) {
  fs::create_directories(root / "text");
  std::string a, b;
  for (int i = 0; i < 300; ++i) (i % 2 ? a : b) += "line " + std::to_string(i) + "\n";
  write_bytes((root / "text" / "a.txt").string(), a);
  write_bytes((root / "text" / "b.txt").string(), b);
  std::vector<std::string> records_;
  for (int i = 0; i < 200; ++i) records_.push_back("record " + std::to_string(i));
  write_records((root / "r.tfrecord").string(), records_);
  write_bytes((root / "t.bin").string(), counting_tokens(2000));
}

/// One pipeline of every file source, their elements as strings, with `names` under `data`.
Pipeline<std::string> every_file_source(const std::vector<std::string>& names, const DataFiles& data) {
  auto text = lines({names[0], names[1]}, {.logical_shards = 8, .data = data}) | shuffle({.buffer = 16});
  auto recs = records({names[2]}, {.data = data}) | sampler();
  auto windows = token_windows({names[3]}, {.seq_len = 7, .data = data}) | sampler() |
                 map([](const std::vector<I64>& w) { return std::to_string(w.front()); });
  return concat(text, recs, windows);
}

// A checkpoint taken with the files under one root resumes with the same files under another (the folder
// moved, as another mount point shows it): exactly the uninterrupted run's remaining elements.
TEST(DataRoot, ASnapshotTakenUnderOneRootResumesUnderAnother) {
  TempDir d;
  const fs::path first = d.path() / "mounted-here", second = d.path() / "elsewhere" / "mounted-there";
  write_rooted_files(first);
  const auto absolute_under = [](const fs::path& root) {
    return std::vector<std::string>{(root / "text/a.txt").string(), (root / "text/b.txt").string(),
                                    (root / "r.tfrecord").string(), (root / "t.bin").string()};
  };
  const std::vector<std::string> relative = {"text/a.txt", "text/./b.txt", "r.tfrecord", "t.bin"};
  const RunOptions o{.seed = 9, .layout = Layout{0, 1, 2}};
  Engine e;
  const auto taken = every_file_source(absolute_under(first), {.root = first.string() + "/"});
  const auto all = testing::collect(taken, o);
  ASSERT_EQ(all.size(), 300u + 200u + 285u);
  auto run = e.start(taken, o);
  const auto before = testing::drain(run, 333);  // mid-stream: the shuffle holds elements
  const auto s = run.snapshot();
  run = e.start(taken, o);  // the run holds the files mapped: let it go before the folder moves
  fs::create_directories(second.parent_path());
  fs::rename(first, second);  // keeps the files' modification times, as a mount point does

  const auto moved = every_file_source(relative, {.root = second.string()});
  EXPECT_EQ(Graph::build(*moved.def()).fingerprint(), Graph::build(*taken.def()).fingerprint());
  auto resumed = e.resume(moved, s, o);
  auto rest = testing::drain(resumed);
  std::vector<std::string> joined = before;
  joined.insert(joined.end(), rest.begin(), rest.end());
  EXPECT_EQ(joined, all);
  // Absolute names under the new root say the same.
  auto again = e.resume(every_file_source(absolute_under(second), {.root = second.string()}), s, o);
  EXPECT_EQ(testing::drain(again), rest);

  // Without a root the names are the paths: another place is another pipeline, refused naming the file.
  testing::expect_throw_with<SnapshotError>(
      [&] { e.resume(every_file_source(absolute_under(second), {}), s, o); }, "text/a.txt");
  // A file moved within the root is another name: refused.
  fs::rename(second / "t.bin", second / "text" / "t.bin");
  testing::expect_throw_with<SnapshotError>(
      [&] { e.resume(every_file_source({"text/a.txt", "text/b.txt", "r.tfrecord", "text/t.bin"}, {.root = second.string()}), s, o); },
      "text/t.bin");
}

TEST(DataRoot, RelativeNamesOutsideTheRootAndMissingFilesAreClearErrors) {
  TempDir d;
  write_rooted_files(d.path());
  testing::expect_throw_with<ConfigError>([&] { lines({"../text/a.txt"}, {.data = {.root = d.file("text")}}); },
                                          "outside the data root");
  testing::expect_throw_with<Error>([&] { lines({"text/none.txt"}, {.data = {.root = d.path().string()}}); },
                                    d.file("text/none.txt"));
  // An absolute name outside the root stays absolute (it does not move with the root).
  const auto p = lines({d.file("text/a.txt")}, {.data = {.root = d.file("r.tfrecord")}});
  EXPECT_EQ(p.def()->params().back().second.rfind(d.file("text/a.txt") + " (", 0), 0u);
}

// A copy has a new modification time: refused as changed data, unless the files are identified by a
// digest of their bytes; then a copy resumes and a file whose bytes changed (same size) is refused.
TEST(DataRoot, ADigestIdentifiesCopiesAndTellsChangedBytes) {
  TempDir d;
  const fs::path first = d.path() / "one", copy = d.path() / "two";
  write_rooted_files(first);
  const std::vector<std::string> names = {"text/a.txt", "text/b.txt", "r.tfrecord", "t.bin"};
  const RunOptions o{.seed = 4, .layout = Layout{0, 1, 1}};
  Engine e;
  for (const FileIdentity identity : {FileIdentity::mtime, FileIdentity::digest}) {
    SCOPED_TRACE(identity == FileIdentity::digest ? "digest" : "mtime");
    fs::remove_all(copy);
    const auto taken = every_file_source(names, {.root = first.string(), .identity = identity});
    const auto all = testing::collect(taken, o);
    auto run = e.start(taken, o);
    const auto before = testing::drain(run, 100);
    const auto s = run.snapshot();
    fs::copy(first, copy, fs::copy_options::recursive);
    for (const auto& n : names)  // the copies are written later than the originals
      fs::last_write_time(copy / n, fs::last_write_time(first / n) + std::chrono::seconds(3));
    const auto copied = every_file_source(names, {.root = copy.string(), .identity = identity});
    if (identity == FileIdentity::mtime) {
      testing::expect_throw_with<SnapshotError>([&] { e.resume(copied, s, o); }, "data changed since the snapshot");
      continue;
    }
    auto resumed = e.resume(copied, s, o);
    auto joined = before;
    for (auto& x : testing::drain(resumed)) joined.push_back(std::move(x));
    EXPECT_EQ(joined, all);
    std::string b;
    {
      std::ifstream in(copy / "text/b.txt", std::ios::binary);
      b.assign(std::istreambuf_iterator<char>(in), {});
    }
    b[0] = 'L';  // same size, other bytes
    write_bytes((copy / "text/b.txt").string(), b);
    testing::expect_throw_with<SnapshotError>(
        [&] { e.resume(every_file_source(names, {.root = copy.string(), .identity = identity}), s, o); },
        "text/b.txt");
  }
  EXPECT_NE(content_digest("abc"), content_digest("abd"));
  EXPECT_NE(content_digest(std::string(64, 'a')), content_digest(std::string(64, 'a') + "a"));
}

TEST(FileSources, SampledRecordsRescaleWithEveryRecordOnce) {
  TempDir d;
  std::vector<std::string> a, b;
  for (int i = 0; i < 700; ++i) (i % 3 ? a : b).push_back("rec" + std::to_string(i));
  write_records(d.file("a.tfrecord"), a);
  write_records(d.file("b.tfrecord"), b);
  auto p = records({d.file("a.tfrecord"), d.file("b.tfrecord")}) | sampler() | shuffle({.buffer = 30}) |
           batch({.size = 8});
  Engine e;
  std::vector<std::string> got;
  std::vector<Snapshot> ranks;
  for (int r = 0; r < 2; ++r) {
    auto run = e.start(p, RunOptions{.seed = 3, .layout = Layout{r, 2, 3}});
    for (int i = 0; i < 10; ++i) {
      auto x = run.next();
      got.insert(got.end(), x->begin(), x->end());
    }
    ranks.push_back(run.snapshot());
  }
  const SnapshotSet set(std::move(ranks));
  for (int r = 0; r < 3; ++r) {
    auto run = e.resume(p, set, RunOptions{.seed = 3, .layout = Layout{r, 3, 1}}, {.rescale = true});
    while (auto x = run.next()) got.insert(got.end(), x->begin(), x->end());
  }
  std::map<std::string, int> count;
  for (const auto& s : got) ++count[s];
  EXPECT_EQ(count.size(), 700u);
  for (const auto& [s, k] : count) EXPECT_EQ(k, 1) << s;
}

TEST(Lines, SplitsLikeTextFilesAcrossAnyNumberOfLogicalShards) {
  TempDir d;
  write_bytes(d.file("a.txt"), "one\r\ntwo\n\nfour\n");
  write_bytes(d.file("b.txt"), "");
  write_bytes(d.file("c.txt"), "x\nlast without newline");
  const std::vector<std::string> expected = {"one", "two", "", "four", "x", "last without newline"};
  for (int shards : {1, 2, 3, 7, 40}) {
    auto p = lines({d.file("a.txt"), d.file("b.txt"), d.file("c.txt")},
                   {.logical_shards = shards, .shuffle_shards = false});
    EXPECT_EQ(testing::collect(p, testing::options()), expected) << shards << " shards";
    for (auto [world, workers] : {std::pair{1, 3}, {2, 2}, {3, 1}}) {
      std::vector<std::string> all;
      for (int r = 0; r < world; ++r) {
        auto part = testing::collect(lines({d.file("a.txt"), d.file("b.txt"), d.file("c.txt")},
                                           {.logical_shards = shards}),
                                     testing::options(workers, 7, r, world));
        all.insert(all.end(), part.begin(), part.end());
      }
      std::sort(all.begin(), all.end());
      auto sorted = expected;
      std::sort(sorted.begin(), sorted.end());
      EXPECT_EQ(all, sorted) << shards << " shards, " << world << " x " << workers;
    }
  }
  EXPECT_THROW(lines({d.file("missing.txt")}), DataError);
}

// Shards of several MiB: lines maps their pages a few MiB at a time, so reads cross from one populated
// window into the next (and a resume starts in the middle of one).
TEST(Lines, ReadsShardsLargerThanOnePopulatedWindow) {
  TempDir d;
  std::vector<std::string> expected;
  write_bytes(d.file("big.txt"), varied_text(11u << 20, expected));
  auto p = lines({d.file("big.txt")}, {.logical_shards = 2, .shuffle_shards = false});
  EXPECT_EQ(testing::collect(p, testing::options()), expected);
  const std::size_t past_first_window = expected.size() * 3 / 8;  // about 4.1 MiB into the first shard
  EXPECT_EQ(testing::stop_and_resume(p, testing::options(), past_first_window), expected);
}

/// The lines of `blocks`, in order.
std::vector<std::string> unpack(const std::vector<TextBlock>& blocks) {
  std::vector<std::string> out;
  for (const auto& b : blocks)
    for (std::string_view line : b) out.emplace_back(line);
  return out;
}

// line_blocks reads the same shards as lines; unpacked, its blocks are exactly the lines lines gives, in
// the same order, whatever the block size: lines longer than a block, empty lines, "\r\n", a last line
// without a newline, shards that start inside a line.
TEST(LineBlocks, HoldExactlyTheLinesOfLinesForAnyBlockSizeShardCountAndLayout) {
  testing::property_trials(40, [&](std::mt19937_64& g) {
    auto pick = [&](int n) { return testing::draw(g, n); };
    TempDir d;
    std::vector<std::string> files;
    for (int f = 0, nf = 1 + pick(4); f < nf; ++f) {
      std::string text;
      for (int l = 0, nl = pick(120); l < nl; ++l) {
        const int len = pick(8) == 0 ? pick(400) : pick(40);
        for (int c = 0; c < len; ++c) text += static_cast<char>(pick(5) == 0 ? ' ' : 'a' + pick(26));
        if (l + 1 < nl || pick(2)) text += pick(4) == 0 ? "\r\n" : "\n";
        else if (pick(2)) text += '\r';  // a last line without a newline, ending in '\r'

      }
      files.push_back(d.file("t" + std::to_string(f) + ".txt"));
      write_bytes(files.back(), text);
    }
    const int shards = 1 + pick(40), epochs = 1 + pick(2);
    const bool shuffled = pick(2) == 0;
    const int size_kind = pick(4);
    const std::int64_t block_bytes = size_kind == 0 ? 64 << 10 : size_kind == 1 ? 1 : 1 + pick(300);
    // The same node name: the shards' order per epoch is drawn from it.
    const auto expected = testing::collect(
        lines(files, {.logical_shards = shards, .epochs = epochs, .shuffle_shards = shuffled, .name = "text"}),
        testing::options());
    const auto blocks_of = [&] {
      return line_blocks(files, {.logical_shards = shards,
                                 .epochs = epochs,
                                 .shuffle_shards = shuffled,
                                 .block_bytes = block_bytes,
                                 .name = "text"});
    };
    const auto blocks = testing::collect(blocks_of(), testing::options());
    ASSERT_EQ(unpack(blocks), expected) << shards << " shards, blocks of " << block_bytes;
    for (const auto& b : blocks) {
      ASSERT_FALSE(b.empty());
      ASSERT_EQ(TextBlock::check(b.text(), b.ends()), "");
      // At most block_bytes of whole lines, or one line that is longer.
      if (b.size() > 1) {
        ASSERT_LE(b.text().size(), static_cast<std::size_t>(block_bytes));
      }
    }
    // Any layout: every line once over the instances.
    const int world = 1 + pick(3), workers = 1 + pick(3);
    std::vector<std::string> all;
    for (int r = 0; r < world; ++r) {
      const auto part = unpack(testing::collect(blocks_of(), testing::options(workers, 7, r, world)));
      all.insert(all.end(), part.begin(), part.end());
    }
    auto sorted = expected;
    std::sort(sorted.begin(), sorted.end());
    std::sort(all.begin(), all.end());
    ASSERT_EQ(all, sorted) << world << " x " << workers;
  });
}

TEST(LineBlocks, ReadLinesLongerThanABlockAndResumeMidShard) {
  TempDir d;
  std::vector<std::string> expected;
  std::string text = varied_text(9u << 20, expected, 5000);  // line 5000 longer than a block
  text += "tail";
  expected.push_back("tail");
  write_bytes(d.file("big.txt"), text);
  auto p = line_blocks({d.file("big.txt")}, {.logical_shards = 2, .shuffle_shards = false});
  const auto blocks = testing::collect(p, testing::options());
  EXPECT_EQ(unpack(blocks), expected);
  EXPECT_GT(blocks.size(), 100u);
  EXPECT_EQ(unpack(testing::stop_and_resume(p, testing::options(), blocks.size() * 3 / 8)), expected);
  EXPECT_EQ(unpack(testing::stop_and_resume(p, testing::options(2), 7)), unpack(testing::collect(p, testing::options(2))));
}

// The conformance battery's check for the two line sources, which need files: snapshotted at
// breakpoints {0, 1, 5, middle, end} and restored through bytes into a fresh Run, a run continues with
// exactly the rest of the uninterrupted stream, for one, two and three workers.
template <class P>
void expect_resume_at_every_breakpoint(const P& p) {
  for (int workers : {1, 2, 3}) {
    const auto whole = testing::collect(p, testing::options(workers));
    ASSERT_GT(whole.size(), 6u);
    for (std::size_t at : {std::size_t{0}, std::size_t{1}, std::size_t{5}, whole.size() / 2, whole.size()})
      ASSERT_EQ(testing::stop_and_resume(p, testing::options(workers), at), whole)
          << workers << " workers, stopped at " << at;
  }
}

TEST(LineSources, ResumeAtEveryBreakpointContinuesTheStream) {
  TempDir d;
  std::vector<std::string> files;
  for (int f = 0; f < 3; ++f) {
    std::string text;
    for (int l = 0; l < 150 + 70 * f; ++l) text += "f" + std::to_string(f) + " line " + std::to_string(l) + "\n";
    files.push_back(d.file("s" + std::to_string(f) + ".txt"));
    write_bytes(files.back(), text);
  }
  expect_resume_at_every_breakpoint(lines(files, {.logical_shards = 13, .epochs = 2}) | shuffle({.buffer = 20}) |
                                    batch({.size = 8}));
  expect_resume_at_every_breakpoint(line_blocks(files, {.logical_shards = 13, .epochs = 2, .block_bytes = 100}) |
                                    shuffle({.buffer = 5}) | batch({.size = 3}));
  expect_resume_at_every_breakpoint(line_blocks(files, {.logical_shards = 5, .block_bytes = 64}));
}

/// Runs `p` a few elements, sets every saved shard offset of its `kind` node to `offset` (as a buggy
/// writer could, checksums valid) and returns the resume's SnapshotError message.
template <class P>
std::string resume_with_offset(const P& p, const std::string& kind, std::uint64_t offset) {
  Engine e;
  auto run = e.start(p, testing::options());
  testing::drain(run, 3);
  Snapshot s = run.snapshot();
  for (auto& st : s.states)
    for (auto& f : st.fields)
      if (st.kind == kind && f.name == "started_offsets") {
        ElementBlobs b;
        b.tag = f.elements.tag;
        for (std::size_t i = 0; i < f.elements.size(); ++i) b.append(encode_to_string(offset));
        f.elements = b;
      }
  try {
    e.resume(p, Snapshot::from_bytes(s.to_bytes()), testing::options());
  } catch (const SnapshotError& err) {
    return err.what();
  }
  return "resumed";
}

TEST(LineSources, RestoredOffsetsOutsideTheirSegmentAreRefused) {
  TempDir d;
  std::string text;
  for (int l = 0; l < 100'000; ++l) text += "line " + std::to_string(l) + "\n";  // shards far longer than any read-ahead
  write_bytes(d.file("t.txt"), text);
  const auto l = lines({d.file("t.txt")}, {.logical_shards = 4, .shuffle_shards = false});
  const auto b = line_blocks({d.file("t.txt")}, {.logical_shards = 4, .shuffle_shards = false, .block_bytes = 50});
  for (std::uint64_t bad : {std::uint64_t{1} << 40, text.size() + 1}) {
    EXPECT_NE(resume_with_offset(l, "lines", bad).find("is outside shard segment"), std::string::npos);
    EXPECT_NE(resume_with_offset(b, "line_blocks", bad).find("is outside shard segment"), std::string::npos);
  }
  // The check is no stricter than it must be: the run is in the first shard, and any offset from its
  // start to the file's end is one a cursor can hold.
  EXPECT_EQ(resume_with_offset(l, "lines", text.size()), "resumed");
  EXPECT_EQ(resume_with_offset(b, "line_blocks", 0), "resumed");
}

TEST(LineBlocks, OptionsAndBlocksAreChecked) {
  TempDir d;
  write_bytes(d.file("a.txt"), "a\n");
  EXPECT_THROW(line_blocks({d.file("a.txt")}, {.block_bytes = 0}), ConfigError);
  EXPECT_THROW(line_blocks({d.file("a.txt")}, {.block_bytes = (std::int64_t{1} << 30) + 1}), ConfigError);
  EXPECT_THROW(line_blocks({d.file("a.txt")}, {.logical_shards = 0}), ConfigError);
  EXPECT_THROW(line_blocks({d.file("missing.txt")}), DataError);
  EXPECT_THROW(line_blocks({}), ConfigError);

  const TextBlock b({"one", "", "three\r"});
  EXPECT_EQ(b.text(), "one\n\nthree\r\n");
  EXPECT_EQ(b.to_strings(), (std::vector<std::string>{"one", "", "three"}));
  EXPECT_EQ(decode_from_string<TextBlock>(encode_to_string(b)), b);
  EXPECT_THROW(TextBlock({"a\nb"}), ConfigError);
  // Decoding refuses line ends that do not describe the text: out of order, past the end, not at a
  // newline, bytes after the last line.
  const auto encoded = [](std::string text, std::vector<std::uint64_t> ends) {
    ByteWriter w;
    w.str(text);
    Codec<std::vector<std::uint64_t>>::encode(w, ends);
    return w.take();
  };
  EXPECT_EQ(decode_from_string<TextBlock>(encoded("a\nb", {1, 3})).to_strings(), (std::vector<std::string>{"a", "b"}));
  for (const auto& [text, ends] : std::vector<std::pair<std::string, std::vector<std::uint64_t>>>{
           {"a\nb\n", {3, 1}}, {"a\n", {9}}, {"ab\n", {1}}, {"a\nb\n", {1}}, {"a", {1, 1}}, {"x", {}},
           {"a\n", {2}}, {"a\nb\n", {3}}}) {  // the last two: a line that holds a newline
    try {
      decode_from_string<TextBlock>(encoded(text, ends));
      ADD_FAILURE() << "decoded a bad block of " << ends.size() << " ends";
    } catch (const SnapshotError& e) {
      EXPECT_NE(std::string(e.what()).find("text block is inconsistent"), std::string::npos) << e.what();
    }
  }
}

/// Runs `p` on the consumer's thread (nothing is read ahead), calls `shrink` once `before` elements
/// have come, reads on and returns the DataError's message ("" if the run ended without one).
/// `delivered` gets every element that came, before the shrink and after it.
template <class T>
std::string error_after_shrinking(const Pipeline<T>& p, std::size_t before, const std::function<void()>& shrink,
                                  std::vector<T>& delivered) {
  RunOptions o = testing::options();
  o.inline_workers = true;
  Engine e;
  auto run = e.start(p, o);
  try {
    for (std::size_t i = 0; i < before; ++i) {
      auto x = run.next();
      if (!x) return "the run ended before the file shrank";
      delivered.push_back(std::move(*x));
    }
    shrink();
    while (auto x = run.next()) delivered.push_back(std::move(*x));
  } catch (const DataError& err) {
    return err.what();
  }
  return "";
}

template <class T>
bool is_prefix(const std::vector<T>& part, const std::vector<T>& whole) {
  return part.size() <= whole.size() && std::equal(part.begin(), part.end(), whole.begin());
}

std::uintmax_t page_size() { return static_cast<std::uintmax_t>(::sysconf(_SC_PAGESIZE)); }

/// Every window of a counting token file is a run of consecutive tokens: none was read from zeros.
void expect_consecutive_tokens(const std::vector<std::vector<I64>>& windows) {
  for (const auto& w : windows)
    for (std::size_t j = 1; j < w.size(); ++j) ASSERT_EQ(w[j], (w[0] + static_cast<I64>(j)) & 0xffff);
}

// Another process may truncate a data file while it is mapped. Reading a page that is gone is then a
// DataError naming the file, not SIGBUS, and nothing read from the lost pages is handed out.
TEST(FileSources, AFileTruncatedWhileMappedIsADataErrorNotACrash) {
  TempDir d;
  const auto shrink = [](const std::string& f, std::uintmax_t to) { return [f, to] { fs::resize_file(f, to); }; };

  // token_windows maps its files when the pipeline is built. The cut is at a page boundary: a cut
  // inside a page reads as zeros up to the page's end, without a fault (see README).
  const std::string tokens = counting_tokens(256u << 10);  // 512 KiB: 255 windows
  const auto in_order = [&] { return token_windows({d.file("t.bin")}, {.seq_len = 1023}); };
  for (bool sampled : {false, true}) {
    SCOPED_TRACE(sampled ? "through a sampler" : "in order");
    write_bytes(d.file("t.bin"), tokens);
    const auto p = sampled ? in_order() | sampler() : in_order();
    std::vector<std::vector<I64>> windows;
    const std::string msg = error_after_shrinking(p, 3, shrink(d.file("t.bin"), 2 * page_size()), windows);
    EXPECT_NE(msg.find("t.bin' shrank while it was read"), std::string::npos) << msg;
    EXPECT_NE(msg.find("it was 524288 bytes when mapped, and is " + std::to_string(2 * page_size()) + " now"),
              std::string::npos)
        << msg;
    EXPECT_LT(windows.size(), 255u);
    expect_consecutive_tokens(windows);
  }

  // lines maps a file when it reaches it; this cut is inside a page, and the line that crosses it runs
  // into the lost page after it.
  std::vector<std::string> text;
  std::string bytes;
  for (int l = 0; bytes.size() < (3u << 20); ++l) {
    text.push_back("line " + std::to_string(l) + std::string(static_cast<std::size_t>(l % 90), 'x'));
    bytes += text.back() + "\n";
  }
  write_bytes(d.file("l.txt"), bytes);
  std::vector<std::string> got_lines;
  const std::string msg = error_after_shrinking(lines({d.file("l.txt")}, {.logical_shards = 1}), 10,
                                                shrink(d.file("l.txt"), 2 * page_size() + 100), got_lines);
  EXPECT_NE(msg.find("l.txt' shrank while it was read"), std::string::npos) << msg;
  EXPECT_GE(got_lines.size(), 10u);
  EXPECT_LT(got_lines.size(), text.size());
  EXPECT_TRUE(is_prefix(got_lines, text));

  // line_blocks: the same cut, blocks of whole lines.
  write_bytes(d.file("l.txt"), bytes);
  std::vector<TextBlock> got_blocks;
  const std::string bmsg =
      error_after_shrinking(line_blocks({d.file("l.txt")}, {.logical_shards = 1, .block_bytes = 1000}), 3,
                            shrink(d.file("l.txt"), 2 * page_size() + 100), got_blocks);
  EXPECT_NE(bmsg.find("l.txt' shrank while it was read"), std::string::npos) << bmsg;
  EXPECT_GE(got_blocks.size(), 3u);
  EXPECT_LT(unpack(got_blocks).size(), text.size());
  EXPECT_TRUE(is_prefix(unpack(got_blocks), text));

  // records: a record cut inside a page fails its checksum on zeros, and the size check names the cause.
  std::vector<std::string> records_in(2000, std::string(1000, 'r'));
  for (std::size_t i = 0; i < records_in.size(); ++i) records_in[i].replace(0, 4, std::to_string(1000 + i));
  for (auto on_error : {OnDataError::fail, OnDataError::skip}) {
    write_records(d.file("r.tfrecord"), records_in);
    std::vector<std::string> got;
    const std::string m = error_after_shrinking(records({d.file("r.tfrecord")}, {.on_error = on_error}), 3,
                                                shrink(d.file("r.tfrecord"), 2 * page_size() + 100), got);
    EXPECT_NE(m.find("r.tfrecord' shrank while it was read"), std::string::npos) << m;
    EXPECT_GE(got.size(), 3u);
    EXPECT_LT(got.size(), records_in.size());
    EXPECT_TRUE(is_prefix(got, records_in));
  }
}

// Workers share token_windows' map. The first to fault puts zero pages over the rest of it; the other
// may then read zeros without a fault of its own, and must see the file's mark all the same.
TEST(FileSources, WorkersSharingAMapAllSeeItShrink) {
  TempDir d;
  write_bytes(d.file("t.bin"), counting_tokens(4u << 20));  // 8 MiB: 4096 windows
  const auto p = token_windows({d.file("t.bin")}, {.seq_len = 1023}) | sampler();
  Engine e;
  auto run = e.start(p, testing::options(2));  // two workers on engine threads; 64 windows queued each at most
  std::vector<std::vector<I64>> windows;
  std::string msg;
  try {
    for (int i = 0; i < 8; ++i) windows.push_back(*run.next());
    fs::resize_file(d.file("t.bin"), 2 * page_size());
    while (auto x = run.next()) windows.push_back(std::move(*x));
  } catch (const DataError& err) {
    msg = err.what();
  }
  EXPECT_NE(msg.find("t.bin' shrank while it was read"), std::string::npos) << msg;
  EXPECT_LT(windows.size(), 4096u);
  expect_consecutive_tokens(windows);
}

// The handler behind that takes only faults in guarded reads of mapped data files; any other SIGBUS
// goes where it went before dpipe's first map: the default action (the process ends), or a handler the
// program had installed. Each runs in a fresh process ("threadsafe" death tests re-run the binary).

/// Maps `path` (3 pages of it), cuts the file to 10 bytes and reads its third page outside any guard.
void fault_outside_a_guard(const std::string& path) {
  const detail::MappedFile m(path);  // the process's first map: installs dpipe's handler
  fs::resize_file(path, 10);
  // The death test's child made this directory and dies without removing it: the map outlives both.
  fs::remove_all(fs::path(path).parent_path());
  const volatile char c = m.data()[2 * page_size()];
  (void)c;
}

TEST(FileSourcesDeathTest, AnUnguardedFaultStillEndsTheProcess) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  TempDir d;
  write_bytes(d.file("x.bin"), std::string(3 * page_size(), 'x'));
  EXPECT_DEATH(fault_outside_a_guard(d.file("x.bin")), "");
}

void exit_with_code_3(int) { std::_Exit(3); }

TEST(FileSourcesDeathTest, AnUnguardedFaultGoesToTheProgramsOwnHandler) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  TempDir d;
  write_bytes(d.file("x.bin"), std::string(3 * page_size(), 'x'));
  EXPECT_EXIT(
      {
        std::signal(SIGBUS, exit_with_code_3);
        fault_outside_a_guard(d.file("x.bin"));
      },
      ::testing::ExitedWithCode(3), "");
}

/// The rescale property of a line source: `Element` std::string for lines, TextBlock for line_blocks.
template <class Element>
void every_line_once_per_epoch_across_random_layout_sequences(int trials) {
  testing::property_trials(trials, [&](std::mt19937_64& g) {
    auto pick = [&](int n) { return testing::draw(g, n); };
    TempDir d;
    std::vector<std::string> files;
    int total = 0;
    for (int f = 0, nf = 1 + pick(5); f < nf; ++f) {
      std::string text;
      for (int l = 0, nl = pick(300); l < nl; ++l, ++total)
        text += "f" + std::to_string(f) + "-l" + std::to_string(l) + std::string(static_cast<std::size_t>(pick(40)), '.') + "\n";
      files.push_back(d.file("part" + std::to_string(f) + ".txt"));
      write_bytes(files.back(), text);
    }
    const int epochs = 1 + pick(2);
    Pipeline<Element> p = [&] {
      if constexpr (std::is_same_v<Element, TextBlock>)
        return line_blocks(files, {.logical_shards = 1 + pick(60), .epochs = epochs, .block_bytes = 1 + pick(200)});
      else
        return lines(files, {.logical_shards = 1 + pick(60), .epochs = epochs});
    }();
    if (pick(2)) p = p | shuffle({.buffer = 1 + pick(50)});
    // Before a dispatch, lines runs once per rank and deals its shards to the ranks.
    const bool dispatched = pick(3) == 0;
    if (dispatched) p = p | dispatch();
    auto b = p | batch({.size = 1 + pick(8)});
    std::vector<std::string> got;
    std::optional<SnapshotSet> set;
    std::string layouts = dispatched ? "(dispatch) " : "";
    for (int stage = 0, stages = 1 + pick(4); stage <= stages; ++stage) {
      const bool last = stage == stages;
      const int world = 1 + pick(6), workers = 1 + pick(4);
      layouts += std::to_string(world) + "x" + std::to_string(workers) + " ";
      Engine e;
      std::vector<Snapshot> next;
      for (int r = 0; r < world; ++r) {
        const RunOptions o{.seed = 5, .layout = Layout{r, world, workers}};
        auto run = set ? e.resume(b, *set, o, {.rescale = true}) : e.start(b, o);
        const int take = last ? 1 << 30 : pick(total / 4 + 2);
        for (int i = 0; i < take; ++i) {
          auto x = run.next();
          if (!x) break;
          if constexpr (std::is_same_v<Element, TextBlock>) {
            const auto unpacked = unpack(*x);
            got.insert(got.end(), unpacked.begin(), unpacked.end());
          } else {
            got.insert(got.end(), x->begin(), x->end());
          }
        }
        if (!last) next.push_back(run.snapshot());
      }
      if (!last) set = SnapshotSet(std::move(next));
    }
    std::map<std::string, int> count;
    for (const auto& s : got) ++count[s];
    ASSERT_EQ(static_cast<int>(count.size()), total) << "layouts " << layouts;
    for (const auto& [line, k] : count) ASSERT_EQ(k, epochs) << line << ", layouts " << layouts;
  });
}

TEST(LinesRescaleProperty, EveryLineOncePerEpochAcrossRandomLayoutSequences) {
  every_line_once_per_epoch_across_random_layout_sequences<std::string>(25);
}

// Blocks in shuffle buffers and partial batches are dealt whole; the shards' cursors regroup as lines'.
TEST(LineBlocksRescaleProperty, EveryLineOncePerEpochAcrossRandomLayoutSequences) {
  every_line_once_per_epoch_across_random_layout_sequences<TextBlock>(25);
}

}  // namespace
}  // namespace dpipe
