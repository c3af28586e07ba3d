// The one atomic-write routine: what it replaces, what it refuses, what it cleans up.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "dpipe/atomic_file.hpp"
#include "dpipe/error.hpp"

namespace dpipe {
namespace {

namespace fs = std::filesystem;

class TempDir {
 public:
  TempDir() : path_(fs::temp_directory_path() / ("dpipe-atomic-" + std::to_string(::getpid()) + "-" + std::to_string(counter_++))) {
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  const fs::path& path() const { return path_; }
  /// Names in the directory, temporaries included.
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(path_)) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }

 private:
  static inline int counter_ = 0;
  fs::path path_;
};

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void put(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

/// The message of the FileError `f` throws, or "" when it throws none.
template <class F>
std::string file_error(F f) {
  try {
    f();
  } catch (const FileError& e) {
    return e.what();
  }
  return "";
}

/// A process id that no process has: a child that has exited and been reaped.
pid_t dead_pid() {
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ::waitpid(child, nullptr, 0);
  return child;
}

TEST(AtomicFile, ReplacesTheContentAndLeavesNoTemporary) {
  TempDir d;
  const auto path = d.file("out.bin");
  write_file_atomically(path, "first");
  EXPECT_EQ(slurp(path), "first");
  write_file_atomically(path, std::string("second\0with a zero", 18));
  EXPECT_EQ(slurp(path), std::string("second\0with a zero", 18));
  EXPECT_EQ(d.names(), std::vector<std::string>{"out.bin"});
}

TEST(AtomicFile, StreamsManyWritesLargerThanItsBuffer) {
  TempDir d;
  const auto path = d.file("big.jsonl");
  std::string expected;
  AtomicFileWriter w(path);
  for (int i = 0; i < 20000; ++i) {
    const std::string line = std::to_string(i) + "\n";
    w.write(line);
    expected += line;
  }
  w.write(std::string(200000, 'x'));
  expected += std::string(200000, 'x');
  EXPECT_FALSE(fs::exists(path)) << "nothing is in place before commit()";
  w.commit();
  EXPECT_EQ(slurp(path), expected);
  EXPECT_THROW(w.commit(), FileError);
}

TEST(AtomicFile, KeepsTheModeOfTheFileItReplaces) {
  TempDir d;
  const auto path = d.file("mode.txt");
  put(path, "old");
  ::chmod(path.c_str(), 0640);
  write_file_atomically(path, "new");
  struct stat st;
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0640u);
}

TEST(AtomicFile, ReplacesTheFileALinkNamesAndKeepsTheLink) {
  TempDir d;
  const auto target = d.file("target.txt"), link = d.file("link.txt"), chain = d.file("chain.txt");
  put(target, "old");
  fs::create_symlink("target.txt", link);  // relative, resolved beside the link
  fs::create_symlink(link, chain);
  write_file_atomically(chain, "new");
  EXPECT_TRUE(fs::is_symlink(link));
  EXPECT_TRUE(fs::is_symlink(chain));
  EXPECT_EQ(slurp(target), "new");
  // A link that names no file yet: the file is created where it points.
  const auto dangling = d.file("dangling.txt");
  fs::create_symlink(d.file("made-later.txt"), dangling);
  write_file_atomically(dangling, "made");
  EXPECT_TRUE(fs::is_symlink(dangling));
  EXPECT_EQ(slurp(d.file("made-later.txt")), "made");
}

TEST(AtomicFile, RefusesAFifoADirectoryAndADevice) {
  TempDir d;
  const auto fifo = d.file("fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto msg = file_error([&] { write_file_atomically(fifo, "x"); });
  EXPECT_NE(msg.find("'" + fifo + "'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("a FIFO"), std::string::npos) << msg;
  struct stat st;
  ASSERT_EQ(::lstat(fifo.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode)) << "the FIFO is still a FIFO";
  // A link to the FIFO is refused too.
  fs::create_symlink(fifo, d.file("to-fifo"));
  EXPECT_NE(file_error([&] { write_file_atomically(d.file("to-fifo"), "x"); }).find("a FIFO"), std::string::npos);

  fs::create_directory(d.file("dir"));
  msg = file_error([&] { write_file_atomically(d.file("dir"), "x"); });
  EXPECT_NE(msg.find("a directory"), std::string::npos) << msg;

  msg = file_error([&] { write_file_atomically("/dev/null", "x"); });
  EXPECT_NE(msg.find("a character device"), std::string::npos) << msg;
  ASSERT_EQ(::stat("/dev/null", &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode));
  EXPECT_EQ(d.names(), (std::vector<std::string>{"dir", "fifo", "to-fifo"})) << "no temporary is left";
}

TEST(AtomicFile, WritesACharacterDeviceInPlaceOnlyWhenAsked) {
  AtomicFileWriter w("/dev/null", {.special = SpecialFiles::write_in_place});
  EXPECT_TRUE(w.in_place());
  w.write("discarded");
  w.commit();
  struct stat st;
  ASSERT_EQ(::stat("/dev/null", &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode));
  AtomicFileWriter full("/dev/full", {.special = SpecialFiles::write_in_place});
  full.write("x");
  const auto msg = file_error([&] { full.commit(); });
  EXPECT_NE(msg.find("cannot write '/dev/full'"), std::string::npos) << msg;
}

TEST(AtomicFile, CleansTemporariesAKilledWriterLeft) {
  TempDir d;
  const auto path = d.file("snap.dpipe");
  put(path, "old");
  const std::string stale = d.file(".snap.dpipe.dpipe-tmp." + std::to_string(dead_pid()) + ".0123abcd");
  const std::string live = d.file(".snap.dpipe.dpipe-tmp." + std::to_string(::getppid()) + ".0123abcd");
  const std::string other = d.file(".other.dpipe.dpipe-tmp." + std::to_string(dead_pid()) + ".0123abcd");
  for (const auto& p : {stale, live, other}) put(p, "half-written");
  write_file_atomically(path, "new");
  EXPECT_EQ(slurp(path), "new");
  EXPECT_FALSE(fs::exists(stale)) << "a dead writer's temporary is removed";
  EXPECT_TRUE(fs::exists(live)) << "a live process's temporary is left alone";
  EXPECT_TRUE(fs::exists(other)) << "another path's temporaries are left alone";
}

TEST(AtomicFile, DestroyedWithoutCommitLeavesTheOldFile) {
  TempDir d;
  const auto path = d.file("keep.txt");
  put(path, "old");
  {
    AtomicFileWriter w(path);
    w.write(std::string(100000, 'n'));
    w.flush();
    EXPECT_EQ(d.names().size(), 2u) << "the temporary sits beside the file";
  }
  EXPECT_EQ(slurp(path), "old");
  EXPECT_EQ(d.names(), std::vector<std::string>{"keep.txt"});
}

TEST(AtomicFile, CommitBesideKeepsTheTargetAsItWas) {
  TempDir d;
  const auto path = d.file("out.jsonl");
  put(path, "good");
  AtomicFileWriter w(path);
  w.write("partial");
  EXPECT_EQ(w.commit_beside(".partial"), path + ".partial");
  EXPECT_EQ(slurp(path), "good");
  EXPECT_EQ(slurp(path + ".partial"), "partial");
}

TEST(AtomicFile, RefusesAFileItMayNotWriteAndAMissingDirectory) {
  TempDir d;
  auto msg = file_error([&] { write_file_atomically(d.file("missing/x.bin"), "x"); });
  EXPECT_NE(msg.find("missing"), std::string::npos) << msg;
  if (::geteuid() == 0) return;  // root may write anything
  const auto path = d.file("ro.txt");
  put(path, "protected");
  ::chmod(path.c_str(), 0444);
  msg = file_error([&] { write_file_atomically(path, "x"); });
  EXPECT_NE(msg.find("'" + path + "'"), std::string::npos) << msg;
  EXPECT_EQ(slurp(path), "protected");
}

}  // namespace
}  // namespace dpipe
