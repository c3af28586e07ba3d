"""The llm_pretrain loader from Python, on generated data (nothing downloaded):

    two JSON-lines corpora → parse_json → tokenize → mix 70/30 → pack(1024) → padded_batch(8)

Two ranks × two workers take a few batches (training a tiny causal LM on them, attention masked per
document by the segment ids) and save their state dicts; the job "dies"; the states are rescaled to three
ranks, which run to the end of the epoch. Every document's tokens must arrive exactly once, checked by
document id and position.

    python3 examples/llm_pretrain/llm_pretrain.py [WORK_DIR]

The same under torchrun (gloo; rank and world size come from torch.distributed), one process per rank:

    python3 examples/llm_pretrain/llm_pretrain.py --phase prepare WORK_DIR
    torchrun --nproc_per_node 2 examples/llm_pretrain/llm_pretrain.py --phase save WORK_DIR
    torchrun --nproc_per_node 3 examples/llm_pretrain/llm_pretrain.py --phase resume WORK_DIR
    python3 examples/llm_pretrain/llm_pretrain.py --phase check WORK_DIR
"""
import collections
import json
import pathlib
import pickle
import random
import subprocess
import sys
import tempfile

import numpy as np
import torch

import dpipe

PROSE = "the loader reads every shard once and a model learns from packed rows of tokens while ranks come and go".split()
CODE = "def f(x): return x + 1 for i in range(n): if not y: print(i) class Loader: self.rank = rank yield".split()
SEQ_LEN, BATCH = 1024, 8


def write_corpus(path, docs, first_id, words, seed):
    rnd = random.Random(seed)
    with open(path, "w") as f:
        for i in range(docs):
            if i % 97 == 13:
                f.write('{"doc": %d, "text": "unterminated\n' % (first_id + i))  # parse_json skips it
                continue
            f.write(json.dumps({"doc": first_id + i, "text": " ".join(rnd.choice(words) for _ in range(rnd.randint(5, 124)))}) + "\n")


def prepare(work):
    write_corpus(work / "prose.jsonl", 6000, 0, PROSE, 1)
    write_corpus(work / "code.jsonl", 3000, 1_000_000, CODE, 2)
    rnd = random.Random(3)
    (work / "spm_corpus.txt").write_text("".join(
        " ".join(rnd.choice(PROSE if i % 3 else CODE) for _ in range(rnd.randint(5, 34))) + "\n" for i in range(4000)))
    subprocess.run(["spm_train", f"--input={work / 'spm_corpus.txt'}", f"--model_prefix={work / 'spm'}",
                    "--vocab_size=64", "--minloglevel=2"], check=True, capture_output=True)


def documents(work, name):
    return (dpipe.lines([str(work / name)], logical_shards=32)
            | dpipe.parse_json({"doc": "int64", "text": "string"}, on_error="skip")
            | dpipe.tokenize(str(work / "spm.model"), bos=True, eos=True))


def pipeline(work):
    return (dpipe.mix(documents(work, "prose.jsonl"), documents(work, "code.jsonl"), weights=[0.7, 0.3])
            | dpipe.pack(SEQ_LEN) | dpipe.padded_batch(BATCH) | dpipe.prefetch(2))


class TinyCausalLM(torch.nn.Module):
    """One attention layer whose mask keeps each token to the earlier tokens of its own document."""

    def __init__(self, vocab=64, dim=32):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.pos = torch.nn.Embedding(SEQ_LEN, dim)
        self.attn = torch.nn.MultiheadAttention(dim, 2, batch_first=True)
        self.out = torch.nn.Linear(dim, vocab)

    def forward(self, tokens, segment_ids, positions):
        x = self.embed(tokens) + self.pos(positions)
        same_doc = segment_ids[:, :, None] == segment_ids[:, None, :]
        causal = torch.ones(SEQ_LEN, SEQ_LEN, dtype=torch.bool).tril()
        allowed = same_doc & causal & (segment_ids[:, :, None] > 0)
        allowed |= torch.eye(SEQ_LEN, dtype=torch.bool)  # padding attends to itself: no empty rows
        mask = ~allowed.repeat_interleave(2, dim=0)  # one per head
        y, _ = self.attn(x, x, x, attn_mask=mask)
        return self.out(y)


def train_step(model, opt, batch):
    tokens = torch.from_numpy(batch["tokens"])
    segments = torch.from_numpy(batch["segment_ids"])
    logits = model(tokens, segments, torch.from_numpy(batch["positions"]))
    # Next-token loss inside each document only.
    target_ok = (segments[:, 1:] == segments[:, :-1]) & (segments[:, 1:] > 0)
    loss = torch.nn.functional.cross_entropy(logits[:, :-1][target_ok], tokens[:, 1:][target_ok])
    opt.zero_grad()
    loss.backward()
    opt.step()
    return float(loss)


def count(batch, seen):
    for row in range(batch["tokens"].shape[0]):
        docs = batch["doc"][row]
        for seg, pos in zip(batch["segment_ids"][row].tolist(), batch["positions"][row].tolist()):
            if seg:
                seen[(docs[seg - 1], pos)] += 1


def expected_tokens(work):
    """Every document's token count, read through the same nodes, by document id."""
    expected = {}
    for name in ("prose.jsonl", "code.jsonl"):
        for d in dpipe.Loader(documents(work, name)):
            expected[d["doc"]] = len(d["tokens"])
    return expected


