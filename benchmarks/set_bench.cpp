// What one rank pays to restore from a snapshot set, as the world size grows (run by hand):
//
//   build/benchmarks/set_bench [--worlds 128,1024,8192] [--dir DIR] [--keep]
//
// For each world size W it writes a real set in-process (every rank runs range | sampler | shuffle(1000) |
// batch(16) | prefetch(4) on 4 workers, takes 20 batches, and writes its reproducible snapshot with
// SnapshotSet::write_rank; the write that completes the set is timed apart, and so is the set's index,
// which the first rescale writes: SnapshotSet::write_index), then measures, each in a fresh process so its
// peak memory is its own:
//   - rank 0 resuming on the set's own layout (Engine::resume from a SnapshotDir), with the set's
//     manifest and again without it (the directory listed);
//   - rank 0 of 3W/4 ranks resuming with a rescale, through the set's index and again without it and its
//     manifest (the directory listed, every rank's state index read);
//   - the offline rescale of the whole set to 3W/4 ranks (SnapshotSet::rescale_dir, `dpipe snapshot
//     rescale`), fsyncs included;
//   - rank 0 of 9W/16 ranks resuming from that rescaled set (its states no longer alike: buffers dealt
//     unevenly, positions re-sliced), through its index.
// A resume is measured five times, each in a fresh process, and the run of median time is shown.
// Per measurement: the time from nothing to a restored Run, the bytes the process read (rchar of
// /proc/self/io: every read and pread, the snapshot files included; directory listings are not counted)
// and the peak resident set (ru_maxrss), beside the process's resident set before it began.
#include <sys/resource.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "dpipe/detail/process_io.hpp"
#include "dpipe/dpipe.hpp"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr int kWorkers = 4;
constexpr int kTaken = 20;

auto pipeline(int world) {
  // Enough elements that every one of the W × 4 instances fills its shuffle buffer and more.
  const std::int64_t n = std::int64_t(world) * kWorkers * 2000;
  return dpipe::range(0, n) | dpipe::sampler() | dpipe::shuffle({.buffer = 1000}) | dpipe::batch({.size = 16}) |
         dpipe::prefetch({.depth = 4});
}

dpipe::RunOptions options(int rank, int world) {
  return dpipe::RunOptions{.seed = 7, .layout = dpipe::Layout{rank, world, kWorkers}};
}

long rss_kib() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  return 0;
}

/// In a fresh process: rank `rank` of `world` restores from `dir`, a set of the pipeline sized for
/// `sized_for` ranks (the world it was first written on); prints "ms bytes peak_kib base_kib".
int measure(const std::string& dir, int rank, int world, int sized_for) {
  const long base = rss_kib();
  const std::uint64_t read0 = dpipe::detail::bytes_read_by_process();
  const auto t0 = Clock::now();
  dpipe::Engine engine(dpipe::EngineOptions{.threads = 1});
  auto run = engine.resume(pipeline(sized_for), dpipe::SnapshotDir{dir}, options(rank, world), {.rescale = true});
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  const std::uint64_t read = dpipe::detail::bytes_read_by_process() - read0;
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  std::cout << ms << " " << read << " " << u.ru_maxrss << " " << base << "\n";
  return run.next() ? 0 : 1;  // it continues
}

