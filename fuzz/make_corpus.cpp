// Writes the seed corpora of the fuzz targets, all made by the library itself: `fuzz_make_corpus OUT
// [SOURCE_ROOT]` fills OUT/<target>/ (the specs of tests/semantics/cases/ join spec_build's seeds when the
// source root is given). scripts/fuzz.sh --seed-corpus runs it and merges the result into fuzz/corpus/
// with libFuzzer's -merge=1, which keeps only the inputs that add coverage.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dpipe/nodes/records.hpp"
#include "fuzz_common.hpp"
#include "set_container.hpp"

using namespace dpipe_fuzz;
namespace fs = std::filesystem;

namespace {

fs::path out_root;

void put(const std::string& target, const std::string& name, const std::string& bytes) {
  const fs::path dir = out_root / target;
  fs::create_directories(dir);
  std::ofstream(dir / name, std::ios::binary) << bytes;
}

/// A snapshot of `p` on `layout` after `n` elements.
std::string snapshot_after(const BuiltPipeline& p, const dpipe::Layout& layout, std::uint64_t n) {
  return p.spec.pipeline.visit([&](const auto& pipeline) {
    auto run = engine().start(pipeline, options(p.spec.seed, layout));
    drain(run, n);
    return run.snapshot().to_bytes();
  });
}

void snapshots() {
  const auto& specs = fuzz_pipelines();
  const auto& built = built_pipelines();
  for (std::size_t i = 0; i < built.size(); ++i)
    for (const std::uint64_t n : {0, 3, 17, 60})
      put("snapshot_restore", std::string(specs[i].name) + "-" + std::to_string(n) + ".dpipe",
          snapshot_after(built[i], built[i].layout, n));
}

void sets() {
  const auto& specs = fuzz_pipelines();
  const auto& built = built_pipelines();
  for (std::size_t i = 0; i < built.size(); ++i) {
    const std::string name = specs[i].name;
    const bool sampled = name.rfind("sampler", 0) == 0;
    for (const int world : {1, 2, 3})
      for (const int workers : {1, 2})
        for (const std::uint64_t n : {0, 5, 40}) {
          if (!sampled && (world != 2 || workers != 1 || n != 5)) continue;  // refused by the rescale: one seed
          SetInput in;
          in.world = static_cast<std::uint8_t>((world + n) % 6);  // another layout: 1 + b % 6 ranks
          in.workers = static_cast<std::uint8_t>(workers % 4);    // 1 + b % 4 workers
          for (int r = 0; r < world; ++r) in.ranks.push_back(snapshot_after(built[i], {r, world, workers}, n));
          put("snapshot_set_rescale",
              name + "-w" + std::to_string(world) + "k" + std::to_string(workers) + "-" + std::to_string(n) + ".set",
              in.encode());
        }
  }
}

void specs(const std::string& source_root) {
  for (const auto& p : fuzz_pipelines()) put("spec_build", std::string(p.name) + ".json", p.spec);
  if (source_root.empty()) return;
  const fs::path cases = fs::path(source_root) / "tests" / "semantics" / "cases";
  if (!fs::is_directory(cases)) return;
  for (const auto& e : fs::directory_iterator(cases)) {
    std::ifstream f(e.path());
    const auto j = nlohmann::json::parse(f, nullptr, false);
    if (j.is_discarded() || !j.contains("spec")) continue;
    put("spec_build", e.path().stem().stem().string() + ".json", j["spec"].dump());
  }
}

std::string with_selector(std::uint8_t sel, const std::string& content) { return std::string(1, static_cast<char>(sel)) + content; }

void readers() {
  // records: framed by the library's own writer.
  const fs::path tmp = out_root / ".records.tmp";
  const std::vector<std::vector<std::string>> record_sets = {
      {}, {"a"}, {"alpha", "", "gamma gamma", std::string(300, 'x')}, {"\x00\x01\x02", "record two", "3"}};
  int k = 0;
  for (const auto& rs : record_sets) {
    dpipe::write_records(tmp.string(), rs);
    std::ifstream f(tmp, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    for (const std::uint8_t sel : {0x00, 0x10, 0x2d, 0x18})
      put("reader_records", "records-" + std::to_string(k) + "-" + std::to_string(sel) + ".bin", with_selector(sel, bytes));
    ++k;
  }
  fs::remove(tmp);
  const std::vector<std::string> texts = {"",
                                          "one line\n",
                                          "a\nb\nc\nd\ne\nf\ng\n",
                                          "no newline at the end",
                                          "crlf\r\nlines\r\n\r\nlast\r\n",
                                          "\n\n\n",
                                          "été\n日本\n" + std::string(200, 'y') + "\nz\n"};
  k = 0;
  for (const auto& t : texts) {
    for (const std::uint8_t sel : {0x00, 0x15, 0x64, 0xc3}) {
      put("reader_lines", "text-" + std::to_string(k) + "-" + std::to_string(sel) + ".txt", with_selector(sel, t));
      put("reader_line_blocks", "text-" + std::to_string(k) + "-" + std::to_string(sel) + ".txt", with_selector(sel, t));
    }
    ++k;
  }
  for (const int n : {0, 1, 7, 40, 333}) {
    std::string toks;
    for (int i = 0; i < n; ++i) {
      const std::uint16_t t = static_cast<std::uint16_t>(i * 37 + 1);
      toks.append(reinterpret_cast<const char*>(&t), 2);
    }
    for (const std::uint8_t sel : {0x00, 0x48, 0x8d, 0xe0})
      put("reader_token_windows", "tokens-" + std::to_string(n) + "-" + std::to_string(sel) + ".bin", with_selector(sel, toks));
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: fuzz_make_corpus OUT_DIR [SOURCE_ROOT]\n");
    return 2;
  }
  out_root = argv[1];
  snapshots();
  sets();
  specs(argc > 2 ? argv[2] : "");
  readers();
  return 0;
}
