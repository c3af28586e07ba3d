"""The pipeline of the Python-made snapshot fixtures (tests/data/snapshots/v6/python-map.*): a state dict
whose nodes call Python callables, so its records hold their input counts (`input_taken`, format 6).

    PYTHONPATH=BUILD/python:tests/python python3 tests/python/python_fixture.py tests/data/snapshots/v<N>

writes `python-map.dpipe` (the state's bytes after TAKE batches) and `python-map.expected.json` (what the
rest of the run yields, and the failure it ends with). The test resumes the file with today's package."""
import json
import pathlib
import sys

import dpipe

TAKE = 10


def add_one_failing_at_1500(x):
    if x == 1500:
        raise ValueError("1500 is not welcome")
    return x + 1


def pipeline():
    return dpipe.range(0, 2000) | dpipe.sampler(shuffle="none") | dpipe.map(add_one_failing_at_1500) | dpipe.batch(size=8)


def loader():
    return dpipe.Loader(pipeline(), seed=6, inline_workers=True, fuse=False)


def rest_and_failure(it):
    """What an iterator yields to its end, as lists, and the message of the NodeError it ends with."""
    out = []
    try:
        for batch in it:
            out.append([int(x) for x in batch])
    except dpipe.NodeError as e:
        return out, str(e)
    return out, None


def main(directory):
    directory = pathlib.Path(directory)
    run = loader()
    it = iter(run)
    for _ in range(TAKE):
        next(it)
    state = run.state_dict()
    rest, failure = rest_and_failure(it)
    (directory / "python-map.dpipe").write_bytes(state["dpipe_snapshot"])
    (directory / "python-map.expected.json").write_text(json.dumps({"take": TAKE, "rest": rest, "failure": failure}) + "\n")


if __name__ == "__main__":
    import python_fixture  # the callables' names in the fingerprint are python_fixture.*, not __main__.*
    python_fixture.main(sys.argv[1])
