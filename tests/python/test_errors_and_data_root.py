"""Mistakes a Python user makes, each a clear error at the call or naming the callable (with its traceback
and the element's index); a lambda's fingerprint holds a digest of its code; and checkpoints that move
with their data (data_root=, file_digest=)."""
import json
import os
import shutil
import subprocess
import sys
import traceback

import numpy as np
import pytest

import dpipe
from conftest import BUILD_ROOT, SOURCE_ROOT, plain


def explode_at(x):
    if x == 7:
        raise ValueError("seven is not welcome")
    return x


def test_a_node_error_names_the_callable_and_the_element_and_keeps_the_traceback():
    for inline in (True, False):
        loader = dpipe.Loader(dpipe.range(0, 20) | dpipe.map(explode_at), inline_workers=inline)
        got = []
        with pytest.raises(dpipe.NodeError) as err:
            for x in loader:
                got.append(x)
        assert got == list(range(7))
        message = str(err.value)
        assert f"{__name__}.explode_at" in message and "on element 7 of its input" in message
        assert message.endswith("counted from the start of its input: 7)"), message  # the element itself, as repr() shows it
        cause = err.value.__cause__
        assert isinstance(cause, ValueError)
        frames = traceback.extract_tb(cause.__traceback__)
        assert any(f.name == "explode_at" and f.filename == __file__ for f in frames), frames


def explode_at_60000(x):
    if x == 60000:
        raise ValueError("60000 is not welcome")
    return x


def input_counts(state):
    """The `input_taken` fields of a state dict's records, by node kind, read by the independent reader."""
    sys.path.insert(0, str(SOURCE_ROOT / "tests" / "integration"))
    import snapshot_reader
    snap = snapshot_reader.read_snapshot(state["dpipe_snapshot"])
    counts = {}
    for record in snap["states"]:
        for f in record["fields"]:
            assert not f["name"].startswith("deferred_"), record  # the node has not met the failure yet
            if f["name"] == "input_taken":
                counts.setdefault(record["kind"], []).append(f["value"])
    return counts


@pytest.mark.parametrize("stage, kind", [
    (lambda p: p | dpipe.map(explode_at_60000), "map"),
    (lambda p: p | dpipe.filter(lambda x: explode_at_60000(x) >= 0), "filter"),
    (lambda p: p | dpipe.flat_map(lambda x: [explode_at_60000(x)]), "flat_map"),
    (lambda p: p | dpipe.parallel_map(explode_at_60000, max_in_flight=4), "parallel_map"),
    (lambda p: p | dpipe.map(double_of) | dpipe.map(halve_and_explode_at_60000), "flat_map"),  # fused into one node
    (lambda p: p.demux(1, lambda x: explode_at_60000(x) * 0)[0], "demux"),
])
def test_the_element_index_of_a_failure_runs_on_across_a_resume_and_restarts_at_a_rescale(stage, kind):
    """A node calling a Python callable saves how many elements of its input it has taken, so a failure after
    a resume names the element's index from the start of its input; a rescale drops the count (no instance of
    another layout had that input), and the message then says it counts from the resume; a snapshot of such
    a run saves no count, so the resume after it says so too."""
    # On the engine's threads the settled snapshot finds the node some 25,000 elements ahead of the consumer.
    def pipeline():  # sampler: a rescalable source
        return stage(dpipe.range(0, 120000) | dpipe.sampler(shuffle="none"))
    for inline in (True, False):
        whole = dpipe.Loader(pipeline(), inline_workers=inline)
        with pytest.raises(dpipe.NodeError, match=r"on element 60000 of its input on this instance, counted from the start of its input: 60000\)"):
            list(whole)
        loader = dpipe.Loader(pipeline(), inline_workers=inline)
        it = iter(loader)
        head = [next(it) for _ in range(100)]
        assert head[:3] == [0, 1, 2]
        state = loader.state_dict()
        counts = input_counts(state)
        assert list(counts) == [kind] and len(counts[kind]) == 1, counts
        assert 100 <= counts[kind][0] < 60000  # mid-stream: taken, not yet at the failing element
        resumed = dpipe.Loader(pipeline(), inline_workers=inline)
        resumed.load_state_dict(state)
        with pytest.raises(dpipe.NodeError, match=r"on element 60000 of its input on this instance, counted from the start of its input: 60000\)"):
            list(resumed)
        if kind == "demux":
            continue  # a demux does not rescale
        rescaled = dpipe.rescale([state], world_size=1, workers=1)[0]
        assert input_counts(rescaled) == {}
        again = dpipe.Loader(pipeline(), inline_workers=inline)
        again.load_state_dict(rescaled)
        expected = 60000 - counts[kind][0]
        with pytest.raises(dpipe.NodeError, match=rf"on element {expected} of its input on this instance, counted from the "
                                                  r"resume \(the snapshot resumed did not record the count\): 60000\)"):
            list(again)
        # A run resumed without a count saves none: the next resume counts from itself, and says so.
        counting = dpipe.Loader(pipeline(), inline_workers=inline)
        counting.load_state_dict(rescaled)
        it = iter(counting)
        assert [next(it) for _ in range(50)] == list(range(100, 150))  # every stage passes its element on
        later = counting.state_dict()
        assert input_counts(later) == {}
        last = dpipe.Loader(pipeline(), inline_workers=inline)
        last.load_state_dict(later)
        with pytest.raises(dpipe.NodeError, match=r"on element \d+ of its input on this instance, counted from the "
                                                  r"resume \(the snapshot resumed did not record the count\): 60000\)"):
            list(last)


