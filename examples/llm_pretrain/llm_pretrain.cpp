// A pretraining loader end to end, on generated data (nothing downloaded):
//
//   two JSON-lines corpora (prose, code) → parse_json → tokenize (a SentencePiece model trained here)
//   → mix 70/30 → pack(1024) → batch(8) → prefetch(2), two workers per rank
//
// Two ranks take a few batches each and write a snapshot set (a checkpoint); the job "dies"; three ranks
// resume the set rescaled to their layout and run to the end of the epoch. Every document's tokens must
// arrive exactly once: each token of a packed row is (its segment's document, its position), and the
// pairs are checked against a plain pass over the corpora.
//
//   llm_pretrain [WORK_DIR] [--prepare-only] [--data]
//
// WORK_DIR (default: a new temporary directory) receives the corpora, the model, the checkpoint set,
// llm_pretrain.json (the same pipeline as a spec for `dpipe run`) and expected.json (each document's
// token count, for checks of other runs). --prepare-only stops after writing them. The checkpoint holds
// the rows in flight as restore keys (at most 64 KiB per rank, checked); --data saves them as data
// instead, to compare.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "dpipe/dpipe.hpp"

namespace fs = std::filesystem;

namespace {

constexpr int kProseDocs = 9000, kCodeDocs = 4500;
constexpr std::int64_t kCodeIds = 1'000'000;  // code documents' ids start here
constexpr std::int64_t kSeqLen = 1024, kBatch = 8;

const char* const kProse[] = {"the", "loader", "reads", "every", "shard", "once", "and", "a", "model", "learns",
                              "from", "packed", "rows", "of", "tokens", "while", "ranks", "come", "and", "go"};
const char* const kCode[] = {"def", "f(x):", "return", "x", "+", "1", "for", "i", "in", "range(n):", "if", "not",
                             "y:", "print(i)", "class", "Loader:", "self.rank", "=", "rank", "yield"};

/// Writes a corpus of JSON lines {"doc": ID, "text": ...}; every 97th line is broken (parse_json skips it).
void write_corpus(const fs::path& path, int docs, std::int64_t first_id, const char* const* words, std::uint64_t seed) {
  std::mt19937_64 g(seed);
  std::ofstream f(path);
  for (int i = 0; i < docs; ++i) {
    if (i % 97 == 13) {
      f << "{\"doc\": " << first_id + i << ", \"text\": \"unterminated\n";
      continue;
    }
    f << "{\"doc\": " << first_id + i << ", \"text\": \"";
    const int n = 5 + static_cast<int>(g() % 120);
    for (int k = 0; k < n; ++k) f << (k ? " " : "") << words[g() % 20];
    f << "\"}\n";
  }
}

std::string json_path(const fs::path& p) { return "\"" + p.string() + "\""; }

/// The pipeline as a spec, for `dpipe run` (the same nodes as pipeline() below).
std::string spec_text(const fs::path& dir) {
  auto corpus = [&](const char* file) {
    return "[{\"op\": \"lines\", \"files\": [" + json_path(dir / file) + "], \"logical_shards\": 32}, "
           "{\"op\": \"parse_json\", \"fields\": {\"doc\": \"int64\", \"text\": \"string\"}, \"on_error\": \"skip\"}, "
           "{\"op\": \"tokenize\", \"model\": " + json_path(dir / "spm.model") + ", \"bos\": true, \"eos\": true}]";
  };
  return "{\"seed\": 7, \"pipeline\": [{\"op\": \"mix\", \"weights\": [0.7, 0.3], \"with\": [" + corpus("prose.jsonl") +
         ", " + corpus("code.jsonl") + "]}, {\"op\": \"pack\", \"seq_len\": " + std::to_string(kSeqLen) +
         "}, {\"op\": \"batch\", \"size\": " + std::to_string(kBatch) + "}, {\"op\": \"prefetch\", \"depth\": 2}]}\n";
}

dpipe::Pipeline<dpipe::Value> documents(const fs::path& file, const fs::path& model) {
  return dpipe::lines({file.string()}, {.logical_shards = 32}) |
         dpipe::parse_json({.fields = {dpipe::JsonField::parse("doc", "int64"), dpipe::JsonField::parse("text", "string")},
                            .on_error = dpipe::OnDataError::skip}) |
         dpipe::tokenize({.model = model.string(), .bos = true, .eos = true});
}

dpipe::Pipeline<std::vector<dpipe::Value>> pipeline(const fs::path& dir) {
  const fs::path model = dir / "spm.model";
  return dpipe::mix(std::vector{documents(dir / "prose.jsonl", model), documents(dir / "code.jsonl", model)},
                    {.weights = {0.7, 0.3}}) |
         dpipe::pack({.seq_len = kSeqLen}) | dpipe::batch({.size = kBatch}) |
         dpipe::prefetch({.depth = 2});  // each worker runs at most 2 batches ahead: a small checkpoint
}

std::vector<std::int64_t> column(const dpipe::Value& row, const char* name) {
  std::vector<std::int64_t> out;
  dpipe::read_int64s(*dpipe::find_field(row, name), out);
  return out;
}

/// Counts every token of a batch under its (document, position).
void count_tokens(const std::vector<dpipe::Value>& batch, std::map<std::pair<std::int64_t, std::int64_t>, int>& seen) {
  for (const dpipe::Value& row : batch) {
    const auto segments = column(row, "segment_ids"), positions = column(row, "positions");
    const auto& docs = std::get<std::vector<dpipe::Value>>(dpipe::find_field(row, "doc")->data);
    for (std::size_t k = 0; k < segments.size(); ++k)
      if (segments[k] > 0)
        ++seen[{std::get<std::int64_t>(docs[static_cast<std::size_t>(segments[k] - 1)].data), positions[k]}];
  }
}

}  // namespace

