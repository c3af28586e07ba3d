"""Pipelines as Python values: each node function returns a Pipeline holding the tool's JSON spec of the
chain, and `a | b` appends b's nodes to a's. Nothing runs here: a Loader builds the spec into a typed C++
pipeline (the same node kinds, options and checks as C++ and the tool)."""

import hashlib
import inspect
import itertools
import json as _json
import operator
import os

from . import _dpipe

# The op catalogue: every op's schema, from the C++ kinds' declarations (dpipe ops --json).
_CATALOGUE = {op["op"]: op for op in _json.loads(_dpipe.spec_ops_json())}
_ids = itertools.count(1)
# `out=` of map: Python types, or the spec's element type names. object (or "value"): any value of the
# kinds a snapshot can hold (None, bool, int, float, str, bytes, tuple, list, dict, numpy arrays).
_OUT_TYPES = {int: "integer", str: "string", bytes: "string", object: "value"}
def _on_field(op, fn, field, into):
    """A callable of `op` that reads field `field` of a record (a dict) and, for map and flat_map, writes
    its result into field `into` (default: the same) of a copy of the record. Its qualified name carries
    the fields, so the fingerprint tells `fn` on another field apart."""
    into = field if into is None else into
    if op == "map":
        def call(record, *rng):  # rng=True: the element's generator after the record
            out = dict(record)
            out[into] = fn(record[field], *rng)
            return out
    elif op == "filter":
        def call(record):
            return fn(record[field])
    else:
        def call(record):
            for value in fn(record[field]):
                out = dict(record)
                out[into] = value
                yield out
    call.__module__ = getattr(fn, "__module__", None) or call.__module__
    call.__qualname__ = f"{getattr(fn, '__qualname__', type(fn).__name__)}[{field}->{into}]"
    call.__name__ = call.__qualname__
    return call


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

    def __bool__(self):  # not len(): a pipeline is true whether or not its length is known
        return True

    def __len__(self):
        """Elements the pipeline yields in a fresh epoch on one rank of one worker, when every node can say
        (as torch's len(datapipe)); else TypeError naming the node that cannot. len(Loader(...)) counts
        one rank of a layout."""
        from ._loader import LoaderBase  # the Loader builds on this module
        return len(LoaderBase(self, rank=0, world_size=1, workers=1))

    def set_shuffle(self, enabled=True):
        """This pipeline with every shuffle on or off (torch's set_shuffle, applied to each shuffle as torch's
        graph_settings.apply_shuffle_settings does). Off, a shuffle passes its elements on in order and buffers
        nothing. A Pipeline does not change, so use what this returns: `p = p.set_shuffle(False)`."""
        if not isinstance(enabled, bool):
            raise TypeError(f"set_shuffle() takes True or False, got {enabled!r}")

        def toggled(node):
            if isinstance(node, Pipeline):  # an input given in a parameter ("with")
                return node.set_shuffle(enabled)
            if isinstance(node, dict):
                out = {k: toggled(v) for k, v in node.items()}
                if out.get("op") == "shuffle":
                    out.pop("enabled", None)
                    if not enabled:
                        out["enabled"] = False
                return out
            if isinstance(node, (list, tuple)):
                return type(node)(toggled(v) for v in node)
            return node

        return Pipeline([toggled(n) for n in self._nodes], self._callables)

    # fork, demux and unzip (methods, made from their schemas below): `a, b = p.fork(2)`.


# Nodes of several outputs: Pipeline methods returning one Pipeline per output. Output 0 continues this
# chain; output i is a pipeline of its own that starts with {"op": "from", "name": N, "output": i}.
_BRANCHING_OPS = ("fork", "demux", "unzip")


def _branch_name(op, pipeline, node, callables):
    """The name a node of several outputs gets when none is given: a digest of what it stands on, so the
    same pipeline built twice names it the same (the names of named nodes reach the keys downstream)."""
    def stable(value):  # a callable by its qualified name, not by the id this process gave it
        if isinstance(value, dict):
            out = {k: stable(v) for k, v in value.items()}
            if out.get("fn") == "external" and "id" in out:
                fn = callables.get(out.pop("id"))
                out["callable"] = f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', type(fn).__name__)}"
            return out
        if isinstance(value, (list, tuple)):
            return [stable(v) for v in value]
        return value

    callables = {**pipeline._callables, **callables}
    text = _json.dumps(stable([_plain(n) for n in pipeline._nodes] + [node]), sort_keys=True, default=repr)
    return f"{op}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"


