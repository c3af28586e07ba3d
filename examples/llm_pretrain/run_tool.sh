#!/usr/bin/env bash
# The llm_pretrain pipeline as a spec through the `dpipe` tool under Open MPI: 2 ranks × 2 workers take 3
# batches each and write a checkpoint set (restore keys in place of the rows in flight); 3 ranks × 2 workers resume it rescaled to the end. Every
# document's tokens must arrive exactly once (checked by document id and position against expected.json,
# which the example writes with its data).
#   examples/llm_pretrain/run_tool.sh BUILD_DIR
set -euo pipefail
BUILD=$1
DPIPE="$BUILD/tools/dpipe"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
"$BUILD/examples/llm_pretrain" "$WORK" --prepare-only
SPEC="$WORK/llm_pretrain.json"
MPIRUN=(timeout 300 mpirun --allow-run-as-root --oversubscribe --mca btl self,vader --mca pml ob1
        --mca oob_tcp_if_include lo)
"${MPIRUN[@]}" -np 2 "$DPIPE" run "$SPEC" --workers 2 --take 3 --output "$WORK/a-{rank}.jsonl" --snapshot-dir "$WORK/set" \
  --restore-keys
# The rows in flight are saved as restore keys: a few KiB per rank.
SET_BYTES=$(find "$WORK/set" -type f -printf '%s\n' | awk '{s += $1} END {print s}')
echo "checkpoint set: $SET_BYTES bytes for 2 ranks"
if [ "$SET_BYTES" -gt $((2 * 64 * 1024)) ]; then echo "the checkpoint holds more than 64 KiB per rank" >&2; exit 1; fi
"${MPIRUN[@]}" -np 3 "$DPIPE" run "$SPEC" --workers 2 --output "$WORK/b-{rank}.jsonl" --resume-dir "$WORK/set" --rescale
# The audit: each batch names, per packed row, the lines (by their first byte) and token ranges it holds.
"$DPIPE" run "$SPEC" --workers 2 --take 2 --provenance > "$WORK/audit.jsonl"
python3 - "$WORK/audit.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    e = json.loads(line)
    pieces = [s for s in e["sources"] if s is not None]
    assert len(pieces) == len(e["sources"]) and pieces, e["sources"][:3]
    # the batch's tokens (segment ids above 0) are exactly its pieces' token ranges
    tokens = sum(1 for row in e["element"] for seg in row["segment_ids"] if seg)
    assert tokens == sum(p[2]["tokens"][1] - p[2]["tokens"][0] for p in pieces), (tokens, pieces[:3])
print("the audit names every packed row's pieces: lines and token ranges")
PY
python3 - "$WORK" <<'PY'
import collections, glob, json, os, sys
work = sys.argv[1]
expected = {int(k): v for k, v in json.load(open(os.path.join(work, "expected.json"))).items()}
seen = collections.Counter()
files = sorted(glob.glob(os.path.join(work, "a-*.jsonl"))) + sorted(glob.glob(os.path.join(work, "b-*.jsonl")))
assert len(files) == 5, files
for f in files:
    for line in open(f):
        for row in json.loads(line):  # a batch: a list of packed rows
            docs = row["doc"]
            for seg, pos in zip(row["segment_ids"], row["positions"]):
                if seg:
                    seen[(docs[seg - 1], pos)] += 1
want = {(d, p) for d, n in expected.items() for p in range(n)}
repeated = [k for k, c in seen.items() if c != 1]
assert not repeated, f"{len(repeated)} tokens delivered more than once, e.g. {repeated[:3]}"
assert set(seen) == want, f"{len(want - set(seen))} tokens lost, {len(set(seen) - want)} unknown"
print(f"llm_pretrain through the tool: every token of {len(expected)} documents exactly once "
      f"({sum(expected.values())} tokens), 2x2 -> 3x2 ranks x workers under mpirun")
PY
