"""state_dict / load_state_dict: exact resume at any element, through pickle and torch.save; refusals;
rescaling every rank's state to another layout, each element exactly once, reproducibly."""
import io
import pickle
import random

import pytest

import dpipe
from conftest import plain

CANONICAL = dpipe.range(0, 3000) | dpipe.shuffle(buffer=200) | dpipe.sharding_filter() \
    | dpipe.map("affine", mul=2) | dpipe.batch(size=16)
RESCALABLE = dpipe.range(0, 4000) | dpipe.sampler(shuffle="global") | dpipe.shuffle(buffer=50) | dpipe.batch(size=8)


def run_all(loader):
    return [plain(x) for x in loader]


@pytest.mark.parametrize("trial", range(6))
def test_resume_at_random_points_through_pickle_and_torch_save(trial):
    rng = random.Random(trial)
    workers = rng.choice([1, 2, 3])
    whole = run_all(dpipe.Loader(CANONICAL, seed=5, rank=1, world_size=2, workers=workers))
    loader = dpipe.Loader(CANONICAL, seed=5, rank=1, world_size=2, workers=workers)
    it = iter(loader)
    at = rng.randrange(0, len(whole) + 1)
    head = [plain(next(it)) for _ in range(at)]
    state = loader.state_dict()
    if trial % 2:
        state = pickle.loads(pickle.dumps(state))
    else:
        torch = pytest.importorskip("torch")
        buf = io.BytesIO()
        torch.save(state, buf)
        buf.seek(0)
        state = torch.load(buf)
    assert state["delivered"] == at and state["rank"] == 1 and state["workers"] == workers
    again = dpipe.Loader(CANONICAL, seed=5, rank=1, world_size=2, workers=workers)
    again.load_state_dict(state)
    assert head + run_all(again) == whole
    # The original goes on too.
    assert head + [plain(x) for x in it] == whole


def test_a_fresh_iter_restarts_and_a_loaded_state_continues():
    loader = dpipe.Loader(dpipe.range(0, 10), seed=0)
    it = iter(loader)
    next(it), next(it)
    state = loader.state_dict()
    assert list(loader) == list(range(10))  # a new iteration starts from the beginning
    loader.load_state_dict(state)
    assert list(loader) == list(range(2, 10))


def test_a_new_iterator_invalidates_the_old_one_and_the_state_describes_the_new():
    loader = dpipe.Loader(dpipe.range(0, 10), seed=0)
    it1 = iter(loader)
    assert [next(it1) for _ in range(5)] == [0, 1, 2, 3, 4]
    it2 = iter(loader)
    with pytest.raises(RuntimeError, match="invalidated: a later iter"):
        next(it1)
    with pytest.raises(RuntimeError, match="invalidated"):
        next(it1)  # for good
    assert loader.state_dict()["delivered"] == 0
    assert next(it2) == 0
    state = loader.state_dict()
    assert state["delivered"] == 1
    # load_state_dict retires the iterator in use too: the next iter() continues the loaded state.
    loader.load_state_dict(state)
    with pytest.raises(RuntimeError, match="load_state_dict"):
        next(it2)
    assert list(loader) == list(range(1, 10))


def test_a_retired_equal_steps_iterator_raises_and_takes_nothing_carried():
    # One gloo process (equal_steps needs torch.distributed), in a child so no group outlives the test.
    code = """
import socket, sys, torch.distributed as dist, dpipe
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
loader = dpipe.Loader(dpipe.range(0, 10), seed=0, rank=0, world_size=1, equal_steps=True)
it1 = iter(loader)
assert next(it1) == 0
state = loader.state_dict()
state["carried"] = [100, 101]  # as a pass that ended early leaves it
it2 = iter(loader)
loader.load_state_dict(state)
for it in (it1, it2):  # it2 was retired before its first next(): it must not take the carried elements
    try:
        next(it)
        sys.exit("a retired iterator went on")
    except RuntimeError as e:
        assert "invalidated" in str(e), e
assert list(loader)[:3] == [100, 101, 1], "the carried elements come first"
print("ok")
"""
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stdout + out.stderr


def test_a_state_of_another_pipeline_seed_or_layout_is_refused():
    loader = dpipe.Loader(CANONICAL, seed=5, rank=0, world_size=2)
    next(iter(loader))
    state = loader.state_dict()
    with pytest.raises(dpipe.SnapshotError, match="seed"):
        dpipe.Loader(CANONICAL, seed=6, rank=0, world_size=2).load_state_dict(state)
    with pytest.raises(dpipe.SnapshotError, match="layout|world_size|rank"):
        dpipe.Loader(CANONICAL, seed=5, rank=1, world_size=2).load_state_dict(state)
    other = dpipe.range(0, 3000) | dpipe.shuffle(buffer=200) | dpipe.sharding_filter() | dpipe.batch(size=32)
    with pytest.raises(dpipe.SnapshotError, match="different pipeline"):
        dpipe.Loader(other, seed=5, rank=0, world_size=2).load_state_dict(state)
    broken = dict(state, dpipe_snapshot=state["dpipe_snapshot"][:-3])
    with pytest.raises(dpipe.SnapshotError):
        dpipe.Loader(CANONICAL, seed=5, rank=0, world_size=2).load_state_dict(broken)
    with pytest.raises(dpipe.SnapshotError, match="not a dpipe loader state"):
        dpipe.Loader(CANONICAL).load_state_dict({"epoch": 1})


