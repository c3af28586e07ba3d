#pragma once
// A console reporter that, after the runs, prints each benchmark's throughput as a ratio of a
// baseline measured in the same process (this machine is noisy; absolute numbers drift).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

namespace dpipe::bench {

struct Ratio {
  // Benchmark names (the median aggregate is used). An empty denominator reads the numerator's own
  // `ratio` counter: a paired measurement (paired.hpp).
  std::string label, numerator, denominator;
  double goal = 0;                             // printed beside the ratio; 0 for none
  bool at_most = false;                        // the goal is an upper bound (times), else a lower bound
};

class RatioReporter : public benchmark::ConsoleReporter {
 public:
  explicit RatioReporter(std::vector<Ratio> ratios) : ratios_(std::move(ratios)) {}

  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const auto& r : runs) {
      std::string name = r.benchmark_name();
      const bool median = r.run_type == Run::RT_Aggregate && r.aggregate_name == "median";
      if (r.run_type == Run::RT_Aggregate && !median) continue;
      if (median) name = name.substr(0, name.size() - std::string("_median").size());
      name = without_repeats(name);
      if (!median && medians_.count(name)) continue;  // an aggregate already gave this one
      auto it = r.counters.find("items_per_second");
      if (it == r.counters.end()) it = r.counters.find("bytes_per_second");
      if (it != r.counters.end()) rate_[name] = it->second.value;
      time_[name] = r.GetAdjustedRealTime();
      if (auto own = r.counters.find("ratio"); own != r.counters.end()) own_ratio_[name] = own->second.value;
      if (median) medians_[name] = true;
    }
  }

  void Finalize() override {
    ConsoleReporter::Finalize();
    std::printf("\nratios (median of repetitions, same process; paired: median of per-pass ratios):\n");
    for (const auto& q : ratios_) {
      double v = 0;
      if (q.denominator.empty() ? !own_ratio_.count(q.numerator)
                                : !time_.count(q.numerator) || !time_.count(q.denominator)) {
        std::printf("  %-58s    not run (filtered out)\n", q.label.c_str());
        continue;
      }
      if (q.denominator.empty())
        v = own_ratio_[q.numerator];
      else if (rate_.count(q.numerator) && rate_.count(q.denominator) && rate_[q.denominator] > 0)
        v = rate_[q.numerator] / rate_[q.denominator];
      else if (time_[q.denominator] > 0)
        v = time_[q.numerator] / time_[q.denominator];
      if (q.goal > 0)
        std::printf("  %-58s %6.3f  (goal %s %.2f)\n", q.label.c_str(), v, q.at_most ? "<=" : ">=", q.goal);
      else
        std::printf("  %-58s %6.3f\n", q.label.c_str(), v);
    }
    std::fflush(stdout);
  }

 private:
  // "BM_Pause/10/iterations:20/repeats:3/manual_time" → "BM_Pause/10": ratios name benchmarks by
  // their function and arguments only.
  static std::string without_repeats(const std::string& name) {
    std::string out;
    std::size_t start = 0;
    while (start <= name.size()) {
      const std::size_t end = std::min(name.find('/', start), name.size());
      const std::string part = name.substr(start, end - start);
      if (part.find(':') == std::string::npos && part != "manual_time" && part != "real_time")
        out += (out.empty() ? "" : "/") + part;
      start = end + 1;
    }
    return out;
  }

  std::vector<Ratio> ratios_;
  std::map<std::string, double> rate_, time_, own_ratio_;
  std::map<std::string, bool> medians_;
};

}  // namespace dpipe::bench
