"""Pipelines from Python: the same node kinds, options and checks as C++, elements as Python sees them,
and the same streams as the tool."""
import inspect
import json
import subprocess
import sys

import numpy as np
import pytest

import dpipe
from conftest import SOURCE_ROOT, plain, semantics_cases, tool_elements


def test_import_does_not_import_torch():
    code = "import sys, dpipe; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


BRANCHING = ("fork", "demux", "unzip")  # Pipeline methods (several outputs); "from" starts their branches


def _function_of(op):
    return getattr(dpipe.Pipeline, op) if op in BRANCHING else getattr(dpipe, op)


def test_every_spec_op_has_a_node_function():
    for op in dpipe._dpipe.spec_ops():
        if op == "from":  # what the outputs of fork, demux and unzip start with
            assert dpipe.range(3).fork(2)[1].spec()["pipeline"][0]["op"] == "from"
            continue
        assert callable(_function_of(op)), op


def test_node_functions_have_the_schemas_signatures():
    import inspect
    sig = inspect.signature(dpipe.batch)
    assert list(sig.parameters) == ["size", "drop_last", "name", "batch_size"]  # torch's name for size last
    assert sig.parameters["size"].default is inspect.Parameter.empty
    assert sig.parameters["drop_last"].default is False
    assert sig.parameters["drop_last"].kind is inspect.Parameter.KEYWORD_ONLY
    assert "elements per batch" in dpipe.batch.__doc__
    # Every parameter of every op's schema is a parameter of its function (other inputs as *inputs).
    for op in json.loads(dpipe._dpipe.spec_ops_json()):
        if op["op"] == "from":
            continue
        params = inspect.signature(_function_of(op["op"])).parameters
        for p in op["params"]:
            assert p["name"] in params or (p["type"] == "list of pipelines" and "inputs" in params), (op["op"], p)
            assert "torch" not in p or params[p["torch"]].kind is inspect.Parameter.KEYWORD_ONLY, (op["op"], p)
    # Positional parameters from the schema: repeat(3), cycle(2), take(3), shuffle(100), dispatch("broadcast").
    assert dpipe.repeat(3).spec()["pipeline"] == [{"op": "repeat", "times": 3}]
    assert dpipe.cycle(2).spec()["pipeline"] == [{"op": "cycle", "count": 2}]
    assert dpipe.shuffle(100).spec()["pipeline"] == [{"op": "shuffle", "buffer": 100}]
    assert list(dpipe.Loader(dpipe.range(3) | dpipe.repeat(2) | dpipe.take(5))) == [0, 0, 1, 1, 2]


def test_an_unknown_keyword_is_a_type_error_at_the_call_naming_it():
    with pytest.raises(TypeError, match="'buffers'.*takes buffer, enabled, name, buffer_size"):
        dpipe.shuffle(buffers=10)
    with pytest.raises(TypeError, match="size"):
        dpipe.batch()  # a required parameter missing
    with pytest.raises(TypeError, match="'mull'.*takes mul, add"):
        dpipe.map("affine", mull=2)
    with pytest.raises(TypeError, match="too many positional"):
        dpipe.take(3, 4)
    with pytest.raises(TypeError, match="'nmae' .map takes fn, field, into, on_error, rng, name; the function 'affine' takes mul, add"):
        dpipe.map("affine", nmae="x")
    with pytest.raises(TypeError, match="concat.. takes one or more other pipelines"):
        dpipe.concat()
    with pytest.raises(dpipe.ConfigError, match="unknown map function 'afine' .known: affine"):
        dpipe.Loader(dpipe.range(3) | dpipe.map("afine"))


def test_pipeline_composes_into_the_tools_spec():
    p = dpipe.range(0, 100) | dpipe.shuffle(buffer=10) | dpipe.sharding_filter() | dpipe.map("affine", mul=2) \
        | dpipe.batch(size=8)
    assert p.spec(seed=4) == {"seed": 4, "pipeline": [
        {"op": "range", "start": 0, "stop": 100}, {"op": "shuffle", "buffer": 10}, {"op": "sharding_filter"},
        {"op": "map", "fn": "affine", "mul": 2}, {"op": "batch", "size": 8}]}
    assert dpipe.range(5).spec() == {"pipeline": [{"op": "range", "stop": 5}]}
    q, seed = dpipe.from_spec(json.dumps(p.spec(seed=4)))
    assert q == p and seed == 4


