// Data-path benchmarks, each beside a baseline in the same binary:
//   build-release/benchmarks/data_bench
// - the sampler's per-index cost (a keyed Feistel permutation computed on the fly) against reading a
//   stored permutation (std::shuffle of a vector) in order;
// - token_windows, in order and through a global-shuffle sampler, against memcpy over the same bytes;
// - records (framing, CRC-32C, one string per record) and lines (three line lengths) against a plain
//   buffered read of the same files; for short lines, also two hand-written loops against the plain
//   read — one making the same strings (the ceiling of one owned string per line), one only finding the
//   lines — and lines against the first;
// - restoring a snapshot set against reading and checksumming its bytes.
// Each source and its baseline run alternately in one benchmark (paired.hpp), so their ratio is taken
// at the same moments of this noisy machine; the permutation and restore pairs are separate benchmarks
// (their ratios are far from their goals).
#include <benchmark/benchmark.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>

#include "dpipe/crc32c.hpp"
#include "dpipe/dpipe.hpp"
#include "paired.hpp"
#include "ratio_reporter.hpp"

namespace {

constexpr std::uint64_t kIndices = 1 << 22;
constexpr std::size_t kTokenBytes = 64 << 20;   // a 64 MiB token file
constexpr std::size_t kRecordBytes = 1024;      // 64 Ki records of 1 KiB
constexpr std::size_t kRecords = 64 << 10;

const std::string& scratch_dir() {
  static const std::string dir = [] {
    auto d = std::filesystem::temp_directory_path() / ("dpipe-data-bench-" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    return d.string();
  }();
  return dir;
}

const std::string& token_file() {
  static const std::string path = [] {
    const std::string p = scratch_dir() + "/tokens.bin";
    std::vector<std::uint16_t> t(kTokenBytes / 2);
    for (std::size_t i = 0; i < t.size(); ++i) t[i] = static_cast<std::uint16_t>(i * 2654435761u);
    std::ofstream(p, std::ios::binary).write(reinterpret_cast<const char*>(t.data()), kTokenBytes);
    return p;
  }();
  return path;
}

const std::string& records_file() {
  static const std::string path = [] {
    const std::string p = scratch_dir() + "/data.tfrecord";
    std::vector<std::string> r(kRecords, std::string(kRecordBytes, 'r'));
    for (std::size_t i = 0; i < r.size(); ++i) std::memcpy(r[i].data(), &i, sizeof i);
    dpipe::write_records(p, r);
    return p;
  }();
  return path;
}

// Single-threaded runs: the sources' own cost, without thread hand-offs.
const dpipe::RunOptions kInline{.seed = 1, .layout = dpipe::Layout{}, .inline_workers = true};

/// Runs `p` to its end once, touching each element's size.
template <class P>
void drain(dpipe::Engine& engine, const P& p) {
  auto run = engine.start(p, kInline);
  std::uint64_t sink = 0;
  while (auto x = run.next()) sink += x->size();
  benchmark::DoNotOptimize(sink);
}

std::int64_t total_bytes(const std::vector<std::string>& files) {
  std::int64_t bytes = 0;
  for (const auto& f : files) bytes += static_cast<std::int64_t>(std::filesystem::file_size(f));
  return bytes;
}

/// The baseline: `files` read once with 64 KiB freads, touching every cache line.
void read_plain(const std::vector<std::string>& files) {
  static std::vector<char> buf(64 << 10);
  std::uint64_t sink = 0;
  for (const auto& path : files) {
    std::FILE* f = std::fopen(path.c_str(), "rb");
    for (std::size_t n; (n = std::fread(buf.data(), 1, buf.size(), f)) > 0;)
      for (std::size_t i = 0; i < n; i += 64) sink += static_cast<unsigned char>(buf[i]);
    std::fclose(f);
  }
  benchmark::DoNotOptimize(sink);
}

/// A second baseline for text: the buffered line loop one writes by hand (std::getline over an
/// ifstream into one reused string), which splits lines but allocates nothing per line.
void read_getline(const std::vector<std::string>& files) {
  std::string line;
  std::uint64_t sink = 0;
  for (const auto& path : files) {
    std::ifstream in(path, std::ios::binary);
    while (std::getline(in, line)) sink += line.size();
  }
  benchmark::DoNotOptimize(sink);
}

/// Hand-written line loops over the plain read's 64 KiB freads, splitting lines with memchr: with
/// `kMakeStrings`, each line's std::string is made and dropped at once (the allocator's best case) —
/// the ceiling of any source whose element is one owned string per line; without, only each line's
/// length is summed — what the memchr search alone costs.
template <bool kMakeStrings>
void split_lines(const std::vector<std::string>& files) {
  static std::vector<char> buf(64 << 10);
  std::uint64_t sink = 0;
  auto take = [&](const char* p, std::size_t n) {
    n -= n > 0 && p[n - 1] == '\r' ? 1 : 0;
    if constexpr (kMakeStrings) {
      const std::string line(p, n);
      benchmark::DoNotOptimize(line.data());
      sink += line.size();
    } else {
      sink += n;
    }
  };
  for (const auto& path : files) {
    std::FILE* f = std::fopen(path.c_str(), "rb");
    std::size_t have = 0;  // bytes of an unfinished line kept at the front of buf
    for (std::size_t n; (n = std::fread(buf.data() + have, 1, buf.size() - have, f)) > 0;) {
      have += n;
      std::size_t at = 0;
      while (const void* nl = std::memchr(buf.data() + at, '\n', have - at)) {
        const std::size_t end = static_cast<std::size_t>(static_cast<const char*>(nl) - buf.data());
        take(buf.data() + at, end - at);
        at = end + 1;
      }
      std::memmove(buf.data(), buf.data() + at, have - at);
      have -= at;
    }
    if (have > 0) take(buf.data(), have);
    std::fclose(f);
  }
  benchmark::DoNotOptimize(sink);
}

void BM_SamplerPermutation(benchmark::State& state) {
  const dpipe::KeyedPermutation perm(kIndices, 0x1234);
  for (auto _ : state) {
    std::uint64_t sink = 0;
    for (std::uint64_t i = 0; i < kIndices; ++i) sink += perm(i);
    benchmark::DoNotOptimize(sink);
  }
  state.SetItemsProcessed(state.iterations() * kIndices);
}

void BM_StoredPermutation(benchmark::State& state) {
  std::vector<std::uint64_t> perm(kIndices);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937_64(0x1234));
  for (auto _ : state) {
    std::uint64_t sink = 0;
    for (std::uint64_t i = 0; i < kIndices; ++i) sink += perm[i];
    benchmark::DoNotOptimize(sink);
  }
  state.SetItemsProcessed(state.iterations() * kIndices);
}

/// Where the baselines copy windows to: a buffer at page offset 1 KiB. Windows start at page offsets
/// 0 and 2 KiB, and a copy whose destination sits at (about) its source's page offset runs at half speed
/// here (4K aliasing: 6.2 against 2.9 ms for the 64 MiB), so a buffer placed wherever the allocator
/// puts it would make the baseline, not the source, vary by 2x from one run to the next.
class CopyTarget {
 public:
  explicit CopyTarget(std::size_t bytes) : storage_(bytes + 8192) {}
  char* data() {
    const auto at = reinterpret_cast<std::uintptr_t>(storage_.data());
    return storage_.data() + ((4096 + 1024 - at % 4096) % 4096);
  }

