"""A real multi-process run: examples/python/train_tiny.py under torchrun (gloo on loopback) on 2 ranks ×
2 workers, stopped at step 20 with every rank's loader state torch.saved, resumed on 3 ranks × 1 worker
through dpipe.rescale: every window of the epoch is trained on exactly once (or reported undelivered by
equal_steps), and the resumed loss curve continues where it stopped."""
import collections
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import SOURCE_ROOT

torch = pytest.importorskip("torch")

SEQ_LEN = 16


def torchrun(nproc, *args, cwd):
    # Debian's torchrun on Python 3.11 needs --redirects 1 --tee 1 (docs/python.md).
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
           "--redirects", "1", "--tee", "1", str(SOURCE_ROOT / "examples" / "python" / "train_tiny.py"), *args]
    out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=600, env=dict(os.environ))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]


def read_logs(root, ranks):
    seen, losses, undelivered = [], {}, 0
    for r in range(ranks):
        for line in open(root / f"seen-rank-{r}.jsonl"):
            rec = json.loads(line)
            if "windows" in rec:
                seen += [tuple(w) for w in rec["windows"]]
                losses.setdefault(rec["step"], []).append(rec["loss"])
            else:
                undelivered += rec["undelivered"]
    return seen, losses, undelivered


def test_train_stop_rescale_resume_under_torchrun(tmp_path):
    torchrun(2, "--dir", str(tmp_path), "--workers", "2", "--stop-at", "20", cwd=tmp_path)
    first, first_losses, _ = read_logs(tmp_path, 2)
    assert sorted(first_losses) == list(range(1, 21))
    for r in range(2):  # this run's part of the logs is read again below with the resumed run's
        os.rename(tmp_path / f"seen-rank-{r}.jsonl", tmp_path / f"first-rank-{r}.jsonl")
    torchrun(3, "--dir", str(tmp_path), "--workers", "1", "--resume", cwd=tmp_path)
    second, second_losses, undelivered = read_logs(tmp_path, 3)

    tokens = np.fromfile(tmp_path / "tokens.bin", dtype=np.uint16).astype(np.int64)
    n = (len(tokens) - 1) // SEQ_LEN
    every = collections.Counter(tuple(tokens[k * SEQ_LEN:k * SEQ_LEN + SEQ_LEN + 1].tolist()) for k in range(n))
    got = collections.Counter(first + second)
    assert not got - every, "a window was trained on that the epoch does not hold that often"
    assert sum((every - got).values()) == undelivered, "windows went missing without being reported"
    assert len(first) + len(second) + undelivered == n

    # The resumed run starts at step 21 and its loss goes on from where the first run stopped.
    assert min(second_losses) == 21
    initial = np.mean(first_losses[1] + first_losses[2] + first_losses[3])
    before_stop = np.mean(first_losses[18] + first_losses[19] + first_losses[20])
    after = np.mean(second_losses[21] + second_losses[22] + second_losses[23])
    assert after < initial - 0.5 and abs(after - before_stop) < 0.5, (initial, before_stop, after)


UNEVEN = """
import json, pickle, sys
import torch.distributed as dist
import dpipe
dist.init_process_group("gloo")
p = dpipe.range(0, 11) | dpipe.sharding_filter()
loader = dpipe.Loader(p, seed=0, equal_steps=True)
got = list(loader)
undelivered = loader.undelivered
state = pickle.loads(pickle.dumps(loader.state_dict()))
loader.set_epoch(1)
second = list(loader)
again = dpipe.Loader(p, seed=0, equal_steps=True)  # resumed from the end of the first pass
again.load_state_dict(state)
again.set_epoch(1)
second_again = list(again)
with open(sys.argv[1] + f"/rank-{dist.get_rank()}.json", "w") as f:
    json.dump({"got": got, "undelivered": undelivered, "second": second, "undelivered_after": loader.undelivered,
               "second_again": second_again}, f)
dist.destroy_process_group()
"""


def test_equal_steps_stop_every_rank_together_and_report_the_rest(tmp_path):
    script = tmp_path / "uneven.py"
    script.write_text(UNEVEN)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "--redirects", "1",
           "--tee", "1", str(script), str(tmp_path)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    r0, r1 = (json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in range(2))
    # sharding_filter gives rank 0 the 6 even numbers and rank 1 the 5 odd ones. What rank 0 held when
    # rank 1 ran out (10) is carried: the next pass delivers it first, and carries what that one cuts off.
    assert r0 == {"got": [0, 2, 4, 6, 8], "undelivered": 1, "second": [10, 0, 2, 4, 6], "undelivered_after": 2,
                  "second_again": [10, 0, 2, 4, 6]}
    assert r1 == {"got": [1, 3, 5, 7, 9], "undelivered": 0, "second": [1, 3, 5, 7, 9], "undelivered_after": 0,
                  "second_again": [1, 3, 5, 7, 9]}