def _branch_method(op):
    make = _node_function(op)
    sig = make.__signature__
    P = inspect.Parameter
    # torch's order: count first (or torch's num_instances=, so count has a default, and so have the
    # positional parameters after it: make() names a missing one).
    params = [P("self", P.POSITIONAL_ONLY), P("count", P.POSITIONAL_OR_KEYWORD, default=None)]
    params += [q.replace(default=None) if q.kind is P.POSITIONAL_OR_KEYWORD and q.default is P.empty else q
               for q in sig.parameters.values() if q.name != "count"]

    def method(self, *args, **kwargs):
        if args:  # the first positional argument is the count
            if "count" in kwargs or "num_instances" in kwargs:
                raise TypeError(f"{op}() got count twice")
            kwargs["count"], args = args[0], args[1:]
        one = make(*args, **kwargs)
        node = dict(one._nodes[0])
        count = node.get("count")
        if not isinstance(count, int) or isinstance(count, bool):
            raise TypeError(f"{op}() needs count, the number of outputs (an int), got {count!r}")
        callables = {**self._callables, **one._callables}
        if node.get("name") is None:
            node["name"] = _branch_name(op, self, node, callables)
        head = Pipeline(self._nodes + (node,), callables)
        return tuple([head] + [Pipeline([{"op": "from", "name": node["name"], "output": i}], callables)
                               for i in range(1, count)])

    method.__name__ = op
    method.__qualname__ = f"Pipeline.{op}"
    method.__signature__ = sig.replace(parameters=params)
    method.__doc__ = (make.__doc__ + f"\n\nReturns a tuple of `count` pipelines, output 0 (this chain, continued) "
                      "first; every output must be read. Without name=, one is made from the pipeline.")
    return method


def _add_branch_methods():
    for op in _BRANCHING_OPS:
        setattr(Pipeline, op, _branch_method(op))


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


def _is_source(op):
    entry = _CATALOGUE.get(op)
    return bool(entry and entry["source"])


def _external(entry):
    """The schema of the function "external" (a Python callable) of an op, or None."""
    return next((f for f in entry.get("functions", ()) if f["name"] == "external"), None)


def _callable_ops():
    """The ops whose `fn` may be a Python callable: those that take the function "external"."""
    return [op for op, e in _CATALOGUE.items() if _external(e)]


def _signature(entry):
    """The Python signature of an op's node function, from its schema: positional parameters first (in
    declaration order), the others keyword-only; other inputs (`with`) as *inputs; a function op's
    builtin parameters as **fn_params."""
    P = inspect.Parameter
    params, has_with, has_fn = [], False, False
    if entry["op"] == "range":  # range(stop), range(start, stop[, step]), as Python's
        params.append(P("args", P.VAR_POSITIONAL))
    for p in entry["params"]:
        if p["type"] == "list of pipelines":
            has_with = True
            continue
        has_fn = has_fn or p["type"] == "function"
        default = P.empty if p["required"] else p["default"]
        if entry["op"] == "range" and default is P.empty:
            default = None  # range(stop) gives it positionally; make() checks that it is given
        if entry["op"] == "range" or not p["positional"]:
            kind = P.KEYWORD_ONLY
        else:
            kind = P.POSITIONAL_OR_KEYWORD
        params.append(P(p["name"], kind, default=default))
    for p in entry["params"]:  # torch's names of the same parameters (shuffle's buffer_size), keyword only
        if "torch" in p:
            params.append(P(p["torch"], P.KEYWORD_ONLY, default=None))
    if has_with:
        params.insert(0, P("inputs", P.VAR_POSITIONAL))
        params.append(P("with_", P.KEYWORD_ONLY, default=None))
    external = _external(entry)
    if external and any(q["name"] == "out" for q in external["params"]):
        params.append(P("out", P.KEYWORD_ONLY, default=None))
    if has_fn:
        params.append(P("fn_params", P.VAR_KEYWORD))
    # Python wants positional parameters before keyword-only ones; a required keyword-only one may follow
    # optional ones.
    order = {P.POSITIONAL_OR_KEYWORD: 0, P.VAR_POSITIONAL: 1, P.KEYWORD_ONLY: 2, P.VAR_KEYWORD: 3}
    params.sort(key=lambda q: order[q.kind])
    return inspect.Signature(params)


