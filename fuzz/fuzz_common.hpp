#pragma once
// What the fuzz targets share: the representative pipelines, running one with bounds, and the rule that
// dpipe::Error (ConfigError, SnapshotError, DataError, FileError, NodeError) is an expected refusal while
// anything else (another exception, a crash, a hang, a sanitizer report) is a finding. See docs/fuzzing.md.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dpipe/dpipe.hpp"
#include "json_spec.hpp"

namespace dpipe_fuzz {

/// Elements a target pulls from one run at most, so that no valid input runs for long.
inline constexpr std::uint64_t kMaxElements = 400;

/// A finding the sanitizers cannot see (an invariant of dpipe's own): printed, then abort().
[[noreturn]] inline void finding(const std::string& what) {
  std::fprintf(stderr, "dpipe fuzz finding: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

/// `PREFIX-PID` under the system's temporary directory, made now and removed, with what it holds, when
/// the process exits.
inline std::string process_temp_dir(const std::string& prefix) {
  static auto* const made = new std::vector<std::string>;  // never destroyed: the exit handler reads it
  if (made->empty())
    std::atexit([] {
      std::error_code ec;
      for (const auto& d : *made) std::filesystem::remove_all(d, ec);
    });
  made->push_back((std::filesystem::temp_directory_path() / (prefix + "-" + std::to_string(::getpid()))).string());
  std::filesystem::create_directories(made->back());
  return made->back();
}

/// One engine for the whole process (a oneTBB arena); runs use inline workers, so a run is deterministic
/// and needs no thread of the engine.
inline dpipe::Engine& engine() {
  static dpipe::Engine e({.threads = 1});
  return e;
}

inline dpipe::RunOptions options(std::uint64_t seed, const dpipe::Layout& layout) {
  dpipe::RunOptions o;
  o.seed = seed;
  o.layout = layout;
  o.inline_workers = true;
  return o;
}

/// The representative pipelines snapshots are restored into: in-memory sources only, every stateful
/// kind a spec can name, one and several workers.
struct FuzzPipeline {
  const char* name;
  const char* spec;
  dpipe::Layout layout;  // the layout the corpus snapshots are taken on
};

inline const std::vector<FuzzPipeline>& fuzz_pipelines() {
  static const std::vector<FuzzPipeline> p = {
      {"shuffle_batch", R"({"seed": 3, "pipeline": [{"op": "range", "stop": 100}, {"op": "shuffle", "buffer": 8},
        {"op": "batch", "size": 4}]})",
       {0, 1, 1}},
      {"sampler_prefetch", R"({"seed": 11, "pipeline": [{"op": "range", "stop": 300}, {"op": "sampler", "shuffle": "global"},
        {"op": "shuffle", "buffer": 8}, {"op": "batch", "size": 4}, {"op": "prefetch", "depth": 2}]})",
       {0, 1, 2}},
      {"sampler_epochs", R"({"seed": 12, "pipeline": [{"op": "range", "stop": 50}, {"op": "sampler", "epochs": 2},
        {"op": "shuffle", "buffer": 4}, {"op": "batch", "size": 3, "drop_last": true}]})",
       {1, 2, 2}},
      {"take_cycle", R"({"seed": 4, "pipeline": [{"op": "range", "stop": 50}, {"op": "take", "count": 37},
        {"op": "cycle", "count": 3}, {"op": "shuffle", "buffer": 5}]})",
       {0, 1, 1}},
      {"strings_concat", R"({"seed": 5, "pipeline": [{"op": "from_vector", "values": ["a", "b\"q", "tab\t", "été", "日", "x", "y"]},
        {"op": "shuffle", "buffer": 3}, {"op": "concat", "with": [[{"op": "from_vector", "values": ["p", "q", "r"]},
        {"op": "repeat", "times": 2}]]}, {"op": "batch", "size": 3}]})",
       {0, 1, 1}},
      {"generator_zip", R"({"seed": 7, "pipeline": [{"op": "generator", "fn": "random_ints", "count": 60, "hi": 1000},
        {"op": "shuffle", "buffer": 10}, {"op": "zip", "with": [[{"op": "range", "start": 100, "stop": 400}]]},
        {"op": "batch", "size": 3}]})",
       {0, 1, 1}},
      {"mux", R"({"seed": 8, "pipeline": [{"op": "range", "stop": 30}, {"op": "mux", "with": [[{"op": "range", "start": 100,
        "stop": 113}], [{"op": "range", "start": 200, "stop": 222}, {"op": "shuffle", "buffer": 4}]]},
        {"op": "mux_longest", "with": [[{"op": "range", "start": 500, "stop": 540}]]}]})",
       {0, 1, 1}},
      {"dispatch_merge", R"({"seed": 9, "pipeline": [{"op": "range", "stop": 300}, {"op": "shuffle", "buffer": 20},
        {"op": "dispatch", "mode": "round_robin"}, {"op": "parallel_map", "fn": "affine", "mul": 3, "max_in_flight": 4},
        {"op": "batch", "size": 5}, {"op": "prefetch", "depth": 2}, {"op": "merge"}, {"op": "unbatch"},
        {"op": "take", "count": 250}]})",
       {0, 1, 2}},
      {"broadcast", R"({"seed": 10, "pipeline": [{"op": "range", "stop": 40}, {"op": "dispatch", "mode": "broadcast"},
        {"op": "map", "fn": "affine", "mul": 2}, {"op": "merge"}, {"op": "batch", "size": 6}]})",
       {0, 1, 2}},
      {"sharded", R"({"seed": 13, "pipeline": [{"op": "range", "stop": 200}, {"op": "sharding_filter"},
        {"op": "filter", "fn": "mod_eq", "mod": 3, "eq": 1}, {"op": "flat_map", "fn": "replicate", "times": 2},
        {"op": "shuffle", "buffer": 6}, {"op": "batch", "size": 4}]})",
       {1, 2, 2}},
      // Value elements (arrays) in a shuffle buffer, a partial batch and the worker queues.
      {"stack_values", R"({"seed": 14, "pipeline": [{"op": "range", "stop": 120}, {"op": "batch", "size": 3},
        {"op": "batch", "size": 2}, {"op": "map", "fn": "stack", "dtype": "uint16"}, {"op": "shuffle", "buffer": 4},
        {"op": "batch", "size": 3}]})",
       {0, 1, 2}},
  };
  return p;
}

