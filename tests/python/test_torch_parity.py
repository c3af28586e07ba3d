"""Torch parity: cases of torch's DataPipe suites (pytorch test/test_datapipe.py, torchdata
test/test_iterdatapipe.py) for the ops dpipe has, with their inputs and expected outputs, run on dpipe.
Where this machine's torch has the op (torch.utils.data.datapipes), the same case runs on torch too, so
an expectation here is torch's behaviour, not a reading of it. Shuffle cases are properties (dpipe's
generator is not torch's). Deliberate differences are listed in docs/python.md ("Differences from torch")
and asserted at the end of this file."""

import pytest

import dpipe
from conftest import plain

try:
    from torch.utils.data.datapipes.iter import IterableWrapper
except ImportError:  # the cases still run on dpipe
    IterableWrapper = None


def run(p, **kw):
    return [plain(x) for x in dpipe.Loader(p, seed=kw.pop("seed", 0), **kw)]


def torch_list(make):
    """The torch side of a case: `make(IterableWrapper)` built and listed, or None without torch."""
    if IterableWrapper is None:
        return None
    return [plain(x) for x in make(IterableWrapper)]


def same_as_torch(expected, make_torch):
    got = torch_list(make_torch)
    assert got is None or got == expected, f"torch gives {got}"


# ---- combining: concat, zip, mux, mux_longest, zip_longest -------------------------------------------

def test_concat():  # test_concat_iterdatapipe
    expected = list(range(10)) + list(range(5))
    assert run(dpipe.range(10) | dpipe.concat(dpipe.range(5))) == expected
    same_as_torch(expected, lambda W: W(range(10)).concat(W(range(5))))
    assert len(dpipe.Loader(dpipe.range(10) | dpipe.concat(dpipe.range(5)))) == 15


def test_zip():  # test_zip_iterdatapipe: stops at the shortest input
    expected = [[i, i, i] for i in range(5)]
    assert run(dpipe.range(10) | dpipe.zip(dpipe.range(10), dpipe.range(5))) == expected
    same_as_torch(expected, lambda W: W(range(10)).zip(W(range(10)), W(range(5))))
    assert len(dpipe.Loader(dpipe.range(10) | dpipe.zip(dpipe.range(10), dpipe.range(5)))) == 5


def test_mux():  # test_mux_iterdatapipe: one from each in turn until the shortest is exhausted
    expected = [0, 10, 20, 1, 11, 21, 2, 12, 22]
    assert run(dpipe.range(3) | dpipe.mux(dpipe.range(10, 15), dpipe.range(20, 25))) == expected
    same_as_torch(expected, lambda W: W(range(3)).mux(W(range(10, 15)), W(range(20, 25))))
    # Inputs of one length: all of them, in turn.
    expected = [0, 10, 1, 11, 2, 12]
    assert run(dpipe.range(3) | dpipe.mux(dpipe.range(10, 13))) == expected
    same_as_torch(expected, lambda W: W(range(3)).mux(W(range(10, 13))))


def test_mux_stops_with_the_first_exhausted_input():  # test_mux_iterdatapipe
    assert run(dpipe.range(4) | dpipe.mux(dpipe.range(4, 8), dpipe.range(8, 12))) == [0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11]
    same_as_torch([0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11], lambda W: W(range(4)).mux(W(range(4, 8)), W(range(8, 12))))
    one = lambda v: dpipe.from_vector(v)  # noqa: E731
    assert run(one([1, 2, 3, 4]) | dpipe.mux(one([10]), one([100, 200, 300]))) == [1, 10, 100]
    same_as_torch([1, 10, 100], lambda W: W([1, 2, 3, 4]).mux(W([10]), W([100, 200, 300])))
    assert run(one([1, 2, 3, 4]) | dpipe.mux_longest(one([10]), one([100, 200, 300]))) == [1, 10, 100, 2, 200, 3, 300, 4]


