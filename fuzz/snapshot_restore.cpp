// Fuzz target: snapshot bytes → decode → restore into each representative pipeline whose fingerprint the
// snapshot carries (fuzz_common.hpp), pull a bounded number of elements, snapshot again and restore that.
// The custom mutator mutates the decoded snapshot and re-encodes it with valid checksums.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "fuzz_common.hpp"
#include "snapshot_mutator.hpp"

using namespace dpipe_fuzz;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  const auto& pipelines = built_pipelines();
  dpipe::Snapshot s;
  try {
    s = dpipe::Snapshot::from_bytes(bytes);
  } catch (const dpipe::SnapshotError&) {
    return 0;
  }
  // What `dpipe snapshot show` does, and a decoded snapshot encodes and decodes again.
  try {
    (void)s.to_json();
  } catch (const dpipe::SnapshotError&) {  // a native blob that does not decode: show refuses the file
  }
  std::string again;
  try {
    again = s.to_bytes();
  } catch (const dpipe::SnapshotError& e) {
    // Only a replay record of an older format, which has no digest steps, cannot be written as today's.
    if (s.meta.format_version >= dpipe::Snapshot::kFormatVersion)
      finding(std::string("a decoded snapshot of today's format does not encode: ") + e.what());
    return 0;
  }
  try {
    (void)dpipe::Snapshot::from_bytes(again);
  } catch (const dpipe::Error& e) {
    finding(std::string("a decoded snapshot does not decode after encoding: ") + e.what());
  }
  bool matched = false;
  for (const auto& p : pipelines) {
    if (p.fingerprint != s.meta.fingerprint) continue;
    matched = true;
    resume_and_pull(p, s, small_layout(s.meta.layout) ? s.meta.layout : p.layout);
  }
  // A snapshot of no pipeline: the first one refuses it (the fingerprint check).
  if (!matched) resume_and_pull(pipelines.front(), s, pipelines.front().layout);
  return 0;
}

extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size, unsigned int seed) {
  return mutate_snapshot_bytes(data, size, max_size, seed);
}