 private:
  std::vector<char> storage_;
};

/// Copies window after window of the token file out with memcpy. With `runtime_size` the size is not
/// a compile-time constant, so the copy is the C library's memcpy, as in token_windows (whose window
/// length is an option); otherwise the compiler inlines it (rep movsq here: about 10 % faster alone).
struct WindowCopy {
  const dpipe::detail::MappedFile& file;
  std::size_t window = 1025 * 2, step = 1024 * 2;
  CopyTarget out{window};
  void runtime_size() {
    std::size_t size = window;
    benchmark::DoNotOptimize(size);
    char* const to = out.data();
    for (std::size_t at = 0; at + size <= file.size(); at += step) {
      std::memcpy(to, file.data() + at, size);
      benchmark::DoNotOptimize(to);
    }
  }
  void constant_size() {
    char* const to = out.data();
    for (std::size_t at = 0; at + 1025 * 2 <= file.size(); at += 1024 * 2) {
      std::memcpy(to, file.data() + at, 1025 * 2);
      benchmark::DoNotOptimize(to);
    }
  }
};

auto token_windows_1024() {
  return dpipe::token_windows<std::uint16_t>({token_file()}, {.dtype = dpipe::TokenType::uint16, .seq_len = 1024});
}

/// token_windows against the same bytes copied out of the mapped file window by window by `copy`.
void token_windows_against(benchmark::State& state, void (WindowCopy::*copy_all)()) {
  const auto p = token_windows_1024();
  const dpipe::detail::MappedFile file(token_file());
  WindowCopy copy{file};
  dpipe::Engine engine;
  dpipe::bench::paired(
      state, static_cast<std::int64_t>(kTokenBytes), [&] { drain(engine, p); }, [&] { (copy.*copy_all)(); });
}
void BM_TokenWindows(benchmark::State& state) { token_windows_against(state, &WindowCopy::runtime_size); }
void BM_TokenWindowsVsInlinedCopy(benchmark::State& state) {
  token_windows_against(state, &WindowCopy::constant_size);
}

// The same windows in a global random order (sampler: keyed permutation computed per index), against
// memcpy of the windows in a random order stored up front.
void BM_SampledTokenWindows(benchmark::State& state) {
  const auto p = token_windows_1024() | dpipe::sampler({.shuffle = dpipe::SamplerShuffle::global});
  const dpipe::detail::MappedFile file(token_file());
  std::size_t window = 1025 * 2, step = 1024 * 2, windows = (file.size() / 2 - 1) / 1024;
  benchmark::DoNotOptimize(window);  // a run-time size: the C library's memcpy, as in token_windows
  std::vector<std::uint64_t> order(windows);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937_64(7));
  CopyTarget out(window);
  char* const to = out.data();
  dpipe::Engine engine;
  dpipe::bench::paired(
      state, static_cast<std::int64_t>(kTokenBytes), [&] { drain(engine, p); },
      [&] {
        for (const std::uint64_t w : order) {
          std::memcpy(to, file.data() + w * step, window);
          benchmark::DoNotOptimize(to);
        }
      });
}

