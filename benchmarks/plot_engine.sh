#!/usr/bin/env bash
# Plots engine throughput against workers and against prefetch depth from engine_bench's JSON output.
#   build-release/benchmarks/engine_bench --benchmark_filter='BM_Spin(Workers|Prefetch)' \
#       --benchmark_out=engine.json --benchmark_out_format=json
#   benchmarks/plot_engine.sh engine.json docs/engine_scaling.png
# Needs python3 and gnuplot (apt: gnuplot-nox).
set -euo pipefail
in=${1:?usage: plot_engine.sh BENCH.json OUT.png}
out=${2:?usage: plot_engine.sh BENCH.json OUT.png}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 - "$in" "$work" <<'PY'
import json, sys, collections
data = json.load(open(sys.argv[1]))
rates = collections.defaultdict(list)
for b in data["benchmarks"]:
    if b.get("run_type") == "aggregate" and b.get("aggregate_name") != "median":
        continue
    name = b["run_name"] if "run_name" in b else b["name"]
    rates[name].append(b.get("items_per_second", 0) / 1e3)
def write(prefix, path):
    rows = []
    for name, v in rates.items():
        if name.startswith(prefix + "/"):
            arg = int(name.split("/")[1])
            rows.append((arg, sorted(v)[len(v) // 2]))
    with open(path, "w") as f:
        for arg, r in sorted(rows):
            f.write(f"{arg} {r:.3f}\n")
write("BM_SpinWorkers", sys.argv[2] + "/workers.dat")
write("BM_SpinPrefetch", sys.argv[2] + "/prefetch.dat")
PY
gnuplot <<GP
set terminal pngcairo size 1000,420 font "DejaVu Sans,10"
set output "$out"
set multiplot layout 1,2 title "dpipe engine: map(spin 2 µs) → batch(64), 2 engine threads, 2 cores"
set grid
set ylabel "thousand elements / s"
set xlabel "workers (prefetch 8)"
set xtics 1
set yrange [0:*]
set key bottom right
plot "$work/workers.dat" using 1:2 with linespoints lw 2 pt 7 title "throughput"
set xlabel "prefetch depth in batches (2 workers)"
set logscale x 2
set xtics ("1" 1, "2" 2, "4" 4, "8" 8, "16" 16, "32" 32)
set key bottom right
plot "$work/prefetch.dat" using 1:2 with linespoints lw 2 pt 7 title "throughput"
unset multiplot
GP
echo "wrote $out"