@pytest.mark.parametrize("workers", [1, 3])
def test_the_canonical_pipeline_matches_the_tool(workers):
    p = dpipe.range(0, 5000) | dpipe.shuffle(buffer=100) | dpipe.sharding_filter() | dpipe.map("affine", mul=2) \
        | dpipe.batch(size=32)
    for rank in range(2):
        got = [plain(b) for b in dpipe.Loader(p, seed=9, rank=rank, world_size=2, workers=workers)]
        assert got == tool_elements(p.spec(seed=9), rank=rank, world_size=2, workers=workers)


@pytest.mark.parametrize("case", semantics_cases(), ids=lambda c: c.name.split(".")[0])
def test_semantics_cases(case):
    c = json.loads(case.read_text())
    layout = c.get("layout", {})
    make = lambda: dpipe.Loader(c["spec"], rank=layout.get("rank", 0), world_size=layout.get("world_size", 1),
                                workers=layout.get("num_workers", 1))
    if "error" in c:
        with pytest.raises(dpipe.ConfigError, match=None) as err:
            list(make())
        assert c["error"] in str(err.value)
    else:
        assert [plain(x) for x in make()] == c["expected"]


def test_a_config_error_names_the_position_and_the_node():
    with pytest.raises(dpipe.ConfigError, match=r"pipeline\[2\] \(batch\): size must be positive, got 0"):
        dpipe.Loader(dpipe.range(10) | dpipe.map("affine", mul=1) | dpipe.batch(size=0))
    with pytest.raises(dpipe.ConfigError, match="unknown op"):
        dpipe.Loader({"pipeline": [{"op": "range", "stop": 3}, {"op": "nope"}]})
    with pytest.raises(dpipe.ConfigError, match="a source"):
        dpipe.range(3) | dpipe.range(4)
    with pytest.raises(TypeError):
        dpipe.batch(1, 2)
    assert issubclass(dpipe.ConfigError, dpipe.Error) and issubclass(dpipe.SnapshotError, dpipe.Error)


def test_scalars_are_ints_and_strings_are_str(tmp):
    assert list(dpipe.Loader(dpipe.range(3))) == [0, 1, 2]
    assert all(type(x) is int for x in dpipe.Loader(dpipe.range(3)))
    f = tmp / "a.txt"
    f.write_text("héllo\nworld\n")
    got = list(dpipe.Loader(dpipe.lines(files=[str(f)])))  # logical shards in a shuffled order
    assert sorted(got) == ["héllo", "world"] and all(type(x) is str for x in got)
    batches = [plain(b) for b in dpipe.Loader(dpipe.lines(files=str(f)) | dpipe.batch(size=2))]
    assert len(batches) == 1 and sorted(batches[0]) == ["héllo", "world"]


def test_records_are_bytes(tmp):
    path = tmp / "r.rec"
    payloads = [b"\x00\xff binary", b"", b"text"]
    dpipe.write_records(str(path), payloads)
    got = list(dpipe.Loader(dpipe.records(files=[str(path)])))
    assert got == payloads and all(type(x) is bytes for x in got)
    # Through a sampler and in batches: lists of bytes.
    got = list(dpipe.Loader(dpipe.records(str(path)) | dpipe.sampler() | dpipe.batch(size=3)))
    assert len(got) == 1 and sorted(got[0]) == sorted(payloads)


