#!/usr/bin/env python3
"""The conformance battery through the tool: for a spec per op (every op the spec front end knows, each
mode of the ones that have modes), `dpipe run` stopped at breakpoints {0, 1, 5, middle, end} with
--take and --snapshot-out, then resumed with --resume, must give exactly the uninterrupted stream, for
one and two workers. Under a sanitizer (DPIPE_SANITIZE, set by tests/meson.build) the breakpoints are {1,
middle}: each run of the tool is several times slower there, and the plain build checks them all. The
library's own battery is tests/conformance/battery_test.cpp.

Prints one line per spec and a closing "battery_cli: N passed, N failed"; exits non-zero on any failure.
Writes JUnit XML to $DPIPE_BUILD_ROOT/test-results/battery_cli.xml, one case per spec."""
import json
import re
import os
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

from tool_files import write_tfrecords, write_tokens

BUILD = os.environ.get("DPIPE_BUILD_ROOT", "build")
DPIPE = os.path.join(BUILD, "tools", "dpipe")
TMP = tempfile.mkdtemp(prefix="dpipe-battery-cli-")
WORKERS = (1, 2)
SANITIZED = os.environ.get("DPIPE_SANITIZE", "none") not in ("", "none")


def path(name):
    return os.path.join(TMP, name)


# ---- data files ------------------------------------------------------------------------------------

def text_file(name, first, count):
    """Lines "{first}…" of 0-120 bytes: every 13th empty, every 4th ending in "\\r\\n", no newline at the end
    of the last one when `count` is odd."""
    out = []
    for l in range(first, first + count):
        line = "" if l % 13 == 0 else f"{l}:" + "abcdefghij"[l % 10] * (l * 37 % 118)
        end = "\r\n" if l % 4 == 0 else "\n"
        out.append(line + (end if l + 1 < first + count or count % 2 == 0 else ""))
    with open(path(name), "w", newline="") as f:
        f.write("".join(out))
    return path(name)


TEXT = [text_file("a.txt", 0, 150), text_file("empty.txt", 0, 0), text_file("b.txt", 1000, 91)]
RECORDS = [path("a.tfrecord"), path("b.tfrecord")]
write_tfrecords(RECORDS[0], [b""] + [bytes([i % 256]) * (i * 7 % 60) + b"r%d" % i for i in range(1, 90)])
write_tfrecords(RECORDS[1], [b"\x00\xffsecond %d" % i for i in range(40)])
TOKENS16 = [path("a16.bin"), path("b16.bin")]
write_tokens(TOKENS16[0], [t & 0xffff for t in range(0, 500)])
write_tokens(TOKENS16[1], [t & 0xffff for t in range(40000, 40301)])
TOKENS32 = [path("a32.bin")]
write_tokens(TOKENS32[0], [70000 + t for t in range(400)], dtype="uint32")



def jsonl_file(name, count):
    """JSON lines of documents {"doc", "text", "score", "ids"[, "tag"]}; every 9th line is not JSON and every
    14th has a "doc" that is a string (bad lines for parse_json)."""
    words = "the of data loader model token pack row shard rank worker epoch resume snapshot batch".split()
    with open(path(name), "w") as f:
        for i in range(count):
            if i % 9 == 4:
                f.write("{not json\n")
                continue
            doc = {"doc": str(i) if i % 14 == 5 else i, "score": i / 4, "ids": list(range(i % 5)),
                   "text": " ".join(words[(i * k) % len(words)] for k in range(1 + i * 7 % 31))}
            if i % 3 == 0:
                doc["tag"] = f"t{i}"
            f.write(json.dumps(doc) + "\n")
    return path(name)


def spm_model(name):
    """A small SentencePiece model trained here on generated text (Debian's spm_train; nothing downloaded)."""
    words = "the of data loader model token pack row shard rank worker epoch resume snapshot batch".split()
    corpus = path(name + ".txt")
    with open(corpus, "w") as f:
        for i in range(1500):
            f.write(" ".join(words[(i * k + k * k) % len(words)] for k in range(3 + i % 17)) + "\n")
    subprocess.run(["spm_train", f"--input={corpus}", f"--model_prefix={path(name)}", "--vocab_size=40",
                    "--minloglevel=2"], check=True, capture_output=True, timeout=120)
    return path(name + ".model")


JSONL = jsonl_file("docs.jsonl", 230)
MODEL = spm_model("spm")
DOCS = [{"op": "lines", "files": [JSONL], "logical_shards": 5},
        {"op": "parse_json", "fields": {"doc": "int64", "text": "string"}, "on_error": "skip"}]
