"""Python callables in map, filter and flat_map: run on the engine's threads, checked results, failures
raised as dpipe.NodeError naming the node and worker with the original exception as __cause__, and exact
resume through them."""
import _thread
import json
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import dpipe
from conftest import BUILD_ROOT, plain
from dpipe import _fuse


def double(x):
    return 2 * x


def test_map_filter_flat_map_with_python_callables():
    p = (dpipe.range(0, 20) | dpipe.map(double) | dpipe.filter(lambda x: x % 3 == 0)
         | dpipe.flat_map(lambda x: [x, x + 1]))
    expected = [y for x in range(20) for y in ([2 * x, 2 * x + 1] if (2 * x) % 3 == 0 else [])]
    assert list(dpipe.Loader(p)) == expected
    # Callables run on the engine's threads; the results come back in order, on 3 workers too.
    threads = set()

    def where(x):
        threads.add(threading.get_ident())
        return x

    q = dpipe.range(0, 300) | dpipe.sharding_filter() | dpipe.map(where)
    got = list(dpipe.Loader(q, workers=3, threads=2))
    assert sorted(got) == list(range(300))
    assert threading.get_ident() not in threads


def test_map_changes_the_element_type_with_out():
    p = dpipe.range(0, 4) | dpipe.map(lambda x: "n" * x, out=str) | dpipe.batch(size=2)
    assert [plain(b) for b in dpipe.Loader(p)] == [["", "n"], ["nn", "nnn"]]
    q = dpipe.range(0, 3) | dpipe.map(lambda x: np.arange(x), out="batch of integer")
    got = list(dpipe.Loader(q))
    assert [a.tolist() for a in got] == [[], [0], [0, 1]] and all(a.dtype == np.int64 for a in got)
    # Batches reach a callable as numpy arrays, and an array or a list may come back.
    r = dpipe.range(0, 6) | dpipe.batch(size=3) | dpipe.map(lambda b: b * 10)
    assert [plain(b) for b in dpipe.Loader(r)] == [[0, 10, 20], [30, 40, 50]]


def test_a_result_of_the_wrong_type_is_a_node_error_naming_the_callable():
    p = dpipe.range(0, 3) | dpipe.map(lambda x: 1.5, name="half")
    with pytest.raises(dpipe.NodeError, match=r"half.*returned float, expected an integer"):
        list(dpipe.Loader(p))


class Boom(Exception):
    pass


def explode_at_5(x):
    if x == 5:
        raise Boom("no five")
    return x


def test_an_exception_reaches_the_consumer_after_the_elements_before_it():
    loader = dpipe.Loader(dpipe.range(0, 10) | dpipe.map(explode_at_5, name="fragile"), workers=1)
    got = []
    with pytest.raises(dpipe.NodeError) as err:
        for x in loader:
            got.append(x)
    assert got == [0, 1, 2, 3, 4]
    e = err.value
    assert "fragile" in str(e) and "Boom: no five" in str(e)
    assert isinstance(e.__cause__, Boom) and str(e.__cause__) == "no five"
    assert e.worker == 0 and "fragile" in e.node


def test_on_error_skip_drops_what_a_callable_raises_on_and_keeps_the_count_in_the_state():
    def not_fourths(x):
        if x % 4 == 0:
            raise ValueError("a multiple of four")
        return x

    p = (dpipe.range(0, 300) | dpipe.sharding_filter() | dpipe.map(not_fourths, on_error="skip")
         | dpipe.filter(lambda x: 1 / (x % 5) > 0, on_error="skip")  # ZeroDivisionError on multiples of 5
         | dpipe.flat_map(lambda x: [x, -x] if x % 7 else [][0], on_error="skip"))  # IndexError on multiples of 7
    want = [y for x in range(300) if x % 4 and x % 5 and x % 7 for y in (x, -x)]
    whole = list(dpipe.Loader(p, workers=2))  # the two workers' elements interleaved
    assert sorted(whole) == sorted(want)
    loader = dpipe.Loader(p, workers=2)
    it = iter(loader)
    head = [next(it) for _ in range(31)]
    state = pickle.loads(pickle.dumps(loader.state_dict()))
    rest = dpipe.Loader(p, workers=2)
    rest.load_state_dict(state)
    assert head + list(rest) == whole
    by_kind = {}
    for key, n in rest.skipped().items():
        kind = key.split("@")[0]
        by_kind[kind] = by_kind.get(kind, 0) + n
    assert by_kind == {"map": sum(1 for x in range(300) if x % 4 == 0),
                       "filter": sum(1 for x in range(300) if x % 4 and x % 5 == 0),
                       "flat_map": sum(1 for x in range(300) if x % 4 and x % 5 and x % 7 == 0)}
    # Skip never swallows an interruption: KeyboardInterrupt raised in a callable stops the loop.
    def interrupted(x):
        if x == 3:
            raise KeyboardInterrupt
        return x
    with pytest.raises((KeyboardInterrupt, dpipe.NodeError)) as err:
        list(dpipe.Loader(dpipe.range(0, 10) | dpipe.map(interrupted, on_error="skip"), inline_workers=True))
    assert isinstance(err.value, KeyboardInterrupt) or isinstance(err.value.__cause__, KeyboardInterrupt)