def test_the_element_index_counts_the_input_of_the_nodes_own_worker():
    # Worker w of 2 reads the elements i with i mod 2 = w (sharding_filter): 60000 is worker 0's element 30000.
    def pipeline():
        return dpipe.range(0, 120000) | dpipe.sharding_filter() | dpipe.map(explode_at_60000)
    loader = dpipe.Loader(pipeline(), workers=2)
    it = iter(loader)
    for _ in range(300):
        next(it)
    state = loader.state_dict()
    assert all(100 <= n < 30000 for n in input_counts(state)["map"]), input_counts(state)
    resumed = dpipe.Loader(pipeline(), workers=2)
    resumed.load_state_dict(state)
    with pytest.raises(dpipe.NodeError, match=r"on element 30000 of its input on this instance, counted from the start of its input") as err:
        list(resumed)
    assert err.value.worker == 0


def test_a_skipping_map_keeps_its_skip_count_and_its_input_count_and_resumes_exactly():
    def fails_on_thousands(x):
        if x % 1000 == 999:
            raise ValueError(x)
        return x
    def pipeline():
        return dpipe.range(0, 5000) | dpipe.map(fails_on_thousands, on_error="skip") | dpipe.batch(size=10)
    whole = [plain(b) for b in dpipe.Loader(pipeline(), inline_workers=True)]
    loader = dpipe.Loader(pipeline(), inline_workers=True)
    it = iter(loader)
    head = [plain(next(it)) for _ in range(150)]  # past elements 999 and 1999 (inline: pulls of 128)
    state = loader.state_dict()
    sys.path.insert(0, str(SOURCE_ROOT / "tests" / "integration"))
    import snapshot_reader
    record = next(r for r in snapshot_reader.read_snapshot(state["dpipe_snapshot"])["states"] if r["kind"] == "map")
    fields = {f["name"]: f["value"] for f in record["fields"]}
    assert record["mode"] == "hook" and list(fields) == ["skipped", "input_taken"], record
    assert fields["skipped"] == 1 and 1500 <= fields["input_taken"] < 2000, fields
    resumed = dpipe.Loader(pipeline(), inline_workers=True)
    resumed.load_state_dict(state)
    assert head + [plain(b) for b in resumed] == whole
    assert sum(len(b) for b in whole) == 5000 - 5


