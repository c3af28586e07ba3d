// The `dpipe` command-line tool: runs JSON-spec pipelines, writes and resumes snapshots, shows
// snapshots and graphs, benchmarks. A thin layer over the library: specs build typed Pipelines.
// Every command, option, help text and exclusion is declared in build_cli(), with CLI11.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "dpipe/atomic_file.hpp"
#include "dpipe/detail/process_io.hpp"
#include "dpipe/detail/text_json.hpp"
#include "dpipe/dpipe.hpp"
#include "dpipe/regular_file.hpp"
#include "json_spec.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using Json = nlohmann::ordered_json;

/// A mistake in the command line found after parsing (exit code 2, as CLI11's own).
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// ---------------------------------------------------------------------------------------------------
// The command line.

/// Options shared by `run` and `bench`.
struct CommonArgs {
  std::string spec;
  std::uint64_t seed = 0;
  int rank = 0;
  int world_size = 1;
  int workers = 1;
  int threads = 0;
  bool stats = false;
  std::string data_root;      // --data-root
  bool digest_files = false;  // --file-digest
  CLI::Option* seed_opt = nullptr;
  CLI::Option* rank_opt = nullptr;
};

struct RunArgs {
  CommonArgs common;
  std::optional<std::int64_t> take;  // absent: every element
  std::optional<std::string> output, snapshot_out, snapshot_dir, resume, resume_dir;
  bool rescale = false;
  bool allow_changed_data = false;
  std::optional<std::uint64_t> step;
  std::uint64_t max_replay = dpipe::ResumeOptions{}.max_replay;
  std::vector<std::string> overrides;
  bool provenance = false;
  bool restore_keys = false;
};

struct BenchArgs {
  CommonArgs common;
  double seconds = 0;
};

struct RescaleArgs {
  std::string dir;
  int world_size = 1;
  int workers = 1;
  std::string out;
};

struct WhichArgs {
  std::string spec, snapshot, data_root;
  std::uint64_t steps = 10;
  bool allow_changed_data = false;
};

struct Cli {
  CLI::App app{"dpipe: runs, benchmarks and inspects dpipe pipelines written as JSON specs, and shows and\n"
               "rescales their snapshots.",
               "dpipe"};
  CLI::App* run = nullptr;
  CLI::App* bench = nullptr;
  CLI::App* graph = nullptr;
  CLI::App* show = nullptr;
  CLI::App* rescale = nullptr;
  CLI::App* which = nullptr;
  CLI::App* ops = nullptr;
  RunArgs run_args;
  BenchArgs bench_args;
  std::string graph_spec;
  std::string graph_data_root;
  std::string show_path;
  RescaleArgs rescale_args;
  WhichArgs which_args;
  struct {
    std::string op;
    bool json = false, markdown = false;
  } ops_args;
};

/// A validator for a decimal integer in [lo, hi]: CLI11's own conversion also takes "-1" for an unsigned
/// option, octal and hexadecimal, and saturates on overflow.
template <class T>
CLI::Validator decimal(T lo, T hi) {
  return CLI::Validator(
      [lo, hi](std::string& s) -> std::string {
        T v{};
        const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
        const bool digits = !s.empty() && s.find_first_not_of("0123456789") == std::string::npos;
        if (!digits || ec != std::errc() || end != s.data() + s.size() || v < lo || v > hi)
          return "must be a decimal integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got '" + s + "'";
        s = std::to_string(v);  // CLI11 would read a leading 0 as octal ("010" as 8)
        return "";
      },
      "");
}

constexpr const char* kSpecHelp =
    "the pipeline: a JSON file (a regular file), '-' for standard input, or the JSON text itself "
    "({\"seed\": S, \"pipeline\": [{\"op\": KIND, ...parameters}, ...]})";

constexpr const char* kLayoutFooter =
    "Layout: the rank and world size come from --rank/--world-size, else from the variables RANK and\n"
    "WORLD_SIZE (torchrun), else from OMPI_COMM_WORLD_RANK and OMPI_COMM_WORLD_SIZE (Open MPI), else\n"
    "rank 0 of 1. --workers sets the workers of this rank (default 1).";

void add_common(CLI::App& cmd, CommonArgs& a) {
  cmd.add_option("SPEC", a.spec, kSpecHelp)->type_name("")->required();
  a.seed_opt = cmd.add_option("--seed", a.seed, "the pipeline seed (default: the spec's \"seed\", else 0)")
                   ->type_name("N")
                   ->transform(decimal<std::uint64_t>(0, std::numeric_limits<std::uint64_t>::max()));
  a.rank_opt = cmd.add_option("--rank", a.rank, "this process's rank (with --world-size)")->type_name("R")->transform(decimal(0, 1'000'000));
  auto* world = cmd.add_option("--world-size", a.world_size, "the number of ranks (with --rank)")->type_name("W")->transform(decimal(1, 1'000'000));
  a.rank_opt->needs(world);
  world->needs(a.rank_opt);
  cmd.add_option("--workers", a.workers, "worker instances on this rank, 1 to 4096 (default 1)")->type_name("K")->transform(decimal(1, 4096));
  cmd.add_option("--threads", a.threads, "threads of the engine, up to 1024 (default 0: one per core)")->type_name("T")->transform(decimal(0, 1024));
  cmd.add_flag("--stats", a.stats, "report elements, seconds and per-node statistics as one JSON line")
      ->multi_option_policy(CLI::MultiOptionPolicy::Throw);
  cmd.add_option("--data-root", a.data_root,
                 "resolve the spec's relative file names against DIR, and name files under DIR relative to it in "
                 "snapshots, so that they resume under another root (docs/files.md)")
      ->type_name("DIR");
  cmd.add_flag("--file-digest", a.digest_files,
               "identify data files in snapshots by a digest of their bytes instead of their modification time "
               "(reads each file once when the pipeline is built)")
      ->multi_option_policy(CLI::MultiOptionPolicy::Throw);
}

