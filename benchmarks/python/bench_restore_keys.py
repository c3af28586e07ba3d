#!/usr/bin/env python3
"""Restore keys: what a state weighs and what it costs to take and to load, with the buffered elements
saved as data (the default) and as keys (Loader(restore_keys=True)). Run by hand, from a build tree:

    PYTHONPATH=build/python /usr/bin/python3 benchmarks/python/bench_restore_keys.py [--quick]

Pipelines, each on 1 and 2 workers (4 without --quick), a state taken after 30 batches:
  canonical  range → sharding_filter → map(f) → batch(4)                  (f: a Python identity)
  rows-1k    range → sampler() → map(row: a 1 KiB numpy array) → shuffle(512) → batch(8)
  rows-64k   the same with 64 KiB rows and shuffle(64)
For each: the state's bytes, the median state_dict() pause over 5 calls, load_state_dict() into a fresh
Loader, and the time from there to the first batch (the recomputation of what was in flight happens in
load_state_dict). The `llm_pretrain` example's kinds (parse_json, tokenize, mix, pack) carry no
provenance yet, so it has no keyed row."""
import argparse
import statistics
import sys
import time

import numpy as np

import dpipe


def identity(x):
    return x


def row_1k(x):
    return np.full(128, x, dtype=np.float64)


def row_64k(x):
    return np.full(8192, x, dtype=np.float64)


def pipeline(name):
    if name == "canonical":
        return dpipe.range(0, 1_000_000) | dpipe.sharding_filter() | dpipe.map(identity) | dpipe.batch(size=4)
    if name == "rows-1k":
        return dpipe.range(0, 100_000) | dpipe.sampler() | dpipe.map(row_1k, out=object) | dpipe.shuffle(512) | dpipe.batch(size=8)
    return dpipe.range(0, 100_000) | dpipe.sampler() | dpipe.map(row_64k, out=object) | dpipe.shuffle(64) | dpipe.batch(size=8)


def measure(name, workers, keys):
    p = pipeline(name)
    loader = dpipe.Loader(p, seed=3, workers=workers, restore_keys=keys)
    it = iter(loader)
    for _ in range(30):
        next(it)
    time.sleep(0.2)  # the workers fill their queues, as they do behind a training step
    pauses = []
    for _ in range(5):
        t0 = time.perf_counter()
        state = loader.state_dict()
        pauses.append(time.perf_counter() - t0)
    size = len(state["dpipe_snapshot"])
    expected = next(it)
    del it
    fresh = dpipe.Loader(p, seed=3, workers=workers, restore_keys=keys)
    t0 = time.perf_counter()
    fresh.load_state_dict(state)
    load = time.perf_counter() - t0
    t1 = time.perf_counter()
    first = next(iter(fresh))
    first_batch = time.perf_counter() - t1
    same = all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(first, expected))
    return size, statistics.median(pauses), load, first_batch, same


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer configurations")
    a = ap.parse_args()
    print(f"{'pipeline':>10} {'workers':>7} {'state':>6} {'bytes':>10} {'pause ms':>9} {'load ms':>8} "
          f"{'1st ms':>7} {'same':>5}")
    for name in ("canonical", "rows-1k", "rows-64k"):
        for workers in (1, 2) if a.quick else (1, 2, 4):
            for keys in (False, True):
                size, pause, load, first, same = measure(name, workers, keys)
                print(f"{name:>10} {workers:>7} {'keys' if keys else 'data':>6} {size:>10} {pause * 1e3:9.2f} "
                      f"{load * 1e3:8.2f} {first * 1e3:7.2f} {str(same):>5}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