def _doc(entry):
    lines = [entry["doc"], "", "Parameters (the spec's, with the same checks as C++; docs/ops.md):"]
    for p in entry["params"]:
        default = "required" if p["required"] else f"default {p['default']!r}"
        choices = f", one of {', '.join(p['choices'])}" if "choices" in p else ""
        torch = f"; torch's name {p['torch']} is taken too" if "torch" in p else ""
        lines.append(f"    {p['name']} ({p['type']}{choices}, {default}{torch}): {p['doc']}")
    for f in entry.get("functions", ()):
        if f["name"] == "external":
            continue
        args = ", ".join(q["name"] + ("" if q["required"] else "=" + _json.dumps(q["default"])) for q in f["params"])
        lines.append(f"    fn={f['name']!r}" + (f" with {args}" if args else "") + f": {f['doc']}")
    lines.append("Rescales: yes." if entry["rescales"] else f"Rescales: no, {entry['rescale_refusal']}.")
    lines.append("Length: known (len(loader))." if entry["length"] else "Length: unknown (len(loader) raises).")
    return "\n".join(lines)


def _check_fn_params(op, entry, fn, fn_params):
    """A builtin function's own parameters: unknown ones raise TypeError here, at the call."""
    if callable(fn):
        if fn_params:
            own = [q["name"] for q in entry["params"]]
            raise TypeError(f"{op}() got an unexpected keyword argument '{next(iter(fn_params))}' ({op} takes "
                            f"{', '.join(own)}; a Python callable takes no function parameters)")
        return
    if not isinstance(fn, str):
        raise TypeError(f"{op}(): fn must be a builtin function's name or a Python callable, got "
                        f"{_kind_of(fn)}")
    for f in entry.get("functions", ()):
        if f["name"] == fn and fn != "external":
            known = [q["name"] for q in f["params"]]
            for key in fn_params:
                if key not in known:
                    own = [q["name"] for q in entry["params"]]
                    raise TypeError(f"{op}() got an unexpected keyword argument '{key}' ({op} takes "
                                    f"{', '.join(own)}; the function '{fn}' takes "
                                    f"{', '.join(known) if known else 'no parameters'})")
            return
    # An unknown function name is the spec's to refuse, with the known ones, when the Loader builds.


def _kind_of(value):
    """How a message names what was given: its type, and what to do for an iterator."""
    if inspect.isgenerator(value) or (hasattr(value, "__next__") and hasattr(value, "__iter__")):
        return f"a {type(value).__name__} object (an iterator: pass list(...) of it, or to generator() the " \
               "function that makes it)"
    return type(value).__name__