def test_batches_of_integers_are_int64_arrays_over_the_cpp_buffer():
    batches = list(dpipe.Loader(dpipe.range(10) | dpipe.batch(size=4)))
    assert [b.tolist() for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    for b in batches:
        assert isinstance(b, np.ndarray) and b.dtype == np.int64 and b.ndim == 1
        assert not b.flags["OWNDATA"] and b.flags["C_CONTIGUOUS"]  # a view of the C++ vector


def test_token_windows_batch_into_one_contiguous_2d_array(tmp):
    tokens = np.arange(1000, dtype=np.uint16)
    path = tmp / "tokens.bin"
    tokens.tofile(path)
    windows = dpipe.token_windows(files=[str(path)], dtype="uint16", seq_len=8)
    p = windows | dpipe.sampler() | dpipe.batch(size=4)
    batches = list(dpipe.Loader(p, seed=1))
    first = batches[0]
    assert first.shape == (4, 9) and first.dtype == np.int64 and first.flags["C_CONTIGUOUS"]
    for row in first:  # each window is L+1 consecutive tokens
        assert (np.diff(row) == 1).all()
    assert sum(len(b) for b in batches) == len(tool_elements(windows.spec()))
    # map("stack") makes the 2-D array on the worker threads; dtype="uint16" keeps the tokens' own type.
    stacked = list(dpipe.Loader(p | dpipe.map("stack"), seed=1))
    assert len(stacked) == len(batches)
    assert all(s.dtype == np.int64 and s.flags["C_CONTIGUOUS"] and s.shape[1] == 9 for s in stacked)
    # Node keys count from the output, so one more node draws another order: the same windows, though.
    rows = lambda bs: sorted(map(tuple, np.concatenate(bs).tolist()))  # noqa: E731
    assert rows(stacked) == rows(batches)
    raw = list(dpipe.Loader(p | dpipe.map("stack", dtype="uint16"), seed=1))
    assert all(r.dtype == np.uint16 and (r.astype(np.int64) == b).all() for r, b in zip(raw, stacked))
    with pytest.raises(dpipe.ConfigError, match="dtype must be one of"):
        dpipe.Loader(p | dpipe.map("stack", dtype="float32"))
    with pytest.raises(dpipe.NodeError, match="does not fit"):
        list(dpipe.Loader(dpipe.range(300, 310) | dpipe.batch(size=2) | dpipe.batch(size=2)
                          | dpipe.map("stack", dtype="uint8")))


def test_nodes_with_several_inputs_take_pipelines():
    p = dpipe.range(0, 3) | dpipe.concat(dpipe.range(10, 12), dpipe.range(20, 21))
    assert list(dpipe.Loader(p)) == [0, 1, 2, 10, 11, 20]
    assert p.spec()["pipeline"][1] == {"op": "concat", "with": [[{"op": "range", "start": 10, "stop": 12}],
                                                                [{"op": "range", "start": 20, "stop": 21}]]}
    z = dpipe.range(0, 3) | dpipe.mux(with_=[dpipe.range(10, 13)])
    assert list(dpipe.Loader(z)) == tool_elements(z.spec())


def test_torch_style_defaults_take_none_shuffle_buffer_and_flatten():
    # take(None): no limit (torch's header(None)); the spec has no take node then.
    p = dpipe.range(0, 7) | dpipe.take(None)
    assert list(dpipe.Loader(p)) == list(range(7))
    assert list(dpipe.Loader(dpipe.range(0, 7) | dpipe.take(3))) == [0, 1, 2]
    # shuffle() holds 10,000 elements, as torch's and the C++ default: 30 elements are one buffer.
    s = dpipe.range(0, 30) | dpipe.shuffle()
    got = list(dpipe.Loader(s, seed=4))
    assert sorted(got) == list(range(30)) and got != list(range(30))
    assert got == list(dpipe.Loader(dpipe.range(0, 30) | dpipe.shuffle(10000), seed=4))
    # flat_map() without a function flattens lists (torch's flatmap()).
    f = dpipe.range(0, 7) | dpipe.batch(3) | dpipe.flat_map()
    assert list(dpipe.Loader(f)) == list(range(7))
    assert list(dpipe.Loader(f)) == tool_elements(f.spec())
    with pytest.raises(dpipe.ConfigError, match="flattens lists"):
        dpipe.Loader(dpipe.range(0, 3) | dpipe.flat_map())


def test_torchs_parameter_names_are_taken_too_and_make_the_same_spec():
    assert dpipe.shuffle(buffer_size=7) == dpipe.shuffle(buffer=7)
    assert dpipe.batch(batch_size=4, drop_last=True) == dpipe.batch(4, drop_last=True)
    assert dpipe.unbatch(unbatch_level=-1) == dpipe.unbatch(level=-1)
    assert dpipe.map("affine", input_col="x", output_col="y", mul=2) == dpipe.map("affine", field="x", into="y", mul=2)
    assert dpipe.filter(bool, input_col="x").spec()["pipeline"][0]["op"] == "filter"
    records = dpipe.range(0, 6) | dpipe.map(lambda i: {"x": i}, out=object)
    doubled = records | dpipe.map(lambda v: 2 * v, input_col="x", output_col="y")
    assert [r["y"] for r in dpipe.Loader(doubled)] == [0, 2, 4, 6, 8, 10]
    for call in (lambda: dpipe.shuffle(10, buffer_size=10), lambda: dpipe.shuffle(buffer=10, buffer_size=10)):
        with pytest.raises(TypeError, match="buffer twice: as buffer and as torch's buffer_size"):
            call()
    assert "buffer_size" in str(inspect.signature(dpipe.shuffle))


def test_unbatch_levels_as_torchs_unbatch_level():
    nested = dpipe.range(0, 12) | dpipe.batch(3) | dpipe.batch(2)
    assert list(dpipe.Loader(nested | dpipe.unbatch(level=2))) == list(range(12))
    assert list(dpipe.Loader(nested | dpipe.unbatch(level=-1))) == list(range(12))
    assert [plain(x) for x in dpipe.Loader(nested | dpipe.unbatch())] == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, 11]]
    assert len(list(dpipe.Loader(nested | dpipe.unbatch(level=0)))) == 2
    p = nested | dpipe.unbatch(level=-1)
    assert list(dpipe.Loader(p)) == tool_elements(p.spec())
    with pytest.raises(dpipe.ConfigError, match="level 3 needs 3 levels of batches, its input has 2"):
        dpipe.Loader(nested | dpipe.unbatch(level=3))
    with pytest.raises(dpipe.ConfigError, match="level must be -1"):
        dpipe.Loader(nested | dpipe.unbatch(level=-2))
    with pytest.raises(dpipe.ConfigError, match="unbatch takes batches"):
        dpipe.Loader(dpipe.range(0, 3) | dpipe.unbatch(level=-1))


