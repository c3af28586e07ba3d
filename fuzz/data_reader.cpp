// Fuzz targets for the data readers, one per DPIPE_FUZZ_READER: 1 records, 2 lines, 3 line_blocks,
// 4 token_windows, 5 parse_json (lines of the file, then pack), 6 tokenize (lines of the file, with a model
// trained once per process by spm_train, then pack when bit 3 is set). The input's first byte chooses the options and layout, the rest is the file's content
// (written to a temporary file). The file is read to the end (at most kMaxElements), then again with a
// snapshot after a few elements and a resume from its bytes: the two streams must be the same.
//
// Selector byte: bit 0 two ranks, bit 1 rank 1 of them, bit 2 two workers, bit 3 a sampler after the source
// (records, token_windows), bit 4 the records' checksums recomputed before the file is written (so that
// mutations of lengths and payloads reach the reader) or shuffle_shards for lines and line_blocks, bit 5
// on_error "skip" (records), dtype uint32 (token_windows) or two epochs (lines, line_blocks), bits 6-7 one
// size parameter: logical_shards, seq_len or block_bytes. parse_json and tokenize: bit 5 on_error "skip",
// bit 4 pack's first_fit mode, bits 6-7 pack's seq_len.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dpipe/nodes/records.hpp"
#include "fuzz_common.hpp"

#ifndef DPIPE_FUZZ_READER
#error "define DPIPE_FUZZ_READER (1 records, 2 lines, 3 line_blocks, 4 token_windows, 5 parse_json, 6 tokenize)"
#endif

using namespace dpipe_fuzz;