void build_cli(Cli& c) {
  auto& app = c.app;
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::Throw);
  app.require_subcommand(1);
  app.footer(
      "Run 'dpipe COMMAND --help' for a command's options. Exit status: 0 done, 1 an error (spec, snapshot,\n"
      "data, a file, or a node that failed; one line on standard error), 2 a usage error.\n"
      "Files dpipe writes (snapshots, --output) appear whole or not at all: see docs/files.md.");

  c.run = app.add_subcommand("run", "Runs a pipeline and writes its elements as JSON lines.");
  auto& r = c.run_args;
  add_common(*c.run, r.common);
  c.run->add_option("--take", r.take, "stop after N elements, 0 for none (default: all)")->type_name("N")
      ->transform(decimal<std::int64_t>(0, std::numeric_limits<std::int64_t>::max()));
  c.run->add_option("--output", r.output,
                    "write the elements to PATH instead of standard output; '{rank}' is replaced by the rank")
      ->type_name("PATH");
  auto* snap_out = c.run->add_option("--snapshot-out", r.snapshot_out, "at the end, write a snapshot file to PATH")->type_name("PATH");
  auto* snap_dir = c.run->add_option("--snapshot-dir", r.snapshot_dir,
                                     "at the end, write this rank's snapshot into the set directory DIR (a reproducible snapshot: "
                                     "rescaling the set gives the same streams every time)")
                         ->type_name("DIR");
  snap_out->excludes(snap_dir);
  auto* resume = c.run->add_option("--resume", r.resume, "resume from the snapshot file PATH")->type_name("PATH");
  auto* resume_dir = c.run->add_option("--resume-dir", r.resume_dir, "resume this rank from the snapshot set DIR")->type_name("DIR");
  resume->excludes(resume_dir);
  c.run->add_option("--step", r.step, "record N as the snapshot's step (a set of mixed steps is refused; with --snapshot-dir and --take it defaults to the resumed step + the --take count)")
      ->type_name("N")
      ->transform(decimal<std::uint64_t>(0, std::numeric_limits<std::uint64_t>::max()));
  c.run->add_option("--max-replay", r.max_replay,
                    "refuse a snapshot that asks a generator to replay more than N elements (default 2^30)")
      ->type_name("N")
      ->transform(decimal<std::uint64_t>(0, std::numeric_limits<std::uint64_t>::max()));
  c.run->add_option("--override", r.overrides,
                    "let this resume change the semantic parameter PARAM (KEY.PARAM: of one node), which the spec "
                    "gives anew: mix's weights; recorded in the snapshots as dpipe.overrides")
      ->type_name("PARAM")
      ->take_all()
      ->allow_extra_args(false);
  c.run->add_flag("--provenance", r.provenance,
                  "write each element as {\"element\": E, \"sources\": [[SOURCE, POSITION], ...]}: the source "
                  "positions it was made from (docs/design.md, \"Provenance\")")
      ->multi_option_policy(CLI::MultiOptionPolicy::Throw);
  c.run->add_flag("--restore-keys", r.restore_keys,
                  "snapshots hold buffered elements as the source positions they were made from, not their bytes, "
                  "where the nodes up to their source can make them again (docs/design.md, \"Restore keys\")")
      ->multi_option_policy(CLI::MultiOptionPolicy::Throw);
  c.run->add_flag("--allow-changed-data", r.allow_changed_data,
                  "accept data files whose modification time changed since the snapshot (same path and size)");
  c.run->add_flag("--rescale", r.rescale, "allow resuming a set taken on another layout (redistributes its state)")
      ->needs(resume_dir)
      ->multi_option_policy(CLI::MultiOptionPolicy::Throw);
  c.run->footer(std::string(kLayoutFooter) +
                "\n\nOutput: one JSON value per line (numbers, strings, arrays for batches); text that is not\n"
                "UTF-8 is written {\"base64\": \"...\"} (docs/files.md). A file named by\n"
                "--output is replaced only when the run succeeds; if it fails, the elements delivered before\n"
                "the failure are kept in PATH.partial. A character device or FIFO (/dev/null, a pipe) is\n"
                "written in place. --output and --snapshot-out must name different files.\n"
                "Snapshots: --snapshot-out/--snapshot-dir save the position after the last element written;\n"
                "--resume/--resume-dir continue from it (same spec, seed and layout unless --rescale).");

  c.bench = app.add_subcommand("bench", "Runs a pipeline as fast as it goes and reports one JSON line of figures.");
  add_common(*c.bench, c.bench_args.common);
  c.bench->add_option("--seconds", c.bench_args.seconds, "stop after this many seconds (default: at the end)")->type_name("S")
      ->check(CLI::PositiveNumber);
  c.bench->footer(kLayoutFooter);

  c.ops = app.add_subcommand("ops", "Lists the ops a spec can use: parameters, rescale rule, state fields.");
  c.ops->add_option("OP", c.ops_args.op, "one op only")->type_name("");
  auto* ops_json = c.ops->add_flag("--json", c.ops_args.json,
                                   "one JSON array of objects: op, doc, params (name, type, default, required, positional, "
                                   "doc, tuning, choices, torch), rescales, rescale_refusal, state, source, length, provenance, functions");
  c.ops->add_flag("--markdown", c.ops_args.markdown, "every op as the Markdown of docs/ops.md")->excludes(ops_json);

  c.graph = app.add_subcommand("graph", "Prints the pipeline's graph in Graphviz DOT.");
  c.graph->add_option("SPEC", c.graph_spec, kSpecHelp)->type_name("")->required();
  c.graph->add_option("--data-root", c.graph_data_root, "resolve the spec's relative file names against DIR (as run does)")
      ->type_name("DIR");

  auto* snapshot = app.add_subcommand("snapshot", "Shows, rescales or looks into snapshots.");
  snapshot->require_subcommand(1);
  c.show = snapshot->add_subcommand("show", "Prints a snapshot file, or a summary of a snapshot set, as JSON.");
  c.show->add_option("PATH", c.show_path, "a snapshot file or a snapshot set directory")->type_name("")->required();
  c.which = snapshot->add_subcommand("which", "Lists the source positions of the next elements a snapshot delivers.");
  auto& w = c.which_args;
  c.which->add_option("SPEC", w.spec, kSpecHelp)->type_name("")->required();
  c.which->add_option("SNAPSHOT", w.snapshot, "a snapshot file of the spec")->type_name("")->required();
  c.which->add_option("--steps", w.steps, "how many elements (default 10)")
      ->type_name("N")
      ->transform(decimal<std::uint64_t>(0, std::numeric_limits<std::uint64_t>::max()));
  c.which->add_option("--data-root", w.data_root, "resolve the spec's relative file names against DIR (as run does)")
      ->type_name("DIR");
  c.which->add_flag("--allow-changed-data", w.allow_changed_data,
                    "accept data files whose modification time changed since the snapshot (same path and size)");
  c.which->footer("The snapshot's seed, epoch and layout are used. Each line is {\"index\": I, \"sources\": [[SOURCE, "
                  "POSITION], ...]} for the element the run delivers I-th (from 0, counted over the run); the elements are "
                  "not written. It resumes the snapshot traced, so it makes the elements again: the spec's functions run.");
  c.rescale = snapshot->add_subcommand("rescale", "Redistributes a snapshot set onto another layout, offline.");
  auto& s = c.rescale_args;
  c.rescale->add_option("DIR", s.dir, "the snapshot set to read")->type_name("")->required();
  c.rescale->add_option("--world-size", s.world_size, "the new number of ranks")->type_name("W")->required()->transform(decimal(1, 1'000'000));
  c.rescale->add_option("--workers", s.workers, "the new number of workers per rank")->type_name("K")->required()->transform(decimal(1, 4096));
  c.rescale->add_option("--out", s.out, "the directory to write the new set into (absent or empty)")
      ->type_name("DIR")
      ->required()
      ->check(CLI::Validator([](std::string& v) { return v.empty() ? std::string("must name a directory, got ''") : std::string(); }, ""));
}

