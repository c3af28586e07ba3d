#!/usr/bin/env bash
# Distributed runs under real Open MPI on loopback: 2 ranks × 3 workers run to step 40 and write a
# snapshot set; 3 ranks × 2 workers resume it with --rescale to step 25 and write another; 1 rank × 1
# worker resumes that to the end. Every element of the epoch must arrive exactly once over all ranks.
# The layout comes from Open MPI's environment (OMPI_COMM_WORLD_RANK/SIZE), not from options.
set -euo pipefail
BUILD=$1
DPIPE="$BUILD/tools/dpipe"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
command -v mpirun >/dev/null || { echo "mpirun is not installed (apt: openmpi-bin)"; exit 1; }
MPIRUN=(timeout 120 mpirun --allow-run-as-root --oversubscribe --mca btl self,vader --mca pml ob1
        --mca oob_tcp_if_include lo)
SPEC='{"seed": 21, "pipeline": [{"op": "range", "stop": 6000}, {"op": "sampler", "shuffle": "global"},
       {"op": "shuffle", "buffer": 100}, {"op": "batch", "size": 16}]}'
"${MPIRUN[@]}" -np 2 "$DPIPE" run "$SPEC" --workers 3 --take 40 --output "$WORK/a-{rank}.jsonl" \
  --snapshot-dir "$WORK/set-a"
ls "$WORK/set-a"
"${MPIRUN[@]}" -np 3 "$DPIPE" run "$SPEC" --workers 2 --take 25 --output "$WORK/b-{rank}.jsonl" \
  --resume-dir "$WORK/set-a" --rescale --snapshot-dir "$WORK/set-b"
"${MPIRUN[@]}" -np 1 "$DPIPE" run "$SPEC" --workers 1 --output "$WORK/c-{rank}.jsonl" \
  --resume-dir "$WORK/set-b" --rescale
# The first set again, straight to 1 rank × 1 worker.
"${MPIRUN[@]}" -np 1 "$DPIPE" run "$SPEC" --workers 1 --output "$WORK/d-{rank}.jsonl" \
  --resume-dir "$WORK/set-a" --rescale
python3 - "$WORK" <<'PY'
import glob, json, os, sys
work = sys.argv[1]
def elements(*prefixes):
    files = [f for p in prefixes for f in sorted(glob.glob(os.path.join(work, p + "-*.jsonl")))]
    return files, [x for f in files for line in open(f) for x in json.loads(line)]
for route, prefixes, count in (("2x3 -> 3x2 -> 1x1", "abc", 6), ("2x3 -> 1x1", "ad", 3)):
    files, got = elements(*prefixes)
    assert len(files) == count, files
    assert sorted(got) == list(range(6000)), f"{route}: {len(got)} elements, {len(set(got))} distinct"
    print(f"mpi: layouts {route}: every one of 6000 elements exactly once over {len(files)} rank outputs")
PY
