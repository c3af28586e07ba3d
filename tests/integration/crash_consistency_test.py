#!/usr/bin/env python3
"""Crash consistency of every file dpipe writes (docs/files.md): writers are killed with SIGKILL at random
moments, 200 times in all, and after each kill the path holds the old or the new complete file; after the
next (complete) write no temporary `.NAME.dpipe-tmp.PID.HEX` is left beside it.

Writers: `dpipe run --snapshot-out`, `dpipe run --snapshot-dir` (one rank's file of a set), `dpipe snapshot
rescale` (a whole new set), `write_records` (tests/crash/records_writer.cpp, in a loop), `dpipe run
--output` and the Python Loader's save() (the write on its background thread). The kill moment is drawn
uniformly over the writer's measured duration (seed printed, or set with DPIPE_CRASH_SEED); the
assertions hold for any moment. Writes JUnit XML with one case per writer to
$DPIPE_BUILD_ROOT/test-results/crash_consistency.xml."""
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import xml.etree.ElementTree as ET

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from snapshot_reader import read_file as read_snapshot  # noqa: E402
from tool_files import tfrecord  # noqa: E402

BUILD = os.environ.get("DPIPE_BUILD_ROOT", "build")
DPIPE = os.path.join(BUILD, "tools", "dpipe")
RECORDS_WRITER = os.path.join(BUILD, "tests", "crash_records_writer")
SEED = int(os.environ.get("DPIPE_CRASH_SEED", str(time.time_ns() % (1 << 32))))
rng = random.Random(SEED)
TMP = tempfile.mkdtemp(prefix="dpipe-crash-")
TEMPORARY = re.compile(r"^\..+\.dpipe-tmp\.\d+\.[0-9a-f]+$")
# A rank's file in a set: rank-R-of-W.wK[.sS].TAG.dpipe (docs/snapshot-format.md).
MANIFEST = "set.dpipe-manifest"
INDEX = "set.dpipe-index"
RANK_FILE = re.compile(r"^rank-(\d+)-of-(\d+)\.w\d+(?:\.s\d+)?\.[0-9a-f]{16}\.dpipe$")


def rank_file(d, rank, world):
    """The one file of rank `rank` of `world` in the set directory d."""
    found = [n for n in os.listdir(d) if (m := RANK_FILE.match(n)) and (int(m.group(1)), int(m.group(2))) == (rank, world)]
    assert len(found) == 1, (d, rank, world, os.listdir(d))
    return os.path.join(d, found[0])
results = []  # (name, error or None, summary)


def temporaries(directory):
    return sorted(n for n in os.listdir(directory) if TEMPORARY.match(n))


def run(cmd):
    r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=120)
    if r.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {r.returncode}: {r.stderr}")


def duration(cmd, times=3):
    """The longest of a few complete runs: the window the kill moment is drawn from."""
    longest = 0.0
    for _ in range(times):
        t0 = time.monotonic()
        run(cmd)
        longest = max(longest, time.monotonic() - t0)
    return longest


def kill_at_random(cmd, window):
    """Starts `cmd`, sends SIGKILL after a random delay in [0, window]; True if it was still running."""
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(rng.uniform(0, window))
    alive = p.poll() is None
    p.send_signal(signal.SIGKILL)
    p.wait()
    return alive


class Tally:
    def __init__(self):
        self.kills = self.alive = self.old = self.new = self.absent = 0

    def __str__(self):
        return (f"{self.kills} kills ({self.alive} while writing): {self.old} old, {self.new} new, "
                f"{self.absent} absent")


def check_old_or_new(tally, state, old, new):
    """`state` is what the path holds (None: absent); `old` is what it held before the killed write."""
    if state is None:
        assert old is None, f"the path vanished: it held {old!r}"
        tally.absent += 1
    elif state == old:
        tally.old += 1
    elif state == new:
        tally.new += 1
    else:
        raise AssertionError(f"the path holds {state!r}, neither the old {old!r} nor the new {new!r}")


def snapshot_state(path):
    """A snapshot file's elements_delivered after a full read with its checksums, or None if absent."""
    if not os.path.exists(path):
        return None
    return read_snapshot(path)["meta"]["elements_delivered"]


def bytes_state(path):
    if not os.path.exists(path):
        return None
    with open(path, "rb") as f:
        return f.read()


