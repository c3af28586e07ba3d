#!/usr/bin/env python3
"""Checkpoints in a training loop: how long state_dict() and save() stop the trainer. Run by hand, from a
build tree:

    PYTHONPATH=build/python /usr/bin/python3 benchmarks/python/bench_checkpoint.py [--quick]

The loop: range → sharding_filter → map(f) → batch(4) on a Loader of 1, 2 or 4 workers; each step sleeps
(a GIL-releasing stand-in for the GPU step) and every few steps takes a checkpoint. f costs 0, ~2 µs of
pure Python, or 20 ms (a sleep: I/O or a decoder that releases the GIL). For each, the pause of every
state_dict() (the exact form, the default; the same with restore_keys=True; and reproducible=True) and of
save() to a set directory (the write on the background thread), median and most over the run, the first call included; the loop's wall
time against the same loop without checkpoints and against torch's DataLoader (as many worker processes,
no checkpoints: it has none); and the bytes of one state."""
import argparse
import statistics
import sys
import tempfile
import time

import dpipe


def cost_0(x):
    return x


def cost_2us(x):
    s = 0
    for i in range(12):  # about 2 µs of interpreter work here
        s += i
    return x + (s & 0)


def cost_20ms(x):
    time.sleep(0.020)
    return x


COSTS = {"0": cost_0, "2us": cost_2us, "20ms": cost_20ms}


def loop(fn, workers, steps, every, step_s, checkpoint, directory=None):
    """Runs `steps` steps; returns (wall seconds, the pauses of the checkpoints, bytes of the last state)."""
    p = dpipe.range(0, 10_000_000) | dpipe.sharding_filter() | dpipe.map(fn) | dpipe.batch(size=4)
    loader = dpipe.Loader(p, seed=1, workers=workers, restore_keys=(checkpoint == "keys"))
    pauses, size = [], 0
    it = iter(loader)
    t0 = time.perf_counter()
    for step in range(1, steps + 1):
        next(it)
        time.sleep(step_s)
        if checkpoint and step % every == 0:
            c0 = time.perf_counter()
            if checkpoint == "save":
                pending = loader.save(directory, step=step)
            else:
                state = loader.state_dict(step=step, reproducible=(checkpoint == "reproducible"))  # keys: exact
            pauses.append(time.perf_counter() - c0)
            if checkpoint == "save":
                pending.wait()
            else:
                size = len(state["dpipe_snapshot"])
    wall = time.perf_counter() - t0
    del it, loader
    return wall, pauses, size


def torch_loop(fn, workers, steps, step_s):
    """The same loop on torch's DataLoader (worker processes, no checkpoint: it has none): wall seconds,
    or None without torch."""
    try:
        import torch.utils.data as tud
    except ImportError:
        return None

    class Mapped(tud.IterableDataset):
        def __iter__(self):
            info = tud.get_worker_info()
            k, i = (info.num_workers, info.id) if info else (1, 0)
            return (fn(x) for x in range(i, 10_000_000, k))

    dl = tud.DataLoader(Mapped(), batch_size=4, num_workers=workers)
    it = iter(dl)
    t0 = time.perf_counter()
    for _ in range(steps):
        next(it)
        time.sleep(step_s)
    wall = time.perf_counter() - t0
    del it
    return wall


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer steps and configurations")
    a = ap.parse_args()
    steps, every, step_s = (40, 10, 0.02) if a.quick else (60, 20, 0.05)
    print(f"# {steps} steps of {step_s * 1000:.0f} ms, a checkpoint every {every} steps; pauses in ms (median / most)")
    print(f"{'f':>5} {'workers':>7} {'mode':>12} {'median':>8} {'most':>8} {'wall':>7} {'no ckpt':>7} {'bytes':>8}"
          f" {'torch':>7}")
    with tempfile.TemporaryDirectory() as d:
        for cost in COSTS:
            for workers in (1, 2) if a.quick else (1, 2, 4):
                base, _, _ = loop(COSTS[cost], workers, steps, every, step_s, None)
                torch_wall = torch_loop(COSTS[cost], workers, steps, step_s)
                torch_text = f"{torch_wall:7.2f}" if torch_wall is not None else "      -"
                for mode in ("exact", "keys", "reproducible", "save"):
                    wall, pauses, size = loop(COSTS[cost], workers, steps, every, step_s, mode, d + f"/{cost}-{workers}")
                    ms = [x * 1000 for x in pauses]
                    print(f"{cost:>5} {workers:>7} {mode:>12} {statistics.median(ms):8.2f} {max(ms):8.2f} "
                          f"{wall:7.2f} {base:7.2f} {size if size else '':>8} {torch_text}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
