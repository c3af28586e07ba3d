#!/usr/bin/env python3
"""A training loop as a GPU job runs it, on one process: a Python decoding step per sample, a training step
that releases the GIL (a sleep stands in for the GPU), and a checkpoint every few steps written in the
background. Stop it at any step and run it again with --resume: it continues after the last checkpoint.

    PYTHONPATH=build/python /usr/bin/python3 examples/python/training_loop.py --dir /tmp/loop --stop-at 25
    PYTHONPATH=build/python /usr/bin/python3 examples/python/training_loop.py --dir /tmp/loop --resume

With the default `workers=1` the Loader decodes the next batch on an engine thread while the step sleeps
(docs/python.md, "Which mode"); `--workers 2` decodes on two. Each run appends the sample ids it trained on
to DIR/seen.jsonl, so a test can check that every sample of the epoch was trained on once across the stop.
It prints the wall time and the longest pause a checkpoint made."""

import argparse
import json
import pathlib
import time

import numpy as np

import dpipe

SAMPLES = 400


def decode(i):
    """A sample as a decoder makes it (the sleep: I/O or a C decoder that releases the GIL)."""
    time.sleep(0.002)
    rng = np.random.default_rng(i)
    return {"id": i, "pixels": rng.integers(0, 255, size=(8, 8), dtype=np.uint8)}


def train_step(batch):
    time.sleep(0.010)  # the GPU's work: the Python thread waits and holds no GIL
    return float(batch["pixels"].mean())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True, help="where checkpoints and the record of trained samples go")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--every", type=int, default=10, help="steps between checkpoints")
    ap.add_argument("--stop-at", type=int, default=None, help="stop after this step (a job killed there)")
    ap.add_argument("--resume", action="store_true", help="continue after the last checkpoint")
    a = ap.parse_args()
    root = pathlib.Path(a.dir)
    root.mkdir(parents=True, exist_ok=True)

    p = (dpipe.range(0, SAMPLES) | dpipe.shuffle(buffer=64) | dpipe.sharding_filter()
         | dpipe.map(decode, out=object) | dpipe.batch(size=8))
    loader = dpipe.Loader(p, seed=3, workers=a.workers)
    step = 0
    if a.resume:
        last = root / "last_step"
        step = int(last.read_text())
        loader.load(root / f"step-{step}")
        print(f"resumed after step {step}")

    pending, longest = None, 0.0
    t0 = time.perf_counter()
    with open(root / "seen.jsonl", "a") as seen:
        for batch in loader:
            step += 1
            train_step({"pixels": np.stack([s["pixels"] for s in batch])})
            seen.write(json.dumps({"step": step, "ids": [s["id"] for s in batch]}) + "\n")
            if step % a.every == 0:
                seen.flush()
                c0 = time.perf_counter()
                if pending is not None:
                    pending.wait()  # the previous write is done before this step's is named the last
                    (root / "last_step").write_text(str(pending_step))
                pending, pending_step = loader.save(root / f"step-{step}", step=step), step
                longest = max(longest, time.perf_counter() - c0)
            if a.stop_at is not None and step == a.stop_at:
                break
    if pending is not None:
        pending.wait()
        (root / "last_step").write_text(str(pending_step))
    print(f"{step} steps, {time.perf_counter() - t0:.2f} s, longest checkpoint pause {longest * 1000:.2f} ms")


if __name__ == "__main__":
    main()