def test_a_python_made_state_of_format_6_resumes_with_its_nodes_input_counts():
    # Written once by the build that introduced format 6 (tests/python/python_fixture.py); never regenerated.
    import python_fixture
    directory = SOURCE_ROOT / "tests" / "data" / "snapshots" / "v6"
    data = (directory / "python-map.dpipe").read_bytes()
    expected = json.loads((directory / "python-map.expected.json").read_text())
    assert input_counts({"dpipe_snapshot": data}) == {"map": [8 * expected["take"]]}
    shown = json.loads(subprocess.run([str(BUILD_ROOT / "tools" / "dpipe"), "snapshot", "show", str(directory / "python-map.dpipe")],
                                      capture_output=True, text=True, check=True).stdout)
    record = next(r for r in shown["states"] if r["kind"] == "map")
    assert record["mode"] == "stateless" and record["fields"]["input_taken"] == 80, record
    loader = python_fixture.loader()
    loader.load_state_dict({"dpipe_snapshot": data})
    rest, failure = python_fixture.rest_and_failure(iter(loader))
    assert rest == expected["rest"] and len(rest) > 100
    assert failure == expected["failure"] and "on element 1500 of its input on this instance, counted from the start of its input" in failure


def double_of(x):
    return 2 * x


def halve_and_explode_at_60000(x):
    return explode_at_60000(x // 2)


def test_mistakes_at_the_call_are_type_errors_naming_what_is_wrong():
    with pytest.raises(TypeError, match=r"map\(\): out= must be .* got float \(a float result: out=object\)"):
        dpipe.range(0, 3) | dpipe.map(lambda x: x / 2, out=float)
    with pytest.raises(TypeError, match=r"from_vector\(\): values must be .* got a generator object"):
        dpipe.from_vector(x for x in range(3))
    with pytest.raises(TypeError, match=r"generator\(\): fn must be .* got a generator object"):
        dpipe.generator((x for x in range(3)))
    with pytest.raises(TypeError, match=r"map\(\): fn must be .* got a generator object"):
        dpipe.map((x for x in range(3)))
    with pytest.raises(TypeError, match=r"batch\(\): size must be an int, got str"):
        dpipe.batch("8")
    with pytest.raises(TypeError, match=r"lines\(\): files must be a str or a list of str, got int"):
        dpipe.lines(3)
    # What numpy gives is taken as the plain value it stands for.
    batches = dpipe.Loader(dpipe.from_vector(np.arange(4)) | dpipe.batch(np.int64(2)))
    assert [list(b) for b in batches] == [[0, 1], [2, 3]]


def test_results_of_the_wrong_kind_name_the_callable():
    def floats(x):
        return np.array([0.5, 1.5])

    def huge(x):
        return 2 ** 70

    def not_iterable(x):
        return 3

    def vast(x):  # past the 4300 digits Python's str() writes
        return 10 ** 5000

    cases = [
        (dpipe.map(floats, out="batch of integer"), r"floats returned a 1-D array of float64, expected a 1-D integer array"),
        (dpipe.map(huge, out=int), r"huge returned the integer 1180591620717411303424, outside the 64 bits"),
        (dpipe.flat_map(not_iterable), r"not_iterable returned int"),
        (dpipe.map(vast, out=int), r"vast returned the integer of 16610 bits, outside the 64 bits"),
    ]
    for node, pattern in cases:
        with pytest.raises(dpipe.NodeError, match=pattern):
            list(dpipe.Loader(dpipe.range(0, 3) | node, fuse=False))


def test_a_changed_lambda_is_refused_at_resume_unless_the_user_vouches_for_it():
    def pipeline(fn):
        return dpipe.range(0, 50) | dpipe.shuffle(8) | dpipe.map(fn)

    first = dpipe.Loader(pipeline(lambda x: x + 1), seed=3)
    it = iter(first)
    head = [next(it) for _ in range(10)]
    state = first.state_dict()
    assert len(head) == 10
    # The same code (another lambda object) resumes.
    same = dpipe.Loader(pipeline(lambda x: x + 1), seed=3)
    same.load_state_dict(state)
    assert head + list(same) == [x + 1 for x in list(dpipe.Loader(dpipe.range(0, 50) | dpipe.shuffle(8), seed=3))]
    changed = dpipe.Loader(pipeline(lambda x: x + 2), seed=3)
    with pytest.raises(dpipe.SnapshotError, match=r"callable is .*<lambda>#[0-9a-f]{12}, the snapshot has .*same_function"):
        changed.load_state_dict(state)
        list(changed)
    vouched = dpipe.Loader(pipeline(lambda x: x + 2), seed=3, same_function=True)
    vouched.load_state_dict(state)
    assert len(list(vouched)) == 40


def write_text(root, name, lines):
    path = os.path.join(root, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write("".join(f"{line}\n" for line in lines))
    return path


def test_a_state_taken_under_one_data_root_resumes_under_another(tmp_path):
    first, second = tmp_path / "here", tmp_path / "there" / "data"
    write_text(first, "a/x.txt", [f"x{i}" for i in range(100)])
    write_text(first, "y.txt", [f"y{i}" for i in range(80)])

    def pipeline(names):
        return dpipe.lines(names, logical_shards=4) | dpipe.shuffle(16) | dpipe.batch(5)

    everything = list(dpipe.Loader(pipeline(["a/x.txt", "y.txt"]), seed=5, data_root=first))
    loader = dpipe.Loader(pipeline([str(first / "a/x.txt"), str(first / "y.txt")]), seed=5, data_root=first)
    it = iter(loader)
    head = [next(it) for _ in range(11)]
    state = loader.state_dict()
    del it, loader
    second.parent.mkdir()
    os.rename(first, second)  # the same files at another place, with their modification times
    moved = dpipe.Loader(pipeline(["a/x.txt", "y.txt"]), seed=5, data_root=str(second))
    moved.load_state_dict(state)
    assert head + list(moved) == everything
    # Without the root, the absolute names are another pipeline: refused, naming the file.
    elsewhere = dpipe.Loader(pipeline([str(second / "a/x.txt"), str(second / "y.txt")]), seed=5)
    with pytest.raises(dpipe.SnapshotError, match="a/x.txt"):
        elsewhere.load_state_dict(state)
        list(elsewhere)
    # A copy has other modification times: refused as changed data, unless identified by a digest.
    copy = tmp_path / "copy"
    shutil.copytree(second, copy, copy_function=shutil.copy)
    for name in ("a/x.txt", "y.txt"):
        st = os.stat(second / name)
        os.utime(copy / name, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))
    copied = dpipe.Loader(pipeline(["a/x.txt", "y.txt"]), seed=5, data_root=copy)
    with pytest.raises(dpipe.SnapshotError, match="data changed since the snapshot"):
        copied.load_state_dict(state)
        list(copied)
    digests = dpipe.Loader(pipeline(["a/x.txt", "y.txt"]), seed=5, data_root=second, file_digest=True)
    it = iter(digests)
    head = [next(it) for _ in range(4)]
    state = digests.state_dict()
    del it
    resumed = dpipe.Loader(pipeline(["a/x.txt", "y.txt"]), seed=5, data_root=copy, file_digest=True)
    resumed.load_state_dict(state)
    assert head + list(resumed) == everything


def test_a_torch_dataloader_with_its_default_batch_size_warns_and_batch_size_none_does_not():
    import warnings

    import torch

    loader = dpipe.Loader(dpipe.range(0, 4))
    with pytest.warns(UserWarning, match="batch_size=None"):
        got = list(torch.utils.data.DataLoader(loader))
    assert [t.tolist() for t in got] == [[0], [1], [2], [3]]  # what the warning says happens
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert [int(t) for t in torch.utils.data.DataLoader(loader, batch_size=None)] == [0, 1, 2, 3]
        assert [t.tolist() for t in torch.utils.data.DataLoader(loader, batch_size=2)] == [[0, 1], [2, 3]]


def test_parallel_map_runs_a_python_callable_in_order_and_resumes_exactly():
    def pipeline():
        return dpipe.range(0, 300) | dpipe.sharding_filter() | dpipe.shuffle(16) | dpipe.parallel_map(lambda x: (x, x * x), max_in_flight=8,
                                                                            out=object)
    for workers in (1, 2):
        full = list(dpipe.Loader(pipeline(), seed=2, workers=workers))
        assert sorted(full) == [(x, x * x) for x in range(300)]
        loader = dpipe.Loader(pipeline(), seed=2, workers=workers)
        it = iter(loader)
        head = [next(it) for _ in range(101)]
        state = loader.state_dict()
        resumed = dpipe.Loader(pipeline(), seed=2, workers=workers)
        resumed.load_state_dict(state)
        assert head + list(resumed) == full
    # A failure ends the stream after the elements before it, naming the callable and the element.
    loader = dpipe.Loader(dpipe.range(0, 20) | dpipe.parallel_map(explode_at, max_in_flight=4))
    got = []
    with pytest.raises(dpipe.NodeError, match=r"explode_at on element 7 of its input") as err:
        for x in loader:
            got.append(x)
    assert got == list(range(7)) and isinstance(err.value.__cause__, ValueError)
    with pytest.raises(dpipe.ConfigError, match="max_in_flight must be between 1"):
        dpipe.Loader(dpipe.range(0, 3) | dpipe.parallel_map(explode_at, max_in_flight=0))


def test_a_config_error_names_the_node_where_the_user_put_it_though_stages_before_it_fused():
    p = dpipe.range(0, 5) | dpipe.map(explode_at) | dpipe.map(explode_at) | dpipe.batch(0)
    for fuse in (True, False):
        with pytest.raises(dpipe.ConfigError, match=r"^pipeline\[3\] \(batch\): size must be positive"):
            dpipe.Loader(p, fuse=fuse)


def test_a_lambdas_digest_is_the_same_in_every_process():
    import subprocess
    import sys
    code = ("from dpipe import _callables; "
            "print(_callables.label(lambda s: s in {'en', 'de', 'es', 'fr', 'it'}))")
    labels = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                             env={**os.environ, "PYTHONHASHSEED": str(seed)}).stdout for seed in (1, 2, 3)}
    assert len(labels) == 1 and "#" in labels.pop()