def test_mux_longest():  # torchdata test_mux_longest_iterdatapipe: exhausted inputs drop out
    assert run(dpipe.range(3) | dpipe.mux_longest(dpipe.range(10, 15), dpipe.range(20, 22))) == \
        [0, 10, 20, 1, 11, 21, 2, 12, 13, 14]


def test_zip_longest():  # torchdata test_zip_longest_iterdatapipe: fill_value for ended inputs
    assert run(dpipe.range(3) | dpipe.zip_longest(dpipe.range(10, 15))) == \
        [[0, 10], [1, 11], [2, 12], [None, 13], [None, 14]]
    assert run(dpipe.range(3) | dpipe.zip_longest(dpipe.range(10, 15), fill=-1)) == \
        [[0, 10], [1, 11], [2, 12], [-1, 13], [-1, 14]]
    assert len(dpipe.Loader(dpipe.range(3) | dpipe.zip_longest(dpipe.range(10, 15)))) == 5


def test_zip_of_inputs_of_several_types():  # torch zips any iterables
    r1, r2 = (dpipe.range(3) | dpipe.zip(dpipe.range(3))).fork(2)
    assert list(dpipe.Loader(r2 | dpipe.concat(r1))) == [(0, 0), (1, 1), (2, 2)] * 2  # rows stay tuples
    rows = list(dpipe.Loader(dpipe.range(3) | dpipe.zip(dpipe.from_vector(["a", "b", "c"]))))
    assert rows == [(0, "a"), (1, "b"), (2, "c")]
    same_as_torch([[0, "a"], [1, "b"], [2, "c"]], lambda W: W(range(3)).zip(W(["a", "b", "c"])))


# ---- branches: fork, demux, unzip ---------------------------------------------------------------------

def test_fork():  # test_fork_iterdatapipe
    a, b, c = dpipe.range(10).fork(3)
    expected = [[i, i, i] for i in range(10)]
    assert run(a | dpipe.zip(b, c)) == expected
    x, y, z = dpipe.range(10).fork(num_instances=3, buffer_size=256)  # torch's names
    assert run(x | dpipe.zip(y, z)) == expected
    with pytest.raises(TypeError, match="count twice"):
        dpipe.range(10).fork(3, num_instances=3)
    with pytest.raises(TypeError, match="buffer twice"):
        dpipe.range(10).fork(2, buffer=4, buffer_size=4)

    def torch_fork(W):
        x, y, z = W(range(10)).fork(num_instances=3)
        return x.zip(y, z)
    same_as_torch(expected, torch_fork)
    assert len(dpipe.Loader(a | dpipe.zip(b, c))) == 10


def test_fork_reading_one_output_to_its_end_needs_the_buffer_for_the_other():
    # test_fork_iterdatapipe: buffer_size=4, output 0 may take 4 elements, the 5th raises BufferError.
    a, b = dpipe.range(10).fork(2, buffer=4, name="f")
    with pytest.raises(dpipe.Error, match="fork 'f'\\): output 0 is 5 elements ahead of output 1, more than its buffer"):
        run(a | dpipe.concat(b))
    # buffer_size=5, reading output 1 to its end first raises too.
    a, b = dpipe.range(10).fork(2, buffer=5, name="f")
    with pytest.raises(dpipe.Error, match="fork 'f'\\): output 1 is 6 elements ahead of output 0"):
        run(b | dpipe.concat(a))
    if IterableWrapper is not None:
        x, y = IterableWrapper(range(10)).fork(num_instances=2, buffer_size=4)
        it = iter(x)
        assert [next(it) for _ in range(4)] == [0, 1, 2, 3]
        with pytest.raises(BufferError):
            next(it)
    # Read in step (zip), a buffer of 1 is enough in torch; dpipe moves elements in chunks, so a zip
    # needs a buffer of a chunk (docs/python.md).
    a, b = dpipe.range(10).fork(2, buffer=256)
    assert run(a | dpipe.zip(b)) == [[i, i] for i in range(10)]
    # With room for the whole stream, it runs.
    a, b = dpipe.range(10).fork(2, buffer=10)
    assert run(a | dpipe.concat(b)) == list(range(10)) * 2