namespace {

#if DPIPE_FUZZ_READER == 1
/// Recomputes both checksums of every TFRecord frame that fits (u64 length, u32 masked CRC of it, the
/// payload, u32 masked CRC of it).
void fix_record_checksums(std::string& b) {
  std::size_t pos = 0;
  while (pos + 12 <= b.size()) {
    std::uint64_t len = 0;
    std::memcpy(&len, b.data() + pos, 8);
    const std::uint32_t hc = dpipe::masked_crc32c(b.data() + pos, 8);
    std::memcpy(b.data() + pos + 8, &hc, 4);
    if (len > b.size() - pos - 12 || b.size() - pos - 12 - len < 4) return;
    const std::uint32_t dc = dpipe::masked_crc32c(b.data() + pos + 12, len);
    std::memcpy(b.data() + pos + 12 + len, &dc, 4);
    pos += 16 + len;
  }
}
#endif

/// The input file, in this process's directory (removed when the process exits).
std::string temp_path() {
  static const std::string path = process_temp_dir("dpipe-fuzz") + "/input";
  return path;
}

#if DPIPE_FUZZ_READER == 6
/// A small SentencePiece model, trained once per process on generated text (nothing downloaded).
const std::string& model_path() {
  static const std::string path = [] {
    const std::string dir = process_temp_dir("dpipe-fuzz-spm");
    {
      std::ofstream f(dir + "/corpus.txt");
      const char* words[] = {"the", "of", "data", "loader", "token", "pack", "row", "résumé", "日本", "x1"};
      for (int i = 0; i < 800; ++i) {
        for (int k = 0; k < 3 + i % 13; ++k) f << words[(i * k + k * k) % 10] << ' ';
        f << '\n';
      }
    }
    const std::string cmd = "spm_train --input=" + dir + "/corpus.txt --model_prefix=" + dir +
                            "/m --vocab_size=40 --minloglevel=2 > /dev/null 2>&1";
    if (std::system(cmd.c_str()) != 0) finding("spm_train could not make the test model (is sentencepiece installed?)");
    return dir + "/m.model";
  }();
  return path;
}
#endif

std::string spec_for(std::uint8_t sel, const std::string& path) {
  const int size_choice = sel >> 6;
  const std::string files = "\"files\": [\"" + path + "\"]";
  std::string source, after;
#if DPIPE_FUZZ_READER == 1
  source = "{\"op\": \"records\", " + files + ((sel & 32) ? ", \"on_error\": \"skip\"}" : "}");
  (void)size_choice;
#elif DPIPE_FUZZ_READER == 2 || DPIPE_FUZZ_READER == 3
  static constexpr int kShards[] = {1, 3, 17, 64};
  static constexpr int kBlock[] = {1, 7, 64, 4096};
  source = std::string("{\"op\": \"") + (DPIPE_FUZZ_READER == 2 ? "lines" : "line_blocks") + "\", " + files +
           ", \"logical_shards\": " + std::to_string(kShards[size_choice]) +
           ", \"shuffle_shards\": " + ((sel & 16) ? "true" : "false") + ((sel & 32) ? ", \"epochs\": 2" : "");
  if (DPIPE_FUZZ_READER == 3) source += ", \"block_bytes\": " + std::to_string(kBlock[(size_choice + (sel & 3)) % 4]);
  source += "}";
#elif DPIPE_FUZZ_READER == 5 || DPIPE_FUZZ_READER == 6
  static constexpr int kSeqLen[] = {1, 3, 8, 64};
  const std::string policy = (sel & 32) ? "\"skip\"" : "\"fail\"";
  source = "{\"op\": \"lines\", " + files + ", \"logical_shards\": 3}, ";
#if DPIPE_FUZZ_READER == 5
  source += "{\"op\": \"parse_json\", \"fields\": {\"doc\": \"int64?\", \"tokens\": \"int64[]\", \"text\": \"string?\", "
              "\"w\": \"float32[]?\", \"b\": \"bool?\", \"raw\": \"bytes?\"}, \"on_error\": " + policy + "}";
#else
  source += "{\"op\": \"tokenize\", \"model\": \"" + model_path() + "\", \"bos\": true, \"eos\": " +
              ((sel & 2) ? "true" : "false") + ", \"on_error\": " + policy + "}";
#endif
  if (DPIPE_FUZZ_READER == 5 || (sel & 8))
    after = ", {\"op\": \"pack\", \"seq_len\": " + std::to_string(kSeqLen[size_choice]) + ", \"mode\": " +
            ((sel & 16) ? "\"first_fit\", \"buffer\": 3}" : "\"greedy\"}");
#else
  static constexpr int kSeqLen[] = {1, 2, 5, 16};
  source = "{\"op\": \"token_windows\", " + files + ", \"seq_len\": " + std::to_string(kSeqLen[size_choice]) +
           ((sel & 32) ? ", \"dtype\": \"uint32\"}" : "}");
#endif
#if DPIPE_FUZZ_READER == 1 || DPIPE_FUZZ_READER == 4
  if (sel & 8) after = ", {\"op\": \"sampler\", \"shuffle\": \"global\"}";
#endif
  return "{\"seed\": 5, \"pipeline\": [" + source + after + "]}";
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::uint8_t sel = data[0];
  std::string content(reinterpret_cast<const char*>(data) + 1, size - 1);
#if DPIPE_FUZZ_READER == 1
  if (sel & 16) fix_record_checksums(content);
#endif
  const std::string path = temp_path();
  {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(content.data(), static_cast<std::streamsize>(content.size()));
    if (!f) finding("cannot write the temporary input " + path);
  }
  const dpipe::Layout layout{(sel & 1) ? (sel >> 1 & 1) : 0, (sel & 1) ? 2 : 1, (sel & 4) ? 2 : 1};
  std::optional<dpipe::Spec> parsed;
  try {
    parsed.emplace(dpipe::parse_spec(spec_for(sel, path)));
  } catch (const dpipe::Error&) {
    return 0;  // a file the reader refuses when the pipeline is built (its index)
  }
  const dpipe::Spec& spec = *parsed;
  spec.pipeline.visit([&](const auto& pipeline) {
    using T = typename std::decay_t<decltype(pipeline)>::element_type;
    std::vector<T> all;
    try {
      auto run = engine().start(pipeline, options(spec.seed, layout));
      while (all.size() < kMaxElements) {
        auto x = run.next();
        if (!x) break;
        all.push_back(std::move(*x));
      }
    } catch (const dpipe::Error&) {
      return;  // malformed data: a DataError naming the file and offset
    }
    // The same stream through a snapshot after k elements.
    const std::size_t k = all.empty() ? 0 : content.size() % (all.size() + 1);
    std::vector<T> again;
    std::string bytes;
    try {
      auto run = engine().start(pipeline, options(spec.seed, layout));
      while (again.size() < k) {
        auto x = run.next();
        if (!x) finding("a second read of the same file ends after " + std::to_string(again.size()) + " elements");
        again.push_back(std::move(*x));
      }
      bytes = run.snapshot().to_bytes();
    } catch (const dpipe::Error& e) {
      finding(std::string("a second read of the same file fails: ") + e.what());
    }
    try {
      auto run = engine().resume(pipeline, dpipe::Snapshot::from_bytes(bytes), options(spec.seed, layout));
      while (again.size() < all.size()) {
        auto x = run.next();
        if (!x) break;
        again.push_back(std::move(*x));
      }
    } catch (const dpipe::Error& e) {
      finding(std::string("a resume from the reader's own snapshot fails: ") + e.what());
    }
    if (again != all)
      finding("the stream resumed after " + std::to_string(k) + " elements differs from the whole stream (" +
              std::to_string(again.size()) + " vs " + std::to_string(all.size()) + " elements)");
  });
  return 0;
}
