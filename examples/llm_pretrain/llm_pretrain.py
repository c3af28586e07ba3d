"""The llm_pretrain loader from Python, on generated data (nothing downloaded):

    two JSON-lines corpora → parse_json → tokenize → mix 70/30 → pack(1024) → padded_batch(8)

Two ranks × two workers take a few batches (training a tiny causal LM on them, attention masked per
document by the segment ids) and save their state dicts; the job "dies"; the states are rescaled to three
ranks, which run to the end of the epoch. Every document's tokens must arrive exactly once, checked by
document id and position.

    python3 examples/llm_pretrain/llm_pretrain.py [WORK_DIR]
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


def main():
    work = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="dpipe-llm-pretrain-py-"))
    work.mkdir(parents=True, exist_ok=True)
    prepare(work)
    expected = {}
    for name in ("prose.jsonl", "code.jsonl"):
        for d in dpipe.Loader(documents(work, name)):
            expected[d["doc"]] = len(d["tokens"])

    torch.manual_seed(0)
    model = TinyCausalLM()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    seen = collections.Counter()
    p = pipeline(work)

    # Two ranks × two workers: 3 batches each (a training step on each), then a checkpoint.
    states, losses = [], []
    for rank in range(2):
        loader = dpipe.Loader(p, rank=rank, world_size=2, workers=2, seed=7)
        it = iter(loader)
        for _ in range(3):
            batch = next(it)
            count(batch, seen)
            losses.append(train_step(model, opt, batch))
        states.append(pickle.loads(pickle.dumps(loader.state_dict())))  # as torch.save would keep it
    print(f"2 ranks x 2 workers: 6 batches, causal LM loss {losses[0]:.2f} -> {losses[-1]:.2f}; "
          f"state dicts of {len(states[0]['dpipe_snapshot']) / 1024:.0f} KiB per rank")

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