def test_demux():  # test_demux_iterdatapipe
    evens, odds = dpipe.range(10).demux(2, lambda x: x % 2)
    assert run(evens | dpipe.concat(odds)) == [0, 2, 4, 6, 8, 1, 3, 5, 7, 9]
    x, y = dpipe.range(10).demux(num_instances=2, classifier_fn=lambda v: v % 2, buffer_size=10)  # torch's names
    assert run(x | dpipe.concat(y)) == [0, 2, 4, 6, 8, 1, 3, 5, 7, 9]
    with pytest.raises(TypeError, match="fn twice"):
        dpipe.range(10).demux(2, lambda v: 0, classifier_fn=lambda v: 0)

    def torch_demux(W):
        x, y = W(range(10)).demux(num_instances=2, classifier_fn=lambda v: v % 2)
        return x.concat(y)
    same_as_torch([0, 2, 4, 6, 8, 1, 3, 5, 7, 9], torch_demux)
    # Read in step (mux), the outputs need no buffer beyond a chunk.
    x, y, z = dpipe.range(9).demux(3, lambda v: v % 3)
    assert run(x | dpipe.mux(y, z)) == list(range(9))


def test_demux_buffer_and_classifier_errors():
    # test_demux_iterdatapipe: classifier 0 if x >= 5 else 1; buffer_size=4 raises at output 0's first
    # element, buffer_size=5 gives range(5, 10) then range(5).
    high_first = lambda x: 0 if x >= 5 else 1  # noqa: E731
    a, b = dpipe.range(10).demux(2, high_first, buffer=4, name="d")
    with pytest.raises(dpipe.Error, match="demux 'd'\\): it holds 5 elements for outputs other than output 0"):
        run(a | dpipe.concat(b))
    a, b = dpipe.range(10).demux(2, high_first, buffer=5)
    assert run(a | dpipe.concat(b)) == list(range(5, 10)) + list(range(5))
    if IterableWrapper is not None:
        x, y = IterableWrapper(range(10)).demux(num_instances=2, classifier_fn=high_first, buffer_size=4)
        with pytest.raises(BufferError):
            next(iter(x))
        x, y = IterableWrapper(range(10)).demux(num_instances=2, classifier_fn=high_first, buffer_size=5)
        assert list(x) + list(y) == list(range(5, 10)) + list(range(5))
    # A classifier returning an output outside 0..count-1: torch raises ValueError, dpipe fails the run.
    a, b = dpipe.range(10).demux(2, lambda x: 5, name="d")
    with pytest.raises(dpipe.Error, match="its function returned 5"):
        run(a | dpipe.concat(b))
    if IterableWrapper is not None:
        x, y = IterableWrapper(range(10)).demux(num_instances=2, classifier_fn=lambda v: 5)
        with pytest.raises(ValueError):
            list(x)


def test_unzip():  # torchdata test_unzipper_iterdatapipe
    rows = dpipe.range(10) | dpipe.zip(dpipe.range(10, 20), dpipe.range(20, 30))
    a, b, c = rows.unzip(3)
    assert run(a | dpipe.concat(b, c)) == list(range(30))
    assert len(dpipe.Loader(a | dpipe.concat(b, c))) == 30


# ---- batching -----------------------------------------------------------------------------------------

