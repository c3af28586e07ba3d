// Fuzz target: spec JSON text → parse_spec (every op's builder and checks) → the graph and its DOT text →
// when the spec is small enough to run briefly, a bounded run on one or two ranks and workers, a snapshot
// of it, and a resume from that snapshot (a snapshot dpipe wrote always restores). Specs that name files
// are left to the reader targets, which control the files' contents.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include <nlohmann/json.hpp>

#include "fuzz_common.hpp"

using namespace dpipe_fuzz;

namespace {

/// Whether a run of the spec is bounded enough to try: integers (other than the seed) within ±1000, at
/// most one `cycle` and only with a count. The bounds are on the input only: the spec is built either way.
bool small_enough(const nlohmann::json& j, int& cycles, int depth = 0) {
  if (depth > 64) return false;
  if (j.is_number_integer()) return j.is_number_unsigned() ? j.get<std::uint64_t>() <= 1000
                                                            : (j.get<std::int64_t>() >= -1000 && j.get<std::int64_t>() <= 1000);
  if (j.is_number_float()) return false;
  if (j.is_object()) {
    if (auto op = j.find("op"); op != j.end() && *op == "cycle") {
      ++cycles;
      if (!j.contains("count") || cycles > 1) return false;
    }
    for (auto it = j.begin(); it != j.end(); ++it)
      if (it.key() != "seed" && !small_enough(it.value(), cycles, depth + 1)) return false;
  }
  if (j.is_array())
    for (const auto& v : j)
      if (!small_enough(v, cycles, depth + 1)) return false;
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  if (text.find("files") != std::string_view::npos) return 0;
  std::optional<BuiltPipeline> built;
  try {
    built.emplace(BuiltPipeline{dpipe::parse_spec(text), 0, {}});
  } catch (const dpipe::Error&) {
    return 0;
  }
  BuiltPipeline& p = *built;
  const dpipe::Spec& spec = p.spec;
  try {
    spec.pipeline.visit([&](const auto& pl) {
      const auto g = dpipe::Graph::build(*pl.def());
      (void)g.to_dot();
      p.fingerprint = g.fingerprint();
    });
  } catch (const dpipe::Error&) {
    return 0;
  }
  int cycles = 0;
  const auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !small_enough(j, cycles)) return 0;
  // The layout from the input's length: one or two ranks and workers.
  p.layout = dpipe::Layout{static_cast<int>(size % 2), 2, static_cast<int>(1 + size / 2 % 2)};
  if (size % 4 == 0) p.layout = dpipe::Layout{0, 1, 1};
  spec.pipeline.visit([&](const auto& pipeline) {
    std::optional<dpipe::Snapshot> s;
    try {
      auto run = engine().start(pipeline, options(spec.seed, p.layout));
      drain(run, 1 + size % 40);
      s = run.snapshot();
      drain(run);
    } catch (const dpipe::Error&) {
      return;
    }
    resume_and_pull(p, *s, p.layout, true);
  });
  return 0;
}