TOKENIZED = DOCS + [{"op": "tokenize", "model": MODEL, "bos": True, "eos": True}]

# ---- one spec per op -------------------------------------------------------------------------------

R = lambda stop, **kw: dict({"op": "range", "stop": stop}, **kw)  # noqa: E731
WORDS = [f"w{i * i}" for i in range(40)]
BATCHES = {"op": "batch", "size": 4}

SPECS = {
    "range": [R(300, start=5, step=3)],
    "range_negative_step": [R(-40, start=100, step=-7)],
    "from_vector_integers": [{"op": "from_vector", "values": [i * i - 50 for i in range(60)]}],
    "from_vector_strings": [{"op": "from_vector", "values": WORDS}],
    "generator_count": [{"op": "generator", "fn": "count", "count": 150}],
    "generator_random_ints": [{"op": "generator", "fn": "random_ints", "count": 200, "lo": -50, "hi": 50}],
    "lines": [{"op": "lines", "files": TEXT, "logical_shards": 7, "epochs": 2}],
    "lines_in_order_batched": [{"op": "lines", "files": TEXT, "logical_shards": 3, "shuffle_shards": False},
                               {"op": "shuffle", "buffer": 10}, BATCHES],
    "line_blocks": [{"op": "line_blocks", "files": TEXT, "logical_shards": 5, "epochs": 2, "block_bytes": 200}],
    "line_blocks_in_order": [{"op": "line_blocks", "files": TEXT, "logical_shards": 2, "shuffle_shards": False,
                              "block_bytes": 1000}, {"op": "shuffle", "buffer": 3}],
    "records": [{"op": "records", "files": RECORDS}],
    "records_skip_sampled": [{"op": "records", "files": RECORDS, "on_error": "skip"},
                             {"op": "sampler", "epochs": 2}, BATCHES],
    "token_windows": [{"op": "token_windows", "files": TOKENS16, "seq_len": 9}],
    "token_windows_uint32": [{"op": "token_windows", "files": TOKENS32, "dtype": "uint32", "seq_len": 13}],
    "token_windows_sampled": [{"op": "token_windows", "files": TOKENS16, "dtype": "uint16", "seq_len": 9},
                              {"op": "sampler", "shuffle": "none"}, {"op": "shuffle", "buffer": 6}],
    "map_affine": [R(120), {"op": "map", "fn": "affine", "mul": 3, "add": -1}],
    "map_identity_strings": [{"op": "from_vector", "values": WORDS}, {"op": "map", "fn": "identity"}],
    "parallel_map": [R(400), {"op": "sharding_filter"},
                     {"op": "parallel_map", "fn": "affine", "mul": 5, "max_in_flight": 7},
                     {"op": "shuffle", "buffer": 10}, BATCHES],
    "parallel_map_in_prefix": [R(300), {"op": "parallel_map", "fn": "identity", "max_in_flight": 5},
                               {"op": "dispatch"}, {"op": "map", "fn": "affine", "mul": 2}],
    "filter": [R(200), {"op": "filter", "fn": "mod_eq", "mod": 3, "eq": 1}],
    "flat_map_replicate": [{"op": "from_vector", "values": WORDS}, {"op": "flat_map", "fn": "replicate", "times": 3}],
    "flat_map_range": [R(30), {"op": "flat_map", "fn": "range"}],
    "sharding_filter_all": [R(300), {"op": "sharding_filter"}],
    "sharding_filter_worker_then_rank": [R(300), {"op": "sharding_filter", "level": "worker"},
                                         {"op": "sharding_filter", "level": "rank"}],
    "sharding_filter_explicit": [R(300), {"op": "sharding_filter", "num_shards": 3, "shard_id": 1}],
    "shuffle": [R(500), {"op": "shuffle", "buffer": 32}],
    "batch": [R(103), {"op": "batch", "size": 10}],
    "batch_drop_last": [R(103), {"op": "batch", "size": 10, "drop_last": True}],
    "batch_of_batches": [R(103), {"op": "batch", "size": 3}, {"op": "batch", "size": 2}],
    "unbatch": [R(100), {"op": "batch", "size": 7}, {"op": "shuffle", "buffer": 3}, {"op": "unbatch"}],
    "take": [R(200), {"op": "shuffle", "buffer": 16}, {"op": "take", "count": 37}],
    "repeat": [R(30), {"op": "repeat", "times": 3}],
    "skip": [R(200), {"op": "sharding_filter"}, {"op": "shuffle", "buffer": 16}, {"op": "skip", "count": 37}],
    "cycle_count": [R(10), {"op": "shuffle", "buffer": 4}, {"op": "cycle", "count": 4}],
    "cycle_forever_then_take": [R(7), {"op": "cycle"}, {"op": "take", "count": 40}],
    "concat": [R(30), {"op": "concat", "with": [[R(140, start=100), {"op": "shuffle", "buffer": 8}]]}],
    "mux": [R(50), {"op": "mux", "with": [[R(130, start=100)]]}],
    "mux_longest": [R(50), {"op": "mux_longest", "with": [[R(130, start=100)], [R(207, start=200)]]}],
    "zip": [R(50), {"op": "zip", "with": [[R(170, start=100)], [R(47, start=7), {"op": "shuffle", "buffer": 5}]]}],
    "sampler_range_none": [R(100), {"op": "sampler", "shuffle": "none", "epochs": 2}],
    "sampler_range_global": [R(100), {"op": "sampler", "shuffle": "global", "epochs": 2}],
    "sampler_vector_none": [{"op": "from_vector", "values": WORDS}, {"op": "sampler", "shuffle": "none", "epochs": 2}],
    "sampler_vector_global": [{"op": "from_vector", "values": WORDS}, {"op": "sampler", "epochs": 2}],
    "dispatch_round_robin": [R(200), {"op": "shuffle", "buffer": 16}, {"op": "dispatch", "mode": "round_robin"},
                             {"op": "shuffle", "buffer": 8}, {"op": "map", "fn": "affine", "mul": 3}, BATCHES],
    "dispatch_broadcast": [R(30), {"op": "dispatch", "mode": "broadcast"}, {"op": "flat_map", "fn": "range"},
                           {"op": "sharding_filter", "level": "worker"}, {"op": "merge"}, BATCHES],
    "sampler_before_dispatch": [R(150), {"op": "sampler", "epochs": 2}, {"op": "dispatch"},
                                {"op": "map", "fn": "affine", "mul": 3}, {"op": "merge"}, {"op": "batch", "size": 6}],
    "lines_before_dispatch": [{"op": "lines", "files": TEXT, "logical_shards": 9}, {"op": "dispatch"},
                              {"op": "batch", "size": 3}, {"op": "merge"}],
    "merge": [R(300), {"op": "sharding_filter"}, {"op": "shuffle", "buffer": 10}, {"op": "merge"},
              {"op": "batch", "size": 7}],
    "merge_then_shuffle_take": [R(300), {"op": "sharding_filter"}, {"op": "merge"}, {"op": "shuffle", "buffer": 20},
                                {"op": "take", "count": 150}],
    "prefetch": [R(300), {"op": "sharding_filter"}, {"op": "batch", "size": 5}, {"op": "prefetch", "depth": 2},
                 {"op": "merge"}, {"op": "unbatch"}],
    "prefetch_at_the_end": [R(300), {"op": "sharding_filter"}, {"op": "prefetch", "depth": 3}],
    "replicate": [R(40), {"op": "replicate"}, {"op": "shuffle", "buffer": 8}, {"op": "batch", "size": 3}],
    "parse_json_skip": [{"op": "lines", "files": [JSONL], "logical_shards": 4, "epochs": 2},
                        {"op": "parse_json", "fields": {"doc": "int64", "text": "string", "score": "float32",
                                                        "ids": "int64[]", "tag": "string?"}, "on_error": "skip"}],
    "flat_map_flatten_default_shuffle": [R(40), {"op": "batch", "size": 3}, {"op": "flat_map"}, {"op": "shuffle"},
                                         {"op": "take"}],
    "unbatch_every_level": [R(50), {"op": "batch", "size": 3}, {"op": "batch", "size": 2}, {"op": "unbatch", "level": -1}],
    "parse_json_on_line_blocks": [{"op": "line_blocks", "files": [JSONL], "logical_shards": 3, "block_bytes": 300},
                                  {"op": "parse_json", "fields": {"doc": "int64", "text": "string"}, "on_error": "skip"}],
    "tokenize": TOKENIZED,
    "tokenize_plain_text": [{"op": "lines", "files": TEXT, "logical_shards": 3},
                            {"op": "tokenize", "model": MODEL, "eos": True}],
    "pack_greedy": TOKENIZED + [{"op": "pack", "seq_len": 16}],
    "pack_first_fit_shuffled": TOKENIZED + [{"op": "shuffle", "buffer": 5},
                                            {"op": "pack", "seq_len": 24, "mode": "first_fit", "buffer": 3}],
    "padded_batch": TOKENIZED + [{"op": "padded_batch", "size": 3, "multiple": 8}],
    "pack_then_padded_batch": TOKENIZED + [{"op": "pack", "seq_len": 12}, {"op": "padded_batch", "size": 2}],
    "bucket_by_length": TOKENIZED + [{"op": "bucket_by_length", "boundaries": [20, 60], "batch_sizes": [4, 3, 2]}],
    "bucket_by_length_max_tokens": TOKENIZED + [{"op": "shuffle", "buffer": 7},
                                                {"op": "bucket_by_length", "boundaries": [40], "max_tokens": 150}],
    "mix_all_exhausted": [{"op": "mix", "weights": [0.7, 0.3], "with": [[R(150), {"op": "sharding_filter"}],
                                                                    [R(1070, start=1000), {"op": "sharding_filter"},
                                                                     {"op": "shuffle", "buffer": 9}]]}],
    "mix_first_exhausted": [{"op": "mix", "weights": [1, 2], "stop": "first_exhausted",
                             "with": [DOCS, [{"op": "lines", "files": [JSONL], "logical_shards": 2},
                                             {"op": "parse_json", "fields": {"doc": "int64"}, "on_error": "skip"}]]}],
    "fields_and_skips": [{"op": "mix", "with": [DOCS, [{"op": "lines", "files": [JSONL], "logical_shards": 3},
                                                      {"op": "parse_json", "fields": {"text": "string"}, "on_error": "skip"}]]},
                         {"op": "map", "fn": "affine", "mul": 2, "field": "doc", "into": "doc2", "on_error": "skip"},
                         {"op": "filter", "fn": "mod_eq", "mod": 3, "eq": 1, "field": "doc"},
                         {"op": "flat_map", "fn": "replicate", "times": 2, "field": "doc2", "into": "copy"},
                         {"op": "map", "fn": "affine", "mul": 0, "add": 3, "field": "doc", "into": "n"},
                         {"op": "flat_map", "fn": "range", "field": "n", "into": "k", "on_error": "skip"}],
    # Branches: concat reads output 0 to its end first, so the node holds the other outputs' elements.
    "fork_zip_and_concat": [R(60), {"op": "sharding_filter"}, {"op": "shuffle", "buffer": 7}, {"op": "fork", "name": "f"},
                            {"op": "map", "fn": "affine", "mul": 2},
                            {"op": "zip", "with": [[{"op": "from", "name": "f", "output": 1}, {"op": "shuffle", "buffer": 3}]]},
                            {"op": "concat", "with": [[{"op": "from", "name": "f", "output": 2}, {"op": "batch", "size": 2}]]}],
    "demux_mux": [R(80), {"op": "sharding_filter"}, {"op": "demux", "name": "d", "fn": "mod", "count": 3, "buffer": 50},
                  {"op": "mux", "with": [[{"op": "from", "name": "d", "output": 1}], [{"op": "from", "name": "d", "output": 2}]]}],
    "unzip_concat": [R(50), {"op": "sharding_filter"}, {"op": "batch", "size": 2, "drop_last": True}, {"op": "unzip", "name": "u"},
                     {"op": "concat", "with": [[{"op": "from", "name": "u", "output": 1}]]}],
    "enumerate_shuffled": [R(40), {"op": "sharding_filter"}, {"op": "shuffle", "buffer": 5}, {"op": "enumerate", "start": 3}],
    "zip_longest_of_two_types": [R(30), {"op": "sharding_filter"},
                                 {"op": "zip_longest", "fill": -1,
                                  "with": [[{"op": "from_vector", "values": ["a", "b", "c", "d", "e"]}, {"op": "cycle", "count": 2}]]}],
    "mix_never_take": [{"op": "mix", "stop": "never", "with": [[R(9), {"op": "shuffle", "buffer": 4}], [R(105, start=100)]]},
                       {"op": "take", "count": 120}],
}