def test_zip_rows_are_tuples_where_they_are_elements():
    z = dpipe.range(0, 3) | dpipe.zip(dpipe.range(10, 13))
    rows = list(dpipe.Loader(z))
    assert rows == [(0, 10), (1, 11), (2, 12)] and all(type(r) is tuple and type(r[0]) is int for r in rows)
    assert list(dpipe.Loader(dpipe.from_vector(values=["a", "b"]) | dpipe.zip(dpipe.from_vector(values=["c", "d"])))) \
        == [("a", "c"), ("b", "d")]
    # Through the nodes that keep the type, and into a Python callable, a row stays a tuple.
    seen = []
    kept = z | dpipe.shuffle(buffer=2) | dpipe.filter(lambda t: seen.append(type(t)) or True) | dpipe.take(count=3)
    assert sorted(dpipe.Loader(kept, seed=4)) == rows and set(seen) == {tuple}
    assert list(dpipe.Loader(z | dpipe.map(lambda t: t[0] + t[1], out=int))) == [10, 12, 14]
    assert list(dpipe.Loader(z | dpipe.batch(size=2) | dpipe.unbatch())) == rows
    # A batch of rows is a 2-D array like any batch of equal-length rows.
    batches = list(dpipe.Loader(z | dpipe.batch(size=2)))
    assert [b.tolist() for b in batches] == [[[0, 10], [1, 11]], [[2, 12]]]
    # The tool shows rows as JSON arrays: the same values.
    assert [list(r) for r in rows] == tool_elements(z.spec())
    # A state taken mid-stream continues with tuples.
    loader = dpipe.Loader(z)
    it = iter(loader)
    next(it)
    again = dpipe.Loader(z)
    again.load_state_dict(loader.state_dict())
    assert list(again) == rows[1:]


