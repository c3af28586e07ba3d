#!/usr/bin/env bash
# The main job: installs what is missing, builds a release build and runs the demo on generated data:
# the canonical pipeline in C++ (run, snapshot to disk half-way, resume, compare, throughput), then the
# same pipeline from a JSON spec through the `dpipe` tool (run to a point, snapshot, resume, bench).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
if [ ! -f build-release/build.ninja ]; then
  mkdir -p logs
  meson setup build-release --buildtype=release -Dtests=false >logs/build-release.setup.log 2>&1 ||
    { cat logs/build-release.setup.log; exit 1; }
fi
meson compile -C build-release examples/quickstart tools/dpipe
echo "== quickstart (C++ API)"
build-release/examples/quickstart "${DEMO_ELEMENTS:-10000000}" "$(mktemp -d)/quickstart.snapshot"

echo "== the same pipeline through the dpipe tool"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
spec='{"seed": 42, "pipeline": [{"op": "range", "stop": 1000000}, {"op": "shuffle", "buffer": 10000},
  {"op": "sharding_filter"}, {"op": "map", "fn": "affine", "mul": 2}, {"op": "batch", "size": 256}]}'
dpipe=build-release/tools/dpipe
$dpipe run "$spec" --output "$work/all.jsonl"
$dpipe run "$spec" --take 1000 --output "$work/part1.jsonl" --snapshot-out "$work/step1000.snapshot"
$dpipe run "$spec" --resume "$work/step1000.snapshot" --output "$work/part2.jsonl" --stats 2>&1 | cut -c1-300
if cat "$work/part1.jsonl" "$work/part2.jsonl" | cmp -s - "$work/all.jsonl"; then
  echo "resumed at batch 1000: the two parts equal the uninterrupted run ($(wc -l <"$work/all.jsonl") batches)"
else
  echo "resumed stream DIFFERS from the uninterrupted run"; exit 1
fi
$dpipe snapshot show "$work/step1000.snapshot" | cut -c1-600
echo "...   (the whole snapshot as JSON: every node's state, the queued batches included)"
echo "== throughput (one worker, then two)"
$dpipe bench "$spec"
$dpipe bench "$spec" --workers 2
