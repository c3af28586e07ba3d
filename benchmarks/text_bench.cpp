// The record nodes against hand-written loops doing the same work, paired in one run (paired.hpp):
// parse_json / a simdjson loop extracting the same fields, pack / a hand-written greedy packer over the
// same token arrays, tokenize / a loop calling SentencePiece on the same lines, and tokenize on two
// workers / on one. The model is trained here by spm_train on generated text (nothing downloaded).
#include <benchmark/benchmark.h>
#include <sentencepiece_processor.h>
#include <simdjson.h>

#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "dpipe/dpipe.hpp"
#include "paired.hpp"

namespace {

using dpipe::bench::paired;
using ParseJsonFields = std::vector<dpipe::JsonField>;

/// A vocabulary of 3,000 made-up words of two to four syllables, so a tokenizer has pieces to learn.
const std::vector<std::string>& vocabulary() {
  static const std::vector<std::string> words = [] {
    const char* const syllables[] = {"ka", "lo", "mi", "ne", "ru", "ta", "shi", "po", "ve", "dan", "gor", "tel",
                                     "qua", "zim", "fe", "bo", "ly", "xen", "or", "at"};
    std::mt19937_64 g(9);
    std::vector<std::string> v;
    for (int i = 0; i < 3000; ++i) {
      std::string w;
      for (int k = 0, n = 2 + int(g() % 3); k < n; ++k) w += syllables[g() % std::size(syllables)];
      v.push_back(w);
    }
    return v;
  }();
  return words;
}

std::string sentence(std::mt19937_64& g, int words) {
  const auto& v = vocabulary();
  std::string s;
  for (int k = 0; k < words; ++k) {
    // Zipf-like: low ids far more often, as in text.
    const std::size_t id = std::size_t(double(v.size()) * std::pow(double(g() % 1'000'000) / 1e6, 3.0));
    s += std::string(k ? " " : "") + v[std::min(id, v.size() - 1)];
  }
  return s;
}

/// JSON lines of documents: an id, ~40 words of text, and a field the parsers skip.
const std::vector<std::string>& json_lines() {
  static const std::vector<std::string> lines = [] {
    std::mt19937_64 g(1);
    std::vector<std::string> v;
    for (int i = 0; i < 50'000; ++i)
      v.push_back("{\"doc\": " + std::to_string(i) + ", \"text\": \"" + sentence(g, 10 + int(g() % 60)) +
                  "\", \"meta\": {\"source\": \"web\", \"score\": 0.5}}");
    return v;
  }();
  return lines;
}

const std::vector<std::string>& text_lines() {
  static const std::vector<std::string> lines = [] {
    std::mt19937_64 g(2);
    std::vector<std::string> v;
    for (int i = 0; i < 20'000; ++i) v.push_back(sentence(g, 10 + int(g() % 60)));
    return v;
  }();
  return lines;
}

/// The bytes of `lines` as a file holds them (a newline each).
std::int64_t file_bytes(const std::vector<std::string>& lines) {
  std::int64_t n = 0;
  for (const auto& l : lines) n += std::int64_t(l.size() + 1);
  return n;
}

/// `lines` written to a file in the benchmark's directory (one per line), for the readers to read.
std::string written(const std::vector<std::string>& lines, const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / ("dpipe-text-bench-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / name).string();
  std::ofstream f(path);
  for (const auto& l : lines) f << l << '\n';
  return path;
}

const std::string& model_path() {
  static const std::string path = [] {
    const auto dir = std::filesystem::temp_directory_path() / ("dpipe-text-bench-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    {
      std::ofstream f(dir / "corpus.txt");
      std::mt19937_64 g(3);
      for (int i = 0; i < 5000; ++i) f << sentence(g, 5 + int(g() % 30)) << '\n';
    }
    const std::string cmd = "spm_train --input=" + (dir / "corpus.txt").string() + " --model_prefix=" + (dir / "m").string() +
                            " --vocab_size=1000 --minloglevel=2 > /dev/null 2>&1";
    if (std::system(cmd.c_str()) != 0) {
      std::fprintf(stderr, "text_bench: spm_train failed (apt-get install sentencepiece)\n");
      std::exit(1);
    }
    return (dir / "m.model").string();
  }();
  return path;
}

dpipe::RunOptions one_worker() { return {.seed = 1, .layout = dpipe::Layout{0, 1, 1}, .inline_workers = true}; }

template <class T>
std::uint64_t drain(dpipe::Engine& e, const dpipe::Pipeline<T>& p, dpipe::RunOptions o) {
  auto run = e.start(p, o);
  std::uint64_t n = 0;
  while (auto x = run.next()) n += 1;
  return n;
}

/// The loop body a user writes: parse a line with simdjson, keep its two fields, hand them on in chunks
/// of 64 (as the pipeline's).
struct DocExtractor {
  struct Doc {
    std::int64_t doc;
    std::string text;
  };
  simdjson::dom::parser parser;
  std::vector<Doc> docs;
  void operator()(std::string_view line) {
    simdjson::dom::element d;
    if (parser.parse(line.data(), line.size()).get(d)) std::abort();
    std::int64_t id = 0;
    std::string_view text;
    if (d["doc"].get_int64().get(id) || d["text"].get_string().get(text)) std::abort();
    docs.push_back({id, std::string(text)});
    if (docs.size() == 64) docs.clear();
  }
};

/// `source | parse_json` of the two fields / a getline + simdjson loop over the same file.
template <class Source>
void parse_json_vs_getline_loop(benchmark::State& state, const std::string& file_name, Source source) {
  const auto& lines = json_lines();
  const std::string file = written(lines, file_name);
  const auto p = source(file) |
                 dpipe::parse_json({.fields = {dpipe::JsonField::parse("doc", "int64"), dpipe::JsonField::parse("text", "string")}});
  dpipe::Engine e({.threads = 1});
  paired(
      state, file_bytes(lines), [&] { benchmark::DoNotOptimize(drain(e, p, one_worker())); },
      [&] {
        std::ifstream f(file);
        std::string l;
        DocExtractor extract;
        while (std::getline(f, l)) extract(l);
        benchmark::DoNotOptimize(extract.docs.data());
      });
}

/// parse_json after `lines` (a string per line) / the getline + simdjson loop.
void BM_ParseJsonVsSimdjsonLoop(benchmark::State& state) {
  parse_json_vs_getline_loop(state, "docs.jsonl", [](const std::string& f) { return dpipe::lines({f}, {.shuffle_shards = false}); });
}

/// parse_json reading `line_blocks` (lines parsed where they lie in the block) / the getline + simdjson
/// loop: the way to read a JSON-lines corpus at speed.
void BM_ParseJsonOnBlocksVsSimdjsonLoop(benchmark::State& state) {
  parse_json_vs_getline_loop(state, "docs3.jsonl",
                             [](const std::string& f) { return dpipe::line_blocks({f}, {.shuffle_shards = false}); });
}

/// The node alone: parse_json after `lines` / the same simdjson loop run by the consumer on the lines'
/// stream (both read the file through `lines`, whose own cost against getline is data_bench's).
void BM_ParseJsonVsLoopOverLines(benchmark::State& state) {
  const auto& lines = json_lines();
  const std::int64_t bytes = file_bytes(lines);
  const std::string file = written(lines, "docs2.jsonl");
  const auto source = dpipe::lines({file}, {.shuffle_shards = false});
  const auto p = source | dpipe::parse_json({.fields = {dpipe::JsonField::parse("doc", "int64"), dpipe::JsonField::parse("text", "string")}});
  dpipe::Engine e({.threads = 1});
  paired(
      state, bytes, [&] { benchmark::DoNotOptimize(drain(e, p, one_worker())); },
      [&] {
        auto run = e.start(source, one_worker());
        DocExtractor extract;
        while (auto l = run.next()) extract(*l);
        benchmark::DoNotOptimize(extract.docs.data());
      });
}

/// mix of two parsed corpora (equal weights, every element of both) / the same two concatenated.
void BM_MixVsConcat(benchmark::State& state) {
  const auto& lines = json_lines();
  const std::int64_t bytes = 2 * file_bytes(lines);
  const std::string a = written(lines, "mix_a.jsonl"), b = written(lines, "mix_b.jsonl");
  const ParseJsonFields fields = {dpipe::JsonField::parse("doc", "int64"), dpipe::JsonField::parse("text", "string")};
  auto corpus = [&](const std::string& f) { return dpipe::lines({f}, {.shuffle_shards = false}) | dpipe::parse_json({.fields = fields}); };
  const auto mixed = dpipe::mix(std::vector{corpus(a), corpus(b)}, {.weights = {1, 1}});
  const auto concatenated = dpipe::concat(corpus(a), corpus(b));
  dpipe::Engine e({.threads = 1});
  paired(
      state, bytes, [&] { benchmark::DoNotOptimize(drain(e, mixed, one_worker())); },
      [&] { benchmark::DoNotOptimize(drain(e, concatenated, one_worker())); });
}

/// Documents of 1 to 2,000 tokens, as records.
const std::vector<dpipe::Value>& documents() {
  static const std::vector<dpipe::Value> docs = [] {
    std::mt19937_64 g(4);
    std::vector<dpipe::Value> v;
    std::vector<std::int64_t> t;
    for (int i = 0; i < 20'000; ++i) {
      t.resize(1 + g() % 2000);
      for (auto& x : t) x = std::int64_t(g() % 32000);
      dpipe::Value r = dpipe::make_record(2);
      dpipe::set_field(r, "doc", dpipe::Value::integer(i));
      dpipe::set_field(r, "tokens", dpipe::int64_array(t));
      v.push_back(std::move(r));
    }
    return v;
  }();
  return docs;
}

void BM_PackVsHandWritten(benchmark::State& state) {
  const auto& docs = documents();
  constexpr std::size_t kSeqLen = 1024;
  std::int64_t bytes = 0;
  for (const auto& d : docs) bytes += std::int64_t(dpipe::find_field(d, "tokens")->as_array().data.size());
  const auto p = dpipe::from_vector(docs) | dpipe::pack({.seq_len = kSeqLen});
  dpipe::Engine e({.threads = 1});
  paired(
      state, bytes, [&] { benchmark::DoNotOptimize(drain(e, p, one_worker())); },
      [&] {
        // Rows of tokens, segment ids and positions, documents end to end, cut every kSeqLen.
        struct Row {
          std::vector<std::int64_t> tokens, segments, positions;
        };
        std::vector<Row> rows;
        Row row;
        std::int64_t segment = 0;
        std::vector<std::int64_t> t;
        for (const auto& d : docs) {
          dpipe::read_int64s(*dpipe::find_field(d, "tokens"), t);
          for (std::size_t at = 0; at < t.size();) {
            const std::size_t take = std::min(kSeqLen - row.tokens.size(), t.size() - at);
            ++segment;
            row.tokens.insert(row.tokens.end(), t.begin() + std::ptrdiff_t(at), t.begin() + std::ptrdiff_t(at + take));
            row.segments.insert(row.segments.end(), take, segment);
            for (std::size_t k = 0; k < take; ++k) row.positions.push_back(std::int64_t(at + k));
            at += take;
            if (row.tokens.size() == kSeqLen) {
              rows.push_back(std::move(row));
              row = {};
              segment = 0;
              if (rows.size() == 64) rows.clear();
            }
          }
        }
        benchmark::DoNotOptimize(rows.data());
      });
}

void BM_TokenizeVsEncodeLoop(benchmark::State& state) {
  const auto& lines = text_lines();
  const std::int64_t bytes = file_bytes(lines);
  const std::string file = written(lines, "text.txt");
  const auto p = dpipe::lines({file}, {.shuffle_shards = false}) | dpipe::tokenize({.model = model_path()});
  sentencepiece::SentencePieceProcessor sp;
  if (!sp.Load(model_path()).ok()) std::abort();
  dpipe::Engine e({.threads = 1});
  paired(
      state, bytes, [&] { benchmark::DoNotOptimize(drain(e, p, one_worker())); },
      [&] {
        std::ifstream f(file);
        std::string l;
        std::vector<int> ids;
        std::vector<std::vector<std::int64_t>> out;
        while (std::getline(f, l)) {
          ids.clear();
          if (!sp.Encode(l, &ids).ok()) std::abort();
          out.emplace_back(ids.begin(), ids.end());
          if (out.size() == 64) out.clear();
        }
        benchmark::DoNotOptimize(out.data());
      });
}

void BM_TokenizeTwoWorkersVsOne(benchmark::State& state) {
  const auto& lines = text_lines();
  const std::int64_t bytes = file_bytes(lines);
  const std::string file = written(lines, "text2.txt");
  const auto p = dpipe::lines({file}, {.logical_shards = 64}) | dpipe::tokenize({.model = model_path()});
  dpipe::Engine e({.threads = 2});
  paired(
      state, bytes, [&] { benchmark::DoNotOptimize(drain(e, p, {.seed = 1, .layout = dpipe::Layout{0, 1, 2}})); },
      [&] { benchmark::DoNotOptimize(drain(e, p, {.seed = 1, .layout = dpipe::Layout{0, 1, 1}})); });
}

}  // namespace

BENCHMARK(BM_ParseJsonVsSimdjsonLoop)->Unit(benchmark::kMillisecond)->UseManualTime()->Repetitions(3);
BENCHMARK(BM_ParseJsonOnBlocksVsSimdjsonLoop)->Unit(benchmark::kMillisecond)->UseManualTime()->Repetitions(3);
BENCHMARK(BM_ParseJsonVsLoopOverLines)->Unit(benchmark::kMillisecond)->UseManualTime()->Repetitions(3);
BENCHMARK(BM_MixVsConcat)->Unit(benchmark::kMillisecond)->UseManualTime()->Repetitions(3);
BENCHMARK(BM_PackVsHandWritten)->Unit(benchmark::kMillisecond)->UseManualTime()->Repetitions(3);
BENCHMARK(BM_TokenizeVsEncodeLoop)->Unit(benchmark::kMillisecond)->UseManualTime()->Repetitions(3);
BENCHMARK(BM_TokenizeTwoWorkersVsOne)->Unit(benchmark::kMillisecond)->UseManualTime()->Repetitions(3);
BENCHMARK_MAIN();
