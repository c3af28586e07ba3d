#!/usr/bin/env python3
"""Reads real snapshot files with the independent reader (snapshot_reader.py, written from
docs/snapshot-format.md) and checks it against `dpipe snapshot show`; resumes the format-version
fixtures of tests/data/snapshots/v<N>/ and compares their streams with the stored ones.

    DPIPE_BUILD_ROOT=build python3 tests/integration/snapshot_reader_test.py
    python3 tests/integration/snapshot_reader_test.py build/tools/dpipe   (or the build directory)

Prints one line per check; exits non-zero when any fails."""
import copy
import glob
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import snapshot_reader as sr  # noqa: E402

SRC = os.environ.get("DPIPE_SOURCE_ROOT") or os.path.dirname(os.path.dirname(HERE))
FIXTURES = os.path.join(SRC, "tests", "data", "snapshots")


def find_tool():
    root = os.environ.get("DPIPE_BUILD_ROOT")
    if root:
        return os.path.join(root, "tools", "dpipe")
    if len(sys.argv) > 1:
        p = sys.argv[1]
        return os.path.join(p, "tools", "dpipe") if os.path.isdir(p) else p
    sys.exit("usage: snapshot_reader_test.py [BUILD_ROOT | path/to/dpipe] (or set DPIPE_BUILD_ROOT)")


DPIPE = find_tool()
TMP = tempfile.mkdtemp(prefix="dpipe-format-")
failures = []
passes = 0


def dpipe(*args, check=True):
    r = subprocess.run([DPIPE, *map(str, args)], capture_output=True, text=True, timeout=120)
    if check and r.returncode != 0:
        raise AssertionError(f"dpipe {' '.join(map(str, args))} exited {r.returncode}: {r.stderr.strip()}")
    return r


def check(name, fn, *args):
    global passes
    try:
        fn(*args)
        passes += 1
        print(f"ok    {name}", flush=True)
    except Exception:  # noqa: BLE001 - every failure is reported, the run goes on
        failures.append(name)
        print(f"FAIL  {name}\n{traceback.format_exc()}", flush=True)


def show(path):
    """`dpipe snapshot show` with JSON objects as lists of (key, value) pairs, keeping their order."""
    return json.loads(dpipe("snapshot", "show", path).stdout, object_pairs_hook=list)


def obj(p):
    return dict(p)


def pairs(x):
    """`x` with every dict a list of (key, value) pairs, as show() reads JSON objects."""
    if isinstance(x, dict):
        return [(k, pairs(v)) for k, v in x.items()]
    if isinstance(x, list):
        return [pairs(v) for v in x]
    return x


# ---- comparing the reader's view with `dpipe snapshot show` ----

def compare_with_show(path):
    snap = sr.read_file(path)
    shown = obj(show(path))
    m = snap["meta"]
    graph_keys = [g["key"] for g in m["graph"]]
    want = {"format_version": snap["header"]["format_version"], "fingerprint": f"{m['fingerprint']:016x}",
            "seed": m["seed"], "epoch": m["epoch"], "elements_delivered": m["elements_delivered"]}
    if snap["header"]["format_version"] >= 2:
        want["id"], want["step"] = f"{m['id']:016x}", m["step"]
    for k, v in want.items():
        assert shown[k] == v, (k, shown[k], v)
    assert obj(shown["layout"]) == m["layout"], (shown["layout"], m["layout"])
    assert obj(shown["user_metadata"]) == m["user_metadata"]
    assert len(shown["graph"]) == len(m["graph"]), (len(shown["graph"]), len(m["graph"]))
    for g_shown, g in zip(shown["graph"], m["graph"]):
        g_shown = obj(g_shown)
        for k in ("key", "kind", "element_type"):
            assert g_shown[k] == g[k], (k, g_shown[k], g[k])
        assert g_shown.get("segment") == g.get("segment"), (g_shown.get("segment"), g.get("segment"))
        assert list(g_shown.get("params", [])) == [tuple(p) for p in g.get("params", [])], \
            (g_shown.get("params"), g.get("params"))
    assert len(shown["states"]) == len(snap["states"]), (len(shown["states"]), len(snap["states"]))
    for s_shown, s in zip(shown["states"], snap["states"]):
        s_shown = obj(s_shown)
        for k in ("key", "kind", "instance", "mode"):
            assert s_shown[k] == s[k], (s["key"], k, s_shown[k], s[k])
        fields = s_shown["fields"]
        assert [n for n, _ in fields] == [f["name"] for f in s["fields"]], (s["key"], fields, s["fields"])
        for (name, v_shown), f in zip(fields, s["fields"]):
            where = f"{s['key']}#{s['instance']}.{name}"
            if f["type"] != "elements":
                assert v_shown == f["value"], (where, v_shown, f["value"])
                continue
            e = obj(v_shown)
            assert e["type"] == f["tag"], (where, e["type"], f["tag"])
            assert e["count"] == len(f["blobs"]), (where, e["count"], len(f["blobs"]))
            assert e["bytes"] == sum(map(len, f["blobs"])), (where, e["bytes"])
            want = pairs(sr.field_values(f, graph_keys))
            assert e["values"] == want, (where, e["values"][:5], want[:5])
    return snap