// ---------------------------------------------------------------------------------------------------
// Specs, layouts, engines.

std::string read_text(const std::string& path_or_json) {
  if (!path_or_json.empty() && (path_or_json[0] == '{' || path_or_json[0] == '[')) return path_or_json;
  std::ostringstream ss;
  if (path_or_json == "-") {
    ss << std::cin.rdbuf();
    return ss.str();
  }
  // A regular file only (a FIFO or a device is refused, never waited on); '-' reads standard input.
  return dpipe::read_regular_file(path_or_json, dpipe::FileRole::spec);
}

/// The spec of `a.spec`, its file sources under `a`'s data root.
dpipe::Spec read_spec(const CommonArgs& a) {
  return dpipe::parse_spec(read_text(a.spec),
                           {.data = {.root = a.data_root,
                                     .identity = a.digest_files ? dpipe::FileIdentity::digest : dpipe::FileIdentity::mtime}});
}

/// Calls `f(pipeline)` with the spec's typed pipeline: the one place the tool looks inside a Spec.
template <class F>
decltype(auto) with_pipeline(const dpipe::Spec& spec, F&& f) {
  return spec.pipeline.visit(std::forward<F>(f));
}

dpipe::RunOptions run_options(const CommonArgs& a, std::uint64_t spec_seed) {
  dpipe::RunOptions o;
  o.seed = *a.seed_opt ? a.seed : spec_seed;
  o.collect_stats = a.stats;
  if (*a.rank_opt) o.layout = dpipe::Layout{a.rank, a.world_size, a.workers};
  else o.layout = dpipe::layout_from_environment(a.workers);
  return o;
}

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