SNAPSHOT_SPEC = json.dumps({"seed": 3, "pipeline": [{"op": "range", "stop": 1000000},
                                                    {"op": "shuffle", "buffer": 3000}, {"op": "batch", "size": 4}]})
SET_SPEC = json.dumps({"seed": 11, "pipeline": [{"op": "range", "stop": 1000000}, {"op": "sampler", "shuffle": "global"},
                                                {"op": "shuffle", "buffer": 2000}, {"op": "batch", "size": 4}]})


def snapshot_writer(name, kills, path, command, takes=(200, 300)):
    """Kills `command(take)` (a writer of the snapshot file `path`), alternating the take so that old and
    new differ; after each kill, one complete write of the same command."""
    tally = Tally()
    window = 1.2 * duration(command(takes[1]))
    old = snapshot_state(path)
    for i in range(kills):
        new = takes[i % 2]
        tally.kills += 1
        tally.alive += kill_at_random(command(new), window)
        check_old_or_new(tally, snapshot_state(path), old, new)
        run(command(new))
        assert snapshot_state(path) == new
        left = temporaries(os.path.dirname(path))
        assert not left, f"temporaries left after a complete write: {left}"
        old = new
    return str(tally)


def case(name, fn):
    t0 = time.monotonic()
    try:
        summary = fn()
        results.append((name, None, summary))
        print(f"ok   {name}: {summary} ({time.monotonic() - t0:.1f} s)")
    except Exception:  # noqa: BLE001 - every failure is reported, not raised
        results.append((name, traceback.format_exc(), ""))
        print(f"FAIL {name}\n{traceback.format_exc()}")


def snapshot_out():
    d = os.path.join(TMP, "snapshot-out")
    os.makedirs(d)
    path = os.path.join(d, "s.dpipe")
    return snapshot_writer("snapshot_out", 50, path,
                           lambda take: [DPIPE, "run", SNAPSHOT_SPEC, "--take", str(take), "--snapshot-out", path])


def manifest_names_present_files(d):
    """A set's manifest, when there is one, names files that are all there (the rank files of its W, K,
    step and TAG): a killed writer never leaves one vouching for a file it removed."""
    path = os.path.join(d, MANIFEST)
    if not os.path.exists(path):
        return
    m = re.fullmatch(rb"dpipe-set 1 world=(\d+) workers=(\d+) step=(\d+|-) tag=([0-9a-f]{16}) crc32c=[0-9a-f]{8}\n",
                     open(path, "rb").read())
    assert m, open(path, "rb").read()
    world, workers, step, tag = int(m[1]), int(m[2]), m[3].decode(), m[4].decode()
    names = [f"rank-{r}-of-{world}.w{workers}{'' if step == '-' else '.s' + step}.{tag}.dpipe" for r in range(world)]
    missing = [n for n in names if not os.path.exists(os.path.join(d, n))]
    assert not missing, f"the manifest names files that are gone: {missing}; the set holds {sorted(os.listdir(d))}"


def snapshot_dir_rank():
    d = os.path.join(TMP, "set")
    # One step given to every write, so rank 1's file keeps its name while its content changes.
    for r in (0, 1):
        run([DPIPE, "run", SET_SPEC, "--rank", str(r), "--world-size", "2", "--take", "100", "--snapshot-dir", d,
             "--step", "1"])
    assert os.path.exists(os.path.join(d, MANIFEST))
    path = rank_file(d, 1, 2)
    summary = snapshot_writer("snapshot_dir", 40, path,
                              lambda take: [DPIPE, "run", SET_SPEC, "--rank", "1", "--world-size", "2", "--take",
                                            str(take), "--snapshot-dir", d, "--step", "1"])
    # The untouched rank is intact and the set reads as a whole.
    assert snapshot_state(rank_file(d, 0, 2)) == 100
    run([DPIPE, "snapshot", "show", d])
    return summary