def test_resume_through_a_python_map_is_exact():
    p = dpipe.range(0, 500) | dpipe.shuffle(buffer=50) | dpipe.sharding_filter() | dpipe.map(double) \
        | dpipe.batch(size=7)
    whole = [plain(b) for b in dpipe.Loader(p, seed=3, workers=2)]
    loader = dpipe.Loader(p, seed=3, workers=2)
    it = iter(loader)
    head = [plain(next(it)) for _ in range(11)]
    state = loader.state_dict()
    again = dpipe.Loader(p, seed=3, workers=2)
    again.load_state_dict(state)
    assert head + [plain(b) for b in again] == whole
    # Another function under the same node is another pipeline.
    other = dpipe.range(0, 500) | dpipe.shuffle(buffer=50) | dpipe.sharding_filter() | dpipe.map(explode_at_5) \
        | dpipe.batch(size=7)
    with pytest.raises(dpipe.SnapshotError, match="different pipeline"):
        dpipe.Loader(other, seed=3, workers=2).load_state_dict(state)


def test_callables_only_where_they_run():
    # Every op with a function takes a Python callable (parallel_map too); elsewhere it is a mistaken value.
    assert set(dpipe._nodes._callable_ops()) == {"generator", "map", "parallel_map", "filter", "flat_map", "demux"}
    with pytest.raises(TypeError, match=r"batch\(\): size must be an int, got function"):
        dpipe.batch(double)
    with pytest.raises(TypeError, match="unexpected keyword argument 'out'"):
        dpipe.batch(size=2, out=int)
    with pytest.raises(TypeError, match="out= is for a Python callable"):
        dpipe.map("affine", out=int)


def test_ctrl_c_while_waiting_for_a_worker_interrupts_promptly_and_loses_nothing():
    def slow(x):
        if x == 0:
            time.sleep(3)  # releases the GIL: the consumer waits, looking for signals
        return x

    loader = dpipe.Loader(dpipe.range(0, 6) | dpipe.map(slow), workers=1, inline_workers=False)
    it = iter(loader)
    timer = threading.Timer(0.3, _thread.interrupt_main)
    started = time.monotonic()
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        next(it)
    assert time.monotonic() - started < 1.5, "the interrupt waited for the worker"
    assert list(it) == [0, 1, 2, 3, 4, 5]  # the run went on: nothing lost, nothing repeated


def record(x):
    """A callable returning every kind of value a snapshot holds."""
    return {"id": x, "half": x / 2, "text": f"n{x}", "raw": bytes([x % 256]), "pair": (x % 2 == 0, None),
            "ids": [x, -x], 7: "int key", "image": np.full((2, 3), x, dtype=np.float32),
            "scalar": np.int32(x)}


