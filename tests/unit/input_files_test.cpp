// What dpipe reads: only regular files (data, snapshots, rank files of a set), never blocking on a
// FIFO, never reading a device; snapshot-set directories whose file names claim huge or disagreeing
// world sizes.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include "dpipe/dpipe.hpp"
#include "../test_util.hpp"

namespace dpipe {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;
using testing::write_bytes;

/// Ends the test process if a call blocks (a FIFO open that waits for a writer) instead of hanging.
struct HangGuard {
  HangGuard() { ::alarm(60); }
  ~HangGuard() { ::alarm(0); }
};

/// Runs `f`, expects a FileError whose message holds `path` and `what`, and that it came at once.
void expect_refused(const std::function<void()>& f, const std::string& path, const std::string& what) {
  const HangGuard guard;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    f();
    ADD_FAILURE() << "'" << path << "' was read";
  } catch (const FileError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("'" + path + "'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("it is " + what), std::string::npos) << msg;
    EXPECT_NE(msg.find("dpipe reads only regular files"), std::string::npos) << msg;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
}

std::string make_fifo(const TempDir& d, const std::string& name) {
  const std::string path = d.file(name);
  EXPECT_EQ(::mkfifo(path.c_str(), 0600), 0);
  return path;
}

TEST(RegularFiles, EveryDataSourceRefusesAFifoWithNoWriterAtOnce) {
  TempDir d;
  const std::string fifo = make_fifo(d, "data.fifo");
  expect_refused([&] { records({fifo}); }, fifo, "a FIFO");
  expect_refused([&] { records({fifo}, {.on_error = OnDataError::skip}); }, fifo, "a FIFO");
  expect_refused([&] { lines({fifo}); }, fifo, "a FIFO");
  expect_refused([&] { line_blocks({fifo}); }, fifo, "a FIFO");
  expect_refused([&] { token_windows({fifo}, {.seq_len = 4}); }, fifo, "a FIFO");
}

TEST(RegularFiles, DirectoriesAndDevicesAreRefusedAsData) {
  TempDir d;
  expect_refused([&] { records({d.path().string()}); }, d.path().string(), "a directory");
  expect_refused([&] { lines({"/dev/zero"}); }, "/dev/zero", "a character device");
  expect_refused([&] { token_windows({"/dev/null"}, {.seq_len = 4}); }, "/dev/null", "a character device");
}

TEST(RegularFiles, SnapshotsMustBeRegularFiles) {
  TempDir d;
  const std::string fifo = make_fifo(d, "snap.fifo");
  expect_refused([&] { Snapshot::read_file(fifo); }, fifo, "a FIFO");
  // /dev/zero would read until memory runs out: it is never read.
  expect_refused([&] { Snapshot::read_file("/dev/zero"); }, "/dev/zero", "a character device");
  expect_refused([&] { Snapshot::read_file(d.path().string()); }, d.path().string(), "a directory");
  // A missing snapshot stays a SnapshotError; an empty one is refused as a snapshot, not a file.
  EXPECT_THROW(Snapshot::read_file(d.file("absent.dpipe")), SnapshotError);
  write_bytes(d.file("empty.dpipe"), "");
  EXPECT_THROW(Snapshot::read_file(d.file("empty.dpipe")), SnapshotError);
}

TEST(RegularFiles, ASetsRankFileThatIsAFifoIsRefused) {
  TempDir d;
  const std::string fifo = make_fifo(d, SnapshotSet::file_name(0, 1));
  expect_refused([&] { SnapshotSet::read_dir(d.path().string()); }, fifo, "a FIFO");
}

TEST(RegularFiles, ReadAllStopsAtTheSizeWhenOpened) {
  TempDir d;
  write_bytes(d.file("f"), "0123456789");
  const RegularFile f(d.file("f"), FileRole::data);
  EXPECT_EQ(f.size(), 10u);
  {
    std::ofstream grow(d.file("f"), std::ios::app);
    grow << "more bytes appended after the open";
  }
  EXPECT_EQ(f.read_all(), "0123456789");
  EXPECT_THROW(RegularFile(d.file("absent"), FileRole::data), DataError);
  EXPECT_THROW(RegularFile(d.file("absent"), FileRole::spec), ConfigError);
}

TEST(SnapshotSetDirectories, AHugeClaimedWorldSizeIsReportedFromTheFilesPresent) {
  TempDir d;
  write_bytes(d.file("rank-0-of-2147483647.dpipe"), "");  // zero bytes, named like rank 0 of 2^31 - 1
  const auto t0 = std::chrono::steady_clock::now();
  try {
    SnapshotSet::read_dir(d.path().string());
    FAIL() << "an incomplete set was read";
  } catch (const SnapshotError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("ranks present: 1 of 2147483647; first missing: 1, 2, 3, 4, 5, …"), std::string::npos) << msg;
    EXPECT_LT(msg.size(), 400u) << msg;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
}

TEST(SnapshotSetDirectories, MissingRanksAreNamedWhenFew) {
  TempDir d;
  for (int r : {0, 2}) write_bytes(d.file(SnapshotSet::file_name(r, 4)), "");
  try {
    SnapshotSet::read_dir(d.path().string());
    FAIL() << "an incomplete set was read";
  } catch (const SnapshotError& e) {
    EXPECT_NE(std::string(e.what()).find("ranks present: 2 of 4; first missing: 1, 3"), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find("…"), std::string::npos) << e.what();
  }
}

TEST(SnapshotSetDirectories, WorldSizesThatDisagreeBetweenFilesAreRefusedByName) {
  TempDir d;
  write_bytes(d.file(SnapshotSet::file_name(0, 2)), "");
  write_bytes(d.file(SnapshotSet::file_name(1, 2)), "");
  write_bytes(d.file(SnapshotSet::file_name(0, 2147483647)), "");
  try {
    SnapshotSet::read_dir(d.path().string());
    FAIL() << "a set of two world sizes was read";
  } catch (const SnapshotError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("2 different world sizes"), std::string::npos) << msg;
    EXPECT_NE(msg.find("rank-0-of-2.dpipe"), std::string::npos) << msg;
    EXPECT_NE(msg.find("rank-0-of-2147483647.dpipe"), std::string::npos) << msg;
  }
}

TEST(SnapshotSetDirectories, ARankFileWhoseContentClaimsAnotherWorldIsRefused) {
  TempDir d;
  Engine e;
  auto run = e.start(range(0, 10), testing::options(1, 7, 0, 2));
  run.next();
  // Rank 0 of 2's snapshot, filed as rank 0 of 1.
  run.snapshot().write_file(d.file(SnapshotSet::file_name(0, 1)));
  try {
    SnapshotSet::read_dir(d.path().string());
    FAIL() << "a misfiled rank was read";
  } catch (const SnapshotError& e) {
    EXPECT_NE(std::string(e.what()).find("says it is rank 0 of 2, expected rank 0 of 1"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dpipe
