// Replays fuzz inputs without libFuzzer: every file named, and every file of every directory named, goes
// through the target's LLVMFuzzerTestOneInput once, in name order. This is how the committed corpora run
// as tests (in CI under ASan + UBSan); a crash, a sanitizer report or a finding aborts the program.
// `--junit PATH` writes one JUnit test case per input (written when every input has passed).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

// The snapshot targets' custom mutators call libFuzzer's byte mutator; a replay never mutates.
extern "C" size_t LLVMFuzzerMutate(uint8_t*, size_t size, size_t) { return size; }

namespace {

std::string xml_escape(const std::string& s) {
  std::string out;
  for (const char c : s) {
    if (c == '&') out += "&amp;";
    else if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (c == '"') out += "&quot;";
    else out += c;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  std::string junit, suite = "fuzz_replay";
  std::vector<fs::path> inputs;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--junit" && i + 1 < argc) {
      junit = argv[++i];
    } else if (a == "--suite" && i + 1 < argc) {
      suite = argv[++i];
    } else if (fs::is_directory(a)) {
      std::vector<fs::path> files;
      for (const auto& e : fs::directory_iterator(a))
        if (e.is_regular_file()) files.push_back(e.path());
      std::sort(files.begin(), files.end());
      inputs.insert(inputs.end(), files.begin(), files.end());
    } else if (fs::is_regular_file(a)) {
      inputs.emplace_back(a);
    } else {
      std::fprintf(stderr, "replay: '%s' is neither a file nor a directory\n", a.c_str());
      return 2;
    }
  }
  if (inputs.empty()) {
    std::fprintf(stderr, "replay: no input (usage: replay [--junit PATH] [--suite NAME] FILE_OR_DIR...)\n");
    return 2;
  }
  for (const auto& p : inputs) {
    std::ifstream f(p, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    std::fprintf(stderr, "replay: %s (%zu bytes)\n", p.c_str(), bytes.size());
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  }
  std::printf("replay: %zu inputs passed\n", inputs.size());
  if (!junit.empty()) {
    fs::create_directories(fs::path(junit).parent_path());
    std::ofstream x(junit);
    x << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites>\n<testsuite name=\"" << xml_escape(suite)
      << "\" tests=\"" << inputs.size() << "\" failures=\"0\">\n";
    for (const auto& p : inputs)
      x << "  <testcase classname=\"" << xml_escape(suite) << "\" name=\"" << xml_escape(p.filename().string())
        << "\"/>\n";
    x << "</testsuite>\n</testsuites>\n";
  }
  return 0;
}