/// Per-node elements and seconds, so a user sees which node is the bottleneck.
Json node_stats_json(const std::vector<dpipe::NodeStats>& stats) {
  Json out = Json::array();
  for (const auto& n : stats)
    out.push_back({{"key", n.key},
                   {"kind", n.kind},
                   {"instance", n.instance},
                   {"elements", n.elements},
                   {"seconds", n.seconds},
                   {"self_seconds", n.self_seconds},
                   {"skipped", n.skipped}});
  return out;
}

/// Compact JSON. Text read from files is put in as dpipe::detail::json_text (UTF-8 as strings, other
/// bytes as {"base64": ...}); the replacement handler only guards against what slipped past.
std::string dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

// ---------------------------------------------------------------------------------------------------
// Outputs.

/// Buffered element lines to standard output or, through AtomicFileWriter, to a file that is replaced
/// only by commit() (character devices and FIFOs are written in place).
class Output {
 public:
  explicit Output(const std::optional<std::string>& path) {
    if (path) file_.emplace(*path, dpipe::AtomicWriteOptions{.special = dpipe::SpecialFiles::write_in_place});
  }
  /// Bytes buffered before they are written.
  static constexpr std::size_t kFlushBytes = std::size_t{1} << 16;
  std::string& buffer() { return buf_; }
  void maybe_flush() {
    if (buf_.size() >= kFlushBytes) flush();
  }
  void flush() {
    if (file_) {
      file_->write(buf_);
      file_->flush();
    } else if ((!buf_.empty() && std::fwrite(buf_.data(), 1, buf_.size(), stdout) != buf_.size()) ||
               std::fflush(stdout) != 0) {
      throw dpipe::Error(std::string("cannot write standard output: ") + std::strerror(errno));
    }
    buf_.clear();
  }
  /// Everything written: the file takes its place (a write error now is still an error).
  void commit() {
    flush();
    if (file_) file_->commit();
  }
  /// The run failed after `delivered` elements: they are flushed, and a file output keeps them under
  /// PATH.partial, leaving PATH as it was. Returns a note for the user (empty when there is none).
  std::string keep_partial(std::uint64_t delivered) noexcept {
    try {
      flush();
      if (!file_ || file_->in_place()) return "";
      const std::string kept = file_->commit_beside(".partial");
      return "the " + std::to_string(delivered) + " elements delivered before the error are in '" + kept + "'; '" +
             file_->path() + "' is unchanged";
    } catch (...) {
      return "";  // the output failed too: the run's own error is the one to report
    }
  }

 private:
  std::optional<dpipe::AtomicFileWriter> file_;
  std::string buf_;
};

/// The path a write to `p` lands on: its symbolic links followed, even one to a file that does not exist
/// yet (up to 40 hops, as the kernel allows), then normalized.
std::filesystem::path landing_path(const std::filesystem::path& p) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path at = fs::absolute(p, ec);
  for (int hop = 0; hop < 40 && fs::is_symlink(at, ec); ++hop) {
    const fs::path target = fs::read_symlink(at, ec);
    if (ec) break;
    at = target.is_absolute() ? target : at.parent_path() / target;
  }
  const fs::path out = fs::weakly_canonical(at, ec);
  return ec ? at.lexically_normal() : out;
}

/// Refuses two outputs on one file: by identity when both exist, else by the paths writes land on.
void check_distinct_outputs(const std::string& output, const std::string& snapshot_out) {
  namespace fs = std::filesystem;
  std::error_code e1, e2;
  bool same = false;
  if (fs::exists(output, e1) && fs::exists(snapshot_out, e2)) {
    same = fs::equivalent(output, snapshot_out, e1);
  } else {
    same = landing_path(output) == landing_path(snapshot_out);
  }
  if (same)
    throw UsageError("--output '" + output + "' and --snapshot-out '" + snapshot_out +
                     "' name the same file; the snapshot would replace the elements");
}

// The figures of a run: what `run --stats` and `bench` print.

/// What `run --stats` prints on standard error.
struct RunFigures {
  std::uint64_t elements = 0;
  double seconds = 0;
  double restore_ms = 0;
  std::uint64_t restore_read_bytes = 0;
  double snapshot_ms = 0;
  std::uint64_t replayed_elements = 0;
  std::uint64_t elements_total = 0;
  std::uint64_t skipped_records = 0;
  std::uint64_t skipped_bytes = 0;
  int threads = 0;
};

void print_run_stats(const RunFigures& f, const std::vector<dpipe::NodeStats>& nodes) {
  const Json stats = {{"elements", f.elements},
                      {"seconds", f.seconds},
                      {"restore_ms", f.restore_ms},
                      {"restore_read_bytes", f.restore_read_bytes},
                      {"snapshot_ms", f.snapshot_ms},
                      {"replayed_elements", f.replayed_elements},
                      {"elements_total", f.elements_total},
                      {"skipped_records", f.skipped_records},
                      {"skipped_bytes", f.skipped_bytes},
                      {"threads", f.threads},
                      {"nodes", node_stats_json(nodes)}};
  std::fprintf(stderr, "%s\n", dump(stats).c_str());
}