def token_keys(batch):
    """(document id, position) of every real token of a batch, as an array of two columns."""
    keys = []
    for row in range(batch["tokens"].shape[0]):
        segments, positions = batch["segment_ids"][row], batch["positions"][row]
        real = segments > 0
        docs = np.asarray(batch["doc"][row], dtype=np.int64)
        keys.append(np.stack([docs[segments[real] - 1], positions[real]], axis=1))
    return np.concatenate(keys) if keys else np.zeros((0, 2), np.int64)


def torchrun_phase(phase, work):
    """One rank under torchrun. `save`: take 3 batches (a training step on each) and torch.save the loader's
    state; `resume`: rescale every saved state to this world size, load this rank's and run to the end of the
    epoch. Each rank writes the (document, position) of every token it was given."""
    import torch.distributed as dist
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(rank)
    model = TinyCausalLM()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    loader = dpipe.Loader(pipeline(work), workers=2, seed=7, restore_keys=True)  # the layout from torch.distributed
    seen, losses = [], []
    if phase == "save":
        it = iter(loader)
        for _ in range(3):
            batch = next(it)
            seen.append(token_keys(batch))
            losses.append(train_step(model, opt, batch))
        torch.save(loader.state_dict(), work / f"loader-rank{rank}.pt")
    else:
        old = [torch.load(f) for f in sorted(work.glob("loader-rank*.pt"))]
        loader.load_state_dict(dpipe.rescale(old, world_size=world, workers=2)[rank])
        for i, batch in enumerate(loader):
            seen.append(token_keys(batch))
            if i < 3:
                losses.append(train_step(model, opt, batch))
    np.save(work / f"seen-{phase}-rank{rank}.npy", np.concatenate(seen) if seen else np.zeros((0, 2), np.int64))
    total = torch.tensor([sum(len(s) for s in seen)])
    dist.all_reduce(total)
    if rank == 0:
        print(f"{phase}: {world} ranks x 2 workers, {int(total)} tokens, causal LM loss {losses[0]:.2f} -> {losses[-1]:.2f}")
    dist.destroy_process_group()


def check(work):
    """Every token the torchrun phases wrote, against every document's tokens: each exactly once."""
    expected = expected_tokens(work)
    seen = np.concatenate([np.load(f) for f in sorted(work.glob("seen-*-rank*.npy"))])
    keys, counts = np.unique(seen[:, 0] * 1_000_000 + seen[:, 1], return_counts=True)
    assert (counts == 1).all(), f"{int((counts > 1).sum())} tokens delivered more than once"
    want = np.array(sorted(d * 1_000_000 + pos for d, n in expected.items() for pos in range(n)), dtype=np.int64)
    assert np.array_equal(keys, want), f"{len(set(want.tolist()) - set(keys.tolist()))} tokens lost"
    print(f"under torchrun, 2 ranks -> 3 ranks: every token of {len(expected)} documents exactly once ({len(want)} tokens)")


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--phase":
        phase, work = sys.argv[2], pathlib.Path(sys.argv[3])
        if phase == "prepare":
            work.mkdir(parents=True, exist_ok=True)
            return prepare(work)
        return check(work) if phase == "check" else torchrun_phase(phase, work)
    work = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="dpipe-llm-pretrain-py-"))
    work.mkdir(parents=True, exist_ok=True)
    prepare(work)
    expected = expected_tokens(work)

    torch.manual_seed(0)
    model = TinyCausalLM()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    seen = collections.Counter()
    p = pipeline(work)

    # Two ranks × two workers: 3 batches each (a training step on each), then a checkpoint.
    states, losses = [], []
    for rank in range(2):
        # restore_keys: the state holds the packed rows in flight as the positions they were made from
        loader = dpipe.Loader(p, rank=rank, world_size=2, workers=2, seed=7, restore_keys=True)
        it = iter(loader)
        for _ in range(3):
            batch = next(it)
            count(batch, seen)
            losses.append(train_step(model, opt, batch))
        states.append(pickle.loads(pickle.dumps(loader.state_dict())))  # as torch.save would keep it
    print(f"2 ranks x 2 workers: 6 batches, causal LM loss {losses[0]:.2f} -> {losses[-1]:.2f}; "
          f"state dicts of {len(states[0]['dpipe_snapshot']) / 1024:.0f} KiB per rank (restore keys)")
    assert all(len(s["dpipe_snapshot"]) <= 64 * 1024 for s in states), [len(s["dpipe_snapshot"]) for s in states]

    # The job dies; three ranks resume the rescaled states and run to the end of the epoch.
    batches = 0
    for rank, state in enumerate(dpipe.rescale(states, world_size=3, workers=2)):
        loader = dpipe.Loader(p, rank=rank, world_size=3, workers=2, seed=7)
        loader.load_state_dict(state)
        for batch in loader:
            count(batch, seen)
            batches += 1
    want = {(d, pos) for d, n in expected.items() for pos in range(n)}
    repeated = [k for k, c in seen.items() if c != 1]
    assert not repeated, f"{len(repeated)} tokens delivered more than once"
    assert set(seen) == want, f"{len(want - set(seen))} tokens lost"
    print(f"3 ranks x 2 workers: {batches} more batches; every token of {len(expected)} documents exactly once "
          f"({sum(expected.values())} tokens)")


if __name__ == "__main__":
    main()
