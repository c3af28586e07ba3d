#pragma once
// Helpers shared by the test suites.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "dpipe/dpipe.hpp"

namespace dpipe::testing {

/// Runs `trial(g)` `trials` times, each with a generator seeded from this machine's entropy plus the
/// trial number. A failure names its seed (rerun with it to reproduce); the first fatal one ends the test.
template <class Trial>
void property_trials(int trials, Trial trial) {
  const std::uint64_t base = std::random_device{}();
  for (int t = 0; t < trials; ++t) {
    const std::uint64_t seed = base + static_cast<std::uint64_t>(t);
    SCOPED_TRACE("property seed " + std::to_string(seed) + " (rerun with this seed to reproduce)");
    std::mt19937_64 g(seed);
    trial(g);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

/// Expects `f()` to throw an E whose message contains `part`.
template <class E, class F>
void expect_throw_with(F&& f, const std::string& part) {
  try {
    f();
    ADD_FAILURE() << "expected an exception containing '" << part << "', nothing was thrown";
  } catch (const E& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

/// An integer in [0, n) drawn from `g`.
inline int draw(std::mt19937_64& g, int n) { return static_cast<int>(g() % static_cast<std::uint64_t>(n)); }

inline RunOptions options(int workers = 1, std::uint64_t seed = 7, int rank = 0, int world = 1) {
  return RunOptions{.seed = seed, .epoch = 0, .layout = Layout{rank, world, workers}};
}

template <class T>
std::vector<T> drain(Run<T>& run, std::optional<std::size_t> limit = std::nullopt) {
  std::vector<T> out;
  while (!limit || out.size() < *limit) {
    auto x = run.next();
    if (!x) break;
    out.push_back(std::move(*x));
  }
  return out;
}

template <class T>
std::vector<T> collect(const Pipeline<T>& p, const RunOptions& o) {
  Engine e;
  auto run = e.start(p, o);
  return drain(run);
}

/// Runs `p` to `at` elements, snapshots through bytes, resumes in a fresh Run; returns prefix + rest.
template <class T>
std::vector<T> stop_and_resume(const Pipeline<T>& p, const RunOptions& o, std::size_t at) {
  Engine e;
  auto run = e.start(p, o);
  auto out = drain(run, at);
  const std::string bytes = run.snapshot({{"step", std::to_string(at)}}).to_bytes();
  auto resumed = e.resume(p, Snapshot::from_bytes(bytes), o);
  auto rest = drain(resumed);
  out.insert(out.end(), rest.begin(), rest.end());
  return out;
}

// ---- data files ---------------------------------------------------------------------------------

/// A fresh directory under the system's temporary directory, removed with everything in it.
class TempDir {
 public:
  TempDir()
      : path_(std::filesystem::temp_directory_path() /
              ("dpipe-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter_++))) {
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  const std::filesystem::path& path() const { return path_; }

 private:
  static inline int counter_ = 0;
  std::filesystem::path path_;
};

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

/// `v` as `bytes` little-endian bytes.
inline std::string le(std::uint64_t v, int bytes) {
  std::string s;
  for (int i = 0; i < bytes; ++i) s += static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}

/// A uint16 token file of `count` tokens first, first + 1, … (mod 2^16).
inline std::string counting_tokens(std::uint32_t count, std::uint32_t first = 0) {
  std::string tokens;
  for (std::uint32_t t = first; t < first + count; ++t) tokens += le(t & 0xffff, 2);
  return tokens;
}

/// About `bytes` of text with lines of 1-300 bytes, every 97th empty, every 5th ending in "\r\n"; line
/// `long_line`, if any, 200 KB long. Lines are numbered from `first` (files made with different `first`
/// hold different lines). `expected` gets the lines as a line source gives them.
inline std::string varied_text(std::size_t bytes, std::vector<std::string>& expected, int long_line = -1,
                               int first = 0) {
  std::string text;
  for (int l = first; text.size() < bytes; ++l) {
    std::string line =
        std::to_string(l) + std::string(static_cast<std::size_t>(l * 7919 % 300), static_cast<char>('a' + l % 26));
    if (l % 97 == 0) line.clear();
    if (l == long_line) line = std::string(200'000, 'L');
    expected.push_back(line);
    text += line + (l % 5 == 0 ? "\r\n" : "\n");
  }
  return text;
}

}  // namespace dpipe::testing