def set_manifest():
    """Rank 1 of a set writes steps 1 and 2 by turns (rank 0 stays at step 1), killed at random: a
    manifest left behind always names files that are there, and after each complete write there is one
    exactly when the set is whole (rank 1 at step 1)."""
    d = os.path.join(TMP, "set-steps")
    writer = lambda r, step: [DPIPE, "run", SET_SPEC, "--rank", str(r), "--world-size", "2", "--take",  # noqa: E731
                              str(100 * step), "--snapshot-dir", d, "--step", str(step)]
    for r in (0, 1):
        run(writer(r, 1))
    window = 1.2 * duration(writer(1, 2), times=1)
    kills = alive = with_manifest = 0
    for i in range(30):
        step = 2 - i % 2
        kills += 1
        alive += kill_at_random(writer(1, step), window)
        manifest_names_present_files(d)
        with_manifest += os.path.exists(os.path.join(d, MANIFEST))
        run(writer(1, step))
        assert os.path.exists(os.path.join(d, MANIFEST)) == (step == 1), (step, sorted(os.listdir(d)))
    return f"{kills} kills ({alive} while writing); a manifest after {with_manifest} of them, each naming files present"


def rescale():
    """A killed rescale leaves the new set complete or absent (it writes into a directory beside it and
    renames that into place); the next rescale to the same directory removes what the killed one left."""
    src = os.path.join(TMP, "rescale-src")
    for r in (0, 1):
        run([DPIPE, "run", SET_SPEC, "--rank", str(r), "--world-size", "2", "--take", "100", "--snapshot-dir", src])
    tally = Tally()
    cmd = lambda out: [DPIPE, "snapshot", "rescale", src, "--world-size", "6", "--workers", "2", "--out", out]  # noqa: E731
    window = 1.2 * duration(cmd(os.path.join(TMP, "rescale-calibrate")), times=1)
    expected = set(range(6))
    complete = partial = 0
    for i in range(30):
        out = os.path.join(TMP, f"rescale-{i}")
        tally.kills += 1
        tally.alive += kill_at_random(cmd(out), window)
        names = set(os.listdir(out)) if os.path.isdir(out) else set()
        assert not names or {MANIFEST, INDEX} <= names, f"a rescaled set without its manifest or index: {sorted(names)}"
        names -= {MANIFEST, INDEX}
        assert all(RANK_FILE.match(n) for n in names), f"unexpected files in a rescaled set: {sorted(names)}"
        ranks = {int(RANK_FILE.match(n).group(1)) for n in names}
        assert len(ranks) == len(names) and ranks in (set(), expected), f"a partial rescaled set: {sorted(names)}"
        for n in names:
            meta = read_snapshot(os.path.join(out, n))["meta"]
            assert meta["layout"]["world_size"] == 6 and meta["layout"]["num_workers"] == 2, meta["layout"]
        tally.new += len(ranks)
        tally.absent += len(expected - ranks)
        complete += ranks == expected
        partial += 0 < len(ranks) < len(expected)
        if not ranks:  # killed before the rename: the next rescale completes and clears the leftovers
            run(cmd(out))
            assert len(os.listdir(out)) == len(expected) + 2, os.listdir(out)  # and the manifest and index
        left = [n for n in os.listdir(TMP) if n.startswith(f".rescale-{i}.dpipe-rescale.")]
        assert not left, f"a killed rescale's directory is still there: {left}"
        shutil.rmtree(out, ignore_errors=True)
    return f"{tally} (rank files); {complete} sets complete, {partial} partial"


def records():
    d = os.path.join(TMP, "records")
    os.makedirs(d)
    path = os.path.join(d, "data.tfrecord")

    def variant(v):
        return b"".join(tfrecord(f"v{v}-record-{i}-{'x' * (i % 50)}".encode()) for i in range(3000 + 1000 * v))

    contents = [variant(0), variant(1)]
    tally = Tally()
    window = 3 * duration([RECORDS_WRITER, path, "1"])  # the loop writes again and again: any moment
    old = bytes_state(path)
    for i in range(40):
        tally.kills += 1
        tally.alive += kill_at_random([RECORDS_WRITER, path, str(i % 2), "loop"], window)
        state = bytes_state(path)
        # A loop writes both variants: the path holds one of them whole (or nothing before the first write).
        assert state is None or state in contents, f"the records file holds {len(state)} bytes of neither variant"
        check_old_or_new(tally, state, old, state if state in contents else None)
        v = rng.randrange(2)
        run([RECORDS_WRITER, path, str(v)])
        assert bytes_state(path) == contents[v]
        left = temporaries(d)
        assert not left, f"temporaries left after a complete write: {left}"
        old = contents[v]
    return str(tally)