/// In a fresh process: the set in `dir` rescaled offline to `world` ranks into `out`; prints
/// "seconds bytes peak_kib base_kib".
int measure_offline(const std::string& dir, const std::string& out, int world) {
  const long base = rss_kib();
  const std::uint64_t read0 = dpipe::detail::bytes_read_by_process();
  const auto t0 = Clock::now();
  dpipe::SnapshotSet::rescale_dir(dir, out, world, kWorkers);
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  const std::uint64_t read = dpipe::detail::bytes_read_by_process() - read0;
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  std::cout << s << " " << read << " " << u.ru_maxrss << " " << base << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> worlds{128, 1024, 8192};
  std::string root = (fs::temp_directory_path() / "dpipe-set-bench").string();
  bool keep = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--measure" && i + 4 < argc)
      return measure(argv[i + 1], std::atoi(argv[i + 2]), std::atoi(argv[i + 3]), std::atoi(argv[i + 4]));
    if (a == "--measure-offline" && i + 3 < argc) return measure_offline(argv[i + 1], argv[i + 2], std::atoi(argv[i + 3]));
    if (a == "--worlds" && i + 1 < argc) {
      worlds.clear();
      std::stringstream ss(argv[++i]);
      for (std::string w; std::getline(ss, w, ',');) worlds.push_back(std::stoi(w));
    } else if (a == "--dir" && i + 1 < argc) {
      root = argv[++i];
    } else if (a == "--keep") {
      keep = true;
    } else {
      std::cerr << "usage: set_bench [--worlds 128,1024,8192] [--dir DIR] [--keep]\n";
      return 2;
    }
  }
  std::printf("%7s %9s %8s %15s %13s %14s %8s | %-38s | %-9s | %-38s | %-11s | %-29s | %s\n", "world", "set MB", "write s",
              "median write ms", "last write ms", "index write ms", "index MB", "same layout, rank 0: ms, MB read, peak MB", "listed ms",
              "rescale to 3/4, rank 0: ms, MB read, peak MB", "no index ms", "offline rescale to 3/4: s, MB read, peak MB",
              "that set to 3/4 again, rank 0: ms, MB read, peak MB");
  for (const int world : worlds) {
    const std::string dir = root + "/w" + std::to_string(world);
    fs::remove_all(dir);
    const auto t0 = Clock::now();
    std::vector<double> write_ms;  // per rank; the last write completes the set (its manifest too)
    {
      dpipe::Engine engine(dpipe::EngineOptions{.threads = 2});
      const auto p = pipeline(world);
      for (int r = 0; r < world; ++r) {
        auto run = engine.start(p, options(r, world));
        for (int i = 0; i < kTaken; ++i) run.next();
        const dpipe::Snapshot snapshot = run.reproducible_snapshot({}, 100);
        const auto w0 = Clock::now();
        dpipe::SnapshotSet::write_rank(dir, snapshot);
        write_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - w0).count());
      }
    }
    const double write_s = std::chrono::duration<double>(Clock::now() - t0).count();
    const double last_write_ms = write_ms.back();
    std::nth_element(write_ms.begin(), write_ms.begin() + world / 2, write_ms.end());
    const double median_write_ms = write_ms[static_cast<std::size_t>(world / 2)];
    const auto i0 = Clock::now();
    if (!dpipe::SnapshotSet::write_index(dir)) std::cerr << "no index written for " << dir << "\n";
    const double index_ms = std::chrono::duration<double, std::milli>(Clock::now() - i0).count();
    const double index_mb = double(fs::file_size(fs::path(dir) / "set.dpipe-index")) / 1e6;
    std::uintmax_t bytes = 0;
    for (const auto& e : fs::directory_iterator(dir)) bytes += e.file_size();
    // The run of median time of five, each in a fresh process (the time varies run to run).
    auto child = [&](int rank, int new_world, const std::string& from = "") {
      const std::string cmd = std::string(argv[0]) + " --measure " + (from.empty() ? dir : from) + " " +
                              std::to_string(rank) + " " + std::to_string(new_world) + " " + std::to_string(world);
      std::vector<std::array<double, 4>> runs;
      for (int k = 0; k < 5; ++k) {
        FILE* f = ::popen(cmd.c_str(), "r");
        std::array<double, 4> m{};
        if (!f || std::fscanf(f, "%lf %lf %lf %lf", &m[0], &m[1], &m[2], &m[3]) != 4) std::cerr << "measure failed: " << cmd << "\n";
        if (f) ::pclose(f);
        runs.push_back(m);
      }
      std::sort(runs.begin(), runs.end());
      const auto& [ms, read, peak, base] = runs[runs.size() / 2];
      char out[64];
      std::snprintf(out, sizeof out, "%9.1f %10.2f %8.1f (base %.1f)", ms, read / 1e6, peak / 1024, base / 1024);
      return std::string(out);
    };
    const std::string same = child(0, world);
    // The same resume without the manifest: the directory is listed (a set written before manifests).
    const fs::path manifest = fs::path(dir) / "set.dpipe-manifest", aside = fs::path(dir + ".manifest");
    fs::rename(manifest, aside);
    const std::string listed = child(0, world).substr(0, 9);
    fs::rename(aside, manifest);
    const std::string rescaled = child(0, world * 3 / 4);
    // The same rescale without the index and the manifest (else it would write the index again): the
    // directory is listed and every rank's state index read.
    const fs::path index = fs::path(dir) / "set.dpipe-index", index_aside = fs::path(dir + ".index");
    fs::rename(index, index_aside);
    fs::rename(manifest, aside);
    const std::string no_index = child(0, world * 3 / 4).substr(0, 9);
    fs::rename(index_aside, index);
    fs::rename(aside, manifest);
    const std::string out = dir + "-rescaled";
    fs::remove_all(out);
    std::string offline;
    {
      const std::string cmd = std::string(argv[0]) + " --measure-offline " + dir + " " + out + " " + std::to_string(world * 3 / 4);
      FILE* f = ::popen(cmd.c_str(), "r");
      double s = 0, read = 0, peak = 0, base = 0;
      if (!f || std::fscanf(f, "%lf %lf %lf %lf", &s, &read, &peak, &base) != 4) std::cerr << "measure failed: " << cmd << "\n";
      if (f) ::pclose(f);
      char text[64];
      std::snprintf(text, sizeof text, "%6.2f %8.1f %8.1f", s, read / 1e6, peak / 1024);
      offline = text;
    }
    // The rescaled set (its states uneven now: buffers dealt, offsets re-sliced) rescaled again to 3/4.
    const int again_from = world * 3 / 4;
    const std::string again = child(0, again_from * 3 / 4, out);
    std::printf("%7d %9.1f %8.1f %15.2f %13.2f %14.1f %8.2f | %-38s | %-9s | %-38s | %-11s | %-29s | %s\n", world, bytes / 1e6,
                write_s, median_write_ms, last_write_ms, index_ms, index_mb, same.c_str(), listed.c_str(), rescaled.c_str(), no_index.c_str(), offline.c_str(),
                again.c_str());
    std::fflush(stdout);
    if (!keep) {
      fs::remove_all(dir);
      fs::remove_all(out);
    }
  }
  return 0;
}