/// What `bench` prints on standard output; `nodes` with --stats.
void print_bench_figures(std::uint64_t n, double secs, std::size_t items, int workers, int threads,
                         const std::optional<std::vector<dpipe::NodeStats>>& nodes) {
  Json figures = {{"elements", n},
                  {"seconds", secs},
                  {"elements_per_s", secs > 0 ? n / secs : 0.0},
                  {"items", items},
                  {"workers", workers},
                  {"threads", threads}};
  if (nodes) figures["nodes"] = node_stats_json(*nodes);
  std::cout << dump(figures) << "\n";
}

// ---------------------------------------------------------------------------------------------------
// A run with its element type behind it: this class is compiled once per spec element type, the commands
// once.

class SpecRun {
 public:
  virtual ~SpecRun() = default;
  /// Appends the next elements to `out`, one JSON line each, until `max` are appended, `out` holds
  /// `until_bytes` or the stream ends; counts each in `written` once it is in `out` (after a failure,
  /// `written` counts what reached `out`). Returns false at the end of the stream.
  virtual bool append_lines(std::string& out, std::uint64_t max, std::size_t until_bytes, std::uint64_t& written) = 0;
  /// Takes up to `max` next elements and adds their sizes to `items` (1 for an element that is not a batch);
  /// returns how many it took (fewer only at the end).
  virtual std::uint64_t take(std::uint64_t max, std::size_t& items) = 0;
  virtual dpipe::Snapshot snapshot(const std::map<std::string, std::string>& meta, std::optional<std::uint64_t> step) = 0;
  virtual dpipe::Snapshot reproducible_snapshot(const std::map<std::string, std::string>& meta,
                                                std::optional<std::uint64_t> step) = 0;
  virtual std::vector<dpipe::NodeStats> node_stats() = 0;
  virtual const std::vector<std::string>& warnings() const = 0;
  virtual const dpipe::RestoreReport& restore_report() const = 0;
  virtual std::uint64_t delivered() const = 0;
  virtual const dpipe::Graph& graph() const = 0;
  virtual const dpipe::Layout& layout() const = 0;
};

template <class T>
class TypedSpecRun final : public SpecRun {
 public:
  /// `sources`: write each element with its provenance (--provenance; a traced run of --restore-keys alone
  /// writes the elements).
  TypedSpecRun(dpipe::Run<T> run, bool bytes, bool sources, bool sources_only = false)
      : run_(std::move(run)), bytes_(bytes), sources_(sources || sources_only), sources_only_(sources_only) {}

  bool append_lines(std::string& out, std::uint64_t max, std::size_t until_bytes, std::uint64_t& written) override {
    for (std::uint64_t n = 0; n < max && out.size() < until_bytes; ++n) {
      auto x = run_.next();
      if (!x) return false;
      const dpipe::Provenance* sources = sources_ ? run_.provenance() : nullptr;
      if (sources_only_) {  // snapshot which
        out += "{\"index\": " + std::to_string(run_.delivered() - 1);
        append_sources(out, sources ? *sources : dpipe::unknown_provenance());
        out += '\n';
        ++written;
        continue;
      }
      if (sources) out += "{\"element\": ";
      dpipe::append_spec_element_json(out, *x, bytes_);
      if (sources) append_sources(out, *sources);
      out += '\n';
      ++written;
    }
    return true;
  }
  /// `, "sources": [[SOURCE, POSITION], ...]}` (dpipe::provenance_json).
  void append_sources(std::string& out, const dpipe::Provenance& sources) const {
    out += ", \"sources\": ";
    out += dpipe::provenance_json(sources, run_.graph().keys());
    out += '}';
  }
  std::uint64_t take(std::uint64_t max, std::size_t& items) override {
    std::uint64_t n = 0;
    for (; n < max; ++n) {
      auto x = run_.next();
      if (!x) break;
      if constexpr (requires { x->size(); }) items += x->size();
      else items += 1;
    }
    return n;
  }
  dpipe::Snapshot snapshot(const std::map<std::string, std::string>& meta, std::optional<std::uint64_t> step) override {
    return run_.snapshot(meta, step);
  }
  dpipe::Snapshot reproducible_snapshot(const std::map<std::string, std::string>& meta,
                                        std::optional<std::uint64_t> step) override {
    return run_.reproducible_snapshot(meta, step);
  }
  std::vector<dpipe::NodeStats> node_stats() override { return run_.node_stats(); }
  const std::vector<std::string>& warnings() const override { return run_.warnings(); }
  const dpipe::RestoreReport& restore_report() const override { return run_.restore_report(); }
  std::uint64_t delivered() const override { return run_.delivered(); }
  const dpipe::Graph& graph() const override { return run_.graph(); }
  const dpipe::Layout& layout() const override { return run_.layout(); }

 private:
  dpipe::Run<T> run_;
  bool bytes_;
  bool sources_;
  bool sources_only_;  // snapshot which: the sources without the element
};

