"""Loader: runs a pipeline for a training loop, on dpipe's own engine threads, and saves and restores
its exact position with the StatefulDataLoader protocol (state_dict / load_state_dict)."""

import atexit
import collections
import itertools
import json
import os
import sys
import weakref

from . import _dpipe
from . import _fuse
from . import _nodes
from ._nodes import Pipeline, from_spec

# Every run this process started and still alive. Before the interpreter finalizes, each stops and joins
# its workers: a worker computing ahead in a Python callable would otherwise ask for the GIL during
# finalization, which ends its thread by force inside the engine (an abort). Loops a script left behind
# (a module global, an iterator after a break, an exception or sys.exit) would be freed only then.
_LIVE_LOOPS = weakref.WeakSet()


def _stop_live_loops():
    for loop in list(_LIVE_LOOPS):
        loop.invalidate("this dpipe iterator was stopped: the interpreter is exiting")


atexit.register(_stop_live_loops)

STATE_KEY = "dpipe_snapshot"
CARRY_KEY = "carried"  # equal_steps: elements a pass cut off, delivered first by the next
_END = object()


def _layout_from_environment():
    """(rank, world_size) from torch.distributed when it is initialized, else RANK/WORLD_SIZE, else Open
    MPI's variables, else (0, 1). torch is looked at only if the program imported it."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    for rank_var, size_var in (("RANK", "WORLD_SIZE"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE")):
        if rank_var in os.environ and size_var in os.environ:
            return int(os.environ[rank_var]), int(os.environ[size_var])
    return 0, 1


def _refuse_torch_workers():
    torch_data = sys.modules.get("torch.utils.data")
    if torch_data is not None and torch_data.get_worker_info() is not None:
        raise _dpipe.ConfigError(
            "a dpipe Loader runs its own workers: wrap it in torch.utils.data.DataLoader(loader, "
            "batch_size=None) with num_workers=0, and set Loader(workers=...) instead")


def _warn_torch_batching():
    """torch's DataLoader(loader) batches by default (batch_size=1): each of dpipe's elements would come
    wrapped in a batch of one, a leading dimension the user rarely means. Its iterator is being built a
    few frames up: found there, that default is named in a warning."""
    torch_data = sys.modules.get("torch.utils.data")
    if torch_data is None:
        return
    try:
        frame = sys._getframe(2)
    except (AttributeError, ValueError):  # an interpreter without frames, or a shallower stack
        return
    for _ in range(8):
        if frame is None:
            return
        for value in (frame.f_locals.get("loader"), frame.f_locals.get("self")):
            if isinstance(value, torch_data.DataLoader):
                if value.batch_size == 1 and value.batch_sampler is not None:
                    import warnings
                    warnings.warn("torch.utils.data.DataLoader(loader) batches dpipe's elements again: with its "
                                  "default batch_size=1 each element gets a leading dimension of 1. Pass "
                                  "batch_size=None (dpipe batches with dpipe.batch)", UserWarning, stacklevel=2)
                return
        frame = frame.f_back


def _has_op(nodes, op):
    """Whether a node of `nodes` (a spec's list, other inputs included) is an `op`."""
    for node in nodes:
        if not isinstance(node, dict):
            continue
        if node.get("op") == op:
            return True
        for value in node.values():
            if isinstance(value, list) and any(isinstance(v, list) and _has_op(v, op) for v in value):
                return True
    return False


class LoaderBase:
    """An iterable over a pipeline's elements for this rank.

    Loader(pipeline, seed=None, rank=None, world_size=None, workers=1, threads=0, epoch=0,
           allow_changed_data=False, equal_steps=False, inline_workers=None, override=(), fuse=True,
           data_root=None, file_digest=False, same_function=False, provenance=False, restore_keys=False)

    `pipeline` is a dpipe.Pipeline, or a spec (dict or JSON text). seed None: the spec's seed, else 0.
    rank/world_size None: from torch.distributed when initialized, else RANK/WORLD_SIZE or Open MPI's
    variables. `workers`: the pipeline's worker instances on this rank; `threads`: engine threads (0: one
    per core); `inline_workers`: True runs the workers in the consumer's thread, inside next() (no hand-off
    between threads, but nothing overlaps with the training step); False on the engine's threads; None,
    the default: for Python callables on one worker without parallel_map, inline while the loop's steps
    are short or busy on the CPU and on an engine thread while they sleep or wait (a GPU step), else on
    the engine's threads; `fuse`: run adjacent Python stages (map, filter, flat_map) as one node, objects passing
    between them unconverted (False: one node each, as in specs and pipelines of earlier versions);
    `data_root`: the directory the file sources' relative names are resolved against; files under it
    are recorded in states by their names relative to it, so a state resumes under another root (the
    same files mounted elsewhere). `file_digest`: identify data files by a digest of their bytes (read
    once when the Loader is made) instead of their modification time, so copies resume too.
    `same_function`: a loaded state was taken with other Python callables (a lambda whose code changed,
    a function renamed) that compute the same: True for every node, or the keys or names of the nodes.
    `provenance`: carry each element's source positions, for `provenance()` (every node must carry them:
    docs/design.md, "Provenance"); the stream is the same.
    `restore_keys`: states hold each buffered element (shuffle buffers, partial batches, worker queues)
    as the source positions it was made from and a checksum, not its bytes, where the nodes between it
    and its source can make it again (maps, filters, Python callables; not a generator); loading the
    state makes them again. States then weigh a few dozen bytes per buffered element whatever its size.
    Implies provenance tracing (every node must carry it); the stream is the same.
    `override`: semantic parameters a loaded state may differ in, the
    pipeline giving the new values (mix's "weights", or "KEY.weights" for one node; recorded in later
    states' metadata as dpipe.overrides). iter(loader) continues from a state loaded since the last iteration, else starts the
    pipeline from its beginning (of epoch `loader.epoch`)."""

    def __init__(self, pipeline, seed=None, rank=None, world_size=None, workers=1, threads=0, epoch=0,
                 allow_changed_data=False, equal_steps=False, inline_workers=None, override=(), fuse=True,
                 data_root=None, file_digest=False, same_function=False, provenance=False, restore_keys=False):
        spec_seed = None
        if not isinstance(pipeline, Pipeline):
            pipeline, spec_seed = from_spec(pipeline)
        self.pipeline = pipeline
        given, given_callables = pipeline.spec()["pipeline"], pipeline._callables
        data = (os.fspath(data_root) if data_root is not None else "", bool(file_digest))

        def build(nodes, callables, places):
            tuple_inputs = set()
            rows = _nodes.zip_rows(nodes, tuple_inputs)
            return _dpipe.build(json.dumps({"pipeline": nodes}), callables, tuple_inputs, rows == 0, *data, places)

        # Fused, each node carries the place the user gave it, which every message names it by.
        nodes, callables = _fuse.fuse(given, given_callables) if fuse else (given, given_callables)
        self._built = build(nodes, callables, fuse)
        if (rank is None) != (world_size is None):
            raise _dpipe.ConfigError("give both rank and world_size, or neither")
        if rank is None:
            rank, world_size = _layout_from_environment()
        options = _dpipe.LoopOptions()
        options.seed = int(seed if seed is not None else (spec_seed or 0))
        options.epoch = int(epoch)
        options.rank, options.world_size, options.workers = int(rank), int(world_size), int(workers)
        options.threads = int(threads)
        if inline_workers is None:  # Python callables with one worker: inline while the loop's steps are short
            # or hold the GIL, on an engine thread while they sleep or wait (a training step), so the next
            # batch is made meanwhile; a parallel_map overlaps its calls on the engine's threads anyway
            options.adaptive_workers = (int(workers) == 1 and bool(callables)
                                        and not _has_op(nodes, "parallel_map"))
            inline_workers = False
        options.inline_workers = bool(inline_workers)
        options.trace = bool(provenance) or bool(restore_keys)
        self._options = options
        self._allow_changed_data = bool(allow_changed_data)
        self._overrides = [override] if isinstance(override, str) else [str(o) for o in override]
        if same_function is True:
            if given_callables:  # else no node has a function to vouch for
                self._overrides.append("callable")
        elif same_function:
            names = [same_function] if isinstance(same_function, str) else list(same_function)
            self._overrides += [f"{n}.callable" for n in names]
        self._equal_steps = bool(equal_steps)
        if self._equal_steps and options.trace:
            raise _dpipe.ConfigError("provenance with equal_steps is not available yet (the elements carried "
                                     "between passes keep none)")
        if self._equal_steps:
            dist = sys.modules.get("torch.distributed")
            if dist is None or not dist.is_initialized():
                raise _dpipe.ConfigError("equal_steps needs torch.distributed initialized (the ranks agree "
                                         "through it when to stop)")
        #: With equal_steps: elements this rank held when another rank ran out, not delivered in the
        #: last pass. They are carried: the next pass delivers them first, before its own elements.
        self.undelivered = 0
        self._carry = collections.deque()  # the elements carried over, as Python values
        self._loop = None       # the run the last iterator drew from
        self._restored = None   # a run restored by load_state_dict, not iterated yet
        self._pending_save = None  # the last save() (its write may be under way)

    # ---- the layout and the epoch ----
    @property
    def seed(self):
        return self._options.seed

    @property
    def rank(self):
        return self._options.rank

    @property
    def world_size(self):
        return self._options.world_size

    @property
    def workers(self):
        return self._options.workers

    @property
    def epoch(self):
        return self._options.epoch

    def set_epoch(self, epoch):
        """The epoch the next fresh iteration runs (every random node reshuffles per epoch). A state
        loaded since the last iteration is continued only if `epoch` is its epoch; another epoch starts
        afresh (so a loop that calls set_epoch(e) first resumes mid-epoch e and begins e + 1 anew)."""
        epoch = int(epoch)
        if self._restored is not None and epoch != self._options.epoch:
            self._restored = None
        self._options.epoch = epoch

    @property
    def element_type(self):
        """What the pipeline yields: "integer", "string", "batch of integer", ..."""
        return self._built.element_type

    @property
    def warnings(self):
        """What the run delivers that may not be meant (a source every worker reads in full, ...)."""
        loop = self._restored or self._loop or self._start(None)
        return list(loop.warnings)

    def provenance(self):
        """The source positions the last element delivered was made from, as `dpipe run --provenance`
        writes them: [[source, position], ...] (source: the node's name, or its key), an entry with
        {"epoch": E, "offsets": [...]} when it has them, None in place of a base element a loaded state held
        as data (a state of restore keys gives its elements theirs back). None before the first element.
        Needs Loader(provenance=True) or restore_keys=True."""
        if not self._options.trace:
            raise _dpipe.ConfigError("provenance() needs Loader(..., provenance=True)")
        return self._loop.provenance() if self._loop is not None else None

    def skipped(self):
        """Elements dropped as bad by nodes with on_error="skip" (parse_json, tokenize, records, map, filter,
        flat_map), by node key: a dict of counts, kept across state_dict() / load_state_dict(). Empty
        before iteration."""
        loop = self._restored or self._loop
        return dict(loop.skipped()) if loop is not None else {}

    def __len__(self):
        """Elements this rank delivers in a fresh epoch, when every node can say (sources know their
        size; batch, take, sharding_filter, zip, ... carry it on): else TypeError naming the node that
        cannot (a filter, a file source). With equal_steps, the fewest any rank has."""
        ranks = range(self.world_size) if self._equal_steps else [self.rank]
        counts = []
        for rank in ranks:
            n, why = self._built.length(rank, self.world_size, self.workers)
            if n is None:
                raise TypeError(f"len() of this Loader is unknown: {why}")
            counts.append(n)
        if self._equal_steps and self._carry:
            raise TypeError("len() of this Loader is unknown: elements carried from the last pass come first, "
                            "and how many the other ranks carry is theirs to know")
        return min(counts)

    # ---- iteration ----
    def _start(self, state):
        loop = _dpipe.start(self._built, self._options, state, self._allow_changed_data, self._overrides)
        _LIVE_LOOPS.add(loop)
        return loop

    def __iter__(self):
        _refuse_torch_workers()
        _warn_torch_batching()
        loop, self._restored = self._restored, None
        if loop is None:
            loop = self._start(None)
        self._retire(self._loop, "a later iter(loader) took its place")
        self._loop = loop
        if self._equal_steps:
            return self._equal_step_elements(loop)
        return loop

    @staticmethod
    def _retire(loop, why):
        """A loader serves one iterator at a time, the one its state_dict() describes: an older one stops
        now and raises on its next next(), instead of going on with a stream no state describes."""
        if loop is not None:
            loop.invalidate("this dpipe iterator was invalidated: " + why + " (a Loader serves one "
                            "iterator at a time, the one state_dict() describes)")

    def _equal_step_elements(self, loop):
        """Every rank yields the same number of elements: before each, the ranks agree (an all-reduce of
        one integer) whether all of them have one; when any has run out, all stop, and each keeps what it
        still held (counted in `undelivered`) to deliver first in the next pass. Uneven ranks would
        otherwise hang DDP's all-reduce."""
        import torch
        import torch.distributed as dist
        if self._loop is not loop:  # retired before its first next(): raises, touching nothing
            next(loop)
        self.undelivered = 0
        carry = self._carry
        flag = torch.zeros(1, dtype=torch.int64)
        while True:
            if self._loop is not loop:  # retired (a later iter(), load_state_dict()): raises naming why
                next(loop)
            if carry:  # left from the last pass: delivered first (popped when yielded, for state_dict)
                x = carry[0]
            else:
                x = next(loop, _END)
            flag[0] = 0 if x is _END else 1
            dist.all_reduce(flag, op=dist.ReduceOp.MIN)
            if flag[0] == 0:
                if x is not _END:
                    if not carry:
                        carry.append(x)
                    carry.extend(loop)  # the rest of this run: one rank's imbalance, a few elements
                self.undelivered = len(carry)
                return
            if carry:
                carry.popleft()
            yield x

    # ---- the StatefulDataLoader protocol ----
    def state_dict(self, step=None, reproducible=False):
        """The position after the last element delivered, as plain Python values (pickle and torch.save
        keep it): the snapshot's bytes and what they hold, readable. Exact: a resume on the same layout
        delivers what this run would have delivered next, and dpipe.rescale of every rank's states
        delivers each element once. The pause is one chunk of work under way at most: the workers keep
        what they computed ahead, in the state. `reproducible=True` first brings every worker to a point
        that timing does not decide (its queue filled to a fixed depth, which costs that many elements'
        work on this thread), so that rescaled states give the same streams on every run; inline, a state
        is one already (after a Ctrl-C it holds fewer elements computed ahead: exact, other bytes)."""
        loop = self._live_loop()
        data, out = loop.snapshot(bool(reproducible) and not self._options.inline_workers, step)
        out[STATE_KEY] = data
        out["element_type"] = self.element_type
        if self._carry:  # equal_steps' elements held for the next pass, as the Python values they are
            out[CARRY_KEY] = list(self._carry)
        return out

    def save(self, directory, step=None):
        """Writes this rank's file of the snapshot set in `directory` (created if needed;
        rank-R-of-W.wK[.sS].TAG.dpipe, as C++'s SnapshotSet::write_rank) on a background thread: this call
        takes the exact state (as state_dict() does) and returns a dpipe.PendingSave at once; the encoding,
        write, fsync and rename happen meanwhile, one write after another in the order they were asked
        for. `wait()` on it raises the write's error; a failed earlier save raises at the next save().
        A crash mid-write leaves the last complete file. Resume with load(directory)."""
        if self._carry:
            raise _dpipe.ConfigError("save(): this loader carries elements equal_steps cut off, which a set file "
                                     "does not hold; use state_dict()")
        previous, self._pending_save = self._pending_save, None
        if previous is not None and previous.done():
            previous.wait()  # raises what it failed with
        self._pending_save = self._live_loop().save(os.fspath(directory), step)
        return self._pending_save

    def load(self, directory, rescale=False):
        """Continue from this rank's file of the snapshot set in `directory` (written by save(), by
        SnapshotSet::write_rank or the tool's --snapshot-dir) on the next iter(). On the set's own layout
        only this rank's file is read; a set of another world size or worker count is refused unless
        `rescale=True`, which reads the set's index and only the elements dealt to this rank."""
        data = _dpipe.read_rank(os.fspath(directory), self.rank, self.world_size, self.workers, bool(rescale))
        self._load_bytes(data, "load()")
        self._carry = collections.deque()

    def _live_loop(self):
        loop = self._restored or self._loop
        if loop is None:
            loop = self._restored = self._start(None)
        return loop

    def load_state_dict(self, state):
        """Continue at the element after the one where `state` was taken, on the next iter(). The state
        is checked now: another pipeline, seed, epoch or layout raises dpipe.SnapshotError, saying what
        differs."""
        self._load_bytes(_snapshot_bytes(state), "load_state_dict()")
        self._carry = collections.deque(state.get(CARRY_KEY, ()))

    def _load_bytes(self, data, by):
        epoch, self._options.epoch = self._options.epoch, int(_dpipe.describe(data)["epoch"])
        try:
            restored = self._start(data)
        except BaseException:
            self._options.epoch = epoch  # a refused state leaves the loader as it was
            raise
        self._retire(self._restored, by + " replaced it before it was iterated")
        self._retire(self._loop, by + " loaded another position")
        self._loop, self._restored = None, restored


def _snapshot_bytes(state):
    if not isinstance(state, dict) or STATE_KEY not in state:
        raise _dpipe.SnapshotError(f"not a dpipe loader state: a dict with '{STATE_KEY}' is expected")
    data = state[STATE_KEY]
    if not isinstance(data, (bytes, bytearray)):
        raise _dpipe.SnapshotError(f"'{STATE_KEY}' must hold bytes, not {type(data).__name__}")
    return bytes(data)


def rescale(state_dicts, world_size, workers):
    """Every rank's state dict of one step → the state dicts of a layout of `world_size` ranks ×
    `workers` workers (like `dpipe snapshot rescale`); rank r of the new layout loads element r."""
    for name, value in (("world_size", world_size), ("workers", workers)):
        # Checked here: pybind11's own refusal of an out-of-range int prints every argument, the states' bytes too.
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value < 2**31:
            raise _dpipe.ConfigError(f"rescale: {name} must be an integer from 1 to 2^31 - 1, got {value!r}")
    blobs = [_snapshot_bytes(s) for s in state_dicts]
    # Elements equal_steps carried are dealt round-robin to the new ranks, in old rank order.
    carried = list(itertools.chain.from_iterable(s.get(CARRY_KEY, ()) for s in state_dicts))
    out = []
    for r, data in enumerate(_dpipe.rescale(blobs, int(world_size), int(workers))):
        d = dict(_dpipe.describe(data))
        d[STATE_KEY] = data
        if state_dicts and "element_type" in state_dicts[0]:
            d["element_type"] = state_dicts[0]["element_type"]
        if carried[r::int(world_size)]:
            d[CARRY_KEY] = carried[r::int(world_size)]
        out.append(d)
    return out
