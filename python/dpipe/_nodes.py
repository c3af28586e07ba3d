"""Pipelines as Python values: each node function returns a Pipeline holding the tool's JSON spec of the
chain, and `a | b` appends b's nodes to a's. Nothing runs here: a Loader builds the spec into a typed C++
pipeline (the same node kinds, options and checks as C++ and the tool)."""

import itertools
import json as _json

from . import _dpipe

# Node functions whose first positional argument is a parameter: map("affine", mul=2), batch(256), ...
_POSITIONAL = {
    "map": ("fn",), "filter": ("fn",), "flat_map": ("fn",), "parallel_map": ("fn",), "generator": ("fn",),
    "batch": ("size",), "shuffle": ("buffer",), "take": ("count",), "prefetch": ("depth",),
    "from_vector": ("values",), "lines": ("files",), "line_blocks": ("files",), "records": ("files",),
}


# Nodes that take other pipelines besides their input: `p | dpipe.concat(q, r)`.
_MULTI_INPUT = {"concat", "zip", "mux", "mux_longest"}


# map, filter, flat_map and generator take a Python callable as `fn`; the spec names it {"fn": "external", "id": N}.
_CALLABLE_OPS = {"map", "filter", "flat_map", "generator"}
_ids = itertools.count(1)
# `out=` of map: Python types, or the spec's element type names. object (or "value"): any value of the
# kinds a snapshot can hold (None, bool, int, float, str, bytes, tuple, list, dict, numpy arrays).
_OUT_TYPES = {int: "integer", str: "string", bytes: "string", object: "value"}


class Pipeline:
    """A chain of nodes: a list of the spec's node objects, and the Python callables they name by id.
    Immutable; `|` makes a new one."""

    __slots__ = ("_nodes", "_callables")

    def __init__(self, nodes, callables=None):
        self._nodes = tuple(nodes)
        self._callables = dict(callables or {})

    def __or__(self, other):
        if not isinstance(other, Pipeline):
            return NotImplemented
        if other._nodes and _is_source(other._nodes[0]["op"]):
            raise _dpipe.ConfigError(
                f"a source ({other._nodes[0]['op']}) can only start a pipeline; combine sources with "
                "concat, zip or mux")
        return Pipeline(self._nodes + other._nodes, {**self._callables, **other._callables})

    def spec(self, seed=None):
        """The tool's spec for this pipeline, as a dict (`dpipe run` takes it as JSON)."""
        out = {"pipeline": [_plain(n) for n in self._nodes]}
        if seed is not None:
            out["seed"] = seed
        return out

    def to_json(self, seed=None):
        return _json.dumps(self.spec(seed))

    def __repr__(self):
        return " | ".join(_node_repr(n) for n in self._nodes) or "Pipeline()"

    def __eq__(self, other):
        return isinstance(other, Pipeline) and self.spec() == other.spec()

    def __hash__(self):
        return hash(self.to_json())


def _plain(value):
    """Pipelines inside parameters ("with") become their node lists."""
    if isinstance(value, Pipeline):
        return [_plain(n) for n in value._nodes]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _node_repr(node):
    params = ", ".join(f"{k}={v!r}" for k, v in node.items() if k != "op")
    return f"{node['op']}({params})"


_SOURCES = None


def _is_source(op):
    global _SOURCES
    if _SOURCES is None:
        _SOURCES = set(_dpipe.spec_sources())
    return op in _SOURCES