def test_a_bool_result_is_the_int_it_is():
    assert list(dpipe.Loader(dpipe.range(0, 4) | dpipe.map(lambda x: x > 1), fuse=False)) == [0, 0, 1, 1]


def test_every_message_names_a_node_by_the_place_the_user_gave_it():
    def ident(x):
        return x

    def wants_big(x):
        return x > -1

    def first_error(pipeline, **options):
        with pytest.raises(dpipe.NodeError) as err:
            list(dpipe.Loader(pipeline, **options))
        return err.value

    # A named node, alone (not fused): its place, kind and name, in the message and in .label.
    e = first_error(dpipe.range(0, 20) | dpipe.map(explode_at, name="fragile"))
    assert e.label == "pipeline[1] (map 'fragile')" and str(e).startswith("pipeline[1] (map 'fragile') failed (worker 0)")
    assert e.node == "fragile"
    # A node after fused stages keeps the place the user gave it; a fused run names its places.
    after = dpipe.range(0, 20) | dpipe.map(ident) | dpipe.filter(wants_big) | dpipe.parallel_map(explode_at)
    for fuse in (True, False):
        assert first_error(after, fuse=fuse).label == "pipeline[3] (parallel_map)"
    inside = dpipe.range(0, 20) | dpipe.map(ident) | dpipe.filter(wants_big) | dpipe.map(explode_at) | dpipe.batch(2)
    e = first_error(inside)  # one node of the graph, which runs the stages as one flat_map
    assert e.label == "pipeline[1..3] (flat_map)" and "map(" in str(e) and "filter(" in str(e)
    assert first_error(inside, fuse=False).label == "pipeline[3] (map)"
    # Inside another input's pipeline, as a spec writes it.
    nested = dpipe.range(0, 20) | dpipe.zip(dpipe.range(0, 20) | dpipe.map(explode_at))
    assert first_error(nested).label == "pipeline[1].with[0][1] (map)"
    # A ConfigError names the same node the same way.
    with pytest.raises(dpipe.ConfigError, match=r"^pipeline\[4\] \(batch\): size must be positive"):
        dpipe.Loader(dpipe.range(0, 20) | dpipe.map(ident) | dpipe.filter(wants_big) | dpipe.map(ident) | dpipe.batch(0))


def test_same_function_on_a_pipeline_without_callables_vouches_for_nothing_and_resumes():
    first = dpipe.Loader(dpipe.range(0, 10) | dpipe.shuffle(4), seed=2)
    it = iter(first)
    head = [next(it) for _ in range(3)]
    state = first.state_dict()
    again = dpipe.Loader(dpipe.range(0, 10) | dpipe.shuffle(4), seed=2, same_function=True)
    again.load_state_dict(state)
    assert head + list(again) == list(dpipe.Loader(dpipe.range(0, 10) | dpipe.shuffle(4), seed=2))
