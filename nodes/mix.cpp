// mix: its options' checks and its rescale rule (compiled once, not once per element type).
#include "dpipe/nodes/mix.hpp"

#include <cmath>

namespace dpipe {

Params mix_params(const MixOptions& o, std::size_t inputs) {
  const std::string node = node_label("mix", o.name);
  if (inputs < 1) throw ConfigError(node + ": needs at least one input");
  if (o.weights.size() != inputs)
    throw ConfigError(node + ": " + std::to_string(o.weights.size()) + " weights for " + std::to_string(inputs) + " inputs");
  double total = 0;
  std::string weights;
  for (const double w : o.weights) {
    if (!std::isfinite(w) || w < 0) throw ConfigError(node + ": a weight must be a finite number not below 0, got " + std::to_string(w));
    total += w;
    weights += (weights.empty() ? "" : ", ") + param_text(w);
  }
  if (total <= 0) throw ConfigError(node + ": the weights must not all be 0");
  if (!std::isfinite(total))  // every draw would land on the last input
    throw ConfigError(node + ": the weights add up beyond the largest number (" + weights +
                      "); only their ratios matter, so give them on a smaller scale");
  const char* stop = o.stop == MixStop::first_exhausted ? "first_exhausted" : o.stop == MixStop::never ? "never" : "all_exhausted";
  return {{"weights", weights}, {"stop", stop}};
}

namespace rescale {
RescaleRule mix_rule() {
  return RescaleRule::dealt([](const RescaleInput& in) {
    in.check_fields<MixState>();
    const std::vector<MixState> old = in.read<MixState>();
    for (std::size_t i = 1; i < old.size(); ++i)
      if (old[i].passes != old[0].passes)
        in.refuse("its instances are on different passes of their inputs (stop = never), whose states belong to "
                  "different epochs");
    return in.write_slots([&](std::size_t j) {
      MixState s;
      const std::size_t n = old.empty() ? 0 : old[0].live.size();
      s.live.assign(n, 1);
      s.yielded.assign(n, 1);  // a restart after the rescale is a pass of its own, not an empty one
      s.passes = old.empty() ? std::vector<std::uint64_t>{} : old[0].passes;
      Rng::State words = old[j % old.size()].rng.state();
      for (std::size_t w = 0; w < words.size(); ++w) words[w] ^= mix64(j * 4 + w + 1 + (std::uint64_t{1} << 40));
      s.rng.set_state(words);
      return s;
    });
  });
}
}  // namespace rescale

}  // namespace dpipe
