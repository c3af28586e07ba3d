// The records writer of the crash-consistency test (tests/integration/crash_consistency_test.py):
// `records_writer PATH VARIANT [loop]` writes the records file of VARIANT (0 or 1) with write_records,
// once, or with `loop` again and again alternating the two variants until it is killed.
#include <cstdio>
#include <string>
#include <vector>

#include "dpipe/error.hpp"
#include "dpipe/nodes/records.hpp"

namespace {

/// Variant v: 3000 + 1000 v records, record i is "v<v>-record-<i>-" and i % 50 'x's (the test builds the
/// same file from the TFRecord format's definition).
std::vector<std::string> variant(int v) {
  std::vector<std::string> out;
  for (int i = 0; i < 3000 + 1000 * v; ++i)
    out.push_back("v" + std::to_string(v) + "-record-" + std::to_string(i) + "-" + std::string(i % 50, 'x'));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: records_writer PATH VARIANT [loop]\n");
    return 2;
  }
  const std::string path = argv[1];
  const int v = std::stoi(argv[2]) % 2;
  const bool loop = argc > 3 && std::string(argv[3]) == "loop";
  const std::vector<std::string> records[] = {variant(0), variant(1)};
  try {
    for (int i = 0;; ++i) {
      dpipe::write_records(path, records[(v + i) % 2]);
      if (!loop) return 0;
    }
  } catch (const dpipe::Error& e) {
    std::fprintf(stderr, "records_writer: %s\n", e.what());
    return 1;
  }
}
