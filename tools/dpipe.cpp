// The `dpipe` command-line tool: runs JSON-spec pipelines, writes and resumes snapshots, shows
// snapshots and graphs, benchmarks. A thin layer over the library: specs build typed Pipelines.
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

#include "dpipe/dpipe.hpp"
#include "json_spec.hpp"

namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kUsage = R"(usage:
  dpipe run SPEC [--seed S] [--rank R --world-size W] [--workers K] [--threads T] [--take N]
                 [--output PATH] [--snapshot-out PATH | --snapshot-dir DIR]
                 [--resume PATH | --resume-dir DIR [--rescale]] [--stats]
  dpipe bench SPEC [--seconds T] [--seed S] [--rank R --world-size W] [--workers K] [--threads T] [--stats]
  dpipe graph SPEC
  dpipe snapshot show PATH|DIR
  dpipe snapshot rescale DIR --world-size W --workers K --out DIR2
SPEC is a JSON file, '-' for standard input, or the JSON text itself. '{rank}' in --output is replaced
by the rank. The layout comes from --rank/--world-size, else RANK/WORLD_SIZE, else Open MPI's variables.
)";

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Parsed `--name value` options and flags, each allowed once.
class Args {
 public:
  Args(int argc, char** argv, int from, const std::vector<std::string>& valued, const std::vector<std::string>& flags) {
    for (int i = from; i < argc; ++i) {
      std::string a = argv[i];
      if (a.rfind("--", 0) == 0) {
        const std::string name = a.substr(2);
        if (values_.count(name) || flags_.count(name)) throw UsageError("option --" + name + " is given twice");
        if (std::find(flags.begin(), flags.end(), name) != flags.end()) {
          flags_.insert(name);
        } else if (std::find(valued.begin(), valued.end(), name) != valued.end()) {
          if (i + 1 >= argc) throw UsageError("option --" + name + " needs a value");
          values_[name] = argv[++i];
        } else {
          throw UsageError("unknown option --" + name);
        }
      } else {
        positional.push_back(a);
      }
    }
  }
  std::vector<std::string> positional;
  bool flag(const std::string& n) const { return flags_.count(n) > 0; }
  std::optional<std::string> value(const std::string& n) const {
    auto it = values_.find(n);
    return it == values_.end() ? std::nullopt : std::optional(it->second);
  }
  std::optional<std::int64_t> integer(const std::string& n, std::int64_t lo, std::int64_t hi) const {
    auto v = value(n);
    if (!v) return std::nullopt;
    char* end = nullptr;
    errno = 0;
    const long long x = std::strtoll(v->c_str(), &end, 10);
    if (v->empty() || *end != '\0' || errno != 0 || x < lo || x > hi)
      throw UsageError("--" + n + " must be an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                       "], got '" + *v + "'");
    return x;
  }

 private:
  std::map<std::string, std::string> values_;
  std::set<std::string> flags_;
};

std::string read_text(const std::string& path_or_json) {
  if (!path_or_json.empty() && (path_or_json[0] == '{' || path_or_json[0] == '[')) return path_or_json;
  std::ostringstream ss;
  if (path_or_json == "-") {
    ss << std::cin.rdbuf();
    return ss.str();
  }
  std::ifstream in(path_or_json, std::ios::binary);
  if (!in) throw dpipe::ConfigError("cannot open spec '" + path_or_json + "': " + std::strerror(errno));
  ss << in.rdbuf();
  return ss.str();
}

dpipe::Spec load_spec(const Args& a) {
  if (a.positional.size() != 1) throw UsageError("expected exactly one SPEC argument");
  return dpipe::parse_spec(read_text(a.positional[0]));
}