int main(int argc, char** argv) {
  bool prepare_only = false, keys = true;
  fs::path dir;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--prepare-only") == 0) prepare_only = true;
    else if (std::strcmp(argv[i], "--data") == 0) keys = false;
    else dir = argv[i];
  }
  const bool own_dir = dir.empty();  // a temporary directory, removed at the end
  if (own_dir) dir = fs::temp_directory_path() / ("dpipe-llm-pretrain-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  try {
    // 1. Data and model.
    write_corpus(dir / "prose.jsonl", kProseDocs, 0, kProse, 1);
    write_corpus(dir / "code.jsonl", kCodeDocs, kCodeIds, kCode, 2);
    {
      std::ofstream text(dir / "spm_corpus.txt");
      std::mt19937_64 g(3);
      for (int i = 0; i < 4000; ++i) {
        const char* const* words = i % 3 ? kProse : kCode;
        for (int k = 0, n = 5 + int(g() % 30); k < n; ++k) text << (k ? " " : "") << words[g() % 20];
        text << '\n';
      }
    }
    const std::string train = "spm_train --input=" + (dir / "spm_corpus.txt").string() + " --model_prefix=" +
                              (dir / "spm").string() + " --vocab_size=64 --minloglevel=2 > /dev/null 2>&1";
    if (std::system(train.c_str()) != 0) {
      std::fprintf(stderr, "llm_pretrain: spm_train failed (apt-get install sentencepiece)\n");
      return 1;
    }
    std::ofstream(dir / "llm_pretrain.json") << spec_text(dir);

    // The reference: each document's token count, from a plain single-worker pass over the corpora.
    dpipe::Engine engine;
    std::map<std::int64_t, std::int64_t> expected;
    for (const char* file : {"prose.jsonl", "code.jsonl"}) {
      auto run = engine.start(documents(dir / file, dir / "spm.model"), {.seed = 7, .layout = dpipe::Layout{0, 1, 1}});
      for (auto&& d : run)
        expected[std::get<std::int64_t>(dpipe::find_field(d, "doc")->data)] =
            static_cast<std::int64_t>(column(d, "tokens").size());
    }
    {
      std::ofstream e(dir / "expected.json");
      e << "{";
      bool first = true;
      for (const auto& [doc, n] : expected) e << (first ? "" : ", ") << "\"" << doc << "\": " << n, first = false;
      e << "}\n";
    }
    std::printf("data: %d prose and %d code documents (%zu parse, the rest are broken lines), model %s\n", kProseDocs,
                kCodeDocs, expected.size(), (dir / "spm.model").c_str());
    if (prepare_only) return 0;

    // 2. Two ranks × two workers take 3 batches each and write their checkpoint: a snapshot set.
    const auto p = pipeline(dir);
    const fs::path ckpt = dir / "checkpoint";
    fs::remove_all(ckpt);
    std::map<std::pair<std::int64_t, std::int64_t>, int> seen;
    std::uint64_t rows_before = 0;
    for (int rank = 0; rank < 2; ++rank) {
      // Traced: the checkpoint holds the prefetched batches and pack's open rows as restore keys.
      auto run = engine.start(p, {.seed = 7, .layout = dpipe::Layout{rank, 2, 2}, .trace = keys});
      for (int b = 0; b < 3; ++b)
        if (auto batch = run.next()) {
          count_tokens(*batch, seen);
          rows_before += batch->size();
        }
      dpipe::SnapshotSet::write_rank(ckpt.string(), run.reproducible_snapshot({}, 3));
    }
    std::uintmax_t bytes = 0;
    for (const auto& f : fs::directory_iterator(ckpt)) bytes += f.is_regular_file() ? f.file_size() : 0;
    std::printf("2 ranks x 2 workers: %llu rows, then a checkpoint of %.1f KiB per rank (%s)\n",
                (unsigned long long)rows_before, double(bytes) / 2 / 1024,
                keys ? "restore keys in place of the rows in flight" : "the rows in flight as data");
    if (keys && bytes > 2 * 64 * 1024) {
      std::fprintf(stderr, "llm_pretrain: the checkpoint holds %.1f KiB per rank, more than 64 KiB\n", double(bytes) / 2 / 1024);
      return 1;
    }

    // 3. The job dies. Three ranks × two workers resume the checkpoint, rescaled, to the end of the epoch.
    std::uint64_t rows_after = 0, recomputed = 0;
    double restore_ms = 0;
    for (int rank = 0; rank < 3; ++rank) {
      const dpipe::Layout layout{rank, 3, 2};
      const auto t0 = std::chrono::steady_clock::now();
      auto run = engine.resume(p, dpipe::SnapshotSet::read_rank(ckpt.string(), layout, true), {.seed = 7, .layout = layout});
      restore_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      recomputed += run.restore_report().recomputed_elements();
      for (auto&& batch : run) {
        count_tokens(batch, seen);
        rows_after += batch.size();
      }
    }
    std::printf("3 ranks x 2 workers: resumed (%.2f ms per rank to read and restore, %llu elements made again from "
                "their keys), %llu more rows\n",
                restore_ms / 3, (unsigned long long)recomputed, (unsigned long long)rows_after);
    if (keys && recomputed == 0) {
      std::fprintf(stderr, "llm_pretrain: the resume made nothing again from restore keys\n");
      return 1;
    }

    // 4. Every document's tokens exactly once.
    std::int64_t tokens = 0, wrong = 0;
    for (const auto& [doc, n] : expected) {
      for (std::int64_t pos = 0; pos < n; ++pos) {
        const auto it = seen.find({doc, pos});
        if (it == seen.end() || it->second != 1) {
          if (wrong++ < 5)
            std::fprintf(stderr, "document %lld, position %lld: delivered %d times\n", (long long)doc, (long long)pos,
                         it == seen.end() ? 0 : it->second);
        }
      }
      tokens += n;
    }
    if (static_cast<std::int64_t>(seen.size()) != tokens) wrong += 1;
    if (wrong) {
      std::fprintf(stderr, "llm_pretrain: %lld tokens lost, repeated or unknown\n", (long long)wrong);
      return 1;
    }
    std::printf("every document's tokens delivered exactly once: %zu documents, %lld tokens, 2x2 -> 3x2 ranks x workers\n",
                expected.size(), (long long)tokens);
    if (own_dir) fs::remove_all(dir);
  } catch (const dpipe::Error& e) {
    std::fprintf(stderr, "llm_pretrain: %s\n", e.what());
    return 1;
  }
  return 0;
}
