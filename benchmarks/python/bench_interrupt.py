#!/usr/bin/env python3
"""Ctrl-C in a training loop: how long from SIGINT to the KeyboardInterrupt, how long the state_dict()
after it takes, and how long the process then takes to exit. Run by hand, from a build tree:

    PYTHONPATH=build/python /usr/bin/python3 benchmarks/python/bench_interrupt.py

Each case runs in a child process: range → sharding_filter → map(f) → batch(4) on a Loader of 1, 2 or 4
workers, f a 20 ms sleep (a decoder that releases the GIL) or 2 ms of pure Python; after a few steps a
thread sends the process SIGINT while the loop waits in next() or in the step. Times in ms, one run each."""
import subprocess
import sys
import time

CHILD = r"""
import os, signal, sys, threading, time
import dpipe

def sleepy(x):
    time.sleep(0.020)
    return x

def busy(x):
    t = time.perf_counter()
    while time.perf_counter() - t < 0.002:
        pass
    return x

WORKERS, FN, WHERE = int(sys.argv[1]), sys.argv[2], sys.argv[3]
p = dpipe.range(0, 10_000_000) | dpipe.sharding_filter() | dpipe.map({"sleep": sleepy, "python": busy}[FN]) | dpipe.batch(size=4)
loader = dpipe.Loader(p, seed=1, workers=WORKERS)
sent = [0.0]

def interrupt():
    sent[0] = time.monotonic()
    os.kill(os.getpid(), signal.SIGINT)

it = iter(loader)
try:
    for step in range(1000):
        if step == 5 and WHERE == "next":
            threading.Timer(0.005, interrupt).start()  # lands inside the next next()
        next(it)
        if step == 5 and WHERE == "step":
            threading.Timer(0.020, interrupt).start()  # lands inside the step
        time.sleep(0.050)
except KeyboardInterrupt:
    raised = time.monotonic()
    t0 = time.monotonic()
    state = loader.state_dict()
    t1 = time.monotonic()
    print("result", (raised - sent[0]) * 1000, (t1 - t0) * 1000, time.monotonic(), flush=True)
    sys.exit(0)
"""


def main():
    print(f"{'f':>6} {'workers':>7} {'where':>5} {'to raise':>9} {'state':>8} {'exit':>8} {'status':>6}")
    for fn in ("sleep", "python"):
        for workers in (1, 2, 4):
            for where in ("next", "step"):
                child = subprocess.run([sys.executable, "-c", CHILD, str(workers), fn, where], capture_output=True,
                                       text=True, timeout=120)
                ended = time.monotonic()
                found = [l.split() for l in child.stdout.splitlines() if l.startswith("result ")]
                if not found:
                    print(f"{fn:>6} {workers:>7} {where:>5}  no result: {child.stderr.strip()[-200:]}")
                    continue
                _, to_raise, state, left = found[0]
                print(f"{fn:>6} {workers:>7} {where:>5} {float(to_raise):9.2f} {float(state):8.2f} "
                      f"{(ended - float(left)) * 1000:8.1f} {child.returncode:>6}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
