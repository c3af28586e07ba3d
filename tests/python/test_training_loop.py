"""examples/python/training_loop.py, stopped after a step and resumed from its last checkpoint (written in
the background): every sample of the epoch is trained on once, and the steps after the checkpoint come
again as they came before the stop."""
import json
import os
import subprocess
import sys

import pytest

from conftest import SOURCE_ROOT

EXAMPLE = SOURCE_ROOT / "examples" / "python" / "training_loop.py"


def run(directory, *args):
    out = subprocess.run([sys.executable, str(EXAMPLE), "--dir", str(directory), *args], capture_output=True,
                         text=True, timeout=120, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.mark.parametrize("workers", [1, 2])
def test_a_stopped_training_loop_resumes_after_its_last_checkpoint_with_every_sample_once(tmp_path, workers):
    run(tmp_path, "--workers", str(workers), "--stop-at", "27", "--every", "10")
    first = [json.loads(l) for l in (tmp_path / "seen.jsonl").read_text().splitlines()]
    assert [r["step"] for r in first] == list(range(1, 28))
    assert (tmp_path / "last_step").read_text() == "20"
    said = run(tmp_path, "--workers", str(workers), "--resume")
    assert "resumed after step 20" in said
    records = [json.loads(l) for l in (tmp_path / "seen.jsonl").read_text().splitlines()]
    again = records[len(first):]
    assert again[0]["step"] == 21
    # The steps the stopped run made after its checkpoint, made again alike.
    assert again[:7] == first[20:27]
    ids = [i for r in first[:20] + again for i in r["ids"]]
    assert sorted(ids) == list(range(400)), "a sample was lost or trained on twice"
