"""The numpy contract (arrays over the C++ buffers, outliving the loader), torch interoperability, and
memory that stays flat."""
import gc
import resource
import sys

import numpy as np
import pytest

import dpipe


def test_an_array_outlives_its_loader_and_keeps_its_buffer():
    loader = dpipe.Loader(dpipe.range(0, 1000) | dpipe.sharding_filter() | dpipe.batch(size=100), workers=2)
    arrays = list(loader)
    del loader
    gc.collect()
    junk = [np.full(100, -1, dtype=np.int64) for _ in range(1000)]  # reuse freed memory, if any was freed
    assert sorted(np.concatenate(arrays).tolist()) == list(range(1000))
    del junk


def test_torch_from_numpy_shares_the_buffer():
    torch = pytest.importorskip("torch")
    batch = next(iter(dpipe.Loader(dpipe.range(0, 8) | dpipe.batch(size=8))))
    t = torch.from_numpy(batch)
    assert t.data_ptr() == batch.ctypes.data and t.dtype == torch.int64


def test_loader_is_an_iterable_dataset_for_torch_dataloader():
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader, IterableDataset
    loader = dpipe.Loader(dpipe.range(0, 20) | dpipe.sharding_filter() | dpipe.batch(size=5), workers=2)
    assert isinstance(loader, IterableDataset)
    got = [b.tolist() for b in DataLoader(loader, batch_size=None)]
    assert sorted(x for b in got for x in b) == list(range(20))
    assert all(isinstance(b, torch.Tensor) for b in DataLoader(loader, batch_size=None))
    with pytest.raises(Exception, match="its own workers"):
        list(DataLoader(loader, batch_size=None, num_workers=1))


def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def rss_growth_mb(pipeline, warm_up, elements):
    """RSS after taking `elements` more elements of the pipeline (2 workers) than after `warm_up`."""
    it = iter(dpipe.Loader(pipeline, workers=2))
    for _ in range(warm_up):
        next(it)
    before = rss_mb()
    for _ in range(elements):
        next(it)
    return rss_mb() - before


def test_memory_stays_flat_over_many_batches():
    grew = rss_growth_mb(dpipe.range(0, 10**9) | dpipe.sharding_filter() | dpipe.batch(size=16), 50_000, 1_000_000)
    assert grew < 20, f"RSS grew {grew:.1f} MB over 10^6 batches"


def test_memory_stays_flat_through_python_callables_and_values():
    def value(x):  # a dict with an array: converted to a C++ value and back for every element
        return {"x": x, "a": np.full(8, x, dtype=np.int32), "t": (x, str(x))}

    p = dpipe.range(0, 10**9) | dpipe.map(value, out=object) | dpipe.filter(lambda v: v["x"] % 3 != 0) \
        | dpipe.batch(size=8)
    grew = rss_growth_mb(p, 5_000, 40_000)
    assert grew < 20, f"RSS grew {grew:.1f} MB over 320,000 Python values"