dpipe::RunOptions run_options(const Args& a, const dpipe::Spec& spec) {
  dpipe::RunOptions o;
  o.seed = spec.seed;
  if (auto s = a.value("seed")) {
    char* end = nullptr;
    errno = 0;
    o.seed = std::strtoull(s->c_str(), &end, 10);
    if (s->empty() || *end || errno || (*s)[0] == '-') throw UsageError("--seed must be a non-negative integer");
  }
  const int workers = static_cast<int>(a.integer("workers", 1, 4096).value_or(1));
  const auto rank = a.integer("rank", 0, 1'000'000);
  const auto world = a.integer("world-size", 1, 1'000'000);
  if (rank.has_value() != world.has_value()) throw UsageError("--rank and --world-size go together");
  if (rank) o.layout = dpipe::Layout{static_cast<int>(*rank), static_cast<int>(*world), workers};
  else o.layout = dpipe::layout_from_environment(workers);
  return o;
}

/// Buffered writer for JSON lines to stdout or a file. A regular file (or a new one) is written under a
/// temporary name beside it and renamed into place only by commit(), so a failed run never leaves a
/// partial file where a good one was. Through a symbolic link, the file it names is replaced (with the
/// same permissions). Other paths (/dev/null, pipes), and files in a directory this process may not
/// write, are written in place.
class Output {
 public:
  explicit Output(const std::optional<std::string>& path) {
    if (!path) return;
    namespace fs = std::filesystem;
    path_ = real_ = *path;
    std::error_code ec;
    const auto status = fs::status(path_, ec);  // of the file a link names
    const bool exists = !ec && fs::exists(status);
    if (exists && !fs::is_regular_file(status)) {  // a device or a pipe
      open_in_place();
      return;
    }
    if (exists) {
      real_ = fs::canonical(path_, ec).string();
      if (ec) real_ = path_;
      if (::access(real_.c_str(), W_OK) != 0) fail_open();  // a read-only file stays refused
    }
    temp_ = real_ + ".tmp-" + std::to_string(::getpid());
    f_ = std::fopen(temp_.c_str(), "wb");
    if (f_) {
      if (exists) ::fchmod(::fileno(f_), static_cast<mode_t>(status.permissions()) & 07777);
      return;
    }
    if (!exists) fail_open();
    temp_.clear();  // no file may be made beside it
    open_in_place();
  }
  Output(const Output&) = delete;
  Output& operator=(const Output&) = delete;
  ~Output() {
    if (f_ != stdout) std::fclose(f_);
    if (!temp_.empty()) std::remove(temp_.c_str());  // not committed or kept: the run failed
  }
  std::string& buffer() { return buf_; }
  void maybe_flush() {
    if (buf_.size() >= (1 << 16)) flush();
  }
  void flush() {
    if (!buf_.empty() && std::fwrite(buf_.data(), 1, buf_.size(), f_) != buf_.size()) fail();
    buf_.clear();
    if (std::fflush(f_) != 0) fail();
  }
  /// Everything written: the file takes its place (a write error now is still an error).
  void commit() {
    flush();
    if (f_ == stdout) return;
    const int closed = std::fclose(f_);
    f_ = stdout;
    if (closed != 0) fail();
    if (!temp_.empty()) {
      if (std::rename(temp_.c_str(), real_.c_str()) != 0) fail();
      temp_.clear();
    }
  }
  /// The run failed after `delivered` elements: they are flushed, and a file output keeps them under
  /// PATH.partial, leaving PATH as it was. Returns a note for the user (empty when there is none).
  std::string keep_partial(std::uint64_t delivered) noexcept {
    try {
      flush();
      if (temp_.empty()) return "";
      const std::string kept = real_ + ".partial";
      const int closed = std::fclose(f_);
      f_ = stdout;
      if (closed != 0 || std::rename(temp_.c_str(), kept.c_str()) != 0) return "";
      temp_.clear();
      return "the " + std::to_string(delivered) + " elements delivered before the error are in '" + kept +
             "'; '" + path_ + "' is unchanged";
    } catch (...) {
      return "";  // the output failed too: the run's own error is the one to report
    }
  }

 private:
  void open_in_place() {
    f_ = std::fopen(real_.c_str(), "wb");
    if (!f_) fail_open();
  }
  [[noreturn]] void fail_open() const {
    throw dpipe::ConfigError("cannot open output '" + path_ + "': " + std::strerror(errno));
  }
  [[noreturn]] void fail() const {
    throw dpipe::Error("cannot write output '" + (path_.empty() ? std::string("standard output") : path_) +
                       "': " + std::strerror(errno));
  }

