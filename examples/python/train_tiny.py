#!/usr/bin/env python3
"""Trains a tiny next-token model on a generated nanoGPT-style token file with dpipe, under torchrun, and
checkpoints model, optimizer and every rank's loader state with torch.save; a later run resumes from the
checkpoint, on the same layout or another (the loader states are rescaled with dpipe.rescale).

    /usr/bin/python3 -m torch.distributed.run --nproc_per_node 2 --redirects 1 --tee 1 \\
        examples/python/train_tiny.py --dir /tmp/tiny --workers 2 --stop-at 20
    /usr/bin/python3 -m torch.distributed.run --nproc_per_node 3 --redirects 1 --tee 1 \\
        examples/python/train_tiny.py --dir /tmp/tiny --workers 1 --resume

(Debian's torchrun on Python 3.11 needs --redirects 1 --tee 1.) Each rank appends what it trained on to
DIR/seen-rank-R.jsonl (step, loss and the batch's windows), so a test can check that every window of the
epoch was seen exactly once across the stop and the rescale."""

import argparse
import faulthandler
import gc
import json
import pathlib
import signal

import numpy as np
import torch
import torch.distributed as dist

import dpipe

VOCAB = 64


def make_tokens(path, n_tokens, seed=0):
    """A learnable token stream: each token is 3 × the previous + 1 (mod VOCAB), with a small random
    step now and then, stored as nanoGPT stores tokens (headerless uint16)."""
    rng = np.random.default_rng(seed)
    noise = rng.choice([0, 0, 0, 1, 2], size=n_tokens)
    tokens = np.empty(n_tokens, dtype=np.uint16)
    t = 1
    for i in range(n_tokens):
        t = (3 * t + 1 + int(noise[i])) % VOCAB
        tokens[i] = t
    tokens.tofile(path)


class TinyLM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, 32)
        self.head = torch.nn.Linear(32, VOCAB)

    def forward(self, x):
        return self.head(self.embed(x))


def main():
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1` prints every thread's stack
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True, help="data, checkpoint and logs")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=20_000)
    ap.add_argument("--stop-at", type=int, default=0, help="checkpoint and exit after this step (0: run the epoch)")
    ap.add_argument("--resume", action="store_true", help="continue from DIR/ckpt")
    args = ap.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    root = pathlib.Path(args.dir)
    tokens = root / "tokens.bin"
    if rank == 0 and not tokens.exists():
        root.mkdir(parents=True, exist_ok=True)
        make_tokens(tokens, args.tokens)
    dist.barrier()

    pipeline = (dpipe.token_windows(files=[str(tokens)], seq_len=args.seq_len, dtype="uint16")
                | dpipe.sampler(shuffle="global") | dpipe.batch(size=args.batch))
    # The layout comes from torch.distributed; equal_steps keeps every rank at the same step count (DDP).
    loader = dpipe.Loader(pipeline, seed=1234, workers=args.workers, equal_steps=True)

    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(TinyLM())
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    step = 0
    ckpt = root / "ckpt"
    if args.resume:
        saved = torch.load(ckpt / "model.pt")
        model.module.load_state_dict(saved["model"])
        opt.load_state_dict(saved["optimizer"])
        step = saved["step"]
        states = [torch.load(ckpt / f"loader-rank{r}.pt") for r in range(saved["world_size"])]
        if (states[0]["world_size"], states[0]["workers"]) != (world, args.workers):
            states = dpipe.rescale(states, world_size=world, workers=args.workers)
        loader.load_state_dict(states[rank])
        print(f"rank {rank}: resumed after step {step}, loader at element {states[rank]['delivered']}", flush=True)

    log = open(root / f"seen-rank-{rank}.jsonl", "a")
    for batch in loader:
        x = torch.from_numpy(batch)  # (B, L+1) int64, no copy
        logits = model(x[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), x[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        log.write(json.dumps({"step": step, "loss": loss.item(), "windows": batch.tolist()}) + "\n")
        if step % 10 == 0:
            print(f"rank {rank}: step {step} loss {loss.item():.3f}", flush=True)
        if step == args.stop_at:
            break
    state = loader.state_dict(step=step)  # every rank takes its own: no collective
    # loader.undelivered counts elements (batches here); the windows they hold are in the carried elements.
    held = sum(len(b) for b in state.get("carried", ()))
    log.write(json.dumps({"undelivered": loader.undelivered, "undelivered_windows": held, "end_step": step}) + "\n")
    print(f"rank {rank}: stopped after step {step}, {loader.undelivered} batches ({held} windows) undelivered",
          flush=True)
    log.close()

    if args.stop_at and step == args.stop_at:
        ckpt.mkdir(parents=True, exist_ok=True)
        torch.save(state, ckpt / f"loader-rank{rank}.pt")
        if rank == 0:
            torch.save({"model": model.module.state_dict(), "optimizer": opt.state_dict(), "step": step,
                        "world_size": world}, ckpt / "model.pt")
    dist.barrier()
    # The DDP model goes before the process group: freed after destroy_process_group(), its reducer holds
    # the group's last reference and torch 1.13 then joins gloo's threads holding the GIL, which one of
    # them may be waiting for (to free a tensor's Python object): the process hangs at exit.
    del model, opt
    gc.collect()
    dist.destroy_process_group()
    print(f"rank {rank}: done", flush=True)


if __name__ == "__main__":
    main()