def _node_function(op):
    positional = _POSITIONAL.get(op, ())

    def make(*args, **params):
        if "with_" in params:  # `with` is a Python keyword
            params["with"] = params.pop("with_")
        if op in _MULTI_INPUT and args:  # concat(q, r): the other inputs
            if "with" in params:
                raise TypeError(f"{op}() takes its other inputs positionally or as with_=, not both")
            params["with"] = list(args)
            args = ()
        if op == "range":
            if not 1 <= len(args) <= 3:
                raise TypeError("range(stop), range(start, stop) or range(start, stop, step)")
            names = {1: ("stop",), 2: ("start", "stop"), 3: ("start", "stop", "step")}[len(args)]
        else:
            if len(args) > len(positional):
                raise TypeError(f"{op}() takes keyword arguments" +
                                (f" (and {', '.join(positional)} first)" if positional else ""))
            names = positional[:len(args)]
        for name, value in zip(names, args):
            if name in params:
                raise TypeError(f"{op}() got {name} twice")
            params[name] = value
        callables = {}
        for value in list(params.values()):  # pipelines given as other inputs bring their callables
            for q in (value if isinstance(value, (list, tuple)) else [value]):
                if isinstance(q, Pipeline):
                    callables.update(q._callables)
        fn = params.get("fn")
        if callable(fn):
            if op not in _CALLABLE_OPS:
                raise TypeError(f"{op}(): Python callables run in map, filter, flat_map and generator; name a builtin "
                                "function here (docs/python.md)")
            fid = next(_ids)
            callables[fid] = fn
            params["fn"] = "external"
            params["id"] = fid
        if op == "generator" and callable(fn):
            params.setdefault("out", object)
        if "out" in params:
            if op not in ("map", "generator") or not callable(fn):
                raise TypeError("out= is for map and generator with a Python callable")
            out = params["out"]
            params["out"] = _OUT_TYPES.get(out, out)
        if op == "lines" or op == "line_blocks" or op == "records":
            files = params.get("files")
            if isinstance(files, str):
                params["files"] = [files]
        node = {"op": op}
        node.update(params)
        return Pipeline([node], callables)

    make.__name__ = op
    make.__qualname__ = op
    make.__doc__ = (f"The {op} node; keyword arguments are its spec parameters "
                    f"(docs/design.md#specs), with the same checks as C++.")
    return make


def from_spec(spec):
    """A Pipeline from the tool's spec: a dict or JSON text ({"seed": S, "pipeline": [...]}). Returns
    (pipeline, seed); seed is None when the spec has none."""
    if isinstance(spec, (str, bytes)):
        spec = _json.loads(spec)
    if not isinstance(spec, dict) or not isinstance(spec.get("pipeline"), list):
        raise _dpipe.ConfigError('spec must be an object with a "pipeline" list')
    unknown = set(spec) - {"seed", "pipeline"}
    if unknown:
        raise _dpipe.ConfigError(f"spec has an unknown key '{sorted(unknown)[0]}' (expected seed and pipeline)")
    return Pipeline(spec["pipeline"]), spec.get("seed")


def zip_rows(nodes, tuple_inputs):
    """Walks a chain of spec nodes: how deep its elements hold zip's rows (0: they are rows, k: batches
    of depth k of rows, None: anything else), adding to `tuple_inputs` the ids of the Python callables
    that receive rows. A row and a batch are one C++ type (a vector); the Loader shows rows as tuples, and
    callables receive them so. A row stays a row through the nodes that keep the element type (filter,
    shuffle, take, ..., a Python map or flat_map without out=)."""
    depth = None
    for node in nodes:
        op = node.get("op")
        for value in node.values():  # other inputs ("with"): chains of their own
            if isinstance(value, list):
                for q in value:
                    if isinstance(q, list):
                        zip_rows(q, tuple_inputs)
        external = node.get("fn") == "external"
        if external and depth == 0 and op != "generator":
            tuple_inputs.add(node["id"])
        if _is_source(op):
            depth = None
        elif op == "zip":
            depth = 0
        elif op == "batch":
            depth = None if depth is None else depth + 1
        elif op == "unbatch":
            depth = depth - 1 if depth else None
        elif op in ("map", "flat_map", "parallel_map") and (not external or "out" in node):
            depth = None
    return depth


NODE_FUNCTIONS = {op: _node_function(op) for op in _dpipe.spec_ops()}