  FILE* f_ = stdout;
  std::string path_;  // as given; empty: standard output
  std::string real_;  // the file it names, links followed
  std::string temp_;  // the file written until commit(); empty when writing in place
  std::string buf_;
};

/// The engine for --threads (0 or absent: one thread per core).
dpipe::Engine make_engine(const Args& a) {
  return dpipe::Engine({.threads = static_cast<int>(a.integer("threads", 0, 1024).value_or(0))});
}

/// `"nodes": [...]`: per-node elements and seconds, so a user sees which node is the bottleneck.
template <class R>
std::string node_stats_json(R& run) {
  std::string out = "[";
  bool first = true;
  for (const auto& n : run.node_stats()) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "\"instance\": %u, \"elements\": %llu, \"seconds\": %.6f, \"self_seconds\": %.6f}",
                  n.instance, static_cast<unsigned long long>(n.elements), n.seconds, n.self_seconds);
    out += first ? "{\"key\": " : ", {\"key\": ";
    first = false;
    dpipe::append_element_json(out, n.key);
    out += ", \"kind\": ";
    dpipe::append_element_json(out, n.kind);
    out += ", ";
    out += buf;
  }
  return out + "]";
}

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

int cmd_run(int argc, char** argv) {
  const Args a(argc, argv, 2,
               {"seed", "rank", "world-size", "workers", "threads", "take", "output", "snapshot-out", "snapshot-dir",
                "resume", "resume-dir"},
               {"stats", "rescale"});
  if (a.value("snapshot-out") && a.value("snapshot-dir")) throw UsageError("--snapshot-out and --snapshot-dir exclude each other");
  if (a.value("resume") && a.value("resume-dir")) throw UsageError("--resume and --resume-dir exclude each other");
  if (a.flag("rescale") && !a.value("resume-dir")) throw UsageError("--rescale goes with --resume-dir");
  const auto spec = load_spec(a);
  auto options = run_options(a, spec);
  options.collect_stats = a.flag("stats");
  const auto take = a.integer("take", 0, INT64_MAX);
  return spec.pipeline.visit(
      [&](const auto& pipeline) {
        using T = typename std::decay_t<decltype(pipeline)>::element_type;
        dpipe::Engine engine = make_engine(a);
        double restore_ms = 0;
        std::uint64_t replayed = 0;
        const auto t_restore = Clock::now();
        auto run = [&] {
          if (auto path = a.value("resume")) {
            auto r = engine.resume(pipeline, dpipe::Snapshot::read_file(*path), options);
            restore_ms = seconds_since(t_restore) * 1e3;
            replayed = r.restore_report().replayed_elements();
            return r;
          }
          if (auto dir = a.value("resume-dir")) {
            auto r = engine.resume(pipeline, dpipe::SnapshotSet::read_dir(*dir), options, {.rescale = a.flag("rescale")});
            restore_ms = seconds_since(t_restore) * 1e3;
            replayed = r.restore_report().replayed_elements();
            return r;
          }
          return engine.start(pipeline, options);
        }();
        std::optional<std::string> output = a.value("output");
        if (output) {
          const std::string rank = std::to_string(options.layout->rank);
          for (auto at = output->find("{rank}"); at != std::string::npos; at = output->find("{rank}", at + rank.size()))
            output->replace(at, 6, rank);
        }
        Output out(output);
        const auto t0 = Clock::now();
        std::uint64_t n = 0;
        try {
          while (!take || n < static_cast<std::uint64_t>(*take)) {
            auto x = run.next();
            if (!x) break;
            dpipe::append_element_json(out.buffer(), *x);
            out.buffer() += '\n';
            out.maybe_flush();
            ++n;
          }
        } catch (...) {
          // Every element delivered before a failure reaches the output, then the error is reported.
          if (const std::string note = out.keep_partial(n); !note.empty())
            std::fprintf(stderr, "dpipe: note: %s\n", note.c_str());
          throw;
        }
        out.commit();
        const double secs = seconds_since(t0);
        if (auto path = a.value("snapshot-out"))
          run.snapshot({{"elements_delivered_by_this_run", std::to_string(n)}}).write_file(*path);
        if (auto dir = a.value("snapshot-dir"))
          dpipe::SnapshotSet::write_rank(*dir, run.snapshot({{"elements_delivered_by_this_run", std::to_string(n)}}));
        if (a.flag("stats")) {
          std::fprintf(stderr,
                       "{\"elements\": %llu, \"seconds\": %.6f, \"restore_ms\": %.3f, \"replayed_elements\": %llu, "
                       "\"elements_total\": %llu, \"skipped_records\": %llu, \"threads\": %d, \"nodes\": %s}\n",
                       static_cast<unsigned long long>(n), secs, restore_ms, static_cast<unsigned long long>(replayed),
                       static_cast<unsigned long long>(run.delivered()),
                       static_cast<unsigned long long>(run.graph().skipped_records()), engine.threads(),
                       node_stats_json(run).c_str());
        }
        (void)sizeof(T);
        return 0;
      });
}

