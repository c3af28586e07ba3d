"""Provenance from Python: Loader(provenance=True).provenance() names the source positions of the last
element delivered, on every layout and through fused Python stages; map(fn, rng=True) gives each sample a
numpy Generator seeded by its provenance, so its draws do not depend on the layout or a resume."""
import numpy as np
import pytest

import dpipe


def delivered_with_provenance(loader):
    out = []
    for x in loader:
        out.append((x, loader.provenance()))
    return out


def ints(x):
    return [int(v) for v in x] if hasattr(x, "__len__") else int(x)


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_each_batch_names_the_dataset_indices_it_holds(workers):
    p = (dpipe.range(100, 400) | dpipe.sampler(name="draw") | dpipe.map(lambda x: x * 2)
         | dpipe.shuffle(buffer=16) | dpipe.batch(size=5))
    got = delivered_with_provenance(dpipe.Loader(p, workers=workers, provenance=True, seed=4))
    seen = []
    for batch, sources in got:
        batch = ints(batch)
        # range(100, 400)'s element i is 100 + i; the map doubled it
        assert sources == [["draw", x // 2 - 100] for x in batch], (batch, sources)
        seen += batch
    assert sorted(seen) == [2 * x for x in range(100, 400)]
    # the stream is the one an untraced Loader delivers
    assert [ints(b) for b, _ in got] == [ints(b) for b in dpipe.Loader(p, workers=workers, seed=4)]


def test_fused_stages_name_an_expansion_by_offsets():
    p = (dpipe.range(0, 30) | dpipe.sampler("none", name="s") | dpipe.map(lambda x: x + 1)
         | dpipe.filter(lambda x: x % 3 != 0) | dpipe.flat_map(lambda x: [x] * (x % 4)))
    got = delivered_with_provenance(dpipe.Loader(p, provenance=True))
    for x, sources in got:
        x = ints(x)
        count = x % 4
        assert len(sources) == 1 and sources[0][:2] == ["s", x - 1], (x, sources)
        assert sources[0][2]["offsets"][0] in range(count)  # the stages include a flat_map: as flat_map's
    assert len(got) == sum(x % 4 for x in range(1, 31) if x % 3 != 0)


def test_provenance_is_asked_for():
    loader = dpipe.Loader(dpipe.range(0, 3))
    next(iter(loader))
    with pytest.raises(dpipe.ConfigError, match="provenance=True"):
        loader.provenance()
    traced = dpipe.Loader(dpipe.range(0, 3) | dpipe.enumerate(), provenance=True)
    with pytest.raises(Exception, match="does not carry provenance yet"):
        list(traced)


def augment(x, rng):
    assert isinstance(rng, np.random.Generator)
    return [int(x), int(rng.integers(0, 2**62))]


def draws(loader):
    out = {}
    for b in loader:
        for x, d in b:
            assert x not in out
            out[x] = d
    return out


def test_map_with_rng_draws_per_sample_whatever_the_layout_and_resume():
    p = dpipe.range(0, 120) | dpipe.sampler() | dpipe.map(augment, rng=True, out=object) | dpipe.batch(size=4)
    reference = draws(dpipe.Loader(p, seed=11))
    assert sorted(reference) == list(range(120)) and len(set(reference.values())) == 120
    for workers in (2, 3):
        assert draws(dpipe.Loader(p, seed=11, workers=workers)) == reference
    ranks = {}
    for rank in range(2):
        ranks.update(draws(dpipe.Loader(p, seed=11, rank=rank, world_size=2, workers=2)))
    assert ranks == reference
    # resumed from a state taken mid-stream, with the workers' queues full
    loader = dpipe.Loader(p, seed=11, workers=2)
    it = iter(loader)
    head = {}
    for _ in range(7):
        for x, d in next(it):
            head[x] = d
    state = loader.state_dict()
    again = dpipe.Loader(p, seed=11, workers=2)
    again.load_state_dict(state)
    rest = draws(again)
    assert not set(head) & set(rest) and {**head, **rest} == reference
    assert draws(dpipe.Loader(p, seed=12)) != reference


def test_map_with_rng_after_fused_stages_on_a_field_and_per_epoch():
    def jitter(v, rng):
        return int(v) + int(rng.integers(0, 1000))
    p = (dpipe.range(0, 40) | dpipe.sampler() | dpipe.map(lambda x: {"v": x * 1000}, out=object)
         | dpipe.filter(lambda r: r["v"] % 3000 != 0) | dpipe.map(jitter, field="v", rng=True))
    loader = dpipe.Loader(p, seed=2)
    first = sorted(r["v"] for r in loader)
    assert len(first) == 26 and all(0 <= v % 1000 < 1000 for v in first)
    assert sorted(r["v"] for r in dpipe.Loader(p, seed=2, workers=3)) == first
    loader.set_epoch(1)
    assert sorted(r["v"] for r in loader) != first  # a new epoch draws anew


def test_map_with_rng_after_a_buffer_of_data_is_refused():
    # a generator cannot make its elements again: the shuffle after it would resume them as data
    p = dpipe.generator(lambda info: range(40), out=int) | dpipe.shuffle(buffer=4) | dpipe.map(augment, rng=True)
    with pytest.raises(dpipe.ConfigError, match=r"\(shuffle\), whose snapshots hold elements as data"):
        list(dpipe.Loader(p))
    # a batch of batches marks where each inner batch starts, so it is made again from its keys: accepted
    p = (dpipe.range(0, 40) | dpipe.sampler() | dpipe.batch(2) | dpipe.batch(2) | dpipe.unbatch() | dpipe.unbatch()
         | dpipe.map(augment, rng=True, out=object))
    assert len(list(dpipe.Loader(p, workers=2))) == 40


def test_map_with_rng_after_a_shuffle_draws_the_same_across_a_resume():
    def draw(x, rng):
        return [int(x), int(rng.integers(0, 1 << 40))]
    p = dpipe.range(0, 2000) | dpipe.sampler() | dpipe.shuffle(buffer=64) | dpipe.map(draw, rng=True, out=object)
    reference = {x: d for x, d in dpipe.Loader(p, seed=5, workers=2)}
    assert len(reference) == 2000
    loader = dpipe.Loader(p, seed=5, workers=2)
    it = iter(loader)
    head = dict(next(it) for _ in range(300))
    state = loader.state_dict()
    again = dpipe.Loader(p, seed=5, workers=2)
    again.load_state_dict(state)
    rest = {x: d for x, d in again}
    assert not set(head) & set(rest) and {**head, **rest} == reference
    assert {x: d for x, d in dpipe.Loader(p, seed=5, workers=1)} == reference
