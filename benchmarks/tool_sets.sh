#!/bin/bash
# What one rank pays to restore from a snapshot set, through the tool (run by hand):
#
#   benchmarks/tool_sets.sh [--tool build/tools/dpipe] W...
#
# For each W: W tool processes (one per rank, 4 workers each) run range | sampler | shuffle(1000) |
# batch(16) | prefetch(4), take 20 batches and write their snapshots into one set directory; then rank 0
# resumes on the set's own layout and with a rescale to 3W/4 ranks, five times each. Prints the median
# restore_ms of `dpipe run --stats` (the restore alone, without the process's start) and, for the rescale,
# the peak resident set of that run (GNU time). The sets are written under a temporary directory, removed
# at the end.
set -euo pipefail
tool=build/tools/dpipe
if [[ "${1:-}" == "--tool" ]]; then tool=$2; shift 2; fi
[[ $# -gt 0 ]] || { echo "usage: $0 [--tool PATH] W..." >&2; exit 2; }
spec='{"seed": 7, "pipeline": [{"op": "range", "stop": 100000000}, {"op": "sampler"},
       {"op": "shuffle", "buffer": 1000}, {"op": "batch", "size": 16}, {"op": "prefetch", "depth": 4}]}'
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT

restore_ms() { python3 -c 'import json, sys; print(json.loads(sys.stdin.read().splitlines()[-1])["restore_ms"])'; }
median() { sort -n | awk '{ v[NR] = $0 } END { print v[int((NR + 1) / 2)] }'; }

printf '%7s %7s | %-22s | %s\n' world "set MB" "same layout restore_ms" "rescale to 3/4: restore_ms, peak MB"
for w in "$@"; do
  dir=$root/w$w
  for ((r = 0; r < w; r++)); do
    "$tool" run "$spec" --rank "$r" --world-size "$w" --workers 4 --take 20 --snapshot-dir "$dir" --step 100 \
      --output /dev/null
  done
  same=$(for _ in 1 2 3 4 5; do
    "$tool" run "$spec" --rank 0 --world-size "$w" --workers 4 --take 1 --resume-dir "$dir" --stats \
      --output /dev/null 2>&1 >/dev/null | restore_ms
  done | median)
  rescaled=$(for _ in 1 2 3 4 5; do
    out=$(/usr/bin/time -f "peak_kb %M" "$tool" run "$spec" --rank 0 --world-size $((w * 3 / 4)) --workers 4 \
      --take 1 --resume-dir "$dir" --rescale --stats --output /dev/null 2>&1 >/dev/null)
    printf '%.2f %d\n' "$(grep '^{' <<<"$out" | restore_ms)" $(( $(awk '/^peak_kb/ { print $2 }' <<<"$out") / 1024 ))
  done | median)
  printf '%7d %7d | %22.2f | %s\n' "$w" "$(du -sm "$dir" | cut -f1)" "$same" "$rescaled"
  rm -rf "$dir"
done