/// Where a run starts: at the beginning, or from a snapshot file or a snapshot set directory.
struct RunStart {
  std::optional<std::string> snapshot_file, set_dir;
  dpipe::ResumeOptions how{};
  bool write_sources = false;  // --provenance
  bool sources_only = false;   // snapshot which
  bool resumes() const { return snapshot_file || set_dir; }
};

std::unique_ptr<SpecRun> start_run(const dpipe::Spec& spec, dpipe::Engine& engine, const dpipe::RunOptions& options,
                                   const RunStart& from = {}) {
  return with_pipeline(spec, [&]<class T>(const dpipe::Pipeline<T>& p) -> std::unique_ptr<SpecRun> {
    auto typed = [&](dpipe::Run<T> run) {
      return std::make_unique<TypedSpecRun<T>>(std::move(run), spec.bytes, from.write_sources, from.sources_only);
    };
    if (from.snapshot_file) return typed(engine.resume(p, dpipe::Snapshot::read_file(*from.snapshot_file), options, from.how));
    if (from.set_dir) return typed(engine.resume(p, dpipe::SnapshotDir{*from.set_dir}, options, from.how));
    return typed(engine.start(p, options));
  });
}

// ---------------------------------------------------------------------------------------------------
// Commands.

/// The step a set write records: --step, else, with --take, where the run stands as every rank was asked
/// to: the resumed snapshot's step (else the elements its rank had delivered; 0 for a new run) plus
/// --take. Ranks writing at one moment then name the same step though none talks to another, and a set
/// mixing two moments (a job killed between two ranks' writes) is refused naming ranks and steps. Without
/// --take the run reads to the end of its stream, and its snapshot has no step unless given.
std::optional<std::uint64_t> set_step(const RunArgs& a, const SpecRun& run, std::optional<std::uint64_t> take) {
  if (a.step || !take) return a.step;
  const dpipe::RestoreReport& resumed = run.restore_report();
  const std::uint64_t base = resumed.step ? *resumed.step : resumed.delivered;
  std::uint64_t step = 0;
  if (__builtin_add_overflow(base, *take, &step))
    throw dpipe::ConfigError("the set's step would pass 2^64 - 1 (the resumed step " + std::to_string(base) + " + --take " +
                             std::to_string(*take) + "): give --step");
  return step;
}

int cmd_run(const RunArgs& a) {
  const auto spec = read_spec(a.common);
  auto options = run_options(a.common, spec.seed);
  options.trace = a.provenance || a.restore_keys;
  std::optional<std::string> output = a.output;
  if (output) {
    const std::string rank = std::to_string(options.layout->rank);
    for (auto at = output->find("{rank}"); at != std::string::npos; at = output->find("{rank}", at + rank.size()))
      output->replace(at, 6, rank);
    if (a.snapshot_out) check_distinct_outputs(*output, *a.snapshot_out);
  }
  const std::optional<std::uint64_t> take = a.take ? std::optional<std::uint64_t>(static_cast<std::uint64_t>(*a.take)) : std::nullopt;
  dpipe::Engine engine({.threads = a.common.threads});
  const RunStart from{.snapshot_file = a.resume,
                      .set_dir = a.resume_dir,
                      .how = {.rescale = a.rescale,
                              .allow_changed_data = a.allow_changed_data,
                              .max_replay = a.max_replay,
                              .overrides = a.overrides},
                      .write_sources = a.provenance};
  if (!a.overrides.empty() && !from.resumes())
    throw dpipe::ConfigError("--override changes a parameter of a resumed run: give --resume or --resume-dir");
  const std::uint64_t read_before = dpipe::detail::bytes_read_by_process();
  const auto t_restore = Clock::now();
  const auto run = start_run(spec, engine, options, from);
  const double restore_ms = from.resumes() ? seconds_since(t_restore) * 1e3 : 0;
  const std::uint64_t restore_read_bytes = from.resumes() ? dpipe::detail::bytes_read_by_process() - read_before : 0;
  for (const auto& w : run->warnings()) std::cerr << "dpipe: warning: " << w << "\n";
  Output out(output);
  const auto t0 = Clock::now();
  std::uint64_t n = 0;
  try {
    // Runs of up to 256 elements, the output flushed whenever it holds 64 KiB.
    while (!take || n < *take) {
      const std::uint64_t want = take ? std::min<std::uint64_t>(*take - n, 256) : 256;
      const bool more = run->append_lines(out.buffer(), want, Output::kFlushBytes, n);
      out.maybe_flush();
      if (!more) break;
    }
  } catch (...) {
    // Every element delivered before a failure reaches the output, then the error is reported.
    if (const std::string note = out.keep_partial(n); !note.empty()) std::fprintf(stderr, "dpipe: note: %s\n", note.c_str());
    throw;
  }
  out.commit();
  const double secs = seconds_since(t0);
  const std::map<std::string, std::string> meta{{"elements_delivered_by_this_run", std::to_string(n)}};
  const auto t_snapshot = Clock::now();
  if (a.snapshot_out) run->snapshot(meta, a.step).write_file(*a.snapshot_out);
  if (a.snapshot_dir) dpipe::SnapshotSet::write_rank(*a.snapshot_dir, run->reproducible_snapshot(meta, set_step(a, *run, take)));
  const double snapshot_ms = a.snapshot_out || a.snapshot_dir ? seconds_since(t_snapshot) * 1e3 : 0;
  if (a.common.stats)
    print_run_stats(RunFigures{.elements = n,
                               .seconds = secs,
                               .restore_ms = restore_ms,
                               .restore_read_bytes = restore_read_bytes,
                               .snapshot_ms = snapshot_ms,
                               .replayed_elements = run->restore_report().replayed_elements(),
                               .elements_total = run->delivered(),
                               .skipped_records = run->graph().skipped_records(),
                               .skipped_bytes = run->graph().skipped_bytes(),
                               .threads = engine.threads()},
                    run->node_stats());
  return 0;
}

