#!/usr/bin/env python3
"""The Python package's figures, each a ratio of two measurements taken in this one process (the machine
is noisy; absolute rates drift). Run by hand, on an idle machine, from a build tree:

    PYTHONPATH=build/python /usr/bin/python3 benchmarks/python/bench_loader.py

1. The canonical pipeline (range(10^7) → shuffle(10000) → sharding_filter → map(x*2) → batch(256))
   consumed in Python as numpy batches, against torch DataPipes on the same pipeline and against the C++
   Run of the same spec (dpipe's own loop, no element handed to Python).
2. nanoGPT's loader (np.memmap, random offsets, torch.stack of B windows) against token_windows |
   sampler(global) | batch(B) → torch tensors.
3. state_dict() on the canonical pipeline: the median time.
4. A Python callable in map: cost per element against a plain Python loop calling the same function,
   the mapped elements taken in batches of 256 (on the engine's thread, and inline in the consumer's
   thread, the default) and one by one; a JSONL chain of callables (json.loads, filter, tokenize,
   windows, batch) against the same plain loop; Ctrl-C's delay while an inline pipeline computes; and
   2 workers against 1 on a function that releases the GIL (numpy work), and parallel_map of it against map.
5. The LLM example (examples/llm_pretrain: parse_json → tokenize → mix → pack(1024) → padded_batch(8),
   2 workers) consumed in Python as dicts of numpy arrays, against the C++ Run of the same spec."""

import _thread
import importlib.util
import json
import pathlib
import statistics
import sys
import tempfile
import threading
import time

import numpy as np

import dpipe