def tool_output():
    d = os.path.join(TMP, "output")
    os.makedirs(d)
    path = os.path.join(d, "out.jsonl")
    specs = [json.dumps({"pipeline": [{"op": "range", "stop": 150000}]}),
             json.dumps({"pipeline": [{"op": "range", "stop": 120000}, {"op": "map", "fn": "affine", "mul": 3}]})]
    cmd = lambda v: [DPIPE, "run", specs[v], "--output", path]  # noqa: E731
    contents = []
    for v in (0, 1):
        run(cmd(v))
        contents.append(bytes_state(path))
    assert contents[0] != contents[1]
    window = 1.2 * max(duration(cmd(0)), duration(cmd(1)))
    tally = Tally()
    old_v = 1
    for i in range(40):
        new_v = 1 - old_v
        tally.kills += 1
        tally.alive += kill_at_random(cmd(new_v), window)
        check_old_or_new(tally, bytes_state(path), contents[old_v], contents[new_v])
        assert not os.path.exists(path + ".partial"), "a killed run left PATH.partial"
        run(cmd(new_v))
        assert bytes_state(path) == contents[new_v]
        left = temporaries(d)
        assert not left, f"temporaries left after a complete write: {left}"
        old_v = new_v
    return str(tally)


# The Python package's background write (Loader.save): in the plain build only (under a sanitizer the
# extension is not built). The interpreter with numpy is Debian's.
PYTHON_PACKAGE = os.path.join(BUILD, "python")
PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
SAVE_WRITER = r"""
import sys, dpipe
take, d = int(sys.argv[1]), sys.argv[2]
p = dpipe.range(0, 1_000_000) | dpipe.sampler(shuffle="global") | dpipe.shuffle(buffer=2000) | dpipe.batch(size=4)
loader = dpipe.Loader(p, seed=11, workers=2)
it = iter(loader)
for _ in range(take):
    next(it)
pending = [loader.save(d, step=1) for _ in range(8)]   # queued one after another on the writer thread
pending[-1].wait()
"""


def python_extension_built():
    package = os.path.join(PYTHON_PACKAGE, "dpipe")
    return os.path.isdir(package) and any(n.startswith("_dpipe") for n in os.listdir(package))


def python_save():
    """Loader.save's write on its background thread, killed at random: this rank's file of the set holds
    the old or the new complete snapshot, and a complete save after it leaves no temporary."""
    d = os.path.join(TMP, "python-save")
    writer = lambda take: ["env", f"PYTHONPATH={PYTHON_PACKAGE}", PYTHON, "-c", SAVE_WRITER, str(take), d]  # noqa: E731
    run(writer(100))
    return snapshot_writer("python_save", 20, rank_file(d, 0, 1), writer, takes=(100, 150))


def main():
    print(f"crash consistency: seed {SEED} (DPIPE_CRASH_SEED), files in {TMP}")
    t0 = time.monotonic()
    case("crash/snapshot_out", snapshot_out)
    case("crash/snapshot_dir_rank_file", snapshot_dir_rank)
    case("crash/set_manifest", set_manifest)
    case("crash/snapshot_rescale", rescale)
    case("crash/records_file", records)
    case("crash/tool_output", tool_output)
    if python_extension_built():
        case("crash/python_background_save", python_save)
    else:
        print("skip crash/python_background_save: the Python extension is not built here")
    print(f"{time.monotonic() - t0:.1f} s")
    out = os.path.join(BUILD, "test-results")
    os.makedirs(out, exist_ok=True)
    suite = ET.Element("testsuite", name="crash_consistency", tests=str(len(results)),
                       failures=str(sum(1 for _, e, _ in results if e)))
    for name, err, summary in results:
        c = ET.SubElement(suite, "testcase", classname="crash_consistency", name=name)
        if err:
            ET.SubElement(c, "failure", message="failed").text = err
        else:
            ET.SubElement(c, "system-out").text = summary
    root = ET.Element("testsuites")
    root.append(suite)
    ET.ElementTree(root).write(os.path.join(out, "crash_consistency.xml"), encoding="utf-8", xml_declaration=True)
    if not any(e for _, e, _ in results):
        shutil.rmtree(TMP, ignore_errors=True)
    return 1 if any(e for _, e, _ in results) else 0


if __name__ == "__main__":
    sys.exit(main())