def test_batch():  # test_batch_iterdatapipe
    expected = [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
    assert run(dpipe.range(10) | dpipe.batch(3)) == expected
    same_as_torch(expected, lambda W: W(range(10)).batch(3))
    assert len(dpipe.Loader(dpipe.range(10) | dpipe.batch(3))) == 4
    expected = [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    assert run(dpipe.range(10) | dpipe.batch(3, drop_last=True)) == expected
    same_as_torch(expected, lambda W: W(range(10)).batch(3, drop_last=True))
    assert len(dpipe.Loader(dpipe.range(10) | dpipe.batch(3, drop_last=True))) == 3


def test_unbatch():  # test_unbatch_iterdatapipe
    nested = dpipe.range(8) | dpipe.batch(2) | dpipe.batch(2)  # [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]
    assert run(nested | dpipe.unbatch()) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert run(nested | dpipe.unbatch(level=2)) == list(range(8))
    assert run(nested | dpipe.unbatch(level=-1)) == list(range(8))
    same_as_torch([[0, 1], [2, 3], [4, 5], [6, 7]], lambda W: W(range(8)).batch(2).batch(2).unbatch())
    same_as_torch(list(range(8)), lambda W: W(range(8)).batch(2).batch(2).unbatch(unbatch_level=2))
    same_as_torch(list(range(8)), lambda W: W(range(8)).batch(2).batch(2).unbatch(unbatch_level=-1))
    with pytest.raises(dpipe.ConfigError, match="level 3 needs 3 levels of batches"):
        run(nested | dpipe.unbatch(level=3))
    if IterableWrapper is not None:
        with pytest.raises(IndexError):
            list(IterableWrapper(range(8)).batch(2).batch(2).unbatch(unbatch_level=5))


# ---- selecting and mapping ----------------------------------------------------------------------------

def test_map_filter_flatmap():  # test_map_iterdatapipe, test_filter_datapipe
    assert run(dpipe.range(10) | dpipe.map(lambda x: x + 1)) == list(range(1, 11))
    same_as_torch(list(range(1, 11)), lambda W: W(range(10)).map(lambda x: x + 1))
    assert run(dpipe.range(10) | dpipe.filter(lambda x: x % 2 == 0)) == [0, 2, 4, 6, 8]
    same_as_torch([0, 2, 4, 6, 8], lambda W: W(range(10)).filter(lambda x: x % 2 == 0))
    # torchdata test_flatmap_iterdatapipe: each element to several; flatmap() of lists flattens.
    assert run(dpipe.range(20) | dpipe.flat_map(lambda e: [e, e * 10])) == [v for e in range(20) for v in (e, e * 10)]
    with pytest.raises(TypeError, match="cannot say"):
        len(dpipe.Loader(dpipe.range(20) | dpipe.flat_map(lambda e: [e, e * 10])))
    with pytest.raises(TypeError, match="cannot say"):  # test_filter_datapipe: a filter has no len
        len(dpipe.Loader(dpipe.range(10) | dpipe.filter(lambda x: x >= 5)))
    assert run(dpipe.range(6) | dpipe.batch(2) | dpipe.flat_map()) == list(range(6))


def test_header_is_take():  # torchdata test_header_iterdatapipe
    assert run(dpipe.range(20) | dpipe.take(5)) == list(range(5))
    assert run(dpipe.range(3) | dpipe.take(10)) == list(range(3))
    assert run(dpipe.range(3) | dpipe.take(None)) == list(range(3))
    assert len(dpipe.Loader(dpipe.range(20) | dpipe.take(5))) == 5
    assert len(dpipe.Loader(dpipe.range(20) | dpipe.take(30))) == 20
    assert len(dpipe.Loader(dpipe.range(20) | dpipe.take(None))) == 20


def test_cycle_and_repeat():  # torchdata test_cycler_iterdatapipe, test_repeater_iterdatapipe
    assert run(dpipe.range(5) | dpipe.cycle(3)) == list(range(5)) * 3
    assert run(dpipe.range(5) | dpipe.cycle(0)) == []
    assert len(dpipe.Loader(dpipe.range(5) | dpipe.cycle(2))) == 10
    endless = iter(dpipe.Loader(dpipe.range(5) | dpipe.cycle()))
    assert [next(endless) for _ in range(50)] == list(range(5)) * 10
    with pytest.raises(TypeError, match="cannot say"):
        len(dpipe.Loader(dpipe.range(5) | dpipe.cycle()))
    with pytest.raises(dpipe.ConfigError):
        run(dpipe.range(5) | dpipe.cycle(-1))
    assert run(dpipe.range(5) | dpipe.repeat(3)) == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4]
    assert len(dpipe.Loader(dpipe.range(5) | dpipe.repeat(2))) == 10
    # torchdata test_combining_infinite_iterdatapipe: an endless input zipped with a finite one ends.
    assert run(dpipe.range(10) | dpipe.cycle() | dpipe.zip(dpipe.range(10))) == [[i, i] for i in range(10)]


def test_enumerate():  # torchdata test_enumerator_iterdatapipe
    letters = dpipe.from_vector(list("abcde"))
    assert list(dpipe.Loader(letters | dpipe.enumerate())) == [(0, "a"), (1, "b"), (2, "c"), (3, "d"), (4, "e")]
    assert list(dpipe.Loader(letters | dpipe.enumerate(start=10))) == \
        [(10, "a"), (11, "b"), (12, "c"), (13, "d"), (14, "e")]
    assert len(dpipe.Loader(letters | dpipe.enumerate())) == 5
    assert list(dpipe.Loader(dpipe.range(10, 13) | dpipe.enumerate())) == [(0, 10), (1, 11), (2, 12)]


def test_sharding_through_branches():  # TestSharding.test_simple_sharding, test_multi_sharding
    def p():  # fork(2) -> map(x * 10) muxed with filter(x % 3 == 1): [0, 1, 10, 4, 20, 7]
        a, b = dpipe.range(10).fork(2)
        return a | dpipe.map(lambda x: x * 10) | dpipe.mux(b | dpipe.filter(lambda x: x % 3 == 1))
    assert run(p()) == [0, 1, 10, 4, 20, 7]
    assert run(p() | dpipe.sharding_filter(num_shards=3, shard_id=1)) == [1, 20]
    if IterableWrapper is not None:
        from torch.utils.data.graph_settings import apply_sharding
        x, y = IterableWrapper(range(10)).fork(num_instances=2)
        sd = x.map(lambda v: v * 10).mux(y.filter(lambda v: v % 3 == 1)).sharding_filter()
        apply_sharding(sd, 3, 1)
        assert list(sd) == [1, 20]
    shards = [run(p() | dpipe.sharding_filter(num_shards=3, shard_id=i)) for i in range(3)]
    assert sorted(x for s in shards for x in s) == sorted([0, 1, 10, 4, 20, 7])
    # Sharded, then forked and zipped.
    a, b = (dpipe.range(13) | dpipe.sharding_filter(num_shards=3, shard_id=0)).fork(2)
    assert run(a | dpipe.zip(b)) == [[0, 0], [3, 3], [6, 6], [9, 9], [12, 12]]
    # test_sharding_length
    for shard, n in enumerate((5, 4, 4)):
        assert len(dpipe.Loader(dpipe.range(13) | dpipe.sharding_filter(num_shards=3, shard_id=shard))) == n
    assert [len(dpipe.Loader(dpipe.range(1) | dpipe.sharding_filter(num_shards=2, shard_id=i))) for i in (0, 1)] == [1, 0]


def test_sharding_filter():  # test_sharding_filter_datapipe: apply_sharding(3, i)
    for shard in range(3):
        expected = list(range(shard, 10, 3))
        assert run(dpipe.range(10) | dpipe.sharding_filter(num_shards=3, shard_id=shard)) == expected
        if IterableWrapper is not None:
            from torch.utils.data.graph_settings import apply_sharding
            dp = IterableWrapper(range(10)).sharding_filter()
            apply_sharding(dp, 3, shard)
            assert [plain(x) for x in dp] == expected
        assert len(dpipe.Loader(dpipe.range(10) | dpipe.sharding_filter(num_shards=3, shard_id=shard))) == \
            len(expected)


# ---- shuffle: properties ------------------------------------------------------------------------------

def test_shuffle_properties():  # test_shuffle_iterdatapipe
    seen = set()
    for seed in range(4):
        out = run(dpipe.range(100) | dpipe.shuffle(buffer=20), seed=seed)
        assert sorted(out) == list(range(100))  # every element once
        seen.add(tuple(out))
    assert len(seen) == 4  # another seed, another order
    # A buffer of one keeps the order, as torch's.
    assert run(dpipe.range(10) | dpipe.shuffle(buffer=1)) == list(range(10))
    same_as_torch(list(range(10)), lambda W: W(range(10)).shuffle(buffer_size=1))
    # The same seed, the same order; and an element moves at most `buffer` - 1 places earlier.
    once = run(dpipe.range(100) | dpipe.shuffle(buffer=8), seed=9)
    assert once == run(dpipe.range(100) | dpipe.shuffle(buffer=8), seed=9)
    assert all(i - pos <= 7 for pos, i in enumerate(once))  # it enters the buffer after an output
    assert len(dpipe.Loader(dpipe.range(100) | dpipe.shuffle(buffer=20))) == 100


def test_shuffle_turned_off():  # test_shuffle_iterdatapipe: set_shuffle(False) keeps the order
    shuffled = dpipe.range(50) | dpipe.shuffle(buffer=20) | dpipe.batch(5) | dpipe.unbatch()
    assert run(shuffled, seed=4) != list(range(50))
    off = shuffled.set_shuffle(False)
    assert run(off, seed=4) == list(range(50))
    assert run(off.set_shuffle(True), seed=4) == run(shuffled, seed=4)  # on again: the same pipeline
    assert off.set_shuffle(True) == shuffled
    assert run(dpipe.range(50) | dpipe.shuffle(buffer_size=20, enabled=False)) == list(range(50))
    same_as_torch(list(range(10)), lambda W: W(range(10)).shuffle().set_shuffle(False))
    # Inside another node's inputs too (torch's apply_shuffle_settings reaches the whole graph).
    mixed = dpipe.range(10) | dpipe.concat(dpipe.range(10, 20) | dpipe.shuffle())
    assert run(mixed.set_shuffle(False)) == list(range(20))
    # Off, it buffers nothing: a state taken mid-stream holds no shuffle buffer.
    loader = dpipe.Loader(dpipe.range(100) | dpipe.shuffle(buffer=30, enabled=False))
    it = iter(loader)
    assert [next(it) for _ in range(10)] == list(range(10))
    state = loader.state_dict()
    rest = list(it)
    loader.load_state_dict(state)
    assert list(loader) == rest == list(range(10, 100))
    with pytest.raises(TypeError, match="True or False"):
        shuffled.set_shuffle("no")


def test_len_of_a_pipeline():  # len(datapipe): known from the sources and nodes, TypeError otherwise
    assert len(dpipe.range(10) | dpipe.batch(3)) == 4
    assert len(dpipe.range(10) | dpipe.zip(dpipe.range(4))) == 4
    assert len(dpipe.range(5) | dpipe.mux_longest(dpipe.range(7))) == 12
    assert len(dpipe.range(20) | dpipe.take(6) | dpipe.repeat(2)) == 12
    assert len(dpipe.range(5) | dpipe.cycle(3)) == 15
    with pytest.raises(TypeError, match="filter"):
        len(dpipe.range(10) | dpipe.filter(lambda x: x > 3))
    assert bool(dpipe.range(10) | dpipe.filter(lambda x: x > 3))  # truth is not len()
    if IterableWrapper is not None:
        assert len(IterableWrapper(range(10)).batch(3)) == 4


# ---- deliberate differences (docs/python.md, "Differences from torch") ----------------------------------

def test_the_deliberate_differences():
    # A branch never read is an error at build time (torch would hold its elements until the buffer filled).
    a, b, c = dpipe.range(5).fork(3, name="f")
    with pytest.raises(dpipe.ConfigError, match="output 2 is never read"):
        run(a | dpipe.zip(b))
    # len() of a pipeline with a filter raises TypeError naming the node, as torch's __len__ does.
    with pytest.raises(TypeError, match="cannot say"):
        len(dpipe.Loader(dpipe.range(10) | dpipe.filter(lambda x: x > 3)))
