"""A callable that calls back into its own Loader — state_dict(), save(), skipped(), next() of its iterator,
iter() or load_state_dict() — is refused with one clear error, inline and on the engine's threads: such a
call would wait for the worker that makes it (a deadlock with workers), or take elements out of their
order. Each case runs in a child process, so that a hang fails the test instead of the suite."""
import json
import os
import subprocess
import sys

import pytest

import dpipe

CHILD = r"""
import json, sys, tempfile, threading
import dpipe

CALL, WORKERS, INLINE = sys.argv[1], int(sys.argv[2]), {"default": None, "inline": True, "threads": False}[sys.argv[3]]
box = {}
handed_over = threading.Event()  # a worker may reach 7 before iter() has returned and `it` is stored

def calls_back(x):
    if x == 7 and CALL != "none":
        handed_over.wait(30)
        loader, it = box["loader"], box["it"]
        if CALL == "state_dict":
            loader.state_dict()
        elif CALL == "save":
            loader.save(tempfile.mkdtemp())
        elif CALL == "skipped":
            loader.skipped()
        elif CALL == "next":
            next(it)
        elif CALL == "iter":
            iter(loader)
        elif CALL == "load_state_dict":
            loader.load_state_dict(box["state"])
    return x

p = dpipe.range(0, 40) | dpipe.sharding_filter() | dpipe.map(calls_back) | dpipe.batch(size=2)
asked, CALL = CALL, "none"
reference = [[int(v) for v in b] for b in dpipe.Loader(p, workers=WORKERS, inline_workers=INLINE)]
CALL = asked
loader = box["loader"] = dpipe.Loader(p, workers=WORKERS, inline_workers=INLINE)
box["state"] = loader.state_dict()
it = box["it"] = iter(loader)
handed_over.set()
got = []
try:
    for b in it:
        got.append([int(v) for v in b])
    print(json.dumps({"error": None}))
except dpipe.NodeError as e:
    print(json.dumps({"error": "NodeError", "cause": repr(e.__cause__), "got": got,
                      "prefix": got == reference[:len(got)]}))
# The loader itself is still usable from the loop: a fresh iteration is whole and in order.
box["it"] = None
CALL = "none"
again = [[int(v) for v in b] for b in loader]
print(json.dumps({"again": again == reference}))
"""


@pytest.mark.parametrize("mode", ["default", "inline", "threads"])
@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("call", ["state_dict", "save", "skipped", "next", "iter", "load_state_dict"])
def test_a_callable_calling_back_into_its_own_loader_is_refused(call, workers, mode):
    child = subprocess.run([sys.executable, "-c", CHILD, call, str(workers), mode], capture_output=True, text=True,
                           timeout=60, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert child.returncode == 0, child.stderr
    first, second = [json.loads(l) for l in child.stdout.splitlines()[-2:]]
    assert first["error"] == "NodeError", first
    assert "of its own Loader from inside the pipeline: refused" in first["cause"], first
    assert "calls_back" in first["cause"], first
    # The elements before the failing one came, in the stream's order.
    assert first["prefix"] is True and 7 not in [x for b in first["got"] for x in b], first
    assert second["again"] is True


def test_a_callable_may_iterate_another_loader():
    def inner_sum(x):
        return x + sum(int(v) for v in dpipe.Loader(dpipe.range(0, 3)))

    assert [int(v) for v in dpipe.Loader(dpipe.range(0, 4) | dpipe.map(inner_sum))] == [3, 4, 5, 6]