def checksums_verify(path):
    data = open(path, "rb").read()
    snap = sr.read_snapshot(data)
    h = snap["header"]
    assert h["header_crc"] == sr.crc32c(data[:28])
    assert h["table_crc"] == sr.crc32c(data[32:32 + 24 * h["section_count"]])
    for s in snap["sections"]:
        assert s["crc"] == sr.crc32c(data[s["offset"]:s["offset"] + s["length"]]), s
    assert h["total_length"] == len(data)
    # dpipe's own layout: sections (4,) 1, 2, 3 (version 3: 4, 1, 3, 2, 5) back to back after the table,
    # up to the end of the file.
    ids = [s["id"] for s in snap["sections"]]
    assert ids in ([1, 2], [1, 2, 3], [4, 1, 2, 3], [4, 1, 3, 2, 5]), ids
    at = 32 + 24 * len(ids)
    for s in snap["sections"]:
        assert s["offset"] == at, (s, at)
        at += s["length"]
    assert at == len(data)


def round_trips(path):
    """Writing back what was read gives the same bytes: the document accounts for every byte."""
    data = open(path, "rb").read()
    again = sr.write_snapshot(sr.read_snapshot(data))
    assert again == data, f"{len(again)} bytes written back, {len(data)} read"


def flips_are_caught(path):
    data = open(path, "rb").read()
    snap = sr.read_snapshot(data)
    spots = [("header", 12), ("section table", 32 + 5)]
    spots += [(f"section {s['id']}", s["offset"] + s["length"] // 2) for s in snap["sections"] if s["length"]]
    for what, at in spots:
        bad = bytearray(data)
        bad[at] ^= 0x5A
        try:
            sr.read_snapshot(bytes(bad))
        except sr.ChecksumError as e:
            assert what in str(e), (what, str(e))
        else:
            raise AssertionError(f"a flipped byte in the {what} (offset {at}) went unnoticed")
        p = os.path.join(TMP, "flipped.dpipe")
        open(p, "wb").write(bad)
        r = dpipe("snapshot", "show", p, check=False)
        assert r.returncode != 0 and "checksum" in r.stderr, (what, r.returncode, r.stderr)


def element_codecs():
    """Hand-made blobs of each native tag, from the document's table."""
    q = lambda *v: struct.pack("<" + "q" * len(v), *v)  # noqa: E731
    s = lambda t: struct.pack("<Q", len(t.encode())) + t.encode()  # noqa: E731
    cases = [
        ("i64", q(-5), -5), ("u8", b"\xff", 255), ("i16", struct.pack("<h", -2), -2),
        ("u32", struct.pack("<I", 7), 7), ("f64", struct.pack("<d", 0.5), 0.5), ("bool", b"\x01", True),
        ("str", s("h\u00e9\n"), "h\u00e9\n"),
        ("vec<i64>", struct.pack("<Q", 2) + q(1, -1), [1, -1]),
        ("vec<str>", struct.pack("<Q", 2) + s("a") + s(""), ["a", ""]),
        ("tup<i64,str>", q(3) + s("x"), [3, "x"]),
        ("opt<i64>", b"\x00", None), ("opt<i64>", b"\x01" + q(9), 9),
        ("vec<tup<u8,opt<str>>>", struct.pack("<Q", 1) + b"\x02\x01" + s("z"), [[2, "z"]]),
        ("text_block", s("ab\r\n\nc") + struct.pack("<QQQQ", 3, 3, 4, 6), ["ab", "", "c"]),
        ("text_block", s("ab\n") + struct.pack("<QQ", 1, 2), ["ab"]),
    ]
    for tag, blob, want in cases:
        got = sr.decode_element(tag, blob)
        assert got == want, (tag, got, want)
    for tag, blob in (("i64", q(1) + b"\x00"), ("opt<i64>", b"\x02"), ("text_block", s("ab\n") + struct.pack("<QQ", 1, 1)),
                      ("text_block", s("ab\nc") + struct.pack("<QQ", 1, 2))):
        try:
            sr.decode_element(tag, blob)
        except sr.FormatError:
            continue
        raise AssertionError(f"{tag} {blob!r} was accepted")
    try:
        sr.decode_element("cereal:N3foo3BarE", b"\x00" * 8)
    except sr.NotNative:
        pass
    else:
        raise AssertionError("a cereal tag was decoded")


def jsonl(text):
    return [json.loads(x) for x in text.splitlines()]


# ---- snapshots made now by the tool ----

CANONICAL = {"seed": 42, "pipeline": [
    {"op": "range", "stop": 100000}, {"op": "shuffle", "buffer": 1000}, {"op": "sharding_filter"},
    {"op": "map", "fn": "affine", "mul": 2}, {"op": "batch", "size": 256}]}
WORDS = ["alpha", "b\"q", "tab\there", "new\nline", "\u00e9t\u00e9", "", "back\\slash", "\u65e5\u672c"]
STRINGS = {"seed": 5, "pipeline": [
    {"op": "from_vector", "values": [w + str(i) for i in range(40) for w in WORDS]},
    {"op": "shuffle", "buffer": 30}, {"op": "batch", "size": 7}]}
ZIPPED = {"seed": 9, "pipeline": [
    {"op": "range", "stop": 500}, {"op": "shuffle", "buffer": 20},
    {"op": "zip", "with": [[{"op": "range", "start": 1000, "stop": 1300}]]},
    {"op": "batch", "size": 3}]}
SAMPLED = {"seed": 11, "pipeline": [
    {"op": "range", "stop": 5000}, {"op": "sampler", "shuffle": "global"}, {"op": "shuffle", "buffer": 64},
    {"op": "map", "fn": "affine", "mul": 1}, {"op": "batch", "size": 16}]}


def blocks_spec():
    path = os.path.join(TMP, "blocks.txt")
    with open(path, "w") as f:
        for i in range(300):
            f.write(f"line {i} " + "w" * (i % 17) + ("\r\n" if i % 5 == 0 else "\n"))
        f.write("no newline at the end")
    return {"seed": 2, "pipeline": [{"op": "line_blocks", "files": [path], "logical_shards": 4, "block_bytes": 200},
                                    {"op": "shuffle", "buffer": 5}]}


def make_single(name, spec, take, *extra):
    path = os.path.join(TMP, name + ".dpipe")
    dpipe("run", json.dumps(spec), "--take", take, "--snapshot-out", path, *extra)
    return path


def main():
    def crc_check_value():
        assert sr.crc32c(b"123456789") == 0xE3069283 and sr.crc32c(b"") == 0
    check("crc32c check value", crc_check_value)
    check("element codecs from the document", element_codecs)

    files = {}
    for name, spec, take, extra in (
            ("canonical", CANONICAL, 37, []),
            ("strings", STRINGS, 9, []),
            ("workers2", CANONICAL, 37, ["--workers", 2]),
            ("zip", ZIPPED, 11, ["--workers", 2]),
            ("line_blocks", None, 3, [])):
        def make(name=name, spec=spec, take=take, extra=extra):
            files[name] = make_single(name, spec or blocks_spec(), take, *extra)
        check(f"{name}: dpipe writes a snapshot", make)

    set_dir = os.path.join(TMP, "set")

    def make_set():
        for r in range(2):
            dpipe("run", json.dumps(SAMPLED), "--rank", r, "--world-size", 2, "--workers", 2, "--take", 13,
                  "--snapshot-dir", set_dir, "--output", os.path.join(TMP, f"set-{r}.jsonl"))
        # The removal log (a hidden file the completing rank reads) is empty: no rank removed a file.
        assert os.path.getsize(os.path.join(set_dir, ".set.dpipe-removals")) == 0
        names = sorted(n for n in os.listdir(set_dir) if not n.startswith("."))
        assert len(names) == 3 and names[2:] == ["set.dpipe-manifest"], names
        # The first rescale of the set writes its index beside the manifest.
        dpipe("run", json.dumps(SAMPLED), "--rank", 0, "--world-size", 1, "--workers", 2, "--take", 1,
              "--resume-dir", set_dir, "--rescale", "--output", os.path.join(TMP, "set-rescaled.jsonl"))
        names = sorted(n for n in os.listdir(set_dir) if not n.startswith("."))
        assert len(names) == 4 and names[2:] == ["set.dpipe-index", "set.dpipe-manifest"], names
        names = names[:2]
        # With --take and no --step, the tool records the step where it was asked to stop (13).
        assert all(re.fullmatch(rf"rank-{r}-of-2\.w2\.s13\.[0-9a-f]{{16}}\.dpipe", n) for r, n in enumerate(names)), names
        for r in range(2):
            files[f"set rank {r}"] = os.path.join(set_dir, names[r])
    check("set: two ranks write rank-R-of-2.w2.s13.TAG.dpipe and the manifest, the first rescale the index", make_set)

    def manifest_as_documented():
        """The manifest line, rebuilt from the document: the set's world, workers, step and the TAG of its
        file names, then the CRC-32C of everything before " crc32c=", as 8 lowercase hex digits."""
        text = open(os.path.join(set_dir, "set.dpipe-manifest"), "rb").read()
        tag = re.fullmatch(r"rank-0-of-2\.w2\.s13\.([0-9a-f]{16})\.dpipe", os.path.basename(files["set rank 0"])).group(1)
        body = f"dpipe-set 1 world=2 workers=2 step=13 tag={tag}".encode()
        assert text == body + b" crc32c=" + f"{sr.crc32c(body):08x}".encode() + b"\n", text
    check("set: the manifest reads as documented, its checksum included", manifest_as_documented)

    def index_as_documented():
        """The set index, read by the reader written from the document: it names the set's manifest, W
        and K, and says what the two rank files hold, every list it places found there by its checksum."""
        data = open(os.path.join(set_dir, "set.dpipe-index"), "rb").read()
        index = sr.read_set_index(data)
        assert index["identity"] == open(os.path.join(set_dir, "set.dpipe-manifest"), "rb").read(), index["identity"]
        assert (index["world"], index["workers"]) == (2, 2), (index["world"], index["workers"])
        placed = [v for n in index["nodes"] for row in n["rows"] for (t, _, v) in row["fields"].values()
                  if t == "elements" and "offset" in v]
        assert placed, "no list is placed by where it lies"
        sr.check_set_index(index, [files["set rank 0"], files["set rank 1"]])
        # A flipped byte anywhere after the head fails the checksum.
        flipped = bytearray(data)
        flipped[len(data) // 2] ^= 1
        try:
            sr.read_set_index(bytes(flipped))
        except sr.ChecksumError:
            return
        raise AssertionError("a flipped byte in the index went unnoticed")
    check("set: the index reads as documented and says what the rank files hold", index_as_documented)

    for name, path in files.items():
        check(f"{name}: every checksum verifies, sections laid out as documented", checksums_verify, path)
        check(f"{name}: content equals `dpipe snapshot show`", compare_with_show, path)
        check(f"{name}: a flipped byte in header, table or any section fails the checksum check",
              flips_are_caught, path)
        check(f"{name}: written back from what was read, byte for byte", round_trips, path)

    def canonical_content():
        snap = sr.read_file(files["canonical"])
        m = snap["meta"]
        assert m["seed"] == 42 and m["elements_delivered"] == 37, m
        assert m["layout"] == {"rank": 0, "world_size": 1, "num_workers": 1}, m["layout"]
        kinds = [(n["kind"], n["element_type"], n["segment"]) for n in m["graph"]]
        assert kinds == [("batch", "vec<i64>", "worker"), ("map", "i64", "worker"),
                         ("sharding_filter", "i64", "worker"),
                         ("shuffle", "i64", "worker"), ("range", "i64", "worker")], kinds
        keys = [n["key"] for n in m["graph"]]
        assert keys == stable_keys_of_a_chain(m["graph"]), keys
        run = snap["states"][0]
        assert (run["key"], run["kind"], run["instance"], run["mode"]) == ("run", "run", 0, "hook"), run
        assert [f["name"] for f in run["fields"]][:2] == ["delivered", "pending"], run["fields"]
        assert run["fields"][0]["value"] == 37
        shuffle = [s for s in snap["states"] if s["kind"] == "shuffle"]
        assert len(shuffle) == 1, shuffle
        buffers = [f for f in shuffle[0]["fields"] if f["type"] == "elements" and f["tag"] == "i64"]
        assert buffers and sum(len(f["blobs"]) for f in buffers) >= 1, shuffle[0]["fields"]
        # Every element the run delivered and the shuffle buffer holds comes from range(100000), twice.
        held = [v for f in buffers for v in sr.field_values(f)]
        assert all(0 <= v < 100000 for v in held) and len(set(held)) == len(held), held[:10]
    check("canonical: graph, run record and shuffle buffer read as expected", canonical_content)

    def stated_properties_are_checked():
        """A file that breaks what the document states of its contents (checksums valid) is refused by
        `snapshot show` and by a resume alike, naming what is wrong."""
        base = sr.read_file(files["workers2"])

        def crafted(change, **write):
            snap = copy.deepcopy(base)
            change(snap)
            return sr.write_snapshot(snap, **write)

        def field(snap, key, name):
            return next(f for st in snap["states"] if st["key"] == key for f in st["fields"] if f["name"] == name)

        hooked = next(st["key"] for st in base["states"][1:] if st["mode"] == "hook" and st["fields"])
        graph_key = next(st["key"] for st in base["states"][1:] if any(n["key"] == st["key"] for n in base["meta"]["graph"]))
        big = 2**64 - 1
        cases = [
            ("its id is 0", crafted(lambda s: s["meta"].update(id=0))),
            ("its step is 7 without its step flag", crafted(lambda s: None, identity=struct.pack("<QBQ", base["meta"]["id"], 0, 7))),
            ("names node", crafted(lambda s: s["meta"]["graph"][1].update(key=s["meta"]["graph"][0]["key"]))),
            ("comes after a greater key", crafted(lambda s: s["meta"].update(user_metadata={"z": "1", "a": "2"}),
                                                  sort_metadata=False)),
            ("the run record says 38 elements delivered, the metadata 37",
             crafted(lambda s: field(s, "run", "delivered").update(value=38))),
            ("2^64 - 1 elements delivered", crafted(lambda s: (field(s, "run", "delivered").update(value=big),
                                                               s["meta"].update(elements_delivered=big)))),
            ("not the run record", crafted(lambda s: s["states"].append(s["states"].pop(0)))),
            ("a second run record", crafted(lambda s: s["states"].append(copy.deepcopy(s["states"][0])))),
            ("is of no instance of rank 0", crafted(lambda s: s["states"][1].update(instance=2))),
            ("is stateless but has a field",
             crafted(lambda s: next(st for st in s["states"] if st["key"] == hooked).update(mode="stateless"))),
            ("its graph node a", crafted(lambda s: next(st for st in s["states"] if st["key"] == graph_key).update(kind="filter"))),
        ]

        def short_blob(snap):  # an i64 of 3 bytes in a shuffle's buffer: show decodes native tags as resume does
            buffer = next(f for st in snap["states"] if st["kind"] == "shuffle" for f in st["fields"] if f["name"] == "buffer")
            buffer["blobs"][0] = buffer["blobs"][0][:3]
        cases.append(("is no valid i64", crafted(short_blob)))
        # Section 5 saying another number than section 2 (a rescale through the index would use it).
        other = copy.deepcopy(base["states"])
        number = next(f for st in other[1:] for f in st["fields"] if f["type"] == "u64")
        number["value"] += 1000
        cases.append(("does not say what the node states (section 2) say", crafted(lambda s: None, index_states=other)))
        for i, (expected, data) in enumerate(cases):
            path = os.path.join(TMP, f"crafted-{i}.dpipe")
            with open(path, "wb") as f:
                f.write(data)
            r = dpipe("snapshot", "show", path, check=False)
            assert r.returncode == 1 and expected in r.stderr, (expected, r.stderr)
            r = dpipe("run", json.dumps(CANONICAL), "--workers", 2, "--resume", path, check=False)
            assert r.returncode == 1 and (expected in r.stderr or expected == "is no valid i64"), (expected, r.stderr)
    check("workers2: a file that breaks what the document states is refused by show and resume", stated_properties_are_checked)

    def replay_steps_are_checked():
        """Format 5's replay record: count, digest, then one digest step per power of two from 2^16 up to
        count. A record claiming 2^30 elements with 14 steps (15 are due) is refused by this reader, by
        show and by resume; with 15 (wrong) ones it is well formed, and resume stops where the fixture's
        generator ends (60 elements), not after 2^30 (the unit test Replay.AForgedLongReplayIs… covers a
        generator that goes on: refused at the first step)."""
        vdir = os.path.join(FIXTURES, "v5")
        spec = os.path.join(vdir, "zip-generator.spec.json")
        base = sr.read_file(os.path.join(vdir, "zip-generator.dpipe"))
        record = next(st for st in base["states"] if st["mode"] == "replay")
        assert [f["name"] for f in record["fields"][:3]] == ["count", "digest", "digest_steps"], record
        assert sr.replay_steps_for(2**16 - 1) == 0 and sr.replay_steps_for(2**16) == 1 and sr.replay_steps_for(2**30) == 15

        def forged(steps):
            snap = copy.deepcopy(base)
            fields = next(st for st in snap["states"] if st["mode"] == "replay")["fields"]
            fields[0]["value"] = 2**30
            fields[2]["blobs"] = [struct.pack("<Q", 0x5A5A + k) for k in range(steps)]
            path = os.path.join(TMP, f"replay-{steps}.dpipe")
            with open(path, "wb") as f:
                f.write(sr.write_snapshot(snap))
            return path

        short = forged(14)
        try:
            sr.read_file(short)
            raise AssertionError("the reader took a replay record with 14 steps for 2^30 elements")
        except sr.FormatError as e:
            assert "14 digest steps for 1073741824 elements" in str(e), e
        for args in (("snapshot", "show", short), ("run", spec, "--resume", short)):
            r = dpipe(*args, check=False)
            assert r.returncode == 1 and "with 14 u64 digest steps, not 15 u64" in r.stderr, (args, r.stderr)
        wrong = forged(15)
        sr.read_file(wrong)  # well formed: only a replay can tell the steps are wrong
        r = dpipe("run", spec, "--resume", wrong, check=False)
        assert r.returncode == 1 and "replay ended after 60 of the 1073741824 recorded elements" in r.stderr, r.stderr
    check("v5/zip-generator: a replay record's digest steps are counted when read and checked as it replays",
          replay_steps_are_checked)

    def fingerprint_recomputed():
        """The document's fingerprint recipe, for linear pipelines of unnamed nodes (node i's input is i + 1)."""
        mix64, fnv1a = _mix64, _fnv1a

        for name in ("canonical", "strings", "workers2"):
            m = sr.read_file(files[name])["meta"]
            h = fnv1a(b"dpipe-graph-v1")

            def add(text):
                nonlocal h
                b = text.encode()
                h = mix64(h ^ fnv1a(b))
                h = mix64(h ^ len(b))
            assert [n["key"] for n in m["graph"]] == stable_keys_of_a_chain(m["graph"])  # unnamed
            for i, n in enumerate(m["graph"]):
                add(n["kind"])
                add("")
                add(n["element_type"])
                for k, v in n["params"]:
                    add(k)
                    add(v)
                add("inputs")
                if i + 1 < len(m["graph"]):
                    h = mix64(h ^ (i + 1))
            assert h == m["fingerprint"], (name, hex(h), hex(m["fingerprint"]))
    check("fingerprint recomputed from the document's recipe (linear pipelines)", fingerprint_recomputed)

    def set_summary():
        shown = obj(show(set_dir))
        snaps = [sr.read_file(files[f"set rank {r}"]) for r in range(2)]
        assert shown["world_size"] == 2 and shown["num_workers"] == 2, shown
        for r, (rank, snap) in enumerate(zip(shown["ranks"], snaps)):
            rank = obj(rank)
            assert snap["meta"]["layout"] == {"rank": r, "world_size": 2, "num_workers": 2}
            assert rank["elements_delivered"] == snap["meta"]["elements_delivered"]
            assert rank["records"] == len(snap["states"])
            buffered = sum(len(f["blobs"]) for s in snap["states"] for f in s["fields"]
                           if f["type"] == "elements" and f["tag"] != "u64")
            assert rank["buffered_elements"] == buffered, (rank, buffered)
        assert len({(s["meta"]["fingerprint"], s["meta"]["seed"], s["meta"]["epoch"]) for s in snaps}) == 1
    check("set: the reader agrees with `dpipe snapshot show DIR` and the ranks agree", set_summary)

    def index_listing_an_instance_twice():
        """A rank file whose records of one node name instance 2 twice (each record of an instance of its
        rank, so the file reads): the index the first rescale writes from it lists that instance twice,
        and the rescale is refused naming the instance, not counting records."""
        dup = os.path.join(TMP, "set-duplicate")
        shutil.rmtree(dup, ignore_errors=True)
        os.makedirs(dup)
        for name in os.listdir(set_dir):
            if name != "set.dpipe-index":
                shutil.copy(os.path.join(set_dir, name), dup)
        path = os.path.join(dup, os.path.basename(files["set rank 1"]))
        snap = sr.read_file(path)
        record = next(st for st in snap["states"] if st["instance"] == 3 and st["kind"] == "shuffle")
        record["instance"] = 2
        open(path, "wb").write(sr.write_snapshot(snap))
        r = dpipe("run", json.dumps(SAMPLED), "--rank", 0, "--world-size", 1, "--workers", 2, "--take", 1,
                  "--resume-dir", dup, "--rescale", "--output", os.path.join(TMP, "dup.jsonl"), check=False)
        assert r.returncode != 0, r.stdout
        assert os.path.exists(os.path.join(dup, "set.dpipe-index")), os.listdir(dup)
        assert "has a record of instance 2 where instance 3's belongs (instance 2 is listed twice)" in r.stderr, r.stderr
    check("set: an index listing an instance twice is refused naming it", index_listing_an_instance_twice)

    def without_node_details():
        """The older layout of version 1 (sections 1 and 2 only) still resumes with today's tool."""
        data = open(files["canonical"], "rb").read()
        snap = sr.read_snapshot(data)
        old = sr.write_snapshot(snap, node_details=False, version=1)
        assert [s["id"] for s in sr.read_snapshot(old)["sections"]] == [1, 2]
        p = os.path.join(TMP, "canonical-no-details.dpipe")
        open(p, "wb").write(old)
        a = dpipe("run", json.dumps(CANONICAL), "--resume", files["canonical"]).stdout
        b = dpipe("run", json.dumps(CANONICAL), "--resume", p).stdout
        assert a == b and a, (len(a), len(b))
        assert "segment" not in dpipe("snapshot", "show", p).stdout
    check("version 1 without the node-details section: read and resumed alike", without_node_details)

    # ---- the format-version fixtures ----
    # v<N>/fixtures.json, and v<N>/<variant>/fixtures.json for files of version N laid out differently
    # (v1/before-node-details: written before section 3 existed).
    manifests = sorted(glob.glob(os.path.join(FIXTURES, "v*", "fixtures.json")) +
                       glob.glob(os.path.join(FIXTURES, "v*", "*", "fixtures.json")))

    def have_fixtures():
        assert manifests, f"no {FIXTURES}/v<N>/fixtures.json"
    check("fixtures: at least one version directory", have_fixtures)
    for manifest in manifests:
        vdir = os.path.dirname(manifest)
        rel = os.path.relpath(vdir, FIXTURES)
        version = int(rel.split(os.sep)[0][1:])
        for fx in json.load(open(manifest)):
            check(f"{rel}/{fx['name']}: reads as version {version}, checksums verify",
                  fixture_reads, vdir, fx, version)
            check(f"{rel}/{fx['name']}: resumed stream equals the stored one", fixture_resumes, vdir, fx)
            if "snapshot" in fx and version < 4:
                check(f"{rel}/{fx['name']}: a snapshot of the resumed run keeps its keys and resumes alike",
                      fixture_resumes_twice, vdir, fx)

    def old_file_of_another_pipeline_is_refused_naming_the_node():
        """A version 3 file against a pipeline with one node replaced: the refusal names that node in the
        file's own (pre-order) keys, not node 0 under today's keys."""
        vdir = os.path.join(FIXTURES, "v3")
        spec = json.loads(open(os.path.join(vdir, "canonical.spec.json")).read())
        spec["pipeline"][3] = {"op": "replicate"}
        r = dpipe("run", json.dumps(spec), "--resume", os.path.join(vdir, "canonical.dpipe"), check=False)
        assert r.returncode != 0, r.stdout[:200]
        assert "pipeline[3] (replicate) is replicate@1 (replicate, i64) here and map@1 (map, i64) in the snapshot" in r.stderr, r.stderr
    check("v3/canonical: another pipeline is refused naming the node that differs",
          old_file_of_another_pipeline_is_refused_naming_the_node)

    print(f"snapshot_reader: {passes} checks passed, {len(failures)} failed")
    for f in failures:
        print(f"  failed: {f}")
    if failures:
        print(f"  files kept in {TMP}")
        return 1
    shutil.rmtree(TMP, ignore_errors=True)
    return 0


def fixture_paths(vdir, fx):
    """The snapshot files of a fixture: one file, or each rank's file of a set."""
    if "snapshot" in fx:
        return [os.path.join(vdir, fx["snapshot"])]
    return sorted(glob.glob(os.path.join(vdir, fx["snapshot_dir"], "*.dpipe")))


_M64 = (1 << 64) - 1


def _mix64(x):
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def _fnv1a(b):
    h = 0xCBF29CE484222325
    for c in b:
        h = ((h ^ c) * 0x100000001B3) & _M64
    return h


def stable_keys_of_a_chain(graph):
    """The keys of format version 4 (docs/snapshot-format.md, "Node keys") of a chain of unnamed nodes,
    node i reading node i + 1, recomputed from the document's recipe."""
    digests = [0] * len(graph)
    for i in reversed(range(len(graph))):
        h = _fnv1a(b"dpipe-key-v1")
        for text in (graph[i]["kind"], graph[i]["element_type"]):
            b = text.encode()
            h = _mix64(_mix64(h ^ _fnv1a(b)) ^ len(b))
        inputs = [i + 1] if i + 1 < len(graph) else []
        for j in inputs:
            h = _mix64(h ^ digests[j])
        digests[i] = _mix64(h ^ len(inputs))
    keys, seen = [], {}
    for n, d in zip(graph, digests):
        base = f"{n['kind']}@{d >> 32:08x}"
        seen[base] = seen.get(base, 0) + 1
        keys.append(base if seen[base] == 1 else f"{base}.{seen[base]}")
    return keys


def fixture_reads(vdir, fx, version):
    paths = fixture_paths(vdir, fx)
    assert paths
    for p in paths:
        snap = sr.read_file(p)
        assert snap["header"]["format_version"] == version, snap["header"]
        assert [s["id"] for s in snap["sections"]] == fx.get("sections", {1: [1, 2, 3], 2: [4, 1, 2, 3]}.get(version, [4, 1, 3, 2, 5])), snap["sections"]
        compare_with_show(p)


def fixture_resumes(vdir, fx):
    spec = open(os.path.join(vdir, fx["spec"])).read()
    # One expected stream, or one per rank for a set.
    names = fx["expected"] if isinstance(fx["expected"], list) else [fx["expected"]]
    expected = [jsonl(open(os.path.join(vdir, n)).read()) for n in names]
    if "snapshot" in fx:
        expected = expected[0]
    if "snapshot" in fx:
        got = jsonl(dpipe("run", spec, *fx.get("args", []), "--resume", os.path.join(vdir, fx["snapshot"])).stdout)
    else:
        got = []
        world = fx["world_size"]
        for r in range(world):
            out = os.path.join(TMP, f"fixture-{fx['name']}-{r}.jsonl")
            dpipe("run", spec, "--rank", r, "--world-size", world, *fx.get("args", []),
                  "--resume-dir", os.path.join(vdir, fx["snapshot_dir"]), "--output", out)
            got.append(jsonl(open(out).read()))
    assert got == expected, f"resumed {len(got)} items, expected {len(expected)}; first difference at " + str(
        next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), len(expected))))


