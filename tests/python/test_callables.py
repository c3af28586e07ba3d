"""Python callables in map, filter and flat_map: run on the engine's threads, checked results, failures
raised as dpipe.NodeError naming the node and worker with the original exception as __cause__, and exact
resume through them."""
import threading

import numpy as np
import pytest

import dpipe
from conftest import plain


def double(x):
    return 2 * x


def test_map_filter_flat_map_with_python_callables():
    p = (dpipe.range(0, 20) | dpipe.map(double) | dpipe.filter(lambda x: x % 3 == 0)
         | dpipe.flat_map(lambda x: [x, x + 1]))
    expected = [y for x in range(20) for y in ([2 * x, 2 * x + 1] if (2 * x) % 3 == 0 else [])]
    assert list(dpipe.Loader(p)) == expected
    # Callables run on the engine's threads; the results come back in order, on 3 workers too.
    threads = set()

    def where(x):
        threads.add(threading.get_ident())
        return x

    q = dpipe.range(0, 300) | dpipe.sharding_filter() | dpipe.map(where)
    got = list(dpipe.Loader(q, workers=3, threads=2))
    assert sorted(got) == list(range(300))
    assert threading.get_ident() not in threads


def test_map_changes_the_element_type_with_out():
    p = dpipe.range(0, 4) | dpipe.map(lambda x: "n" * x, out=str) | dpipe.batch(size=2)
    assert [plain(b) for b in dpipe.Loader(p)] == [["", "n"], ["nn", "nnn"]]
    q = dpipe.range(0, 3) | dpipe.map(lambda x: np.arange(x), out="batch of integer")
    got = list(dpipe.Loader(q))
    assert [a.tolist() for a in got] == [[], [0], [0, 1]] and all(a.dtype == np.int64 for a in got)
    # Batches reach a callable as numpy arrays, and an array or a list may come back.
    r = dpipe.range(0, 6) | dpipe.batch(size=3) | dpipe.map(lambda b: b * 10)
    assert [plain(b) for b in dpipe.Loader(r)] == [[0, 10, 20], [30, 40, 50]]


def test_a_result_of_the_wrong_type_is_a_node_error_naming_the_callable():
    p = dpipe.range(0, 3) | dpipe.map(lambda x: 1.5, name="half")
    with pytest.raises(dpipe.NodeError, match=r"half.*returned float, expected an integer"):
        list(dpipe.Loader(p))


class Boom(Exception):
    pass


def explode_at_5(x):
    if x == 5:
        raise Boom("no five")
    return x


def test_an_exception_reaches_the_consumer_after_the_elements_before_it():
    loader = dpipe.Loader(dpipe.range(0, 10) | dpipe.map(explode_at_5, name="fragile"), workers=1)
    got = []
    with pytest.raises(dpipe.NodeError) as err:
        for x in loader:
            got.append(x)
    assert got == [0, 1, 2, 3, 4]
    e = err.value
    assert "fragile" in str(e) and "Boom: no five" in str(e)
    assert isinstance(e.__cause__, Boom) and str(e.__cause__) == "no five"
    assert e.worker == 0 and "fragile" in e.node


def test_resume_through_a_python_map_is_exact():
    p = dpipe.range(0, 500) | dpipe.shuffle(buffer=50) | dpipe.sharding_filter() | dpipe.map(double) \
        | dpipe.batch(size=7)
    whole = [plain(b) for b in dpipe.Loader(p, seed=3, workers=2)]
    loader = dpipe.Loader(p, seed=3, workers=2)
    it = iter(loader)
    head = [plain(next(it)) for _ in range(11)]
    state = loader.state_dict()
    again = dpipe.Loader(p, seed=3, workers=2)
    again.load_state_dict(state)
    assert head + [plain(b) for b in again] == whole
    # Another function under the same node is another pipeline.
    other = dpipe.range(0, 500) | dpipe.shuffle(buffer=50) | dpipe.sharding_filter() | dpipe.map(explode_at_5) \
        | dpipe.batch(size=7)
    with pytest.raises(dpipe.SnapshotError, match="different pipeline"):
        dpipe.Loader(other, seed=3, workers=2).load_state_dict(state)


def test_callables_only_where_they_run():
    with pytest.raises(TypeError, match="map, filter and flat_map"):
        dpipe.parallel_map(double)
    with pytest.raises(TypeError, match="out="):
        dpipe.batch(size=2, out=int)