// records (framing, CRC-32C, one string per record) against a plain buffered read of the file.
void BM_Records(benchmark::State& state) {
  const auto p = dpipe::records({records_file()});
  dpipe::Engine engine;
  dpipe::bench::paired(
      state, static_cast<std::int64_t>(kRecords * kRecordBytes), [&] { drain(engine, p); },
      [&] { read_plain({records_file()}); });
}

// Restoring a snapshot set of 8 ranks × 4 workers over 30,000 logical shards of text: read the set
// (every rank's file, checksummed), check it, and restore one rank's Run, ready to yield.
constexpr int kWorld = 8, kWorkers = 4;
const std::string& lines_set() {
  static const std::string dir = [] {
    std::vector<std::string> files;
    for (int f = 0; f < 16; ++f) {
      files.push_back(scratch_dir() + "/text" + std::to_string(f) + ".txt");
      std::ofstream out(files.back());
      for (int l = 0; l < 20'000; ++l) out << "file " << f << " line " << l << " of some text\n";
    }
    auto p = dpipe::lines(files, {.logical_shards = 30'000}) | dpipe::shuffle({.buffer = 100}) |
             dpipe::batch({.size = 32});
    const std::string d = scratch_dir() + "/set";
    dpipe::Engine engine;
    for (int r = 0; r < kWorld; ++r) {
      auto run = engine.start(p, dpipe::RunOptions{.seed = 1, .layout = dpipe::Layout{r, kWorld, kWorkers}});
      for (int i = 0; i < 50; ++i) run.next();
      dpipe::SnapshotSet::write_rank(d, run.snapshot());
    }
    return d;
  }();
  return dir;
}
std::vector<std::string> lines_files() {
  std::vector<std::string> files;
  for (int f = 0; f < 16; ++f) files.push_back(scratch_dir() + "/text" + std::to_string(f) + ".txt");
  return files;
}

void BM_RestoreSet(benchmark::State& state) {
  const std::string& dir = lines_set();
  auto p = dpipe::lines(lines_files(), {.logical_shards = 30'000}) | dpipe::shuffle({.buffer = 100}) |
           dpipe::batch({.size = 32});
  dpipe::Engine engine;
  for (auto _ : state) {
    auto run = engine.resume(p, dpipe::SnapshotSet::read_dir(dir),
                             dpipe::RunOptions{.seed = 1, .layout = dpipe::Layout{3, kWorld, kWorkers}});
    benchmark::DoNotOptimize(run.delivered());
  }
}

// Baseline: read every rank file of the set and checksum its bytes.
void BM_ReadSetBytes(benchmark::State& state) {
  const std::string& dir = lines_set();
  std::vector<std::string> rank_files;  // the names the ranks wrote
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (dpipe::SnapshotSet::parse_file_name(e.path().filename().string())) rank_files.push_back(e.path().string());
  if (rank_files.size() != static_cast<std::size_t>(kWorld)) {
    state.SkipWithError("the set does not hold one file per rank");
    return;
  }
  std::size_t bytes = 0;
  for (auto _ : state) {
    std::uint32_t crc = 0;
    bytes = 0;
    for (const auto& path : rank_files) {
      std::ifstream in(path, std::ios::binary);
      const std::string b((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      crc ^= dpipe::crc32c(b);
      bytes += b.size();
    }
    benchmark::DoNotOptimize(crc);
  }
  state.counters["set_bytes"] = static_cast<double>(bytes);
}

/// Every line of `files` through `lines` (256 logical shards of 37-270 KiB here, in order, single-threaded),
/// paired with `baseline` over the same files.
void lines_against(benchmark::State& state, const std::vector<std::string>& files,
                   void (*baseline)(const std::vector<std::string>&)) {
  const auto p = dpipe::lines(files, {.logical_shards = 256, .shuffle_shards = false});
  dpipe::Engine engine;
  dpipe::bench::paired(
      state, total_bytes(files), [&] { drain(engine, p); }, [&] { baseline(files); });
}

/// The same lines through `line_blocks` (64 KiB blocks), paired with the plain read.
void line_blocks_against_plain(benchmark::State& state, const std::vector<std::string>& files) {
  const auto p = dpipe::line_blocks(files, {.logical_shards = 256, .shuffle_shards = false});
  dpipe::Engine engine;
  dpipe::bench::paired(
      state, total_bytes(files), [&] { drain(engine, p); }, [&] { read_plain(files); });
}

void BM_Lines(benchmark::State& state) {
  lines_set();  // makes the files
  lines_against(state, lines_files(), read_plain);
}
void BM_LinesVsGetline(benchmark::State& state) {
  lines_set();
  lines_against(state, lines_files(), read_getline);
}

/// Writes `files` text files of `lines` lines each into the scratch directory, line l of file f made
/// by `line(f, l)` (newline included).
template <class MakeLine>
std::vector<std::string> write_text_files(const std::string& stem, int files, int lines, MakeLine line) {
  std::vector<std::string> out;
  for (int f = 0; f < files; ++f) {
    out.push_back(scratch_dir() + "/" + stem + std::to_string(f));
    std::ofstream o(out.back());
    for (int l = 0; l < lines; ++l) o << line(f, l);
  }
  return out;
}

// The same with lines of about 1 KiB (JSON-lines corpora average a few KiB per line).
std::vector<std::string> long_lines_files() {
  static const auto files = write_text_files("long", 4, 16'000, [](int, int l) {
    return "{\"id\": " + std::to_string(l) + ", \"text\": \"" + std::string(1000 + (l * 37) % 100, char('a' + l % 26)) +
           "\"}\n";
  });
  return files;
}

// And lines of about 120 bytes (CSV rows, log lines).
std::vector<std::string> medium_lines_files() {
  static const auto files = write_text_files("medium", 8, 12'000, [](int f, int l) {
    return std::to_string(l) + ',' + std::to_string(f) + ",2026-11-22T17:00:00," +
           std::string(80 + (l * 13) % 40, char('a' + l % 26)) + '\n';
  });
  return files;
}

void BM_LinesVsOwnedLoop(benchmark::State& state) {
  lines_set();
  lines_against(state, lines_files(), split_lines<true>);
}
void BM_LinesMedium(benchmark::State& state) { lines_against(state, medium_lines_files(), read_plain); }
void BM_LinesMediumVsOwnedLoop(benchmark::State& state) {
  lines_against(state, medium_lines_files(), split_lines<true>);
}
/// The hand-written loops themselves against the plain read: the ceiling of one owned string per line,
/// and the cost of the memchr search alone.
void loop_against_plain(benchmark::State& state, const std::vector<std::string>& files,
                        void (*loop)(const std::vector<std::string>&)) {
  dpipe::bench::paired(
      state, total_bytes(files), [&] { loop(files); }, [&] { read_plain(files); });
}
void BM_OwnedLoopShort(benchmark::State& state) {
  lines_set();
  loop_against_plain(state, lines_files(), split_lines<true>);
}
void BM_SplitLoopShort(benchmark::State& state) {
  lines_set();
  loop_against_plain(state, lines_files(), split_lines<false>);
}
void BM_OwnedLoopMedium(benchmark::State& state) { loop_against_plain(state, medium_lines_files(), split_lines<true>); }
void BM_LinesLong(benchmark::State& state) { lines_against(state, long_lines_files(), read_plain); }
void BM_LineBlocks(benchmark::State& state) {
  lines_set();
  line_blocks_against_plain(state, lines_files());
}
void BM_LineBlocksMedium(benchmark::State& state) { line_blocks_against_plain(state, medium_lines_files()); }
void BM_LineBlocksLong(benchmark::State& state) { line_blocks_against_plain(state, long_lines_files()); }

BENCHMARK(BM_Lines)->Unit(benchmark::kMillisecond)->UseManualTime()->Repetitions(3);
BENCHMARK(BM_LinesVsGetline)->Unit(benchmark::kMillisecond)->UseManualTime()->Repetitions(3);
BENCHMARK(BM_LinesVsOwnedLoop)->Unit(benchmark::kMillisecond)->UseManualTime()->Repetitions(3);
BENCHMARK(BM_OwnedLoopShort)->Unit(benchmark::kMillisecond)->UseManualTime()->Repetitions(3);
BENCHMARK(BM_SplitLoopShort)->Unit(benchmark::kMillisecond)->UseManualTime()->Repetitions(3);
BENCHMARK(BM_LinesMedium)->Unit(benchmark::kMillisecond)->UseManualTime()->Repetitions(3);
BENCHMARK(BM_LinesMediumVsOwnedLoop)->Unit(benchmark::kMillisecond)->UseManualTime()->Repetitions(3);
BENCHMARK(BM_OwnedLoopMedium)->Unit(benchmark::kMillisecond)->UseManualTime()->Repetitions(3);
BENCHMARK(BM_LinesLong)->Unit(benchmark::kMillisecond)->UseManualTime()->Repetitions(3);
BENCHMARK(BM_LineBlocks)->Unit(benchmark::kMillisecond)->UseManualTime()->Repetitions(3);
BENCHMARK(BM_LineBlocksMedium)->Unit(benchmark::kMillisecond)->UseManualTime()->Repetitions(3);
BENCHMARK(BM_LineBlocksLong)->Unit(benchmark::kMillisecond)->UseManualTime()->Repetitions(3);
BENCHMARK(BM_RestoreSet)->Unit(benchmark::kMicrosecond)->Repetitions(3);
BENCHMARK(BM_ReadSetBytes)->Unit(benchmark::kMicrosecond)->Repetitions(3);
BENCHMARK(BM_SamplerPermutation)->Unit(benchmark::kMillisecond)->Repetitions(3);
BENCHMARK(BM_StoredPermutation)->Unit(benchmark::kMillisecond)->Repetitions(3);
BENCHMARK(BM_TokenWindows)->Unit(benchmark::kMillisecond)->UseManualTime()->Repetitions(3);
BENCHMARK(BM_TokenWindowsVsInlinedCopy)->Unit(benchmark::kMillisecond)->UseManualTime()->Repetitions(3);
BENCHMARK(BM_SampledTokenWindows)->Unit(benchmark::kMillisecond)->UseManualTime()->Repetitions(3);
BENCHMARK(BM_Records)->Unit(benchmark::kMillisecond)->UseManualTime()->Repetitions(3);

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  benchmark::AddCustomContext("allocator", DPIPE_BENCH_ALLOCATOR);
  dpipe::bench::RatioReporter reporter({
      {"sampler index / stored permutation read (per-index rate)", "BM_SamplerPermutation", "BM_StoredPermutation", 0},
      {"token_windows / memcpy of the same bytes (paired)", "BM_TokenWindows", "", 0.5},
      {"token_windows / the same copies inlined by the compiler (paired)", "BM_TokenWindowsVsInlinedCopy", "", 0},
      {"sampler(global) over token_windows / memcpy in a stored random order (paired)", "BM_SampledTokenWindows", "", 0},
      {"records / plain buffered read of the same file (paired)", "BM_Records", "", 0.5},
      {"lines (~30-byte lines) / plain buffered read (paired)", "BM_Lines", "", 0.5},
      {"lines (~30-byte lines) / hand-written getline loop (paired)", "BM_LinesVsGetline", "", 0},
      {"  the same lines / a hand-written loop making the same strings (paired)", "BM_LinesVsOwnedLoop", "", 0},
      {"  that hand-written loop / plain buffered read (paired)", "BM_OwnedLoopShort", "", 0},
      {"  the loop finding the lines (memchr), making nothing / plain buffered read (paired)", "BM_SplitLoopShort", "", 0},
      {"lines (~120-byte lines) / plain buffered read (paired)", "BM_LinesMedium", "", 0.5},
      {"  the same lines / a hand-written loop making the same strings (paired)", "BM_LinesMediumVsOwnedLoop", "", 0},
      {"  that hand-written loop / plain buffered read (paired)", "BM_OwnedLoopMedium", "", 0},
      {"lines (~1 KiB lines) / plain buffered read (paired)", "BM_LinesLong", "", 0.5},
      {"line_blocks (~30-byte lines) / plain buffered read (paired)", "BM_LineBlocks", "", 0.5},
      {"line_blocks (~120-byte lines) / plain buffered read (paired)", "BM_LineBlocksMedium", "", 0.5},
      {"line_blocks (~1 KiB lines) / plain buffered read (paired)", "BM_LineBlocksLong", "", 0.5},
      {"restore a set of 8 x 4 over 30,000 shards / read+checksum its bytes", "BM_RestoreSet", "BM_ReadSetBytes", 2.0,
       true},
  });
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  std::filesystem::remove_all(scratch_dir());
}