int cmd_bench(int argc, char** argv) {
  const Args a(argc, argv, 2, {"seconds", "seed", "rank", "world-size", "workers", "threads"}, {"stats"});
  const auto spec = load_spec(a);
  auto options = run_options(a, spec);
  options.collect_stats = a.flag("stats");
  double limit = 0;
  if (auto s = a.value("seconds")) {
    char* end = nullptr;
    limit = std::strtod(s->c_str(), &end);
    if (s->empty() || *end || !(limit > 0)) throw UsageError("--seconds must be a positive number");
  }
  const bool progress = ::isatty(2);
  return spec.pipeline.visit(
      [&](const auto& pipeline) {
        dpipe::Engine engine = make_engine(a);
        auto run = engine.start(pipeline, options);
        const auto t0 = Clock::now();
        auto last_report = t0, last_check = t0;
        std::uint64_t n = 0, stride = 1, next_check = 1;
        std::size_t sink = 0;
        while (auto x = run.next()) {
          if constexpr (requires { x->size(); }) sink += x->size();
          else sink += 1;
          // The clock is read every `stride` elements: every element while they are slow (checks more
          // than 1 ms apart), up to every 1024th while checks come less than 100 µs apart.
          if (++n >= next_check) {
            const auto now = Clock::now();
            if (now - last_check > std::chrono::milliseconds(1)) stride = 1;
            else if (now - last_check < std::chrono::microseconds(100) && stride < 1024) stride *= 2;
            last_check = now;
            next_check = n + stride;
            if (limit > 0 && std::chrono::duration<double>(now - t0).count() >= limit) break;
            if (progress && now - last_report > std::chrono::milliseconds(250)) {
              const double s = std::chrono::duration<double>(now - t0).count();
              std::fprintf(stderr, "\r%llu elements  %.1f s  %.0f elements/s   ", static_cast<unsigned long long>(n), s,
                           n / s);
              last_report = now;
            }
          }
        }
        const double secs = seconds_since(t0);
        if (progress) std::fprintf(stderr, "\r%80s\r", "");
        std::printf("{\"elements\": %llu, \"seconds\": %.6f, \"elements_per_s\": %.1f, \"items\": %zu, "
                    "\"workers\": %d, \"threads\": %d%s}\n",
                    static_cast<unsigned long long>(n), secs, secs > 0 ? n / secs : 0.0, sink,
                    run.layout().num_workers, engine.threads(),
                    a.flag("stats") ? (", \"nodes\": " + node_stats_json(run)).c_str() : "");
        return 0;
      });
}

int cmd_graph(int argc, char** argv) {
  const Args a(argc, argv, 2, {}, {});
  const auto spec = load_spec(a);
  spec.pipeline.visit([](const auto& p) { std::cout << dpipe::Graph::build(*p.def()).to_dot(); });
  return 0;
}