KNOWN_VERSIONS_TODAY = max(sr.KNOWN_VERSIONS)


def fixture_resumes_twice(vdir, fx):
    """A run resumed from a file of version 1 to 3 keeps that file's node keys (and so its random
    streams): its own snapshot, of today's version, resumes to the rest of the stored stream."""
    spec = open(os.path.join(vdir, fx["spec"])).read()
    expected = jsonl(open(os.path.join(vdir, fx["expected"])).read())
    old = sr.read_file(os.path.join(vdir, fx["snapshot"]))
    mid = os.path.join(TMP, f"twice-{os.path.basename(vdir)}-{fx['name']}.dpipe")
    head = jsonl(dpipe("run", spec, *fx.get("args", []), "--resume", os.path.join(vdir, fx["snapshot"]),
                       "--take", 2, "--snapshot-out", mid).stdout)
    again = sr.read_file(mid)
    assert again["header"]["format_version"] == KNOWN_VERSIONS_TODAY, again["header"]
    assert [n["key"] for n in again["meta"]["graph"]] == [n["key"] for n in old["meta"]["graph"]]
    rest = jsonl(dpipe("run", spec, *fx.get("args", []), "--resume", mid).stdout)
    assert head + rest == expected, f"{len(head)} + {len(rest)} items, expected {len(expected)}"


if __name__ == "__main__":
    sys.exit(main())