int cmd_bench(const BenchArgs& a) {
  const auto spec = read_spec(a.common);
  const auto options = run_options(a.common, spec.seed);
  const double limit = a.seconds;
  const bool progress = ::isatty(2);
  dpipe::Engine engine({.threads = a.common.threads});
  const auto run = start_run(spec, engine, options);
  const auto t0 = Clock::now();
  auto last_report = t0, last_check = t0;
  std::uint64_t n = 0, stride = 1;
  std::size_t items = 0;
  for (;;) {
    // The clock is read every `stride` elements: every element while they are slow (checks more than
    // 1 ms apart), up to every 1024th while checks come less than 100 µs apart.
    const std::uint64_t got = run->take(stride, items);
    n += got;
    if (got < stride) break;
    const auto now = Clock::now();
    if (now - last_check > std::chrono::milliseconds(1)) stride = 1;
    else if (now - last_check < std::chrono::microseconds(100) && stride < 1024) stride *= 2;
    last_check = now;
    if (limit > 0 && std::chrono::duration<double>(now - t0).count() >= limit) break;
    if (progress && now - last_report > std::chrono::milliseconds(250)) {
      const double s = std::chrono::duration<double>(now - t0).count();
      std::fprintf(stderr, "\r%llu elements  %.1f s  %.0f elements/s   ", static_cast<unsigned long long>(n), s, n / s);
      last_report = now;
    }
  }
  const double secs = seconds_since(t0);
  if (progress) std::fprintf(stderr, "\r%80s\r", "");
  print_bench_figures(n, secs, items, run->layout().num_workers, engine.threads(),
                      a.common.stats ? std::optional(run->node_stats()) : std::nullopt);
  return 0;
}

int cmd_graph(const std::string& spec_text, const std::string& data_root) {
  const auto spec = dpipe::parse_spec(read_text(spec_text), {.data = {.root = data_root}});
  with_pipeline(spec, [](const auto& p) { std::cout << dpipe::Graph::build(*p.def()).to_dot(); });
  return 0;
}

/// What a set summary says of one rank's snapshot.
Json rank_summary(int r, const dpipe::Snapshot& s) {
  std::uint64_t buffered = 0;
  for (const auto& st : s.states)
    for (const auto& f : st.fields)
      if (f.type == dpipe::FieldType::elements && f.elements.tag != "u64") buffered += f.elements.size();
  return {{"rank", r},
          {"elements_delivered", s.meta.elements_delivered},
          {"records", s.states.size()},
          {"buffered_elements", buffered}};
}

/// One JSON object summarising a snapshot set: layout, identity (from rank 0's metadata `m`), and per
/// rank what it holds (`ranks`, from rank_summary).
Json set_summary(const dpipe::SnapshotMeta& m, Json ranks) {
  Json nodes = Json::array();
  for (const auto& g : m.graph) nodes.push_back(dpipe::detail::json_text<Json>(g.key + " (" + g.kind + ")"));
  return {{"world_size", m.layout.world_size},
          {"num_workers", m.layout.num_workers},
          {"seed", m.seed},
          {"epoch", m.epoch},
          {"nodes", std::move(nodes)},
          {"ranks", std::move(ranks)}};
}

Json set_summary(const dpipe::SnapshotSet& set) {
  Json ranks = Json::array();
  for (int r = 0; r < set.world_size(); ++r) ranks.push_back(rank_summary(r, set.rank(r)));
  return set_summary(set.rank(0).meta, std::move(ranks));
}

int cmd_show(const std::string& path) {
  if (std::filesystem::is_directory(path)) std::cout << dump(set_summary(dpipe::SnapshotSet::read_dir(path))) << "\n";
  else std::cout << dpipe::Snapshot::read_file(path).to_json() << "\n";
  return 0;
}

int cmd_which(const WhichArgs& a) {
  const dpipe::SnapshotMeta meta = dpipe::Snapshot::read_meta(a.snapshot);
  const auto spec = dpipe::parse_spec(read_text(a.spec), {.data = {.root = a.data_root}});
  dpipe::RunOptions options{.seed = meta.seed, .epoch = meta.epoch, .layout = meta.layout, .trace = true};
  dpipe::Engine engine;
  const auto run = start_run(spec, engine, options,
                             {.snapshot_file = a.snapshot, .how = {.allow_changed_data = a.allow_changed_data}, .sources_only = true});
  std::string out;
  std::uint64_t written = 0;
  run->append_lines(out, a.steps, std::numeric_limits<std::size_t>::max(), written);
  std::cout << out;
  return 0;
}