/// One JSON object summarising a snapshot set: layout, identity, and per rank what it holds.
std::string set_summary(const dpipe::SnapshotSet& set) {
  const auto& m = set.rank(0).meta;
  std::string out = "{\"world_size\": " + std::to_string(set.world_size()) +
                    ", \"num_workers\": " + std::to_string(set.num_workers()) + ", \"seed\": " +
                    std::to_string(m.seed) + ", \"epoch\": " + std::to_string(m.epoch) + ", \"nodes\": [";
  for (std::size_t i = 0; i < m.graph.size(); ++i) {
    out += i ? ", " : "";
    dpipe::append_element_json(out, m.graph[i].key + " (" + m.graph[i].kind + ")");
  }
  out += "], \"ranks\": [";
  for (int r = 0; r < set.world_size(); ++r) {
    const auto& s = set.rank(r);
    std::uint64_t buffered = 0;
    for (const auto& st : s.states)
      for (const auto& f : st.fields)
        if (f.type == dpipe::FieldType::elements && f.elements.tag != "u64") buffered += f.elements.size();
    out += (r ? ", " : "") + std::string("{\"rank\": ") + std::to_string(r) + ", \"elements_delivered\": " +
           std::to_string(s.meta.elements_delivered) + ", \"records\": " + std::to_string(s.states.size()) +
           ", \"buffered_elements\": " + std::to_string(buffered) + "}";
  }
  return out + "]}";
}

int cmd_snapshot(int argc, char** argv) {
  const std::string sub = argc >= 3 ? argv[2] : "";
  if (sub == "show") {
    const Args a(argc, argv, 3, {}, {});
    if (a.positional.size() != 1) throw UsageError("expected exactly one snapshot PATH or set DIR");
    if (std::filesystem::is_directory(a.positional[0]))
      std::cout << set_summary(dpipe::SnapshotSet::read_dir(a.positional[0])) << "\n";
    else
      std::cout << dpipe::Snapshot::read_file(a.positional[0]).to_json() << "\n";
    return 0;
  }
  if (sub == "rescale") {
    const Args a(argc, argv, 3, {"world-size", "workers", "out"}, {});
    if (a.positional.size() != 1) throw UsageError("expected exactly one snapshot set DIR");
    const auto world = a.integer("world-size", 1, 1'000'000), workers = a.integer("workers", 1, 4096);
    const auto out = a.value("out");
    if (!world || !workers || !out) throw UsageError("snapshot rescale needs --world-size, --workers and --out");
    if (std::filesystem::exists(*out) && !std::filesystem::is_empty(*out))
      throw dpipe::ConfigError("output directory '" + *out + "' is not empty");
    const auto set = dpipe::SnapshotSet::read_dir(a.positional[0]).rescaled(static_cast<int>(*world), static_cast<int>(*workers));
    set.write_dir(*out);
    std::cout << set_summary(set) << "\n";
    return 0;
  }
  throw UsageError("expected 'dpipe snapshot show PATH|DIR' or 'dpipe snapshot rescale DIR ...'");
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

}  // namespace

int main(int argc, char** argv) {
  std::ios::sync_with_stdio(false);
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string cmd = argv[1];
  try {
    int rc = 0;
    if (cmd == "run") rc = cmd_run(argc, argv);
    else if (cmd == "bench") rc = cmd_bench(argc, argv);
    else if (cmd == "graph") rc = cmd_graph(argc, argv);
    else if (cmd == "snapshot") rc = cmd_snapshot(argc, argv);
    else throw UsageError("unknown command '" + cmd + "'");
    // What went to standard output must have arrived (a full disk is an error).
    std::cout.flush();
    if (!std::cout || std::fflush(stdout) != 0 || std::ferror(stdout))
      throw dpipe::Error(std::string("cannot write standard output: ") + std::strerror(errno));
    return rc;
  } catch (const UsageError& e) {
    std::fprintf(stderr, "dpipe: %s\n%s", e.what(), kUsage);
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dpipe: error: %s\n", describe(e).c_str());
    return 1;
  }
}