def _integer(value):
    """An int (numpy integers too), or None."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def _as_list(value):
    """A list of a list, tuple or 1-D numpy array; None for anything else."""
    if isinstance(value, (list, tuple)):
        return list(value)
    if type(value).__module__ == "numpy" and type(value).__name__ == "ndarray" and value.ndim == 1:
        return value.tolist()
    return None


def _checked_param(op, p, value):
    """`value` of parameter `p` as the spec writes it (a JSON value); TypeError naming the parameter and
    what it needs when it is not of the schema's type. None (absent) passes."""
    if value is None:
        return value
    kind, name = p["type"], p["name"]

    def bad(want):
        raise TypeError(f"{op}(): {name} must be {want}, got {_kind_of(value)}")

    if kind == "integer":
        x = _integer(value)
        return x if x is not None else bad("an int")
    if kind == "number":
        x = _integer(value)
        if x is not None:
            return x
        return float(value) if isinstance(value, float) else bad("a number")
    if kind == "boolean":
        return value if isinstance(value, bool) else bad("True or False")
    if kind in ("string", "choice"):
        return value if isinstance(value, str) else bad("a str")
    if kind in ("list of integers", "list of numbers"):
        items = _as_list(value)
        if items is None:
            bad("a list of ints" if kind == "list of integers" else "a list of numbers")
        out = []
        for x in items:
            i = _integer(x)
            if i is None and kind == "list of numbers" and isinstance(x, float):
                i = x
            if i is None:
                bad(f"a list of {'ints' if kind == 'list of integers' else 'numbers'} (item {len(out)} is "
                    f"{type(x).__name__})")
            out.append(i)
        return out
    if kind == "list of strings":  # file names: str or os.PathLike, one or a list
        if isinstance(value, (str, os.PathLike)):
            value = [value]
        items = _as_list(value)
        if items is None or not all(isinstance(x, (str, os.PathLike)) for x in items):
            bad("a str or a list of str")
        return [os.fspath(x) for x in items]
    if kind == "list of integers or strings":
        items = _as_list(value)
        if items is None:
            bad("a list of ints or a list of str")
        if items and all(isinstance(x, str) for x in items):
            return items
        ints = [_integer(x) for x in items]
        if any(i is None for i in ints):
            bad("a list of ints or a list of str (not mixed, no floats)")
        return ints
    return value


def _checked_out(op, out):
    """map's out=: a Python type of _OUT_TYPES or an element type name."""
    if isinstance(out, str):
        return out
    if out in _OUT_TYPES:
        return _OUT_TYPES[out]
    hint = " (a float result: out=object)" if out is float else ""
    raise TypeError(f"{op}(): out= must be int, str, bytes, object or an element type name such as 'batch of "
                    f"integer', got {getattr(out, '__name__', type(out).__name__)}{hint}")


def _node_function(op):
    entry = _CATALOGUE[op]
    sig = _signature(entry)
    callable_op = op in _callable_ops()
    has_var_keyword = any(q.kind is inspect.Parameter.VAR_KEYWORD for q in sig.parameters.values())
    known_keywords = [q.name for q in sig.parameters.values() if q.kind is not inspect.Parameter.VAR_POSITIONAL]

    def make(*args, **kwargs):
        if not has_var_keyword:  # an unknown keyword first: it is likely a misspelling of a missing one
            for key in kwargs:
                if key not in sig.parameters or sig.parameters[key].kind is inspect.Parameter.VAR_POSITIONAL:
                    raise TypeError(f"{op}() got an unexpected keyword argument '{key}' (it takes "
                                    f"{', '.join(known_keywords)})")
        for p in entry["params"]:  # torch's name given: the parameter itself (a positional one may be missing)
            if p.get("torch") in kwargs:
                if p["name"] in kwargs or (sig.parameters[p["name"]].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
                                           and list(sig.parameters).index(p["name"]) < len(args)):
                    raise TypeError(f"{op}() got {p['name']} twice: as {p['name']} and as torch's {p['torch']}")
                kwargs[p["name"]] = kwargs.pop(p["torch"])
        bound = sig.bind(*args, **kwargs)  # TypeError naming a missing argument or an extra positional one
        given = dict(bound.arguments)
        params = {}
        if op == "range":
            positional = given.pop("args", ())
            if len(positional) > 3:
                raise TypeError("range(stop), range(start, stop) or range(start, stop, step)")
            names = {0: (), 1: ("stop",), 2: ("start", "stop"), 3: ("start", "stop", "step")}[len(positional)]
            for name, value in zip(names, positional):
                if name in given:
                    raise TypeError(f"range() got {name} twice")
                params[name] = value
            if given.get("stop") is None:
                given.pop("stop", None)
            if "stop" not in params and "stop" not in given:
                raise TypeError("range() missing the argument 'stop'")
        inputs = given.pop("inputs", ())
        with_ = given.pop("with_", None)
        if inputs and with_ is not None:
            raise TypeError(f"{op}() takes its other inputs positionally or as with_=, not both")
        fn_params = given.pop("fn_params", {})
        field, into = given.pop("field", None), given.pop("into", None)
        if into is not None and field is None:
            raise TypeError(f"{op}(): into= needs field=, the field the function reads")
        if field is not None and callable(given.get("fn")):  # the callable is wrapped here
            given["fn"] = _on_field(op, given["fn"], field, into)
            if op == "map":
                given["out"] = object
        elif field is not None:  # a builtin function: the spec reads the field
            given["field"] = field
            if into is not None:
                given["into"] = into
        params.update(given)
        if inputs or with_ is not None:
            params["with"] = list(inputs) if inputs else with_
        elif any(p["type"] == "list of pipelines" and p["required"] for p in entry["params"]):
            raise TypeError(f"{op}() takes one or more other pipelines: {op}(q, r) or {op}(with_=[q, r])")
        fn = params.get("fn")
        if "fn" in params:
            _check_fn_params(op, entry, fn, fn_params)
            params.update(fn_params)
        callables = {}
        for value in list(params.values()):  # pipelines given as other inputs bring their callables
            for q in (value if isinstance(value, (list, tuple)) else [value]):
                if isinstance(q, Pipeline):
                    callables.update(q._callables)
        if callable(fn):
            if not callable_op:
                ops = _callable_ops()
                raise TypeError(f"{op}(): Python callables run in {', '.join(ops[:-1])} and {ops[-1]}; name a "
                                "builtin function here (docs/python.md)")
            fid = next(_ids)
            callables[fid] = fn
            params["fn"] = "external"
            params["id"] = fid
        if op == "generator" and callable(fn):
            params.setdefault("out", object)
        if params.get("out") is not None:
            if not callable(fn):
                raise TypeError(f"{op}(): out= is for a Python callable")
            params["out"] = _checked_out(op, params["out"])
        else:
            params.pop("out", None)
        for p in entry["params"]:  # each value of the schema's type, or a TypeError here, at the call
            if p["name"] in params and p["type"] not in ("function", "list of pipelines"):
                params[p["name"]] = _checked_param(op, p, params[p["name"]])
        node = {"op": op}
        node.update(params)
        return Pipeline([node], callables)

    make.__name__ = op
    make.__qualname__ = op
    make.__signature__ = sig
    make.__doc__ = _doc(entry)
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


