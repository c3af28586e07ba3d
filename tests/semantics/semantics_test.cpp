// Runs every semantics case (../shared/semantics/cases, checked against torch, and tests/semantics/cases)
// through the library: the spec is built, run on its layout, and the stream compared element by
// element with the expected one; "error" cases must fail with a ConfigError containing the text.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

#include "dpipe/dpipe.hpp"
#include "json_spec.hpp"

namespace dpipe {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

json run_case(const json& c) {
  const Spec spec = parse_spec(c.at("spec").dump());
  RunOptions o{.seed = spec.seed, .epoch = 0, .layout = Layout{}};
  if (c.contains("layout")) {
    const auto& l = c["layout"];
    o.layout = Layout{l.at("rank").get<int>(), l.at("world_size").get<int>(), l.at("num_workers").get<int>()};
  }
  std::string lines;
  spec.pipeline.visit(
      [&](const auto& p) {
        Engine e;
        auto run = e.start(p, o);
        while (auto x = run.next()) {
          append_element_json(lines, *x);
          lines += '\n';
        }
      });
  json out = json::array();
  std::size_t start = 0;
  while (start < lines.size()) {
    const auto end = lines.find('\n', start);
    out.push_back(json::parse(lines.substr(start, end - start)));
    start = end + 1;
  }
  return out;
}

class CaseTest : public ::testing::Test {
 public:
  explicit CaseTest(fs::path path) : path_(std::move(path)) {}
  void TestBody() override {
    std::ifstream in(path_);
    const json c = json::parse(in);
    if (c.contains("error")) {
      const auto want = c["error"].get<std::string>();
      try {
        run_case(c);
        FAIL() << "expected a ConfigError containing: " << want;
      } catch (const ConfigError& e) {
        EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
      }
      return;
    }
    EXPECT_EQ(run_case(c), c.at("expected")) << path_;
  }

 private:
  fs::path path_;
};

std::vector<fs::path> case_files() {
  const char* root = std::getenv("DPIPE_SOURCE_ROOT");
  const fs::path src = root ? root : ".";
  std::vector<fs::path> files;
  for (const fs::path& dir : {src / ".." / "shared" / "semantics" / "cases", src / "tests" / "semantics" / "cases"}) {
    if (!fs::is_directory(dir)) continue;
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().string().ends_with(".case.json")) files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace
}  // namespace dpipe

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const auto files = dpipe::case_files();
  for (const auto& f : files) {
    const bool shared = f.string().find("shared") != std::string::npos;
    ::testing::RegisterTest(shared ? "TorchCases" : "ProjectCases", f.stem().stem().string().c_str(), nullptr, nullptr,
                            __FILE__, __LINE__, [f]() -> ::testing::Test* { return new dpipe::CaseTest(f); });
  }
  if (files.empty()) {
    std::fprintf(stderr, "no semantics cases found: set DPIPE_SOURCE_ROOT to the source tree\n");
    return 1;
  }
  return RUN_ALL_TESTS();
}