def test_a_shuffle_keeps_its_order_when_nodes_are_added_after_it():
    p = dpipe.range(50) | dpipe.shuffle(buffer=100)
    order = list(dpipe.Loader(p, seed=3))
    assert sorted(order) == list(range(50)) and order != list(range(50))
    assert list(dpipe.Loader(p | dpipe.prefetch(4), seed=3)) == order
    assert [x for b in dpipe.Loader(p | dpipe.batch(4), seed=3) for x in b] == order
    # A name fixes the order whatever lies upstream.
    named = list(dpipe.Loader(dpipe.range(50) | dpipe.shuffle(buffer=100, name="s"), seed=3))
    assert list(dpipe.Loader(dpipe.range(50) | dpipe.map(lambda x: x) | dpipe.shuffle(buffer=100, name="s"),
                             seed=3)) == named


def test_len_of_a_loader_is_what_each_rank_delivers_when_every_node_can_say(tmp_path):
    pipelines = {
        "sharded batches": dpipe.range(103) | dpipe.sharding_filter() | dpipe.batch(8),
        "sharded full batches": dpipe.range(103) | dpipe.sharding_filter() | dpipe.batch(8, drop_last=True),
        "sampler of two epochs, take": dpipe.range(3, 50, 2) | dpipe.sampler(epochs=2) | dpipe.take(9)
        | dpipe.map(lambda x: x + 1),
        "by the ranks, then the workers": dpipe.range(-40, 0) | dpipe.sharding_filter(level="rank")
        | dpipe.sharding_filter(level="worker") | dpipe.shuffle(buffer=5) | dpipe.repeat(2) | dpipe.skip(3),
        "by hand": dpipe.range(31) | dpipe.sharding_filter(num_shards=4, shard_id=3) | dpipe.cycle(3),
        "concat and zip": dpipe.range(10) | dpipe.sampler() | dpipe.concat(dpipe.range(7) | dpipe.sampler())
        | dpipe.zip(dpipe.range(100) | dpipe.sampler()) | dpipe.batch(3),
        "read in full by every worker": dpipe.range(5) | dpipe.replicate() | dpipe.prefetch(2),
        "merged, then batched": dpipe.range(77) | dpipe.sampler() | dpipe.merge() | dpipe.batch(10),
    }
    for name, p in pipelines.items():
        for world, workers in [(1, 1), (3, 2), (2, 3)]:
            for rank in range(world):
                loader = dpipe.Loader(p, rank=rank, world_size=world, workers=workers, seed=5)
                assert len(loader) == len(list(loader)), (name, rank, world, workers)
    assert len(dpipe.Loader(dpipe.range(0), workers=2)) == 0
    # A node that cannot say makes len() a TypeError naming it; the loader still iterates.
    unknown = dpipe.Loader(dpipe.range(10) | dpipe.filter(lambda x: x % 2) | dpipe.batch(2, name="b"))
    with pytest.raises(TypeError, match=r"unknown: pipeline\[1\] \(filter\) cannot say how many elements"):
        len(unknown)
    assert len(list(unknown)) == 3
    path = tmp_path / "a.txt"
    path.write_text("x\ny\n")
    with pytest.raises(TypeError, match=r"\(lines\) cannot say"):
        len(dpipe.Loader(dpipe.lines(str(path))))
    with pytest.raises(TypeError, match=r"\(cycle\) cannot say"):
        len(dpipe.Loader(dpipe.range(3) | dpipe.cycle()))
    with pytest.raises(TypeError, match=r"\(map\) cannot say"):
        len(dpipe.Loader(dpipe.range(3) | dpipe.map(lambda x: x, on_error="skip")))


def test_the_package_says_its_version_and_lists_the_loader():
    # The extension is compiled with the project's version, the one libdpipe's pkg-config file gives.
    meson_build = (SOURCE_ROOT / "meson.build").read_text()
    version = meson_build.split("version : '", 1)[1].split("'", 1)[0]
    assert dpipe.__version__ == version
    assert "Loader" in dir(dpipe) and "batch" in dir(dpipe)


def _resumed_everywhere(make, workers):
    """Every breakpoint: the elements before it, then a new Loader loaded with the state taken there."""
    whole = [plain(x) for x in dpipe.Loader(make(), seed=4, workers=workers)]
    for at in range(len(whole) + 1):
        loader = dpipe.Loader(make(), seed=4, workers=workers)
        it = iter(loader)
        head = [plain(next(it)) for _ in range(at)]
        again = dpipe.Loader(make(), seed=4, workers=workers)
        again.load_state_dict(loader.state_dict())
        assert head + [plain(x) for x in again] == whole, f"{workers} workers, breakpoint {at}"
    return whole