def zip_rows(nodes, tuple_inputs, branches=None):
    """Walks a chain of spec nodes: how deep its elements hold zip's rows (0: they are rows, k: batches
    of depth k of rows, None: anything else), adding to `tuple_inputs` the ids of the Python callables
    that receive rows. A row and a batch are one C++ type (a vector); the Loader shows rows as tuples, and
    callables receive them so. A row stays a row through the nodes that keep the element type (filter,
    shuffle, take, ..., a Python map or flat_map without out=)."""
    if branches is None:  # a fork's or demux's name → its elements' depth, from a first pass, so a branch
        branches = {}     # read before the chain with its node (b | zip(a)) finds it
        zip_rows(nodes, set(), branches)
    depth = None
    for node in nodes:
        op = node.get("op")
        for value in node.values():  # other inputs ("with"): chains of their own
            if isinstance(value, list):
                for q in value:
                    if isinstance(q, list):
                        zip_rows(q, tuple_inputs, branches)
        if op in ("fork", "demux") and node.get("name") is not None:
            branches[node["name"]] = depth
        if op == "from":
            depth = branches.get(node.get("name"))
            continue
        external = node.get("fn") == "external"
        if external and depth == 0 and op != "generator":
            tuple_inputs.add(node["id"])
        if _is_source(op) or op == "unzip":
            depth = None
        elif op in ("zip", "zip_longest", "enumerate"):
            depth = 0
        elif op == "batch":
            depth = None if depth is None else depth + 1
        elif op == "unbatch":
            level = node.get("level", 1)
            if level is None:
                level = 1
            if level != 0:  # level 0 adds no node
                depth = depth - level if depth and level != -1 and depth >= level else None
        elif op in ("map", "flat_map", "parallel_map") and (not external or "out" in node):
            depth = None
    return depth


# fork, demux and unzip are Pipeline methods (several outputs); `from` is what their outputs start with.
NODE_FUNCTIONS = {op: _node_function(op) for op in _CATALOGUE if op not in _BRANCHING_OPS + ("from",)}
_add_branch_methods()
