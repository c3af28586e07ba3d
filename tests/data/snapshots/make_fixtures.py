#!/usr/bin/env python3
"""Writes the format-version fixtures of the current format version with a built `dpipe` tool:

    python3 tests/data/snapshots/make_fixtures.py BUILD/tools/dpipe tests/data/snapshots/v<N>

Run it once when a new format version is introduced, into a new v<N> directory; never over an existing
one (the fixtures of a version are the files that version wrote, kept so later readers are tested on
them). For each fixture it stores the spec, the snapshot taken after `take` elements, and the stream a
resume must yield, which it checks equals the tail of an uninterrupted run; fixtures.json lists them
for tests/integration/snapshot_reader_test.py."""
import json
import os
import subprocess
import sys

FIXTURES = [
    {"name": "canonical", "take": 5, "args": [],
     "spec": {"seed": 42, "pipeline": [
         {"op": "range", "stop": 300}, {"op": "shuffle", "buffer": 20}, {"op": "sharding_filter"},
         {"op": "map", "fn": "affine", "mul": 2}, {"op": "batch", "size": 8}]}},
    {"name": "canonical-workers2", "take": 7, "args": ["--workers", "2"],
     "spec": {"seed": 42, "pipeline": [
         {"op": "range", "stop": 300}, {"op": "shuffle", "buffer": 20}, {"op": "sharding_filter"},
         {"op": "map", "fn": "affine", "mul": 2}, {"op": "batch", "size": 8}]}},
    {"name": "strings", "take": 3, "args": [],
     "spec": {"seed": 5, "pipeline": [
         {"op": "from_vector", "values": [w + str(i) for i in range(6)
                                          for w in ("alpha", "b\"q", "tab\t", "\u00e9t\u00e9", "", "\u65e5")]},
         {"op": "shuffle", "buffer": 8}, {"op": "batch", "size": 4}]}},
    {"name": "zip-generator", "take": 4, "args": [],
     "spec": {"seed": 7, "pipeline": [
         {"op": "generator", "fn": "random_ints", "count": 60, "hi": 1000}, {"op": "shuffle", "buffer": 10},
         {"op": "zip", "with": [[{"op": "range", "start": 100, "stop": 400}]]}, {"op": "batch", "size": 3}]}},
    {"name": "set-sampled", "take": 5, "args": ["--workers", "2"], "world_size": 2,
     "spec": {"seed": 11, "pipeline": [
         {"op": "range", "stop": 300}, {"op": "sampler", "shuffle": "global"}, {"op": "shuffle", "buffer": 8},
         {"op": "map", "fn": "affine", "mul": 1}, {"op": "batch", "size": 4}]}},
    # Version 7 on: buffered elements saved as restore keys (a traced run).
    {"name": "keys-sampled", "take": 6, "args": ["--workers", "2", "--restore-keys"],
     "spec": {"seed": 13, "pipeline": [
         {"op": "range", "stop": 400}, {"op": "sampler", "shuffle": "global", "name": "draw"},
         {"op": "map", "fn": "affine", "mul": 3}, {"op": "shuffle", "buffer": 16},
         {"op": "flat_map", "fn": "replicate", "times": 2}, {"op": "batch", "size": 5}]}},
    # Version 8 on: extended keys (a batch of batches: each inner batch's start marked).
    {"name": "keys-grouped", "take": 4, "args": ["--workers", "2", "--restore-keys"],
     "spec": {"seed": 17, "pipeline": [
         {"op": "range", "stop": 300}, {"op": "sampler", "shuffle": "global", "name": "draw"},
         {"op": "batch", "size": 3}, {"op": "shuffle", "buffer": 4}, {"op": "batch", "size": 2}]}},
]


def main(dpipe, out):
    if os.path.exists(os.path.join(out, "fixtures.json")):
        sys.exit(f"{out} already holds fixtures; a version's fixtures are never regenerated")
    os.makedirs(out, exist_ok=True)

    def run(*args):
        r = subprocess.run([dpipe, *map(str, args)], capture_output=True, text=True, check=True)
        return r.stdout

    manifest = []
    for fx in FIXTURES:
        name, take, args = fx["name"], fx["take"], fx["args"]
        spec = name + ".spec.json"
        with open(os.path.join(out, spec), "w") as f:
            json.dump(fx["spec"], f, ensure_ascii=False)
            f.write("\n")
        spec_path = os.path.join(out, spec)
        entry = {"name": name, "spec": spec, "args": args}
        if "world_size" in fx:
            world = fx["world_size"]
            entry.update(snapshot_dir=name, world_size=world, expected=[])
            fulls = []
            for r in range(world):  # every rank's file first: a set resumes only when complete
                layout = ["--rank", r, "--world-size", world]
                fulls.append(run("run", spec_path, *layout, *args).splitlines(keepends=True))
                head = run("run", spec_path, *layout, *args, "--take", take, "--snapshot-dir", os.path.join(out, name))
                assert head.splitlines(keepends=True) == fulls[r][:take]
            for r in range(world):
                layout = ["--rank", r, "--world-size", world]
                rest = run("run", spec_path, *layout, *args, "--resume-dir", os.path.join(out, name))
                assert rest.splitlines(keepends=True) == fulls[r][take:], f"{name} rank {r}: resume differs"
                expected = f"{name}.rank{r}.expected.jsonl"
                open(os.path.join(out, expected), "w").write(rest)
                entry["expected"].append(expected)
        else:
            snap = name + ".dpipe"
            full = run("run", spec_path, *args).splitlines(keepends=True)
            head = run("run", spec_path, *args, "--take", take, "--snapshot-out", os.path.join(out, snap))
            assert head.splitlines(keepends=True) == full[:take]
            rest = run("run", spec_path, *args, "--resume", os.path.join(out, snap))
            assert rest.splitlines(keepends=True) == full[take:], f"{name}: resume differs"
            expected = name + ".expected.jsonl"
            open(os.path.join(out, expected), "w").write(rest)
            entry.update(snapshot=snap, expected=expected)
        entry["take"] = take
        manifest.append(entry)
    with open(os.path.join(out, "fixtures.json"), "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