def rate(fn, elements, repeats=3):
    """Elements per second, the best of `repeats` runs of fn()."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return elements / best


def canonical(n):
    return (dpipe.range(0, n) | dpipe.shuffle(buffer=10_000) | dpipe.sharding_filter()
            | dpipe.map("affine", mul=2) | dpipe.batch(size=256))


def consume(loader):
    for _ in loader:
        pass


def main():
    figures = []
    n = 10**7 if "--full" in sys.argv else 2 * 10**6

    # 1. The canonical pipeline.
    p = canonical(n)
    py_rate = rate(lambda: consume(dpipe.Loader(p, seed=1)), n)
    built = dpipe._dpipe.build(p.to_json(), {})
    opts = dpipe._dpipe.LoopOptions()
    opts.seed = 1
    cpp_rate = rate(lambda: dpipe._dpipe.drain(built, opts), n)
    figures.append(("canonical, Python numpy batches / C++ Run of the same spec", py_rate / cpp_rate, ">= 0.7"))
    try:
        from torch.utils.data.datapipes.iter import IterableWrapper
        m = 200_000
        dp = IterableWrapper(range(m)).shuffle(buffer_size=10_000).sharding_filter().map(lambda x: 2 * x).batch(256)
        torch_rate = rate(lambda: consume(dp), m, repeats=2)
        figures.append(("canonical, dpipe in Python / torch DataPipes", py_rate / torch_rate, ">= 100"))
    except ImportError:
        figures.append(("canonical, dpipe in Python / torch DataPipes", None, "torch not installed"))

    # 2. nanoGPT's loader against token_windows | sampler | batch → tensors.
    import torch
    B, L = 32, 256
    with tempfile.TemporaryDirectory() as d:
        path = f"{d}/train.bin"
        np.random.default_rng(0).integers(0, 50_000, size=20_000_000, dtype=np.uint16).tofile(path)
        steps = 300

        def nanogpt():
            data = np.memmap(path, dtype=np.uint16, mode="r")
            for _ in range(steps):
                ix = torch.randint(len(data) - L, (B,))
                x = torch.stack([torch.from_numpy(data[i:i + L].astype(np.int64)) for i in ix])
                y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + L].astype(np.int64)) for i in ix])
                del x, y

        pipe = dpipe.token_windows(files=[path], seq_len=L, dtype="uint16") | dpipe.sampler(shuffle="global") \
            | dpipe.batch(size=B)

        def with_dpipe():
            it = iter(dpipe.Loader(pipe, seed=0, workers=2))
            for _ in range(steps):
                w = torch.from_numpy(next(it))
                x, y = w[:, :-1], w[:, 1:]
                del x, y

        figures.append(("token windows, dpipe → tensors / nanoGPT's get_batch",
                        rate(with_dpipe, steps) / rate(nanogpt, steps), ">= 1.0"))

    # 3. state_dict() on the canonical pipeline.
    loader = dpipe.Loader(canonical(10**7), seed=1, workers=2)
    it = iter(loader)
    times = []
    for _ in range(50):
        for _ in range(20):
            next(it)
        t0 = time.perf_counter()
        loader.state_dict()
        times.append(time.perf_counter() - t0)
    figures.append(("state_dict() median, ms", statistics.median(times) * 1e3, "<= 1"))

    # 4. A Python callable in map.
    def f(x):
        return x + 1

    m = 400_000
    plain_rate = rate(lambda: [f(x) for x in range(m)], m, repeats=5)
    batched = dpipe.range(0, m) | dpipe.map(f) | dpipe.batch(size=256)
    threaded = rate(lambda: consume(dpipe.Loader(batched, inline_workers=False)), m, repeats=5)
    inline = rate(lambda: consume(dpipe.Loader(batched)), m, repeats=5)
    one_by_one = rate(lambda: consume(dpipe.Loader(dpipe.range(0, m) | dpipe.map(f))), m, repeats=5)
    bare = rate(lambda: consume(dpipe.Loader(dpipe.range(0, m))), m, repeats=5)
    figures.append(("map(python fn) | batch (default: inline) / a Python loop calling it", plain_rate / inline, "<= 1.2"))
    figures.append(("  the same, on an engine thread (inline_workers=False)", plain_rate / threaded, "-"))
    figures.append(("  map(python fn), elements one by one", plain_rate / one_by_one, "-"))
    figures.append(("  no map, elements one by one (the loader's own cost)", plain_rate / bare, "-"))

    # The JSONL chain of the issue "Python at a Python loop's speed": lines → map(json.loads, out=object) →
    # filter → map(tokenize) → flat_map(windows) → batch, against the same loop in plain Python.
    with tempfile.TemporaryDirectory() as d:
        path = f"{d}/docs.jsonl"
        with open(path, "w") as f:
            for i in range(100_000):
                words = " ".join(f"w{(i * 7 + j) % 97}" for j in range(12))
                f.write(json.dumps({"id": i, "text": words, "lang": "en" if i % 5 else "de"}) + "\n")

        def english(r):
            return r["lang"] == "en"

        def tokenize(r):
            return [len(w) for w in r["text"].split()]

        def windows(t):
            return [t[i:i + 4] for i in range(0, len(t), 4)]

        def plain_loop():
            batches, batch = 0, []
            with open(path) as f:
                for line in f:
                    r = json.loads(line)
                    if not english(r):
                        continue
                    for w in windows(tokenize(r)):
                        batch.append(w)
                        if len(batch) == 16:
                            batches, batch = batches + 1, []
            return batches

        chain = (dpipe.lines(path) | dpipe.map(json.loads, out=object) | dpipe.filter(english)
                 | dpipe.map(tokenize, out=object) | dpipe.flat_map(windows) | dpipe.batch(size=16))
        count = plain_loop()
        loop_rate = rate(plain_loop, count, repeats=5)
        chain_rate = rate(lambda: consume(dpipe.Loader(chain)), count, repeats=5)
        unfused = rate(lambda: consume(dpipe.Loader(chain, fuse=False)), count, repeats=3)
        threaded = rate(lambda: consume(dpipe.Loader(chain, inline_workers=False)), count, repeats=3)
        figures.append(("JSONL chain of callables (default Loader) / the plain loop", loop_rate / chain_rate, "<= 1.3"))
        figures.append(("  the same, stages not fused", loop_rate / unfused, "-"))
        figures.append(("  the same, on an engine thread (inline_workers=False)", loop_rate / threaded, "-"))

    # Ctrl-C while an inline pipeline computes: from the signal to KeyboardInterrupt in the loop.
    def one_ms(x):
        time.sleep(0.001)
        return x

    latencies = []
    for _ in range(5):
        sent = []
        timer = threading.Timer(0.2, lambda: (sent.append(time.perf_counter()), _thread.interrupt_main()))
        timer.start()
        try:
            consume(dpipe.Loader(dpipe.range(0, 10**6) | dpipe.map(one_ms) | dpipe.batch(size=4)))
        except KeyboardInterrupt:
            latencies.append(time.perf_counter() - sent[0])
    figures.append(("Ctrl-C to KeyboardInterrupt, inline, elements of 1 ms (median ms)",
                    statistics.median(latencies) * 1e3, "<= 100"))

    def heavy(b):  # numpy releases the GIL inside the sort
        return np.sort(np.random.default_rng(int(b[0])).random(200_000)).astype(np.int64)[:4]

    k = 400
    work = dpipe.range(0, k) | dpipe.sharding_filter() | dpipe.batch(size=1) | dpipe.map(heavy)
    one = rate(lambda: consume(dpipe.Loader(work, workers=1, threads=2)), k, repeats=2)
    two = rate(lambda: consume(dpipe.Loader(work, workers=2, threads=2)), k, repeats=2)
    figures.append(("map(numpy fn), 2 workers / 1 worker", two / one, ">= 1.7"))
    overlapped = dpipe.range(0, k) | dpipe.batch(size=1) | dpipe.parallel_map(heavy, max_in_flight=8)
    par = rate(lambda: consume(dpipe.Loader(overlapped, workers=1, threads=2)), k, repeats=2)
    figures.append(("parallel_map(numpy fn), 1 worker / map, 1 worker", par / one, ">= 1.7"))

    # 5. The LLM example's pipeline, on its generated corpora.
    spec = importlib.util.spec_from_file_location(
        "llm_pretrain", pathlib.Path(__file__).resolve().parents[2] / "examples" / "llm_pretrain" / "llm_pretrain.py")
    llm = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(llm)
    with tempfile.TemporaryDirectory() as d:
        work = pathlib.Path(d)
        llm.prepare(work)
        p = llm.pipeline(work)
        batches = sum(1 for _ in dpipe.Loader(p, workers=2, seed=7))
        built = dpipe._dpipe.build(p.to_json(), {})
        opts = dpipe._dpipe.LoopOptions()
        opts.seed, opts.workers = 7, 2
        py_rate = rate(lambda: consume(dpipe.Loader(p, workers=2, seed=7)), batches)
        cpp_rate = rate(lambda: dpipe._dpipe.drain(built, opts), batches)
        figures.append((f"llm_pretrain ({batches} padded batches), Python dicts / C++ Run", py_rate / cpp_rate, ">= 0.8"))

    for label, value, goal in figures:
        shown = "n/a" if value is None else f"{value:.3f}"
        print(f"{label:<62} {shown:>9}  (goal {goal})")


if __name__ == "__main__":
    main()