def test_fork_demux_and_unzip_as_torchs_and_resumed_at_every_element():
    a, b = dpipe.range(10).fork(2)
    assert list(dpipe.Loader(a | dpipe.map(lambda x: x * 2) | dpipe.zip(b))) == [(2 * i, i) for i in range(10)]
    # The branch may come first: the chain with the fork is built ahead.
    assert list(dpipe.Loader(b | dpipe.zip(a))) == [(i, i) for i in range(10)]
    assert len(dpipe.Loader(a | dpipe.concat(b))) == 20
    evens, odds = dpipe.range(10).demux(2, lambda x: x % 2)
    assert list(dpipe.Loader(odds | dpipe.concat(evens))) == [1, 3, 5, 7, 9, 0, 2, 4, 6, 8]
    with pytest.raises(TypeError, match=r"pipeline\[1\] \(demux 'demux-[0-9a-f]+'\) cannot say"):
        len(dpipe.Loader(evens | dpipe.concat(odds)))
    left, right = (dpipe.range(6) | dpipe.zip(dpipe.range(10, 16))).unzip(2)
    assert list(dpipe.Loader(right | dpipe.concat(left))) == [10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5]
    # Rows of a zip keep being tuples through a fork.
    r1, r2 = (dpipe.range(3) | dpipe.zip(dpipe.range(3))).fork(2)
    assert list(dpipe.Loader(r1 | dpipe.concat(r2))) == [(0, 0), (1, 1), (2, 2)] * 2

    def forked():
        x, y, z = (dpipe.range(40) | dpipe.sharding_filter() | dpipe.shuffle(buffer=6)).fork(3, name="f")
        return x | dpipe.zip(y | dpipe.map(lambda v: v + 100)) | dpipe.concat(z | dpipe.batch(2))

    def demuxed():
        x, y, z = (dpipe.range(45) | dpipe.sharding_filter()).demux(3, lambda v: v % 3, buffer=60)
        return y | dpipe.concat(x | dpipe.shuffle(buffer=4), z)

    for workers in (1, 2):
        assert len(_resumed_everywhere(forked, workers)) == 60
        assert sorted(_resumed_everywhere(demuxed, workers)) == list(range(45))


def test_a_branch_never_read_and_a_buffer_too_small_are_errors_naming_the_node():
    a, b, c = dpipe.range(10).fork(3, name="f")
    with pytest.raises(dpipe.ConfigError, match=r"^pipeline\[1\] \(fork 'f'\): output 2 is never read"):
        list(dpipe.Loader(a | dpipe.zip(b)))
    x, y = dpipe.range(100).fork(2, buffer=10, name="g")
    with pytest.raises(dpipe.Error, match=r"^pipeline\[\d+\] \(fork 'g'\): output 0 is 11 elements ahead of output 1"):
        list(dpipe.Loader(x | dpipe.concat(y)))
    p, q = dpipe.range(10).demux(2, lambda v: 5)
    with pytest.raises(dpipe.Error, match="its function returned 5 for an element; the outputs are 0 to 1"):
        list(dpipe.Loader(p | dpipe.concat(q)))
    with pytest.raises(TypeError, match="needs count"):
        dpipe.range(3).fork(None)


def test_an_iteration_that_delivers_nothing_warns_once(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    with pytest.warns(RuntimeWarning, match="delivered no element"):
        assert list(dpipe.Loader(dpipe.lines(str(empty)))) == []
    loader = dpipe.Loader(dpipe.range(0, 5) | dpipe.filter(lambda x: x > 9))
    it = iter(loader)
    with pytest.warns(RuntimeWarning, match="every element filtered out"):
        assert list(it) == []
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert list(it) == []  # once per iteration
        # A state taken at the end of an epoch resumes to nothing more, without a warning: it delivered.
        done = dpipe.Loader(dpipe.range(0, 3))
        assert list(done) == [0, 1, 2]
        again = dpipe.Loader(dpipe.range(0, 3))
        again.load_state_dict(done.state_dict())
        assert list(again) == []