# Every op of the catalogue (the kinds' schemas, `dpipe ops --json`) appears above: a new op needs a spec here.
def catalogue():
    """The op catalogue, by op (read when the check runs, not when the module is imported)."""
    out = subprocess.run([DPIPE, "ops", "--json"], capture_output=True, text=True, check=True, timeout=60).stdout
    return {op["op"]: op for op in json.loads(out)}


def undeclared_params(spec, ops):
    """The parameters a node of the built graph writes into its fingerprint that its kind's schema does not
    declare (the kind's own or its builtin functions'): `dpipe graph` labels carry them as k=v lines."""
    out = subprocess.run([DPIPE, "graph", spec], capture_output=True, text=True, check=True, timeout=60).stdout
    wrong = []
    for label in re.findall(r'label="([^"]*)"', out):
        lines = label.split("\\n")
        kind, params = lines[1], [ln.split("=", 1)[0] for ln in lines[2:] if "=" in ln]
        entry = ops.get(kind)
        if entry is None:
            continue
        schema = entry["params"] + [p for f in entry.get("functions", ()) for p in f["params"]]
        declared = [re.escape(k).replace(r"\*", r"\d+") for p in schema for k in p.get("fingerprint", [p["name"]])]
        wrong += [f"{kind}.{k}" for k in params if not any(re.fullmatch(d, k) for d in declared)]
    return wrong