def rescaled_run(threads, reproducible=True):
    """2 ranks × 2 workers take 30 batches each; rescaled to 3 ranks × 1 worker, which run to the end."""
    states, head = [], []
    for rank in range(2):
        loader = dpipe.Loader(RESCALABLE, seed=11, rank=rank, world_size=2, workers=2, threads=threads)
        it = iter(loader)
        head += [plain(next(it)) for _ in range(30)]
        states.append(pickle.loads(pickle.dumps(loader.state_dict(step=30, reproducible=reproducible))))
    new_states = dpipe.rescale(states, world_size=3, workers=1)
    assert [s["rank"] for s in new_states] == [0, 1, 2] and all(s["step"] == 30 for s in new_states)
    tails = []
    for rank, state in enumerate(new_states):
        loader = dpipe.Loader(RESCALABLE, seed=11, rank=rank, world_size=3, workers=1, threads=threads)
        loader.load_state_dict(state)
        tails.append(run_all(loader))
    return head, tails


def test_rescale_delivers_every_element_once_and_the_same_streams_every_time():
    head, tails = rescaled_run(threads=1)
    seen = [x for b in head for x in b] + [x for t in tails for b in t for x in b]
    assert sorted(seen) == list(range(4000))
    head2, tails2 = rescaled_run(threads=2)
    assert head2 == head and tails2 == tails


def test_the_default_state_is_exact_and_rescales_exactly_once():
    # The default state_dict() keeps what the workers computed ahead, however far timing let them run.
    head, tails = rescaled_run(threads=2, reproducible=False)
    seen = [x for b in head for x in b] + [x for t in tails for b in t for x in b]
    assert sorted(seen) == list(range(4000))


def slow_identity(x):
    import time
    time.sleep(0.0002)  # long enough that the workers are mid-chunk when the state is taken
    return x


@pytest.mark.parametrize("workers", [1, 2])
def test_save_writes_in_the_background_and_load_continues_exactly(tmp, workers):
    p = RESCALABLE | dpipe.map(slow_identity)
    whole = run_all(dpipe.Loader(p, seed=3, workers=workers))
    loader = dpipe.Loader(p, seed=3, workers=workers)
    it = iter(loader)
    head = [plain(next(it)) for _ in range(40)]
    pending = loader.save(tmp / "ckpt", step=40)
    assert isinstance(pending, dpipe.PendingSave)
    assert pending.wait(timeout=60) and pending.done()
    assert [n for n in (tmp / "ckpt").iterdir() if n.name.startswith("rank-0-of-1.w")]
    # The run goes on meanwhile, exactly as without the save.
    assert head + [plain(x) for x in it] == whole
    again = dpipe.Loader(p, seed=3, workers=workers)
    again.load(tmp / "ckpt")
    assert head + run_all(again) == whole
    # Another layout only with rescale=True, reading the elements dealt to this rank.
    other = dpipe.Loader(p, seed=3, rank=0, world_size=2, workers=1)
    with pytest.raises(dpipe.SnapshotError, match="rescale"):
        other.load(tmp / "ckpt")
    tails = []
    for rank in range(2):
        other = dpipe.Loader(p, seed=3, rank=rank, world_size=2, workers=1)
        other.load(tmp / "ckpt", rescale=True)
        tails += run_all(other)
    assert sorted(x for b in head + tails for x in b) == list(range(4000))


def test_a_failed_save_raises_at_wait_and_at_the_next_save(tmp):
    (tmp / "a-file").write_text("not a directory")
    loader = dpipe.Loader(RESCALABLE, seed=3, workers=2)
    it = iter(loader)
    next(it)
    pending = loader.save(tmp / "a-file")
    with pytest.raises(dpipe.SnapshotError, match="cannot create snapshot directory"):
        pending.wait()
    with pytest.raises(dpipe.SnapshotError, match="cannot create snapshot directory"):
        loader.save(tmp / "fine")
    loader.save(tmp / "fine").wait()  # the failure was told once; the next save goes ahead


def test_a_refused_state_leaves_the_loader_on_its_own_epoch():
    other_epoch = dpipe.Loader(CANONICAL, seed=5, epoch=3)
    next(iter(other_epoch))
    foreign = other_epoch.state_dict()
    foreign_seed = dpipe.Loader(CANONICAL, seed=6, epoch=3)
    next(iter(foreign_seed))
    loader = dpipe.Loader(CANONICAL, seed=5, epoch=0)
    with pytest.raises(dpipe.SnapshotError):
        loader.load_state_dict(foreign_seed.state_dict())
    assert loader.epoch == 0
    loader.load_state_dict(foreign)  # a state of this pipeline and seed is taken, with its epoch
    assert loader.epoch == 3


def test_rescale_refuses_a_bad_layout_in_one_short_line():
    loader = dpipe.Loader(dpipe.range(0, 100) | dpipe.sharding_filter(), workers=2)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    for world_size, workers in ((1, 2**31), (0, 1), (2, True), (1.5, 1)):
        with pytest.raises(dpipe.ConfigError) as err:
            dpipe.rescale([state], world_size, workers)
        assert len(str(err.value)) < 200 and "must be an integer from 1 to 2^31 - 1" in str(err.value)
    with pytest.raises(dpipe.SnapshotError, match="5000 workers"):
        dpipe.rescale([state], 1, 5000)  # above the engine's most workers: refused by the engine, named


def test_rescale_deals_elements_equal_steps_carried_to_the_new_ranks():
    states = []
    for rank, carried in ((0, [100]), (1, [101, 102])):
        loader = dpipe.Loader(RESCALABLE, seed=2, rank=rank, world_size=2)
        it = iter(loader)
        next(it)
        state = loader.state_dict()
        state["carried"] = carried  # as equal_steps leaves it when a pass ends early
        states.append(state)
    new = dpipe.rescale(states, world_size=3, workers=1)
    assert [s.get("carried") for s in new] == [[100], [101], [102]]
    assert "carried" not in dpipe.rescale(states[:1] + [dict(states[1], carried=[])], 2, 1)[1]
