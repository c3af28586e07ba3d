#!/bin/bash
# What one rank pays to write a snapshot set and to restore from it, through the tool (run by hand):
#
#   benchmarks/tool_sets.sh [--tool build/tools/dpipe] [--take BATCHES] [--orders "global none"] W...
#
# For each sampler order and each W: W tool processes (one per rank, 4 workers each) run range(10^8) |
# sampler(ORDER) | shuffle(1000) | batch(16) | prefetch(4), take BATCHES batches (50 unless given) and
# write their snapshots into one set directory, rank after rank; then rank 0 resumes on the set's own
# layout and with a rescale to 3W/4 ranks, five times each. Prints, per row: the median restore_ms of
# `dpipe run --stats` (the restore alone, without the process's start) on the same layout; for the
# rescale, the median restore_ms, the bytes it read (restore_read_bytes) and the peak resident set of that
# run (GNU time); the median rank's write (snapshot_ms) and the write of the last rank, which completes the
# set and writes its manifest (the median of that write and four repeats of it, each with the last rank's
# file, the manifest and the index removed first). The sets are written under a temporary directory,
# removed at the end.
set -euo pipefail
tool=build/tools/dpipe
take=50
orders="global none"
while [[ $# -gt 0 && "$1" == --* ]]; do
  case "$1" in
    --tool) tool=$2; shift 2 ;;
    --take) take=$2; shift 2 ;;
    --orders) orders=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
[[ $# -gt 0 ]] || { echo "usage: $0 [--tool PATH] [--take BATCHES] [--orders \"global none\"] W..." >&2; exit 2; }
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT

stat_of() { python3 -c 'import json, sys; print(json.loads(sys.stdin.read().splitlines()[-1])[sys.argv[1]])' "$1"; }
median() { sort -n | awk '{ v[NR] = $0 } END { print v[int((NR + 1) / 2)] }'; }

printf '%-6s %6s %6s | %-12s | %-28s | %s\n' order world "set MB" "same layout" "rescale to 3/4" "write ms"
printf '%-6s %6s %6s | %-12s | %-28s | %s\n' "" "" "" "restore_ms" "restore_ms  read KB  peak MB" "median rank, completing (median of 5)"
for order in $orders; do
  spec="{\"seed\": 7, \"pipeline\": [{\"op\": \"range\", \"stop\": 100000000}, {\"op\": \"sampler\", \"shuffle\": \"$order\"},
         {\"op\": \"shuffle\", \"buffer\": 1000}, {\"op\": \"batch\", \"size\": 16}, {\"op\": \"prefetch\", \"depth\": 4}]}"
  for w in "$@"; do
    dir=$root/w$w
    writes=$root/writes
    : > "$writes"
    for ((r = 0; r < w; r++)); do
      "$tool" run "$spec" --rank "$r" --world-size "$w" --workers 4 --take "$take" --snapshot-dir "$dir" --step 100 \
        --stats --output /dev/null 2>&1 >/dev/null | stat_of snapshot_ms >> "$writes"
    done
    write_median=$(median < "$writes")
    write_last=$(tail -n 1 "$writes")
    same=$(for _ in 1 2 3 4 5; do
      "$tool" run "$spec" --rank 0 --world-size "$w" --workers 4 --take 1 --resume-dir "$dir" --stats \
        --output /dev/null 2>&1 >/dev/null | stat_of restore_ms
    done | median)
    rescaled=$(for _ in 1 2 3 4 5; do
      out=$(/usr/bin/time -f "peak_kb %M" "$tool" run "$spec" --rank 0 --world-size $((w * 3 / 4)) --workers 4 \
        --take 1 --resume-dir "$dir" --rescale --stats --output /dev/null 2>&1 >/dev/null)
      line=$(grep '^{' <<<"$out")
      printf '%8.2f %8.1f %8d\n' "$(stat_of restore_ms <<<"$line")" "$(( $(stat_of restore_read_bytes <<<"$line") ))e-3" \
        $(( $(awk '/^peak_kb/ { print $2 }' <<<"$out") / 1024 ))
    done | median)
    # The completing write again, four times (the last rank's file, the manifest and the index removed
    # first): the median of five, as one write is one noisy sample.
    completing=$root/completing
    tail -n 1 "$writes" > "$completing"
    for _ in 1 2 3 4; do
      rm -f "$dir/rank-$((w - 1))-of-$w".* "$dir/set.dpipe-manifest" "$dir/set.dpipe-index"
      "$tool" run "$spec" --rank $((w - 1)) --world-size "$w" --workers 4 --take "$take" --snapshot-dir "$dir" --step 100 \
        --stats --output /dev/null 2>&1 >/dev/null | stat_of snapshot_ms >> "$completing"
    done
    [[ -f "$dir/set.dpipe-manifest" ]] || { echo "the completing write left no manifest in $dir" >&2; exit 1; }
    printf '%-6s %6d %6d | %12.2f | %s | %8.2f %8.2f\n' "$order" "$w" "$(du -sm "$dir" | cut -f1)" "$same" "$rescaled" \
      "$write_median" "$(median < "$completing")"
    rm -rf "$dir"
  done
done