def same_value(a, b):
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape and (a == b).all()
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(same_value(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def test_python_values_flow_through_buffers_and_snapshots():
    p = (dpipe.range(0, 120) | dpipe.sharding_filter() | dpipe.map(record, out=object)
         | dpipe.shuffle(buffer=16) | dpipe.batch(size=5))
    whole = list(dpipe.Loader(p, seed=2, workers=2))
    assert len(whole) == 24 and all(isinstance(b, list) and len(b) == 5 for b in whole)
    first = whole[0][0]
    expected = record(first["id"])
    expected["scalar"] = int(expected["scalar"])  # a numpy scalar comes back as the Python number it holds
    assert same_value(first, expected), first
    assert sorted(v["id"] for b in whole for v in b) == list(range(120))
    for at in (0, 3, 11):
        loader = dpipe.Loader(p, seed=2, workers=2)
        it = iter(loader)
        head = [next(it) for _ in range(at)]
        state = pickle.loads(pickle.dumps(loader.state_dict()))  # shuffle buffers of dicts and arrays
        again = dpipe.Loader(p, seed=2, workers=2)
        again.load_state_dict(state)
        assert same_value(head + list(again), whole), at


def test_a_value_a_snapshot_cannot_hold_is_refused_where_it_is_returned():
    p = dpipe.range(0, 3) | dpipe.map(lambda x: {"x": object()}, out=object, name="boxes")
    with pytest.raises(dpipe.NodeError, match=r"boxes.*returned object, expected None, bool, int"):
        list(dpipe.Loader(p))
    q = dpipe.range(0, 3) | dpipe.map(lambda x: np.array(["a", "b"]), out=object)
    with pytest.raises(dpipe.NodeError, match="not one of numbers"):
        list(dpipe.Loader(q))
    r = dpipe.range(0, 3) | dpipe.map(lambda x: 2**70, out=object)
    with pytest.raises(dpipe.NodeError, match="outside 64 bits"):
        list(dpipe.Loader(r))


def rows(info):
    """A generator source: its elements depend only on the information dpipe passes."""
    rng = np.random.default_rng([info["seed"], info["worker"]])
    for i in range(30):
        yield {"i": i, "worker": info["worker"], "draw": rng.integers(0, 1000), "epoch": info["epoch"]}


def test_a_python_generator_source_restores_by_replay():
    p = dpipe.generator(rows) | dpipe.batch(size=4)
    whole = list(dpipe.Loader(p, seed=5, workers=2))
    assert sum(len(b) for b in whole) == 60  # every worker runs its own instance
    assert sorted((v["worker"], v["i"]) for b in whole for v in b) == [(w, i) for w in range(2) for i in range(30)]
    assert whole == list(dpipe.Loader(p, seed=5, workers=2))
    assert whole != list(dpipe.Loader(p, seed=6, workers=2))
    for at in (0, 5, 14):
        loader = dpipe.Loader(p, seed=5, workers=2)
        it = iter(loader)
        head = [next(it) for _ in range(at)]
        again = dpipe.Loader(p, seed=5, workers=2)
        again.load_state_dict(pickle.loads(pickle.dumps(loader.state_dict())))
        assert head + list(again) == whole, at
    ints = dpipe.generator(lambda info: range(info["worker"], 10, info["workers"]), out=int)
    assert sorted(dpipe.Loader(ints, workers=2)) == list(range(10))


def test_a_generator_that_raises_is_a_node_error_after_what_it_yielded():
    def broken(info):
        yield 1
        yield 2
        raise ValueError("disk gone")

    got = []
    with pytest.raises(dpipe.NodeError) as e:
        for x in dpipe.Loader(dpipe.generator(broken, out=int, name="src")):
            got.append(x)
    assert got == [1, 2]
    assert isinstance(e.value.__cause__, ValueError) and "disk gone" in str(e.value.__cause__)


def keep_even(x):
    return x % 2 == 0


def spread(x):
    return [x, x + 100] if x % 3 else []


def test_adjacent_python_stages_fuse_into_one_node_and_yield_what_separate_nodes_yield():
    pipelines = [
        dpipe.range(0, 60) | dpipe.map(double) | dpipe.filter(lambda x: x % 5 != 0) | dpipe.flat_map(spread),
        dpipe.range(0, 60) | dpipe.flat_map(spread) | dpipe.map(double) | dpipe.filter(keep_even)
        | dpipe.flat_map(lambda x: [x] * (x % 4)) | dpipe.map(lambda x: -x),
        dpipe.range(0, 60) | dpipe.filter(keep_even) | dpipe.map(lambda x: {"n": x}, out=object)
        | dpipe.map(lambda r: (r["n"], str(r["n"])), out=object) | dpipe.batch(size=4),
        dpipe.range(0, 30) | dpipe.map(lambda x: "n" * x, out=str) | dpipe.map(len, out=int) | dpipe.filter(keep_even),
        dpipe.range(0, 20) | dpipe.zip(dpipe.range(100, 120)) | dpipe.map(lambda row: row[0] + row[1], out=int)
        | dpipe.filter(keep_even),
        dpipe.range(0, 20) | dpipe.zip(dpipe.range(0, 20) | dpipe.map(double) | dpipe.filter(keep_even)),
    ]
    for p in pipelines:
        separate = [plain(x) for x in dpipe.Loader(p, fuse=False)]
        fused = [plain(x) for x in dpipe.Loader(p)]
        assert fused == separate and fused
    # Fused: one node per run of adjacent stages, the other inputs' chains too; a name, on_error="skip" or
    # a map converting to a plain type (out=str) keeps a node apart.
    nodes, callables = _fuse.fuse(pipelines[1].spec()["pipeline"], pipelines[1]._callables)
    assert [n["op"] for n in nodes] == ["range", "map"]
    assert callables[nodes[1]["id"]]._dpipe_fused_stages.startswith("flat_map(test_callables.spread) | map(")
    nodes, _ = _fuse.fuse(pipelines[5].spec()["pipeline"], pipelines[5]._callables)
    assert [n["op"] for n in nodes[1]["with"][0]] == ["range", "map"]
    nodes, _ = _fuse.fuse(pipelines[3].spec()["pipeline"], pipelines[3]._callables)
    assert [n["op"] for n in nodes] == ["range", "map", "map", "filter"]
    apart = (dpipe.range(0, 5) | dpipe.map(double, name="d") | dpipe.map(double) | dpipe.filter(keep_even, on_error="skip")
             | dpipe.map(double))
    assert len(_fuse.fuse(apart.spec()["pipeline"], apart._callables)[0]) == 5
    # The first stage of a fused chain over zip's rows receives them as tuples, as an unfused one does.
    rows = dpipe.range(0, 3) | dpipe.zip(dpipe.range(5, 8)) | dpipe.map(lambda r: type(r).__name__, out=str) \
        | dpipe.filter(bool)
    assert list(dpipe.Loader(rows)) == ["tuple"] * 3


def test_a_fused_stage_that_fails_ends_the_stream_after_every_output_before_it():
    def boom_at(x):
        if x == 7:
            raise Boom("seven")
        return x

    p = dpipe.range(0, 20) | dpipe.flat_map(lambda x: [x] * 5) | dpipe.map(boom_at)
    got = []
    with pytest.raises(dpipe.NodeError) as err:
        for x in dpipe.Loader(p):
            got.append(x)
    assert got == [y for x in range(7) for y in [x] * 5]
    assert "seven" in str(err.value) and isinstance(err.value.__cause__, Boom)
    assert "flat_map(" in str(err.value) or "flat_map@" in err.value.node
    with pytest.raises(dpipe.NodeError, match="returned int, not an iterable"):
        list(dpipe.Loader(dpipe.range(0, 3) | dpipe.map(double) | dpipe.flat_map(double)))
    # A string is no list of outputs, fused or not, last stage or inside the run.
    for fused in (True, False):
        with pytest.raises(dpipe.NodeError, match="str"):
            list(dpipe.Loader(dpipe.range(0, 3) | dpipe.map(double) | dpipe.flat_map(lambda x: "ab"), fuse=fused))
    with pytest.raises(dpipe.NodeError, match="returned str, not an iterable"):
        list(dpipe.Loader(dpipe.range(0, 3) | dpipe.flat_map(lambda x: "ab") | dpipe.map(double)))

    # The outputs a failing input gave before it failed are dropped, as flat_map drops them, on either thread.
    def half_then_boom(x):
        yield x
        if x == 4:
            raise Boom("mid-expansion")
        yield -x

    q = dpipe.range(0, 8) | dpipe.map(double) | dpipe.flat_map(half_then_boom)
    for inline in (True, False):
        got = []
        with pytest.raises(dpipe.NodeError):
            for x in dpipe.Loader(q, inline_workers=inline):
                got.append(x)
        assert got == [0, 0, 2, -2], (inline, got)


def test_fused_stages_resume_exactly_at_every_element_with_outputs_held_mid_expansion(tmp_path):
    p = (dpipe.range(0, 40) | dpipe.map(double) | dpipe.flat_map(lambda x: range(x % 9))
         | dpipe.filter(lambda x: x != 3) | dpipe.batch(size=5))
    for inline in (True, False):
        whole = [plain(b) for b in dpipe.Loader(p, inline_workers=inline)]
        held = 0
        for k in range(len(whole)):
            loader = dpipe.Loader(p, inline_workers=inline)
            it = iter(loader)
            head = [plain(next(it)) for _ in range(k)]
            state = loader.state_dict()
            path = tmp_path / "s.dpipe"
            path.write_bytes(state["dpipe_snapshot"])
            shown = subprocess.run([str(BUILD_ROOT / "tools" / "dpipe"), "snapshot", "show", str(path)],
                                   capture_output=True, text=True, check=True).stdout
            held += "pending" in shown and '"pending": []' not in shown
            again = dpipe.Loader(p, inline_workers=inline)
            again.load_state_dict(state)
            assert head + [plain(b) for b in again] == whole, (inline, k)
        assert held > 0, "no state met the fused node with outputs held"


_INTERRUPTED_CHILD = textwrap.dedent("""
    import json, os, signal, sys, threading, time
    import dpipe

    def slow(x):
        time.sleep(0.03)
        return x

    p = dpipe.range(0, 200) | dpipe.map(slow) | dpipe.filter(lambda x: x % 5 != 4)
    loader = dpipe.Loader(p)
    got = []
    threading.Timer(0.5, lambda: (setattr(sys.modules[__name__], "sent", time.monotonic()),
                                  os.kill(os.getpid(), signal.SIGINT))).start()
    try:
        for x in loader:
            got.append(x)
        print(json.dumps({"error": "no interrupt"}))
        sys.exit(0)
    except KeyboardInterrupt:
        latency = time.monotonic() - sent
    state = loader.state_dict()
    rest = dpipe.Loader(p)
    rest.load_state_dict(state)
    resumed = got + list(rest) == list(dpipe.Loader(p))
    del loader, rest
    print(json.dumps({"latency": latency, "delivered": state["delivered"], "got": len(got), "resumed": resumed,
                      "threads": len(os.listdir("/proc/self/task")),
                      "handler_restored": signal.getsignal(signal.SIGINT) is signal.default_int_handler}))
""")


def test_ctrl_c_during_an_inline_run_raises_at_an_element_and_the_state_is_the_last_delivered():
    # A pipeline of Python callables with one worker runs inline, inside next(): a Ctrl-C is held until
    # the element being computed is ready, then raised before it is taken.
    child = subprocess.run([sys.executable, "-c", _INTERRUPTED_CHILD], capture_output=True, text=True,
                           timeout=120, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert child.returncode == 0, child.stderr
    out = json.loads(child.stdout.strip().splitlines()[-1])
    assert "error" not in out, out
    assert out["delivered"] == out["got"] > 0
    assert out["resumed"] is True
    assert out["latency"] < 0.2, out  # the pull under way: a few elements of 30 ms
    assert out["threads"] == 1 and out["handler_restored"], out


def test_one_worker_computes_ahead_during_a_step_that_sleeps_and_inline_in_a_loop_that_only_reads():
    # The default for Python callables on one worker: inline while the loop's steps are short (the calls
    # run in next(), on the loop's thread), on an engine thread while they sleep (a GPU step), so that
    # the next batches are made during the step. The stream is the same either way.
    main = threading.get_ident()
    calls = []

    def f(x):
        calls.append((x, threading.get_ident()))
        time.sleep(0.001)  # a batch takes 4 ms: a step of 20 ms does not fill the worker's queue
        return x * 3

    p = dpipe.range(0, 400) | dpipe.map(f) | dpipe.batch(size=4)
    expected = [[3 * i for i in range(k, k + 4)] for k in range(0, 400, 4)]
    loader = dpipe.Loader(p)
    got = [plain(b) for b in loader]  # a loop that only reads
    assert got == expected
    assert {t for _, t in calls} == {main}, "a loop that only reads ran the calls off its thread"

    calls.clear()
    it = iter(loader)
    got = []
    for step in range(12):  # steps of 20 ms that release the GIL
        got.append(plain(next(it)))
        made = len(calls)
        time.sleep(0.02)
        if step >= 4:
            # During the step, the batches after it were made, on another thread.
            assert len(calls) > made, f"nothing was computed during step {step}"
    assert any(t != main for _, t in calls)
    state = loader.state_dict()
    got += [plain(b) for b in it]  # and back to reading only
    assert got == expected
    loader.load_state_dict(state)
    assert [plain(b) for b in loader] == expected[12:]
