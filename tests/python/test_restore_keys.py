"""Restore keys from Python: Loader(restore_keys=True) states hold the buffered elements (a shuffle's buffer,
the workers' queues) as their source positions, not their bytes; load_state_dict makes them again with the
same Python callables, and the stream goes on as the uninterrupted one; an element that comes out
different (the callable changed under the same_function vouch) is refused; states rescale with their keys."""
import pickle

import numpy as np
import pytest

import dpipe

COUNT = 6000


def row(x):
    return np.full(128, x, dtype=np.float64)  # 1 KiB


def pipeline(f=row):
    return dpipe.range(0, COUNT) | dpipe.sampler(name="draw") | dpipe.map(f, out=object) | dpipe.shuffle(512) | dpipe.batch(size=8)


def firsts(batches):
    return [float(r[0]) for b in batches for r in b]


def stream(loader, n=None):
    it = iter(loader)
    out = []
    for b in it:
        out.append(np.asarray(b))
        if n is not None and len(out) == n:
            break
    return out


@pytest.mark.parametrize("workers", [1, 2])
def test_a_state_of_keys_is_small_and_resumes_the_same_stream(workers):
    whole = firsts(stream(dpipe.Loader(pipeline(), seed=2, workers=workers)))
    assert sorted(whole) == [float(x) for x in range(COUNT)]
    sizes = {}
    for keys in (True, False):
        loader = dpipe.Loader(pipeline(), seed=2, workers=workers, restore_keys=keys)
        head = firsts(stream(loader, 40))
        state = pickle.loads(pickle.dumps(loader.state_dict()))
        sizes[keys] = len(state["dpipe_snapshot"])
        fresh = dpipe.Loader(pipeline(), seed=2, workers=workers, restore_keys=keys)
        fresh.load_state_dict(state)
        assert head + firsts(stream(fresh)) == whole, keys
        # a state of keys also resumes in a Loader that does not trace
        if keys:
            plain = dpipe.Loader(pipeline(), seed=2, workers=workers)
            plain.load_state_dict(state)
            assert head + firsts(stream(plain)) == whole
    # each worker's shuffle buffer holds 512 rows of 1 KiB: as data over 512 KiB a worker, as keys tens of KiB
    assert sizes[False] > 512 * 1024 * workers, sizes
    assert sizes[True] <= 64 * 1024 and sizes[True] * 10 < sizes[False], sizes


def test_keys_give_provenance_back_after_a_resume():
    loader = dpipe.Loader(pipeline(), seed=2, restore_keys=True)
    stream(loader, 10)
    state = loader.state_dict()
    fresh = dpipe.Loader(pipeline(), seed=2, restore_keys=True)
    fresh.load_state_dict(state)
    for b in fresh:
        assert fresh.provenance() == [["draw", int(r[0])] for r in np.asarray(b)]


def other_row(x):
    return np.full(128, x + 0.5, dtype=np.float64)


def test_an_element_that_comes_out_different_is_refused():
    loader = dpipe.Loader(pipeline(), seed=2, restore_keys=True)
    stream(loader, 10)
    state = loader.state_dict()
    # Another function, vouched for as the same: the rows it makes again differ from the saved checksums.
    fresh = dpipe.Loader(pipeline(other_row), seed=2, restore_keys=True, same_function=True)
    with pytest.raises(dpipe.SnapshotError, match="came out different from the one saved"):
        fresh.load_state_dict(state)


def test_rescaled_keys_deliver_every_element_once():
    seen = []
    states = []
    for rank in range(2):
        loader = dpipe.Loader(pipeline(), seed=2, rank=rank, world_size=2, workers=2, restore_keys=True)
        seen += firsts(stream(loader, 30))
        states.append(loader.state_dict())
    for rank, state in enumerate(dpipe.rescale(states, world_size=3, workers=1)):
        loader = dpipe.Loader(pipeline(), seed=2, rank=rank, world_size=3, workers=1, restore_keys=True)
        loader.load_state_dict(state)
        seen += firsts(stream(loader))
    assert sorted(seen) == [float(x) for x in range(COUNT)]