def ops_of(chain):
    for node in chain:
        yield node["op"]
        for inner in node.get("with", []):
            yield from ops_of(inner)


# ---- the check -------------------------------------------------------------------------------------

def dpipe(*args):
    r = subprocess.run([DPIPE, *map(str, args)], capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise AssertionError(f"dpipe {' '.join(map(str, args))} exited {r.returncode}: {r.stderr.strip()}")


def read(p):
    with open(p) as f:
        return f.read().splitlines()


def first_difference(got, want):
    for i, (g, w) in enumerate(zip(got, want)):
        if g != w:
            return f"element {i}: got {g[:80]}, expected {w[:80]}"
    return f"{len(got)} elements, expected {len(want)}"


def check(name, chain, ops):
    """Returns "" or what went wrong, for every worker count and breakpoint."""
    spec = path(name + ".json")
    with open(spec, "w") as f:
        json.dump({"seed": 11, "pipeline": chain}, f)
    problems, sizes = [], []
    if wrong := undeclared_params(spec, ops):
        problems.append("parameters its schema does not declare: " + ", ".join(wrong))
    for workers in WORKERS:
        full = path(f"{name}-{workers}-full.jsonl")
        dpipe("run", spec, "--workers", workers, "--output", full)
        want = read(full)
        sizes.append(len(want))
        if not want:
            problems.append(f"workers {workers}: the stream is empty")
            continue
        points = {1, len(want) // 2} if SANITIZED else {0, 1, 5, len(want) // 2, len(want)}
        for at in sorted(points):
            snap, head, rest = (path(f"{name}-{workers}-{at}.{ext}") for ext in ("snapshot", "a.jsonl", "b.jsonl"))
            dpipe("run", spec, "--workers", workers, "--take", at, "--snapshot-out", snap, "--output", head)
            dpipe("run", spec, "--workers", workers, "--resume", snap, "--output", rest)
            got = read(head) + read(rest)
            if got != want:
                problems.append(f"workers {workers}, breakpoint {at}: {first_difference(got, want)}")
    return "; ".join(problems), sizes


def write_junit(results):
    suite = ET.Element("testsuite", name="battery_cli", tests=str(len(results)),
                       failures=str(sum(1 for _, e in results if e)))
    for name, err in results:
        tc = ET.SubElement(suite, "testcase", name=name, classname="battery_cli")
        if err:
            ET.SubElement(tc, "failure", message=err.splitlines()[0][:300]).text = err
    root = ET.Element("testsuites")
    root.append(suite)
    out = os.path.join(BUILD, "test-results", "battery_cli.xml")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    ET.ElementTree(root).write(out)


def main():
    results = []
    ops = catalogue()
    missing = set(ops) - {op for chain in SPECS.values() for op in ops_of(chain)}
    if missing:
        results.append(("every_op_has_a_spec", "no spec uses " + ", ".join(sorted(missing))))
    modes = {n.get("mode", "round_robin") for c in SPECS.values() for n in c if n["op"] == "dispatch"}
    if modes != {"round_robin", "broadcast"}:
        results.append(("every_op_has_a_spec", "dispatch modes covered: " + ", ".join(sorted(modes))))
    start = time.monotonic()
    for name, chain in SPECS.items():
        t = time.monotonic()
        try:
            err, sizes = check(name, chain, ops)
        except Exception as e:  # noqa: BLE001 - every failure is reported, not raised
            err, sizes = f"{type(e).__name__}: {e}", []
        results.append((name, err))
        counts = "".join(f"{w} worker{'s' if w > 1 else ''}: {n}; " for w, n in zip(WORKERS, sizes))
        print(f"{'FAIL' if err else 'ok  '} {name} ({counts}{time.monotonic() - t:.1f} s){': ' + err if err else ''}",
              flush=True)
    write_junit(results)
    failed = [n for n, e in results if e]
    print(f"battery_cli: {len(results) - len(failed)} passed, {len(failed)} failed "
          f"({len(SPECS)} specs, {time.monotonic() - start:.1f} s)")
    if not failed:
        shutil.rmtree(TMP, ignore_errors=True)
    else:
        print(f"files kept in {TMP}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