/// The pipelines, built once (a spec pipeline is an immutable definition: any number of runs).
struct BuiltPipeline {
  dpipe::Spec spec;
  std::uint64_t fingerprint;
  dpipe::Layout layout;
};

inline const std::vector<BuiltPipeline>& built_pipelines() {
  static const std::vector<BuiltPipeline> b = [] {
    std::vector<BuiltPipeline> out;
    for (const auto& p : fuzz_pipelines()) {
      auto spec = dpipe::parse_spec(p.spec);
      const auto fp = spec.pipeline.visit([](const auto& pl) { return dpipe::Graph::build(*pl.def()).fingerprint(); });
      out.push_back({std::move(spec), fp, p.layout});
    }
    return out;
  }();
  return b;
}

/// A layout the targets are willing to run (a snapshot's own, when it is this small).
inline bool small_layout(const dpipe::Layout& l) {
  return l.world_size >= 1 && l.world_size <= 16 && l.num_workers >= 1 && l.num_workers <= 4 && l.rank >= 0 &&
         l.rank < l.world_size;
}

/// Pulls at most `max` elements.
template <class R>
std::uint64_t drain(R& run, std::uint64_t max = kMaxElements) {
  std::uint64_t n = 0;
  while (n < max && run.next()) ++n;
  return n;
}

/// Resumes `pipeline` from `s` on `layout`, pulls a bounded number of elements, then checks that the
/// run's own snapshot encodes, decodes and restores (a snapshot dpipe wrote always restores). A
/// dpipe::Error from the first resume or the pulls is an expected refusal, unless `s` was written by a
/// run (`written_by_dpipe`); from the second resume it is a finding. A NodeError from the pulls (a failure
/// the snapshot recorded, raised again) is expected either way.
inline void resume_and_pull(const BuiltPipeline& p, const dpipe::Snapshot& s, const dpipe::Layout& layout,
                            bool written_by_dpipe = false) {
  p.spec.pipeline.visit([&](const auto& pipeline) {
    std::optional<dpipe::Snapshot> again;
    try {
      auto run = engine().resume(pipeline, s, options(p.spec.seed, layout));
      drain(run, kMaxElements / 2);
      again = run.snapshot();
      drain(run, kMaxElements / 2);
    } catch (const dpipe::NodeError&) {
      return;
    } catch (const dpipe::Error& e) {
      if (written_by_dpipe) finding(std::string("a snapshot written by a run does not restore: ") + e.what());
      return;
    }
    std::string bytes;
    try {
      bytes = again->to_bytes();
      auto back = dpipe::Snapshot::from_bytes(bytes);
      auto run = engine().resume(pipeline, back, options(p.spec.seed, layout));
      drain(run, 8);
    } catch (const dpipe::NodeError&) {
      // a failure restored from the snapshot is raised again at the same point
    } catch (const dpipe::Error& e) {
      finding(std::string("a snapshot written by a resumed run does not restore: ") + e.what());
    }
  });
}

/// A small deterministic generator for the mutators.
struct Rand {
  std::uint64_t s;
  std::uint64_t next() {
    s += 0x9e3779b97f4a7c15ull;
    std::uint64_t z = s;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  std::uint64_t below(std::uint64_t n) { return n ? next() % n : 0; }
  bool one_in(std::uint64_t n) { return below(n) == 0; }
};

}  // namespace dpipe_fuzz