int cmd_rescale(const RescaleArgs& a) {
  if (std::filesystem::exists(a.out) && !std::filesystem::is_empty(a.out))
    throw dpipe::ConfigError("output directory '" + a.out + "' is not empty");
  // One new rank at a time: the summary keeps rank 0's metadata and a few numbers per rank.
  std::optional<dpipe::SnapshotMeta> first;
  Json ranks = Json::array();
  dpipe::SnapshotSet::rescale_dir(a.dir, a.out, a.world_size, a.workers, [&](const dpipe::Snapshot& s) {
    if (!first) first = s.meta;
    ranks.push_back(rank_summary(s.meta.layout.rank, s));
  });
  std::cout << dump(set_summary(*first, std::move(ranks))) << "\n";
  return 0;
}

int cmd_ops(const std::string& op, bool json, bool markdown) {
  if (markdown && !op.empty()) throw UsageError("--markdown lists every op; leave OP out");
  if (markdown) std::cout << dpipe::spec_ops_markdown();
  else if (json) std::cout << dpipe::spec_ops_json(op) << "\n";
  else std::cout << dpipe::spec_ops_text(op);
  return 0;
}

std::string describe(const std::exception& e) {
  std::string msg = e.what();
  try {
    std::rethrow_if_nested(e);
  } catch (const std::exception& inner) {
    const std::string cause = describe(inner);
    // A NodeError already quotes its cause: say it once.
    if (msg.size() < cause.size() || msg.compare(msg.size() - cause.size(), cause.size(), cause) != 0)
      msg += ": caused by: " + cause;
  } catch (...) {
    msg += ": caused by an unknown exception";
  }
  return msg;
}

/// `text` as one printable line: control characters as \n, \r, \t or \xNN, and bytes that are not UTF-8
/// as \xNN, so an error keeps its promised one line whatever a snapshot's strings or a file name hold.
std::string one_line(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  const auto escape = [&](unsigned char c) {
    static constexpr char kHex[] = "0123456789abcdef";
    if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else out += {'\\', 'x', kHex[c >> 4], kHex[c & 15]};
  };
  for (std::size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x20 || c == 0x7f) {
      escape(c);
      ++i;
      continue;
    }
    if (c < 0x80) {
      out += static_cast<char>(c);
      ++i;
      continue;
    }
    // A UTF-8 sequence: its length from the lead byte, then continuation bytes (no overlong or surrogate
    // forms: detail::is_utf8 decides, on the sequence alone).
    const std::size_t n = c >= 0xf0 ? (c <= 0xf4 ? 4 : 0) : c >= 0xe0 ? 3 : c >= 0xc2 ? 2 : 0;
    if (n != 0 && i + n <= text.size() && dpipe::detail::is_utf8(text.substr(i, n))) {
      out.append(text.substr(i, n));
      i += n;
    } else {
      escape(c);
      ++i;
    }
  }
  return out;
}

constexpr const char* kUsageHint = "Run 'dpipe --help' or 'dpipe COMMAND --help' for the commands and their options.\n";

}  // namespace

int main(int argc, char** argv) {
  std::ios::sync_with_stdio(false);
  Cli cli;
  build_cli(cli);
  if (argc < 2) {
    std::cerr << cli.app.help();
    return 2;
  }
  const auto known = cli.app.get_subcommands([&](const CLI::App* c) { return c->get_name() == argv[1]; });
  if (argv[1][0] != '-' && known.empty()) {
    std::fprintf(stderr, "dpipe: unknown command '%s'; the commands are run, bench, graph, snapshot and ops\n%s", argv[1],
                 kUsageHint);
    return 2;
  }
  try {
    cli.app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) return cli.app.exit(e);  // --help
    std::fprintf(stderr, "dpipe: %s\n%s", e.what(), kUsageHint);
    return 2;
  }
  try {
    int rc = 0;
    if (*cli.run) rc = cmd_run(cli.run_args);
    else if (*cli.bench) rc = cmd_bench(cli.bench_args);
    else if (*cli.graph) rc = cmd_graph(cli.graph_spec, cli.graph_data_root);
    else if (*cli.show) rc = cmd_show(cli.show_path);
    else if (*cli.rescale) rc = cmd_rescale(cli.rescale_args);
    else if (*cli.which) rc = cmd_which(cli.which_args);
    else if (*cli.ops) rc = cmd_ops(cli.ops_args.op, cli.ops_args.json, cli.ops_args.markdown);
    // What went to standard output must have arrived (a full disk is an error).
    std::cout.flush();
    if (!std::cout || std::fflush(stdout) != 0 || std::ferror(stdout))
      throw dpipe::Error(std::string("cannot write standard output: ") + std::strerror(errno));
    return rc;
  } catch (const UsageError& e) {
    std::fprintf(stderr, "dpipe: %s\n%s", one_line(e.what()).c_str(), kUsageHint);
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dpipe: error: %s\n", one_line(describe(e)).c_str());
    return 1;
  }
}
