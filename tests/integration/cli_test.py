#!/usr/bin/env python3
"""End-to-end tests of the `dpipe` tool: semantics cases, snapshot/resume, stats, inspection, errors.

Writes JUnit XML to $DPIPE_BUILD_ROOT/test-results/cli.xml so the test summary counts every case."""
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
import xml.etree.ElementTree as ET

from tool_files import tfrecord, write_tokens

SRC = os.environ.get("DPIPE_SOURCE_ROOT", ".")
BUILD = os.environ.get("DPIPE_BUILD_ROOT", "build")
DPIPE = os.path.join(BUILD, "tools", "dpipe")
TMP = tempfile.mkdtemp(prefix="dpipe-cli-")
results = []  # (name, error or None)


def rank_file(d, rank, world):
    """The one file of rank `rank` of `world` in the set directory d (rank-R-of-W.wK[.sS].TAG.dpipe)."""
    found = glob.glob(os.path.join(d, f"rank-{rank}-of-{world}.w*.dpipe"))
    assert len(found) == 1, (d, rank, world, os.listdir(d))
    return found[0]


def dpipe(*args, check=True, timeout=60):
    r = subprocess.run([DPIPE, *map(str, args)], capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise AssertionError(f"dpipe {' '.join(map(str, args))} exited {r.returncode}: {r.stderr}")
    return r


def lines(stdout):
    return [json.loads(x) for x in stdout.splitlines()]


def case(name):
    def wrap(fn):
        try:
            fn()
            results.append((name, None))
        except Exception:  # noqa: BLE001 - every failure is reported, not raised
            results.append((name, traceback.format_exc()))
        return fn
    return wrap


def layout_args(c):
    if "layout" not in c:
        return []
    l = c["layout"]
    return ["--rank", l["rank"], "--world-size", l["world_size"], "--workers", l["num_workers"]]


case_files = sorted(glob.glob(os.path.join(SRC, "..", "shared", "semantics", "cases", "*.case.json"))) + sorted(
    glob.glob(os.path.join(SRC, "tests", "semantics", "cases", "*.case.json")))
assert case_files, "no semantics cases found"

for path in case_files:
    def check_case(path=path):
        c = json.load(open(path))
        r = dpipe("run", json.dumps(c["spec"]), *layout_args(c), check=False)
        if "error" in c:
            assert r.returncode != 0, "expected a failure"
            assert c["error"] in r.stderr, r.stderr
            assert len(r.stderr.strip().splitlines()) == 1, "errors are one line: " + r.stderr
        else:
            assert r.returncode == 0, r.stderr
            assert lines(r.stdout) == c["expected"], (lines(r.stdout), c["expected"])
    case("semantics/" + os.path.basename(path).replace(".case.json", ""))(check_case)

CANONICAL = {"seed": 3, "pipeline": [
    {"op": "range", "start": 0, "stop": 20000},
    {"op": "shuffle", "buffer": 1000},
    {"op": "sharding_filter"},
    {"op": "map", "fn": "affine", "mul": 2},
    {"op": "batch", "size": 32}]}
SPEC = os.path.join(TMP, "canonical.json")
json.dump(CANONICAL, open(SPEC, "w"))
GEN_SPEC = os.path.join(TMP, "gen.json")
json.dump({"seed": 1, "pipeline": [{"op": "generator", "fn": "random_ints", "count": 5000, "hi": 100},
                                    {"op": "shuffle", "buffer": 50}, {"op": "batch", "size": 8}]}, open(GEN_SPEC, "w"))


@case("run/resume_continues_exactly_at_several_points")
def _():
    for workers in (1, 3):
        full = lines(dpipe("run", SPEC, "--workers", workers).stdout)
        for take in (0, 1, 7, len(full) // 2, len(full)):
            snap = os.path.join(TMP, f"s{workers}_{take}.bin")
            head = lines(dpipe("run", SPEC, "--workers", workers, "--take", take, "--snapshot-out", snap).stdout)
            rest = lines(dpipe("run", SPEC, "--workers", workers, "--resume", snap).stdout)
            assert head + rest == full, (workers, take)


@case("run/provenance_names_the_source_positions_of_each_element")
def _():
    spec = json.dumps({"seed": 3, "pipeline": [
        {"op": "range", "start": 1000, "stop": 1200, "name": "ids"}, {"op": "sampler", "name": "draw"},
        {"op": "shuffle", "buffer": 9}, {"op": "batch", "size": 4}]})
    plain = lines(dpipe("run", spec, "--workers", 2).stdout)
    for workers in (1, 2, 3):
        got = lines(dpipe("run", spec, "--workers", workers, "--provenance").stdout)
        assert sorted(x for r in got for x in r["element"]) == list(range(1000, 1200)), workers
        for r in got:  # the sampler drew dataset index i of range(1000, 1200): element 1000 + i
            assert [["draw", x - 1000] for x in r["element"]] == r["sources"], r
        if workers == 2:
            assert [r["element"] for r in got] == plain  # tracing does not change the stream
    # Across a resume of a traced run's snapshot (restore keys), every element is named; from a snapshot of
    # data (an untraced run's), an element it held (in the shuffle's full buffer of 9, in the run's hands)
    # is unknown (null) and the rest are named as before.
    snap = os.path.join(TMP, "provenance.bin")
    spec = json.dumps({**json.loads(spec), "pipeline": [{"op": "range", "start": 1000, "stop": 21000, "name": "ids"},
                                                         *json.loads(spec)["pipeline"][1:]]})
    whole = lines(dpipe("run", spec).stdout)
    for traced_snapshot in (True, False):
        head = lines(dpipe("run", spec, "--take", 10, "--snapshot-out", snap,
                           *(["--provenance"] if traced_snapshot else [])).stdout)
        rest = lines(dpipe("run", spec, "--resume", snap, "--provenance").stdout)
        assert [r["element"] if traced_snapshot else r for r in head] + [r["element"] for r in rest] == whole
        # null for a batch held whole (the run's hands), a null entry for an element of the shuffle's buffer
        pairs = [(x, s) for r in rest for x, s in zip(r["element"], r["sources"] or [None] * len(r["element"]), strict=True)]
        unknown = [x for x, s in pairs if s is None]
        assert all(s == ["draw", x - 1000] for x, s in pairs if s is not None)
        if traced_snapshot:
            assert not unknown and len(pairs) == 20000 - 40, (len(unknown), len(pairs))
            # `snapshot show` names the keys' sources as --provenance does.
            shown = json.loads(dpipe("snapshot", "show", snap).stdout)
            buffer = next(st for st in shown["states"] if st["kind"] == "shuffle")["fields"]["buffer"]
            assert buffer["type"] == "keys:i64" and buffer["count"] == 9, buffer
            assert all(len(v["key"]) == 1 and v["key"][0][0] == "draw" and isinstance(v["crc32c"], int)
                       for v in buffer["values"]), buffer
            # `snapshot which` lists the sources of what the resume delivers next, counted over the run.
            which = lines(dpipe("snapshot", "which", spec, snap, "--steps", 25).stdout)
            assert which == [{"index": 10 + i, "sources": r["sources"]} for i, r in enumerate(rest[:25])], which[:3]
        else:
            assert 9 <= len(unknown) < len(pairs) // 2, (len(unknown), len(pairs))
    # Expansions carry offsets; a kind that does not carry provenance is refused by name.
    expanded = lines(dpipe("run", json.dumps({"pipeline": [{"op": "range", "stop": 3},
                                                         {"op": "flat_map", "fn": "replicate", "times": 2}]}),
                           "--provenance").stdout)
    assert [r["sources"][0][2]["offsets"] for r in expanded] == [[0], [1]] * 3, expanded
    refused = dpipe("run", json.dumps({"pipeline": [{"op": "range", "stop": 3}, {"op": "enumerate"}]}),
                    "--provenance", check=False)
    assert refused.returncode == 1 and "does not carry provenance yet" in refused.stderr, refused.stderr
    # A zip's row names one element of each input, in order.
    zipped = lines(dpipe("run", json.dumps({"pipeline": [{"op": "range", "stop": 3, "name": "a"},
                                                       {"op": "zip", "with": [[{"op": "range", "start": 10, "stop": 13, "name": "b"}]]}]}),
                         "--provenance").stdout)
    assert [r["sources"] for r in zipped] == [[["a", i], ["b", i]] for i in range(3)], zipped


@case("run/map_with_rng_draws_per_sample_whatever_the_layout")
def _():
    spec = json.dumps({"seed": 5, "pipeline": [{"op": "range", "stop": 300}, {"op": "sampler"},
                                               {"op": "map", "fn": "add_random", "below": 10**12, "rng": True}]})
    def draws(*args):
        out = {}
        for world in ([1] if "--workers" in args else [1, 2, 3]):
            for rank in range(world):
                for x in lines(dpipe("run", spec, "--rank", rank, "--world-size", world, *args).stdout):
                    out.setdefault(x, 0)
                    out[x] += 1
        return out
    reference = lines(dpipe("run", spec).stdout)
    assert len(set(reference)) == 300 and reference != list(range(300))
    for args in ((), ("--workers", 2), ("--workers", 3)):
        assert sorted(draws(*args)) == sorted(reference), args
    snap = os.path.join(TMP, "rng.bin")
    head = lines(dpipe("run", spec, "--workers", 2, "--take", 77, "--snapshot-out", snap).stdout)
    rest = lines(dpipe("run", spec, "--workers", 2, "--resume", snap).stdout)
    assert sorted(head + rest) == sorted(reference)
    for node, says in (({"op": "map", "fn": "add_random", "below": 10}, 'give "rng": true'),
                       ({"op": "map", "fn": "identity", "rng": True}, "takes no generator")):
        r = dpipe("run", json.dumps({"pipeline": [{"op": "range", "stop": 3}, node]}), check=False)
        assert r.returncode == 1 and says in r.stderr, r.stderr


@case("run/numbers_with_leading_zeros_are_decimal")
def _():
    spec = json.dumps({"pipeline": [{"op": "range", "stop": 100}, {"op": "sharding_filter"}]})
    # "010" is ten, not octal eight, for every integer option.
    assert lines(dpipe("run", spec, "--take", "010").stdout) == list(range(10))
    assert lines(dpipe("run", spec, "--take", "007", "--seed", "010", "--workers", "02").stdout) == \
        lines(dpipe("run", spec, "--take", "7", "--seed", "10", "--workers", "2").stdout)
    assert lines(dpipe("run", spec, "--rank", "01", "--world-size", "02", "--take", "3").stdout) == [1, 3, 5]
    snap = os.path.join(TMP, "octal_step.bin")
    dpipe("run", spec, "--take", "2", "--step", "010", "--snapshot-out", snap)
    shown = dpipe("snapshot", "show", snap).stdout
    assert re.search(r"step\D+10\b", shown), shown


@case("run/take_zero_takes_nothing_and_no_take_takes_all")
def _():
    full = lines(dpipe("run", SPEC).stdout)
    snap = os.path.join(TMP, "take0.bin")
    assert lines(dpipe("run", SPEC, "--take", 0, "--snapshot-out", snap).stdout) == []
    # The snapshot before the first element resumes the whole stream.
    assert lines(dpipe("run", SPEC, "--resume", snap).stdout) == full and len(full) > 0


@case("run/take_counts_from_the_resume_point_and_snapshots_chain")
def _():
    full = lines(dpipe("run", SPEC).stdout)
    a, b = os.path.join(TMP, "a.bin"), os.path.join(TMP, "b.bin")
    first = lines(dpipe("run", SPEC, "--take", 10, "--snapshot-out", a).stdout)
    second = lines(dpipe("run", SPEC, "--resume", a, "--take", 10, "--snapshot-out", b).stdout)
    rest = lines(dpipe("run", SPEC, "--resume", b).stdout)
    assert len(second) == 10
    assert first + second + rest == full


@case("run/stats_report_restore_and_replay")
def _():
    snap = os.path.join(TMP, "gen.bin")
    dpipe("run", GEN_SPEC, "--take", 100, "--snapshot-out", snap)
    r = dpipe("run", GEN_SPEC, "--resume", snap, "--stats")
    stats = json.loads(r.stderr.strip().splitlines()[-1])
    for k in ("elements", "seconds", "restore_ms", "replayed_elements"):
        assert k in stats, stats
    # Batched and delivered, plus buffered in the shuffle, plus what the worker had produced ahead of
    # the consumer (at most its queue, 64 batches of 8 by default, and half that again in hand).
    assert 100 * 8 + 50 <= stats["replayed_elements"] <= 100 * 8 + 50 + 96 * 8, stats
    assert stats["restore_ms"] > 0
    fresh = json.loads(dpipe("run", SPEC, "--stats").stderr.strip().splitlines()[-1])
    assert fresh["restore_ms"] == 0 and fresh["replayed_elements"] == 0 and fresh["elements"] > 0


@case("run/output_file")
def _():
    out = os.path.join(TMP, "out.jsonl")
    dpipe("run", SPEC, "--take", 5, "--output", out)
    assert len(open(out).read().splitlines()) == 5


@case("run/a_failed_run_keeps_the_old_output_and_what_it_delivered")
def _():
    out = os.path.join(TMP, "kept.jsonl")
    dpipe("run", json.dumps({"pipeline": [{"op": "range", "stop": 100000}]}), "--output", out)
    good = open(out).read()
    failing = {"pipeline": [{"op": "range", "stop": 100000}, {"op": "map", "fn": "throw_at", "index": 50000}]}
    r = dpipe("run", json.dumps(failing), "--output", out, check=False)
    assert r.returncode == 1 and "throw_at" in r.stderr, r.stderr
    assert open(out).read() == good, "a failed run replaced the good output"
    partial = lines(open(out + ".partial").read())
    assert partial == list(range(50000)), len(partial)
    assert "kept.jsonl.partial" in r.stderr, r.stderr
    assert not glob.glob(os.path.join(TMP, ".kept.jsonl.dpipe-tmp.*")), "a temporary file was left behind"
    # Through a symbolic link, the file it names is replaced, keeping its permissions.
    os.chmod(out, 0o640)
    link = os.path.join(TMP, "kept-link.jsonl")
    os.symlink(out, link)
    dpipe("run", json.dumps({"pipeline": [{"op": "range", "stop": 3}]}), "--output", link)
    assert os.path.islink(link) and lines(open(out).read()) == [0, 1, 2]
    assert os.stat(out).st_mode & 0o777 == 0o640, oct(os.stat(out).st_mode)
    # To standard output: every element before the failure arrives, then the one-line error.
    r = dpipe("run", json.dumps({"pipeline": [{"op": "range", "stop": 1000},
                                              {"op": "map", "fn": "throw_at", "index": 20}]}), check=False)
    assert r.returncode == 1 and lines(r.stdout) == list(range(20)), (r.returncode, r.stdout[:200])
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


@case("run/write_errors_are_errors")
def _():
    if not os.path.exists("/dev/full"):
        return
    small = json.dumps({"pipeline": [{"op": "range", "stop": 10}]})
    r = dpipe("run", small, "--output", "/dev/full", check=False)
    assert r.returncode == 1 and "cannot write" in r.stderr, (r.returncode, r.stderr)
    with open("/dev/full", "w") as full:
        for args in (["run", small], ["graph", small]):
            r = subprocess.run([DPIPE, *args], stdout=full, stderr=subprocess.PIPE, text=True, timeout=60)
            assert r.returncode == 1 and "cannot write" in r.stderr and "standard output" in r.stderr, (args, r.returncode, r.stderr)


@case("run/a_failure_recorded_in_a_snapshot_resumes_to_the_same_failure")
def _():
    spec = json.dumps({"pipeline": [{"op": "range", "stop": 1000}, {"op": "replicate"},
                                    {"op": "map", "fn": "throw_at", "index": 20, "name": "fragile"}]})
    full = dpipe("run", spec, "--workers", 2, check=False)
    assert full.returncode == 1
    snap = os.path.join(TMP, "failed-ahead.bin")
    # The case is a snapshot that holds the failure itself: the workers have run ahead into it by the
    # time the consumer has 5 elements, in practice at once (the loop only makes that certain).
    for _ in range(20):
        head = dpipe("run", spec, "--workers", 2, "--take", 5, "--snapshot-out", snap)
        if "failing on element 20" in dpipe("snapshot", "show", snap).stdout:
            break
    else:
        raise AssertionError("no snapshot caught the workers' failure")
    rest = dpipe("run", spec, "--workers", 2, "--resume", snap, check=False)
    assert rest.returncode == 1 and "fragile" in rest.stderr, (rest.returncode, rest.stderr)
    assert len(rest.stderr.strip().splitlines()) == 1, rest.stderr
    assert lines(head.stdout) + lines(rest.stdout) == lines(full.stdout)


@case("spec/limits_are_errors_not_crashes")
def _():
    def nested(levels):
        deep = [{"op": "range", "stop": 1}]
        for _ in range(levels):
            deep = [{"op": "range", "stop": 1}, {"op": "concat", "with": [deep]}]
        return json.dumps({"pipeline": deep})
    assert len(lines(dpipe("run", nested(256)).stdout)) == 257
    for cmd in ("run", "graph"):
        r = dpipe(cmd, nested(257), check=False)
        assert r.returncode == 1 and "nest more than 256 levels" in r.stderr, (r.returncode, r.stderr[-300:])
    for values in ([18446744073709551615], [9223372036854775808]):
        r = dpipe("run", json.dumps({"pipeline": [{"op": "from_vector", "values": values}]}), check=False)
        assert r.returncode == 1 and "64-bit" in r.stderr, (r.returncode, r.stdout, r.stderr)
    r = dpipe("run", json.dumps({"pipeline": [{"op": "range", "stop": 9223372036854775808}]}), check=False)
    assert r.returncode == 1 and "64-bit" in r.stderr, (r.returncode, r.stdout, r.stderr)
    # A value nested 70,000 lists deep (140 KB) is named by its kind in a short line, never printed whole.
    deep_spec = os.path.join(TMP, "deep_values.json")  # a file: one argument may not hold 140 KB
    with open(deep_spec, "w") as f:
        f.write('{"pipeline": [{"op": "from_vector", "values": [' + "[" * 70000 + "1" + "]" * 70000 + ']}]}')
    r = dpipe("run", deep_spec, check=False)
    assert r.returncode == 1 and "must hold only integers, found a list of 1" in r.stderr, (r.returncode, r.stderr[:300])
    assert len(r.stderr) < 300, len(r.stderr)
    r = dpipe("run", json.dumps({"pipeline": [{"op": "range", "stop": 9223372036854775807}]}), "--take", 2)
    assert lines(r.stdout) == [0, 1]
    r = dpipe("run", '{"pipeline": [{"op": "range", "stop": 9999999e9999}]}', check=False)  # beyond a double
    assert r.returncode == 1 and "not valid JSON" in r.stderr, (r.returncode, r.stderr)
    r = dpipe("run", json.dumps({"pipeline": [{"op": "range", "stop": 9},
                                              {"op": "batch", "size": 2, "name": "run"}]}), check=False)
    assert r.returncode == 1 and "reserved" in r.stderr, r.stderr
    text = os.path.join(TMP, "limits.txt")
    open(text, "w").write("a\nb\n")
    r = dpipe("run", json.dumps({"pipeline": [{"op": "lines", "files": [text], "logical_shards": 64,
                                              "epochs": 288230376151711744}]}), check=False)
    assert r.returncode == 1 and "2^62" in r.stderr, (r.returncode, r.stderr)
    empty = os.path.join(TMP, "empty.txt")
    open(empty, "w").close()
    r = dpipe("run", json.dumps({"pipeline": [{"op": "lines", "files": [empty], "epochs": 10000000}]}),
              "--take", 1, timeout=30)
    assert r.stdout == "", r.stdout


@case("bench/seconds_bounds_slow_elements")
def _():
    t0 = time.time()
    spec = {"pipeline": [{"op": "range", "stop": 100000}, {"op": "map", "fn": "spin", "ns": 50000000}]}
    r = dpipe("bench", json.dumps(spec), "--seconds", "0.5", "--threads", 1, timeout=60)
    assert json.loads(r.stdout)["elements"] < 100, r.stdout
    assert time.time() - t0 < 20


@case("run/seed_option_overrides_the_spec")
def _():
    a = dpipe("run", SPEC, "--seed", 3).stdout
    b = dpipe("run", SPEC).stdout
    c = dpipe("run", SPEC, "--seed", 4).stdout
    assert a == b and a != c


@case("snapshot/show_renders_json")
def _():
    snap = os.path.join(TMP, "show.bin")
    dpipe("run", SPEC, "--take", 3, "--snapshot-out", snap)
    shown = json.loads(dpipe("snapshot", "show", snap).stdout)
    kinds = {s["kind"] for s in shown["states"]}
    assert {"run", "range", "shuffle", "sharding_filter", "map", "batch"} <= kinds, kinds
    assert shown["seed"] == 3 and shown["layout"]["num_workers"] == 1
    shuffle = next(s for s in shown["states"] if s["kind"] == "shuffle")
    assert shuffle["fields"]["buffer"]["count"] == 1000
    # Kinds that declare one say what their record means.
    assert shuffle["summary"] == "1000 of 1000 buffered", shuffle.get("summary")
    batch = next(s for s in shown["states"] if s["kind"] == "batch")
    assert batch["summary"].endswith(" of " + str(CANONICAL["pipeline"][-1]["size"]) + " elements of the next batch"), batch
    assert "summary" not in next(s for s in shown["states"] if s["kind"] == "map")


@case("snapshot/refusals_are_one_clear_line")
def _():
    snap = os.path.join(TMP, "good.bin")
    dpipe("run", SPEC, "--take", 3, "--snapshot-out", snap)
    data = open(snap, "rb").read()
    bad = os.path.join(TMP, "bad.bin")
    for mutated, needle in ((data[: len(data) // 2], "truncated"), (b"XXXX" + data[4:], "magic"),
                            (data[:-2] + bytes([data[-2] ^ 1]) + data[-1:], "checksum")):
        open(bad, "wb").write(mutated)
        r = dpipe("run", SPEC, "--resume", bad, check=False)
        assert r.returncode == 1 and needle in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
        r = dpipe("snapshot", "show", bad, check=False)
        assert r.returncode == 1 and needle in r.stderr, r.stderr
    r = dpipe("run", SPEC, "--resume", snap, "--seed", 9, check=False)
    assert r.returncode == 1 and "seed 3" in r.stderr, r.stderr
    r = dpipe("run", SPEC, "--resume", snap, "--workers", 2, check=False)
    assert r.returncode == 1 and "layout" in r.stderr, r.stderr
    r = dpipe("run", GEN_SPEC, "--resume", snap, check=False)
    assert r.returncode == 1 and "different pipeline" in r.stderr, r.stderr
    r = dpipe("run", SPEC, "--resume", os.path.join(TMP, "missing.bin"), check=False)
    assert r.returncode == 1 and "cannot open" in r.stderr, r.stderr


@case("graph/dot")
def _():
    dot = dpipe("graph", SPEC).stdout
    assert dot.startswith("digraph") and "shuffle@" in dot and "->" in dot


@case("bench/json_line")
def _():
    r = dpipe("bench", SPEC)
    b = json.loads(r.stdout)
    assert b["elements"] == 625 and b["elements_per_s"] > 0 and b["seconds"] > 0
    forever = {"pipeline": [{"op": "range", "stop": 10}, {"op": "cycle"}]}
    t0 = time.time()
    b = json.loads(dpipe("bench", json.dumps(forever), "--seconds", "0.3").stdout)
    assert 0.25 < b["seconds"] < 5 and time.time() - t0 < 10 and b["elements"] > 0


@case("misuse/unsplit_source_warns_replicate_silences_double_sharding_refused")
def _():
    unsplit = json.dumps({"pipeline": [{"op": "range", "stop": 4}]})
    r = dpipe("run", unsplit, "--workers", 2)
    assert len(lines(r.stdout)) == 8, r.stdout  # every worker delivers every element, as torch does
    assert "dpipe: warning: pipeline[0] (range) is read in full by the workers" in r.stderr, r.stderr
    assert "replicate()" in r.stderr, r.stderr
    marked = json.dumps({"pipeline": [{"op": "range", "stop": 4}, {"op": "replicate"}]})
    r = dpipe("run", marked, "--workers", 2)
    assert len(lines(r.stdout)) == 8 and r.stderr == "", r.stderr
    twice = json.dumps({"pipeline": [{"op": "range", "stop": 4}, {"op": "sampler"}, {"op": "sharding_filter"}]})
    r = dpipe("run", twice, "--workers", 2, check=False)
    assert r.returncode == 2 or r.returncode == 1, r.returncode
    assert "pipeline[2] (sharding_filter) shards over every rank and worker, but pipeline[1] (sampler) already deals" in r.stderr, r.stderr
    assert "Remove the sharding_filter" in r.stderr, r.stderr


@case("snapshot/step_and_id_and_a_set_of_mixed_steps_refused")
def _():
    spec = json.dumps({"pipeline": [{"op": "range", "stop": 100}, {"op": "sampler"}]})
    d = os.path.join(TMP, "mixed-steps")
    for rank, step in ((0, 1200), (1, 1300)):
        dpipe("run", spec, "--rank", rank, "--world-size", 2, "--take", 3, "--snapshot-dir", d, "--step", step)
    shown = json.loads(dpipe("snapshot", "show", rank_file(d, 1, 2)).stdout)
    assert shown["step"] == 1300 and shown["format_version"] == 8 and shown["id"] != "0" * 16, shown
    # The names say the steps: refused from the directory listing, naming ranks and steps.
    r = dpipe("run", spec, "--rank", 0, "--world-size", 2, "--resume-dir", d, check=False)
    assert r.returncode == 1 and "step 1200 on rank 0; step 1300 on rank 1" in r.stderr, r.stderr
    # Reading the whole set (show, rescale) refuses it too, naming the ids.
    r = dpipe("snapshot", "show", d, check=False)
    assert r.returncode == 1 and "names step 1300" in r.stderr and "step 1200" in r.stderr, r.stderr


@case("snapshot/a_set_without_step_names_its_moment_and_another_runs_set_is_kept")
def _():
    spec = json.dumps({"seed": 9, "pipeline": [{"op": "range", "stop": 1000}, {"op": "sampler"},
                                                {"op": "shuffle", "buffer": 50}, {"op": "batch", "size": 4}]})
    a, b, mixed = (os.path.join(TMP, n) for n in ("moment-a", "moment-b", "moment-mixed"))
    for rank in (0, 1):
        dpipe("run", spec, "--rank", rank, "--world-size", 2, "--take", 10, "--snapshot-dir", a)
        dpipe("run", spec, "--rank", rank, "--world-size", 2, "--take", 20, "--snapshot-dir", b)
    # Without --step, a write with --take records where the rank was asked to stop: step 10 and step 20.
    assert json.loads(dpipe("snapshot", "show", rank_file(a, 1, 2)).stdout)["step"] == 10
    os.makedirs(mixed)
    shutil.copy(rank_file(a, 0, 2), mixed)
    shutil.copy(rank_file(b, 1, 2), mixed)
    r = dpipe("run", spec, "--rank", 0, "--world-size", 2, "--resume-dir", mixed, check=False)
    assert r.returncode == 1 and "step 10 on rank 0; step 20 on rank 1" in r.stderr, r.stderr
    # A resumed run counts on from the step it resumed: 10 + 5.
    later = os.path.join(TMP, "moment-a-later")
    for rank in (0, 1):
        dpipe("run", spec, "--rank", rank, "--world-size", 2, "--resume-dir", a, "--take", 5, "--snapshot-dir", later)
    assert json.loads(dpipe("snapshot", "show", rank_file(later, 0, 2)).stdout)["step"] == 15
    # Written back into the set it resumed, rank by rank, the set is two moments until the last rank
    # writes: the next resume of rank 1 meanwhile is refused, not half old and half new.
    dpipe("run", spec, "--rank", 0, "--world-size", 2, "--resume-dir", a, "--take", 5, "--snapshot-dir", a)
    r = dpipe("run", spec, "--rank", 1, "--world-size", 2, "--resume-dir", a, "--take", 5, check=False)
    assert r.returncode == 1 and "step 10 on rank 1; step 15 on rank 0" in r.stderr, r.stderr
    shutil.rmtree(a)
    shutil.copytree(later, a)
    # Another run (seed 10) writing into that directory is refused, and the set stays whole and resumable.
    before = sorted(os.listdir(a))
    r = dpipe("run", spec, "--seed", 10, "--rank", 0, "--world-size", 2, "--take", 15, "--snapshot-dir", a, check=False)
    assert r.returncode == 1 and "holds the set of another run" in r.stderr and "seed 9" in r.stderr, r.stderr
    assert sorted(os.listdir(a)) == before, (before, os.listdir(a))
    for rank in (0, 1):
        dpipe("run", spec, "--rank", rank, "--world-size", 2, "--resume-dir", a, "--take", 1)


@case("resume/data_root_moves_with_the_files_and_digests_accept_copies")
def _():
    here, there = os.path.join(TMP, "root-here"), os.path.join(TMP, "moved", "root-there")
    os.makedirs(os.path.join(here, "text"))
    with open(os.path.join(here, "text", "a.txt"), "w") as f:
        f.write("".join(f"line {i}\n" for i in range(40)))
    spec = json.dumps({"pipeline": [{"op": "lines", "files": ["text/a.txt"], "logical_shards": 4},
                                     {"op": "shuffle", "buffer": 8}]})
    everything = lines(dpipe("run", spec, "--seed", 3, "--data-root", here).stdout)
    snap = os.path.join(TMP, "rooted.snap")
    head = lines(dpipe("run", spec, "--seed", 3, "--data-root", here, "--take", 9, "--snapshot-out", snap).stdout)
    os.makedirs(os.path.dirname(there))
    os.rename(here, there)
    rest = lines(dpipe("run", spec, "--seed", 3, "--data-root", there, "--resume", snap).stdout)
    assert head + rest == everything and len(everything) == 40, (head, rest)
    # Named by absolute path without a root, the file is another pipeline's.
    absolute = spec.replace('"text/a.txt"', json.dumps(os.path.join(there, "text", "a.txt")))
    r = dpipe("run", absolute, "--seed", 3, "--resume", snap, check=False)
    assert r.returncode == 1 and "text/a.txt" in r.stderr and "snapshot" in r.stderr, r.stderr
    # With digests, a copy with a new modification time resumes; without, it is changed data.
    digest_snap = os.path.join(TMP, "digest.snap")
    dpipe("run", spec, "--seed", 3, "--data-root", there, "--file-digest", "--take", 9, "--snapshot-out", digest_snap)
    copy = os.path.join(TMP, "root-copy")
    shutil.copytree(there, copy, copy_function=shutil.copy)
    st = os.stat(os.path.join(there, "text", "a.txt"))
    os.utime(os.path.join(copy, "text", "a.txt"), ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))
    assert lines(dpipe("run", spec, "--seed", 3, "--data-root", copy, "--file-digest", "--resume", digest_snap).stdout) == rest
    r = dpipe("run", spec, "--seed", 3, "--data-root", copy, "--resume", snap, check=False)
    assert r.returncode == 1 and "data changed since the snapshot" in r.stderr, r.stderr
    # graph reads the spec's files as run does: under the root, and refused without it.
    assert "text/a.txt" in dpipe("graph", spec, "--data-root", there).stdout
    assert dpipe("graph", spec, check=False).returncode == 1


@case("resume/changed_data_refused_unless_allowed_and_tuning_free")
def _():
    data = os.path.join(TMP, "changing.txt")
    with open(data, "w") as f:
        f.write("aa\nbb\ncc\ndd\n")
    spec = json.dumps({"pipeline": [{"op": "lines", "files": [data], "shuffle_shards": False},
                                     {"op": "prefetch", "depth": 4}]})
    snap = os.path.join(TMP, "changing.snap")
    first = lines(dpipe("run", spec, "--take", 1, "--snapshot-out", snap).stdout)
    assert first == ["aa"], first
    with open(data, "w") as f:
        f.write("xx\nyy\nzz\nww\n")
    st = os.stat(data)
    os.utime(data, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))
    r = dpipe("run", spec, "--resume", snap, check=False)
    assert r.returncode != 0 and "data changed since the snapshot" in r.stderr and data in r.stderr, r.stderr
    assert "--allow-changed-data" in r.stderr, r.stderr
    # Lines read before the snapshot come from it, the others from the file as it is now.
    accepted = lines(dpipe("run", spec, "--resume", snap, "--allow-changed-data").stdout)
    assert len(accepted) == 3, accepted
    # A changed prefetch depth changes no element, so it resumes; a changed parameter is named.
    deeper = spec.replace('"depth": 4', '"depth": 9')
    assert lines(dpipe("run", deeper, "--resume", snap, "--allow-changed-data").stdout) == accepted
    other = spec.replace('"shuffle_shards": false', '"shuffle_shards": true')
    r = dpipe("run", other, "--resume", snap, "--allow-changed-data", check=False)
    assert r.returncode != 0 and "shuffle_shards is true, the snapshot has false" in r.stderr, r.stderr


@case("resume/mix_weights_change_only_when_overridden_and_the_change_is_recorded")
def _():
    def spec(weights):
        return json.dumps({"pipeline": [{"op": "mix", "weights": weights, "with": [
            [{"op": "range", "stop": 3000}, {"op": "sampler"}, {"op": "shuffle", "buffer": 10}],
            [{"op": "range", "start": 10000, "stop": 13000}, {"op": "sampler", "shuffle": "none"}]]},
            {"op": "prefetch", "depth": 8}]})
    d = os.path.join(TMP, "mix-override")
    head = lines(dpipe("run", spec([0.7, 0.3]), "--take", 30, "--snapshot-dir", d).stdout)
    r = dpipe("run", spec([1, 0]), "--resume-dir", d, check=False)
    assert r.returncode == 1 and "weights is 1, 0, the snapshot has 0.7, 0.3" in r.stderr, r.stderr
    assert "(resume with the override 'weights' to change it)" in r.stderr, r.stderr
    r = dpipe("run", spec([1, 0]), "--resume-dir", d, "--override", "wieghts", check=False)
    assert r.returncode == 1 and "override 'wieghts': no node of this pipeline" in r.stderr, r.stderr
    r = dpipe("run", spec([1, 0]), "--override", "weights", check=False)
    assert r.returncode != 0 and "--override changes a parameter of a resumed run" in r.stderr, r.stderr
    e = os.path.join(TMP, "mix-override-2")
    rest = lines(dpipe("run", spec([1, 0]), "--resume-dir", d, "--override", "weights", "--take", 50,
                       "--snapshot-dir", e).stdout)
    rest += lines(dpipe("run", spec([1, 0]), "--resume-dir", e).stdout)  # the new weights need no override now
    got = head + rest
    assert len(got) == len(set(got)), "an element delivered twice"
    assert sorted(x for x in got if x < 10000) == list(range(3000)), "input 0 not delivered exactly once"
    assert 0 < sum(1 for x in got if x >= 10000) < 3000, "input 1 still drawn after its weight became 0"
    shown = json.loads(dpipe("snapshot", "show", rank_file(e, 0, 1)).stdout)
    history = shown["user_metadata"]["dpipe.overrides"]
    # The tool's set write with --take records the step (the resumed one + --take): the change is said there.
    assert re.fullmatch(r"mix@[0-9a-f]{8}\.weights: 0\.7, 0\.3 → 1, 0 at step 30", history), history


@case("errors_stay_one_printable_line")
def _():
    # A file name with a newline, a tab and a byte that is not UTF-8 is escaped in the one error line.
    bad = os.path.join(TMP, "no\nsuch\tfile").encode() + b"\xff"
    r = subprocess.run([DPIPE, "run", json.dumps({"pipeline": [{"op": "range", "stop": 3}]}), "--resume", bad],
                       capture_output=True, timeout=60)
    err = r.stderr.decode("utf-8")  # valid UTF-8: the stray byte is written as \xff
    assert r.returncode == 1 and len(err.strip().splitlines()) == 1, err
    assert "no\\nsuch\\tfile\\xff" in err, err


@case("usage_errors_exit_2")
def _():
    r = dpipe("snapshot", "rescale", TMP, "--world-size", 2, "--workers", 1, "--out", "", check=False)
    assert r.returncode == 2 and "--out: must name a directory, got ''" in r.stderr, (r.returncode, r.stderr)
    for args in (["run"], ["run", SPEC, "--bogus"], ["run", SPEC, "--take", "-1"], ["frob"],
                 ["run", SPEC, "--rank", 1], ["run", SPEC, "--step", "-1"], ["run", SPEC, "--step", "0x10"],
                 ["run", SPEC, "--step", ""], ["run", SPEC, "--max-replay", "-1"],
                 ["run", SPEC, "--max-replay", "18446744073709551616"]):
        r = dpipe(*args, check=False)
        assert r.returncode == 2, (args, r.returncode, r.stderr)


@case("help_describes_commands_spec_layout_and_rank")
def _():
    top = dpipe("--help").stdout
    for word in ("run", "bench", "graph", "snapshot"):
        assert word in top, top
    run = dpipe("run", "--help").stdout
    for text in ("SPEC", "standard input", "RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "{rank}", "--snapshot-out",
                 "Excludes: --snapshot-dir", "--rescale Needs: --resume-dir"):
        assert text in run, (text, run)
    r = dpipe("frob", check=False)
    assert r.returncode == 2 and "unknown command 'frob'" in r.stderr, r.stderr


@case("files/two_outputs_links_fifos_and_stale_temporaries")
def _():
    small = json.dumps({"pipeline": [{"op": "range", "stop": 3}]})
    same = os.path.join(TMP, "same.out")
    for other in (same, os.path.join(TMP, ".", "same.out")):
        r = dpipe("run", small, "--output", same, "--snapshot-out", other, check=False)
        assert r.returncode == 2 and "same file" in r.stderr, r.stderr
    open(same, "w").write("old")
    link = os.path.join(TMP, "same-link.out")
    os.symlink(same, link)
    r = dpipe("run", small, "--output", same, "--snapshot-out", link, check=False)
    assert r.returncode == 2 and "same file" in r.stderr and open(same).read() == "old", r.stderr
    # A link to the output that does not exist yet is the same file too.
    fresh, dangling = os.path.join(TMP, "fresh.out"), os.path.join(TMP, "dangling-link.out")
    os.symlink(fresh, dangling)
    r = dpipe("run", small, "--take", 3, "--output", fresh, "--snapshot-out", dangling, check=False)
    assert r.returncode == 2 and "same file" in r.stderr and not os.path.exists(fresh), r.stderr
    # --snapshot-out through a link replaces the file it names; a FIFO or a device is refused, unchanged.
    snap, snap_link = os.path.join(TMP, "linked.bin"), os.path.join(TMP, "linked-link.bin")
    open(snap, "w").write("old")
    os.symlink(snap, snap_link)
    dpipe("run", small, "--take", 1, "--snapshot-out", snap_link)
    assert os.path.islink(snap_link) and "range" in dpipe("snapshot", "show", snap_link).stdout
    fifo = os.path.join(TMP, "snap.fifo")
    os.mkfifo(fifo)
    r = dpipe("run", small, "--snapshot-out", fifo, check=False)
    assert r.returncode == 1 and "FIFO" in r.stderr and fifo in r.stderr, r.stderr
    assert os.path.exists(fifo) and not os.path.isfile(fifo)
    r = dpipe("run", small, "--snapshot-out", os.devnull, check=False)
    assert r.returncode == 1 and "character device" in r.stderr, r.stderr
    # A temporary that a killed writer left is removed by the next write to the same path.
    child = subprocess.Popen(["true"])
    child.wait()
    stale = os.path.join(TMP, f".linked.bin.dpipe-tmp.{child.pid}.00ff")
    open(stale, "w").write("half")
    dpipe("run", small, "--take", 2, "--snapshot-out", snap)
    assert not os.path.exists(stale), "a dead writer's temporary was left"
    # In a set the names carry the step: a rank's next write removes its killed writes of any step, and
    # only its own (another rank's, or a live writer's, stay).
    sets = os.path.join(TMP, "stale-set")
    os.makedirs(sets, exist_ok=True)
    mine = os.path.join(sets, f".rank-0-of-2.w1.s5.0123456789abcdef.dpipe.dpipe-tmp.{child.pid}.00ff")
    other_rank = os.path.join(sets, f".rank-1-of-2.w1.s5.0123456789abcdef.dpipe.dpipe-tmp.{child.pid}.00ff")
    live = os.path.join(sets, f".rank-0-of-2.w1.s5.0123456789abcdef.dpipe.dpipe-tmp.{os.getpid()}.00ff")
    for f in (mine, other_rank, live):
        open(f, "w").write("half")
    dpipe("run", small, "--rank", 0, "--world-size", 2, "--take", 2, "--step", 6, "--snapshot-dir", sets)
    assert not os.path.exists(mine), "rank 0's killed write of step 5 was left by its write of step 6"
    assert os.path.exists(other_rank) and os.path.exists(live)
    # A killed writer's temporary of the manifest goes in the same listing; a live writer's stays.
    dead_manifest = os.path.join(sets, f".set.dpipe-manifest.dpipe-tmp.{child.pid}.00ff")
    live_manifest = os.path.join(sets, f".set.dpipe-manifest.dpipe-tmp.{os.getpid()}.00ff")
    for f in (dead_manifest, live_manifest):
        open(f, "w").write("half")
    dpipe("run", small, "--rank", 1, "--world-size", 2, "--take", 2, "--step", 6, "--snapshot-dir", sets)
    assert os.path.exists(os.path.join(sets, "set.dpipe-manifest")), sorted(os.listdir(sets))
    assert not os.path.exists(dead_manifest) and not os.path.exists(other_rank), sorted(os.listdir(sets))
    assert os.path.exists(live_manifest) and os.path.exists(live)


@case("ops_lists_every_op_with_its_schema")
def _():
    ops = json.loads(dpipe("ops", "--json").stdout)
    by_op = {o["op"]: o for o in ops}
    assert set(by_op) >= {"range", "batch", "shuffle", "merge", "dispatch"}, sorted(by_op)
    for o in ops:
        assert {"op", "doc", "params", "rescales", "state"} <= set(o), o
        for p in o["params"]:
            assert {"name", "type", "default", "required", "positional", "doc"} <= set(p), (o["op"], p)
    batch = by_op["batch"]
    assert [p["name"] for p in batch["params"]] == ["size", "drop_last", "name"]
    assert batch["rescales"] is True and batch["state"] == ["partial", "input_done"]
    assert by_op["take"]["rescales"] is False and "cannot be dealt" in by_op["take"]["rescale_refusal"]
    # A kind says whether it carries provenance and makes its elements again from restore keys.
    assert "restore keys" in by_op["shuffle"]["provenance"] and "provenance" not in by_op["enumerate"], by_op["enumerate"]
    text = dpipe("ops", "shuffle").stdout
    assert text.startswith("shuffle: ") and "buffer" in text and "rescales: yes" in text and "state: buffer, rng, input_done" in text, text
    r = dpipe("ops", "nope", check=False)
    assert r.returncode == 1 and "unknown op 'nope' (known: range," in r.stderr, r.stderr
    r = dpipe("run", '{"pipeline": [{"op": "nope"}]}', check=False)
    assert r.returncode == 1 and "unknown op 'nope' (known: range," in r.stderr, r.stderr
    # docs/ops.md is the catalogue's Markdown, current.
    with open(os.path.join(SRC, "docs", "ops.md")) as f:
        assert f.read() == dpipe("ops", "--markdown").stdout, "docs/ops.md is stale: run 'dpipe ops --markdown > docs/ops.md'"


@case("spec_errors_name_the_node")
def _():
    r = dpipe("run", '{"pipeline": [{"op": "range", "stop": 3, "stop": 5}]}', check=False)
    assert r.returncode == 1 and "key 'stop' twice" in r.stderr, r.stderr
    r = dpipe("run", '{"seed": 1, "seed": 2, "pipeline": [{"op": "range", "stop": 3}]}', check=False)
    assert r.returncode == 1 and "key 'seed' twice" in r.stderr, r.stderr
    r = dpipe("run", '{"pipeline": [{"op": "range", "stop": 3}, {"op": "batch", "size": 2, "name": "b"}, {"op": "unbatch"}, {"op": "map", "fn": "nope"}]}', check=False)
    assert r.returncode == 1 and "pipeline[3] (map)" in r.stderr and "unknown map function" in r.stderr, r.stderr
    r = dpipe("run", "{not json", check=False)
    assert r.returncode == 1 and "not valid JSON" in r.stderr, r.stderr
    r = dpipe("run", SPEC, "--rank", 2, "--world-size", 2, check=False)
    assert r.returncode == 1 and "rank 2" in r.stderr, r.stderr


ENGINE_SPEC = {"seed": 5, "pipeline": [
    {"op": "range", "stop": 3000},
    {"op": "shuffle", "buffer": 100},
    {"op": "dispatch", "mode": "round_robin"},
    {"op": "parallel_map", "fn": "spin", "ns": 1000, "max_in_flight": 16},
    {"op": "batch", "size": 10},
    {"op": "prefetch", "depth": 3},
    {"op": "merge"},
    {"op": "unbatch"},
    {"op": "map", "fn": "affine", "mul": 3}]}


@case("engine/same_stream_for_any_thread_count_and_resume_exact")
def _():
    spec = json.dumps(ENGINE_SPEC)
    ref = lines(dpipe("run", spec, "--workers", 3, "--threads", 1).stdout)
    assert sorted(ref) == [3 * x for x in range(3000)], "dispatch → merge delivers every element once"
    for threads in (2, 8):
        assert lines(dpipe("run", spec, "--workers", 3, "--threads", threads).stdout) == ref, threads
    snap = os.path.join(TMP, "engine.bin")
    head = lines(dpipe("run", spec, "--workers", 3, "--take", 1234, "--snapshot-out", snap).stdout)
    rest = lines(dpipe("run", spec, "--workers", 3, "--threads", 1, "--resume", snap).stdout)
    assert head + rest == ref


@case("engine/broadcast_gives_every_worker_every_element")
def _():
    spec = {"pipeline": [{"op": "range", "stop": 4}, {"op": "dispatch", "mode": "broadcast"}, {"op": "merge"}]}
    assert lines(dpipe("run", json.dumps(spec), "--workers", 2).stdout) == [0, 0, 1, 1, 2, 2, 3, 3]


@case("engine/stats_name_every_node_per_worker")
def _():
    r = dpipe("run", json.dumps(ENGINE_SPEC), "--workers", 2, "--stats")
    stats = json.loads(r.stderr.strip().splitlines()[-1])
    nodes = stats["nodes"]
    spin = [n for n in nodes if n["kind"] == "parallel_map"]
    assert sorted(n["instance"] for n in spin) == [0, 1], nodes
    assert sum(n["elements"] for n in spin) == 3000
    assert all(n["seconds"] >= n["self_seconds"] >= 0 for n in nodes)
    b = json.loads(dpipe("bench", json.dumps(ENGINE_SPEC), "--workers", 2, "--threads", 2, "--stats").stdout)
    assert b["workers"] == 2 and b["threads"] == 2 and b["elements"] == 3000 and len(b["nodes"]) == len(nodes)


@case("engine/throw_at_fails_fast_naming_the_node")
def _():
    for workers in (1, 4):
        spec = {"pipeline": [{"op": "range", "stop": 10000000}, {"op": "sharding_filter"},
                             {"op": "map", "fn": "spin", "ns": 100},
                             {"op": "map", "fn": "throw_at", "index": 5000, "name": "fragile"}]}
        t0 = time.time()
        r = dpipe("run", json.dumps(spec), "--workers", workers, "--output", os.devnull, check=False, timeout=60)
        assert r.returncode == 1, r
        assert "fragile" in r.stderr and "throw_at" in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert time.time() - t0 < 30
    bad = {"pipeline": [{"op": "range", "stop": 3}, {"op": "parallel_map", "fn": "throw_at", "index": 1}]}
    r = dpipe("run", json.dumps(bad), check=False)
    assert r.returncode == 1 and "parallel_map" in r.stderr, r.stderr


@case("engine/misplaced_boundaries_are_errors")
def _():
    for pipeline, text in (
            ([{"op": "range", "stop": 3}, {"op": "merge"}, {"op": "dispatch"}], "dispatch"),
            ([{"op": "range", "stop": 3}, {"op": "prefetch"}, {"op": "batch", "size": 2}], "prefetch"),
            ([{"op": "range", "stop": 3}, {"op": "dispatch", "mode": "scatter"}], "mode")):
        r = dpipe("run", json.dumps({"pipeline": pipeline}), "--workers", 2, check=False)
        assert r.returncode == 1 and text in r.stderr, r.stderr


SAMPLED = {"seed": 11, "pipeline": [
    {"op": "range", "stop": 5000},
    {"op": "sampler", "shuffle": "global"},
    {"op": "shuffle", "buffer": 64},
    {"op": "map", "fn": "affine", "mul": 1},
    {"op": "batch", "size": 16}]}


def run_ranks(spec, world, workers, take=None, snapshot_dir=None, resume_dir=None, rescale=False, tag="x"):
    """Runs every rank as its own process (no MPI), returns the elements each delivered."""
    out = []
    for r in range(world):
        args = ["run", spec, "--rank", r, "--world-size", world, "--workers", workers,
                "--output", os.path.join(TMP, f"{tag}-{{rank}}.jsonl")]
        if take is not None:
            args += ["--take", take]
        if snapshot_dir:
            args += ["--snapshot-dir", snapshot_dir]
        if resume_dir:
            args += ["--resume-dir", resume_dir]
        if rescale:
            args.append("--rescale")
        dpipe(*args)
        out += [x for batch in lines(open(os.path.join(TMP, f"{tag}-{r}.jsonl")).read()) for x in batch]
    return out


@case("rescale/two_by_three_to_three_by_two_to_one_by_one_every_element_once")
def _():
    spec = json.dumps(SAMPLED)
    a, b = os.path.join(TMP, "set-a"), os.path.join(TMP, "set-b")
    got = run_ranks(spec, 2, 3, take=40, snapshot_dir=a, tag="a")
    show = json.loads(dpipe("snapshot", "show", a).stdout)
    assert show["world_size"] == 2 and show["num_workers"] == 3 and len(show["ranks"]) == 2, show
    r = dpipe("run", spec, "--rank", 0, "--world-size", 3, "--workers", 2, "--resume-dir", a, check=False)
    assert r.returncode == 1 and "rescale" in r.stderr, r.stderr
    got += run_ranks(spec, 3, 2, take=25, snapshot_dir=b, resume_dir=a, rescale=True, tag="b")
    got += run_ranks(spec, 1, 1, resume_dir=b, rescale=True, tag="c")
    assert sorted(got) == list(range(5000)), (len(got), len(set(got)))


@case("rescale/offline_tool_and_refusals")
def _():
    spec = json.dumps(SAMPLED)
    a, c = os.path.join(TMP, "set-off"), os.path.join(TMP, "set-off-4x1")
    got = run_ranks(spec, 2, 2, take=30, snapshot_dir=a, tag="o")
    summary = json.loads(dpipe("snapshot", "rescale", a, "--world-size", 4, "--workers", 1, "--out", c).stdout)
    assert summary["world_size"] == 4 and summary["num_workers"] == 1
    got += run_ranks(spec, 4, 1, resume_dir=c, tag="p")  # the layout matches: no --rescale needed
    assert sorted(got) == list(range(5000))
    # A rank whose file is gone finds the set incomplete; so does every rank once no manifest vouches for it.
    os.remove(rank_file(a, 1, 2))
    r = dpipe("run", spec, "--rank", 1, "--world-size", 2, "--workers", 2, "--resume-dir", a, check=False)
    assert r.returncode == 1 and "incomplete" in r.stderr and "1 of 2" in r.stderr, r.stderr
    os.remove(os.path.join(a, "set.dpipe-manifest"))
    r = dpipe("run", spec, "--rank", 0, "--world-size", 2, "--workers", 2, "--resume-dir", a, check=False)
    assert r.returncode == 1 and "incomplete" in r.stderr and "1 of 2" in r.stderr, r.stderr
    sharded = json.dumps({"pipeline": [{"op": "range", "stop": 100}, {"op": "sharding_filter"}]})
    d = os.path.join(TMP, "set-sharded")
    run_ranks(sharded.replace("]}", ", {\"op\": \"batch\", \"size\": 2}]}"), 1, 2, take=3, snapshot_dir=d, tag="s")
    r = dpipe("snapshot", "rescale", d, "--world-size", 2, "--workers", 1, "--out", d + "-2", check=False)
    assert r.returncode == 1 and "sharding_filter" in r.stderr and "sampler" in r.stderr, r.stderr
    r = dpipe("run", json.dumps({"pipeline": [{"op": "range", "stop": 9}, {"op": "map", "fn": "identity"},
                                              {"op": "sampler"}]}), check=False)
    assert r.returncode == 1 and "pipeline[2] (sampler)" in r.stderr and "random-access" in r.stderr, r.stderr


@case("files/records_and_token_windows_through_specs")
def _():
    import base64
    path = os.path.join(TMP, "data.tfrecord")
    toks = os.path.join(TMP, "toks.bin")
    write_tokens(toks, list(range(20)))
    spec = {"pipeline": [{"op": "token_windows", "files": [toks], "dtype": "uint16", "seq_len": 6}]}
    assert lines(dpipe("run", json.dumps(spec)).stdout) == [list(range(0, 7)), list(range(6, 13)), list(range(12, 19))]
    sampled = {"seed": 4, "pipeline": [{"op": "token_windows", "files": [toks], "seq_len": 6},
                                       {"op": "sampler"}]}
    got = lines(dpipe("run", json.dumps(sampled)).stdout)
    assert sorted(got) == [list(range(0, 7)), list(range(6, 13)), list(range(12, 19))], got
    bad = {"pipeline": [{"op": "records", "files": [os.path.join(TMP, "nope.tfrecord")]}]}
    r = dpipe("run", json.dumps(bad), check=False)
    assert r.returncode == 1 and "nope.tfrecord" in r.stderr, r.stderr
    # A records file with one good record and a corrupt one, read with on_error skip.
    open(path, "wb").write(tfrecord(b"\x00\x01hello") + tfrecord(b"broken", good=False) + tfrecord(b"end"))
    spec = {"pipeline": [{"op": "records", "files": [path], "on_error": "skip"}, {"op": "sampler", "shuffle": "none"}]}
    r = dpipe("run", json.dumps(spec), "--stats")
    assert [base64.b64decode(x) for x in lines(r.stdout)] == [b"\x00\x01hello", b"end"], r.stdout
    assert json.loads(r.stderr.strip().splitlines()[-1])["skipped_records"] == 1
    r = dpipe("run", json.dumps({"pipeline": [{"op": "records", "files": [path]}]}), check=False)
    assert r.returncode == 1 and "byte offset" in r.stderr and "checksum" in r.stderr, r.stderr


@case("files/restore_keys_hold_positions_and_refuse_changed_data")
def _():
    # Windows of 256 tokens (512 bytes) through a sampler and a shuffle of 64 on 2 workers: a snapshot of
    # keys holds tens of bytes per buffered window, one of data the windows; both resume the same stream.
    toks = os.path.join(TMP, "keyed-toks.bin")
    write_tokens(toks, [i % 50000 for i in range(256 * 400 + 1)])
    spec = json.dumps({"seed": 5, "pipeline": [{"op": "token_windows", "files": [toks], "seq_len": 255},
                                               {"op": "sampler"}, {"op": "shuffle", "buffer": 64},
                                               {"op": "batch", "size": 2}]})
    whole = lines(dpipe("run", spec, "--workers", 2).stdout)
    sizes = {}
    for mode, flags in (("keys", ["--restore-keys"]), ("data", [])):
        snap = os.path.join(TMP, f"keyed-{mode}.bin")
        head = lines(dpipe("run", spec, "--workers", 2, "--take", 30, "--snapshot-out", snap, *flags).stdout)
        rest = lines(dpipe("run", spec, "--workers", 2, "--resume", snap).stdout)
        assert head + rest == whole, mode
        sizes[mode] = os.path.getsize(snap)
        shown = json.loads(dpipe("snapshot", "show", snap).stdout)
        tags = [f["type"] for st in shown["states"] if st["kind"] == "shuffle" for f in st["fields"].values()
                if isinstance(f, dict) and f["count"] > 0 and f["type"] != "u64"]
        assert tags and all(t.startswith("keys:") == (mode == "keys") for t in tags), (mode, tags)
    assert sizes["keys"] * 10 < sizes["data"], sizes
    # The file changes under the snapshot (same size, other tokens): resumed with --allow-changed-data, a
    # snapshot of keys refuses the window that comes out different; one of data delivers what it held.
    data = bytearray(open(toks, "rb").read())
    data[:2 * 256 * 400] = bytes(x ^ 0x5a for x in data[:2 * 256 * 400])
    open(toks, "wb").write(bytes(data))
    os.utime(toks, (1, 1))
    r = dpipe("run", spec, "--workers", 2, "--resume", os.path.join(TMP, "keyed-keys.bin"), "--allow-changed-data", check=False)
    assert r.returncode == 1 and "came out different from the one saved" in r.stderr, r.stderr
    r = dpipe("run", spec, "--workers", 2, "--resume", os.path.join(TMP, "keyed-data.bin"), "--allow-changed-data")
    assert len(lines(r.stdout)) == len(whole) - 30


def write_row_files(stem, files, rows_in):
    """Writes `files` text files of rows_in(f) lines "file{f} line{i}"; returns their paths and every row."""
    paths, rows = [], []
    for f in range(files):
        path = os.path.join(TMP, f"{stem}{f}.txt")
        these = [f"file{f} line{i}" for i in range(rows_in(f))]
        open(path, "w").write("\n".join(these) + "\n")
        paths.append(path)
        rows += these
    return paths, rows


@case("files/lines_with_logical_shards_rescale_through_the_tool")
def _():
    paths, expected = write_row_files("text", 3, lambda f: 200 + 50 * f)
    spec = json.dumps({"seed": 8, "pipeline": [{"op": "lines", "files": paths, "logical_shards": 17},
                                               {"op": "shuffle", "buffer": 20}, {"op": "batch", "size": 4}]})
    d = os.path.join(TMP, "set-lines")
    got = run_ranks(spec, 2, 2, take=30, snapshot_dir=d, tag="la")
    got += run_ranks(spec, 3, 1, resume_dir=d, rescale=True, tag="lb")
    assert sorted(got) == sorted(expected), (len(got), len(expected))


@case("files/line_blocks_print_their_lines_and_rescale_through_the_tool")
def _():
    path = os.path.join(TMP, "blocks.txt")
    open(path, "w").write("alpha\r\nbeta\n\ngamma delta\nlast")
    spec = {"pipeline": [{"op": "line_blocks", "files": [path], "logical_shards": 1, "block_bytes": 12}]}
    r = dpipe("run", json.dumps(spec))
    # Blocks of whole lines within 12 bytes: "alpha\\r\\nbeta\\n" is 12; the empty line cannot join "gamma delta".
    assert lines(r.stdout) == [["alpha", "beta"], [""], ["gamma delta"], ["last"]], r.stdout
    for bad in ({"block_bytes": 0}, {"logical_shards": 0}):
        r = dpipe("run", json.dumps({"pipeline": [dict(spec["pipeline"][0], **bad)]}), check=False)
        assert r.returncode == 1 and "must be between 1 and" in r.stderr, r.stderr
    paths, expected = write_row_files("blocks", 3, lambda f: 300 + 40 * f)
    spec = json.dumps({"seed": 3, "pipeline": [{"op": "line_blocks", "files": paths, "logical_shards": 11,
                                                "block_bytes": 200},
                                               {"op": "shuffle", "buffer": 6}, {"op": "batch", "size": 2}]})
    d = os.path.join(TMP, "set-blocks")
    got = run_ranks(spec, 2, 2, take=12, snapshot_dir=d, tag="ba")
    got += run_ranks(spec, 3, 1, resume_dir=d, rescale=True, tag="bb")
    flat = [line for block in got for line in block]
    assert sorted(flat) == sorted(expected), (len(flat), len(expected))


def decode_text(v):
    """Text as the tool writes it: a JSON string when it is UTF-8, else {"base64": ...} (docs/files.md)."""
    if isinstance(v, str):
        return v.encode("utf-8")
    assert isinstance(v, dict) and list(v) == ["base64"], v
    import base64
    return base64.b64decode(v["base64"], validate=True)


def json_lines(raw):
    """Every line of raw output bytes, each checked to be UTF-8 and one JSON value."""
    assert raw.endswith(b"\n"), raw[-50:]
    return [json.loads(line.decode("utf-8")) for line in raw.split(b"\n")[:-1]]


NON_UTF8_LINES = [b"plain", b"caf\xc3\xa9", b"\xff\xfe not text", b"half \xc3", b"\xed\xa0\x80 a surrogate",
                  b"overlong \xc0\xaf", b"", b'quote " backslash \\ tab \t bell \x07', b"\xf4\x90\x80\x80 too high",
                  b"\xf0\x9f\x99\x82 emoji"]


@case("output/text_that_is_not_utf8_is_written_as_lossless_json")
def _():
    path = os.path.join(TMP, "non-utf8.txt")
    open(path, "wb").write(b"\n".join(NON_UTF8_LINES) + b"\n")
    src = {"op": "lines", "files": [path], "logical_shards": 1, "shuffle_shards": False}
    r = subprocess.run([DPIPE, "run", json.dumps({"pipeline": [src]})], capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr
    values = json_lines(r.stdout)
    assert [decode_text(v) for v in values] == NON_UTF8_LINES, values
    assert values[0] == "plain" and values[1] == "caf\u00e9" and isinstance(values[2], dict), values
    # Batches hold the same values; --output writes the same bytes.
    out = os.path.join(TMP, "non-utf8.jsonl")
    spec = json.dumps({"pipeline": [src, {"op": "batch", "size": 4}]})
    r = subprocess.run([DPIPE, "run", spec, "--output", out], capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr
    batches = json_lines(open(out, "rb").read())
    assert [decode_text(v) for b in batches for v in b] == NON_UTF8_LINES, batches


@case("output/snapshot_show_writes_text_that_is_not_utf8_losslessly")
def _():
    path = os.path.join(TMP, "non-utf8-show.txt")
    open(path, "wb").write(b"\n".join(NON_UTF8_LINES) + b"\n")
    snap = os.path.join(TMP, "non-utf8.snapshot")
    # After one element, the shuffle's buffer holds the other lines.
    spec = json.dumps({"pipeline": [{"op": "lines", "files": [path], "logical_shards": 1, "shuffle_shards": False},
                                    {"op": "shuffle", "buffer": 64}]})
    r = subprocess.run([DPIPE, "run", spec, "--take", "1", "--snapshot-out", snap], capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([DPIPE, "snapshot", "show", snap], capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr
    (shown,) = json_lines(r.stdout)
    held = [decode_text(v) for st in shown["states"] for f in st["fields"].values()
            if isinstance(f, dict) and f.get("type") == "str" for v in f["values"]]
    delivered = decode_text(json_lines(subprocess.run([DPIPE, "run", spec, "--take", "1"], capture_output=True,
                                                      timeout=60).stdout)[0])
    assert sorted(held + [delivered]) == sorted(NON_UTF8_LINES), held
    # The set summary too.
    d = os.path.join(TMP, "set-non-utf8")
    r = subprocess.run([DPIPE, "run", spec, "--take", "1", "--snapshot-dir", d], capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([DPIPE, "snapshot", "show", d], capture_output=True, timeout=60)
    assert r.returncode == 0 and json_lines(r.stdout)[0]["world_size"] == 1, r.stderr


@case("files/fifos_and_devices_are_refused_without_waiting")
def _():
    fifo = os.path.join(TMP, "input.fifo")
    os.mkfifo(fifo)
    range_spec = json.dumps({"pipeline": [{"op": "range", "stop": 3}]})
    for args in (["run", fifo], ["run", range_spec, "--resume", fifo], ["snapshot", "show", fifo],
                 ["run", json.dumps({"pipeline": [{"op": "records", "files": [fifo]}]})],
                 ["run", json.dumps({"pipeline": [{"op": "lines", "files": [fifo]}]})],
                 ["run", range_spec, "--resume", "/dev/zero"], ["snapshot", "show", "/dev/zero"]):
        r = dpipe(*args, check=False, timeout=20)
        what = "a character device" if "/dev/zero" in args else "a FIFO"
        assert r.returncode == 1 and f"it is {what}, and dpipe reads only regular files" in r.stderr, (args, r.stderr)
    d = os.path.join(TMP, "set-fifo")
    os.makedirs(d)
    os.mkfifo(os.path.join(d, "rank-0-of-1.dpipe"))
    r = dpipe("snapshot", "show", d, check=False, timeout=20)
    assert r.returncode == 1 and "a FIFO" in r.stderr, r.stderr
    # Standard input stays a way to give the spec.
    r = subprocess.run([DPIPE, "run", "-"], input=range_spec, capture_output=True, text=True, timeout=20)
    assert r.returncode == 0 and lines(r.stdout) == [0, 1, 2], r.stderr


@case("files/a_set_named_like_rank_0_of_2_31_is_reported_from_its_files")
def _():
    d = os.path.join(TMP, "set-huge-world")
    os.makedirs(d)
    open(os.path.join(d, "rank-0-of-2147483647.dpipe"), "wb").close()
    t0 = time.time()
    r = dpipe("snapshot", "show", d, check=False, timeout=20)
    assert r.returncode == 1 and "ranks present: 1 of 2147483647; first missing: 1, 2, 3, 4, 5, …" in r.stderr, r.stderr
    assert len(r.stderr) < 500 and time.time() - t0 < 5, (len(r.stderr), time.time() - t0)


@case("files/records_skip_resynchronises_after_a_bad_length_and_counts_the_bytes")
def _():
    import base64
    path = os.path.join(TMP, "bad-length.tfrecord")
    damaged = bytearray(tfrecord(b"lost record"))
    damaged[9] ^= 0x40  # its length checksum
    open(path, "wb").write(tfrecord(b"first") + bytes(damaged) + tfrecord(b"second") + tfrecord(b"third"))
    spec = {"pipeline": [{"op": "records", "files": [path], "on_error": "skip"}, {"op": "sampler", "shuffle": "none"}]}
    r = dpipe("run", json.dumps(spec), "--stats")
    assert [base64.b64decode(x) for x in lines(r.stdout)] == [b"first", b"second", b"third"], r.stdout
    stats = json.loads(r.stderr.strip().splitlines()[-1])
    assert stats["skipped_records"] == 1 and stats["skipped_bytes"] == len(damaged), stats


@case("flat_map/builtin_range_streams_a_huge_expansion_and_resumes_inside_it")
def _():
    huge = 1 << 62
    spec = json.dumps({"pipeline": [{"op": "range", "stop": 2},
                                    {"op": "map", "fn": "affine", "mul": 0, "add": huge},
                                    {"op": "flat_map", "fn": "range"}]})
    snap = os.path.join(TMP, "flat-map-range.snapshot")
    t0 = time.time()
    r = dpipe("run", spec, "--take", 1000, "--snapshot-out", snap, timeout=30)
    assert lines(r.stdout) == list(range(1000)), r.stdout[-200:]
    assert os.path.getsize(snap) < 1 << 20, os.path.getsize(snap)  # the queues' elements and (next, end), not 2^62
    r = dpipe("run", spec, "--take", 5, "--resume", snap, timeout=30)
    assert lines(r.stdout) == [1000, 1001, 1002, 1003, 1004], r.stdout
    assert time.time() - t0 < 20, time.time() - t0


def write_junit(path):
    suite = ET.Element("testsuite", name="cli", tests=str(len(results)),
                       failures=str(sum(1 for _, e in results if e)))
    for name, err in results:
        tc = ET.SubElement(suite, "testcase", name=name, classname="cli")
        if err:
            ET.SubElement(tc, "failure", message=err.splitlines()[-1]).text = err
    root = ET.Element("testsuites")
    root.append(suite)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    ET.ElementTree(root).write(path)


write_junit(os.path.join(BUILD, "test-results", "cli.xml"))
failed = [n for n, e in results if e]
for name, err in results:
    if err:
        print(f"FAIL {name}\n{err}")
print(f"cli: {len(results) - len(failed)} passed, {len(failed)} failed")
if failed:
    print(f"files kept in {TMP}")
else:
    shutil.rmtree(TMP, ignore_errors=True)
sys.exit(1 if failed else 0)
