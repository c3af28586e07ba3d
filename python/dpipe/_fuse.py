"""Adjacent Python stages fused into one node before a Loader builds its pipeline.

A chain such as map(json.loads, out=object) | filter(keep) | map(tokenize) | flat_map(windows) would
otherwise convert every element between Python objects and dpipe's values at each stage, and call into
Python once per stage. Fused, the stages run as one generated function: objects pass between them as
Python made them, and only the run's first input and its outputs are converted (docs/python.md, "Python
callables at loop speed")."""

import itertools

from ._callables import label as _label

_FUSIBLE_OPS = ("map", "filter", "flat_map")
_FUSIBLE_KEYS = {"op", "fn", "id", "out", "on_error", "at"}
_fused_ids = itertools.count(-1, -1)  # negative: never one of the node functions' ids


def _fusible(node):
    """A Python callable in map, filter or flat_map with nothing that needs the node kept apart: no name
    (its key is the user's), no on_error="skip" (skips are counted per node)."""
    return (node.get("op") in _FUSIBLE_OPS and node.get("fn") == "external" and set(node) <= _FUSIBLE_KEYS
            and node.get("on_error", "fail") == "fail")


def _outputs(result, stage):
    """A flat_map stage's result inside a fused run: an iterable, not a string (as flat_map checks)."""
    if isinstance(result, (str, bytes)) or not hasattr(result, "__iter__"):
        raise TypeError(f"flat_map stage {stage} of fused stages returned {type(result).__name__}, not an iterable "
                        "of outputs (a list, a tuple, a generator)")
    return result


def compose(stages):
    """One function of an input that returns the outputs of `stages` ((op, callable) pairs) for it, as an
    iterable: a map rebinds the element, a filter drops it, a flat_map loops over what it returns."""
    env = {f"f{i}": fn for i, (_, fn) in enumerate(stages)}
    env["_outputs"] = _outputs
    body, level, looping = [], 1, False
    for i, (op, _) in enumerate(stages):
        pad = "    " * level
        if op == "map":
            body.append(f"{pad}x = f{i}(x)")
        elif op == "filter":
            body.append(f"{pad}if not f{i}(x):")
            body.append(f"{pad}    {'continue' if looping else 'return ()'}")
        elif i == len(stages) - 1 and not looping:  # a last flat_map: its iterable is the outputs
            body.append(f"{pad}return f{i}(x)")
            level = 0
        else:
            body.append(f"{pad}for x in _outputs(f{i}(x), {i}):")
            level += 1
            looping = True
    if looping:
        body = ["    out = []"] + body + ["    " * level + "out.append(x)", "    return out"]
    elif level:
        body.append("    return (x,)")
    source = "def fused(x):\n" + "\n".join(body) + "\n"
    exec(compile(source, "<dpipe fused stages>", "exec"), env)
    fused = env["fused"]
    fused._dpipe_fused_stages = " | ".join(f"{op}({_label(fn)})" for op, fn in stages)
    fused._dpipe_fused_expands = any(op == "flat_map" for op, _ in stages)  # else one output at most per input
    return fused


def fuse(nodes, callables):
    """The spec's chain `nodes` with each run of two or more fusible nodes as one map node of a fused
    callable (other inputs' chains too), and the callables by id with the fused ones added. Each node
    carries the place the user put it at ("at": "pipeline[4]", a fused run "pipeline[1..3]"), which
    messages name it by (the spec is built with places=True)."""
    callables = dict(callables)

    def chain(nodes, where):
        out, run = [], []  # run: (index, node) of the fusible nodes met in a row

        def flush():
            if len(run) == 1:
                out.append(run[0][1])
            elif run:
                stages = [(n["op"], callables[n["id"]]) for _, n in run]
                out_type = None  # the last map's out=, else the input's type (filter and flat_map keep it)
                for _, n in run:
                    if n["op"] == "map" and n.get("out") is not None:
                        out_type = n["out"]
                fid = next(_fused_ids)
                callables[fid] = compose(stages)
                node = {"op": "map", "fn": "external", "id": fid, "at": f"{where}[{run[0][0]}..{run[-1][0]}]"}
                if out_type is not None:
                    node["out"] = out_type
                out.append(node)
            run.clear()

        for i, node in enumerate(nodes):
            place = f"{where}[{i}]"
            node = {k: ([chain(v, f"{place}.{k}[{j}]") if isinstance(v, list) else v for j, v in enumerate(value)]
                        if isinstance(value, list) and any(isinstance(v, list) for v in value) else value)
                    for k, value in node.items()}
            node["at"] = place
            if _fusible(node):
                # A map whose out= is a plain type converts there: the stage after it starts a new run.
                if run and run[-1][1]["op"] == "map" and run[-1][1].get("out") not in (None, "value"):
                    flush()
                run.append((i, node))
            else:
                flush()
                out.append(node)
        flush()
        return out

    return chain(list(nodes), "pipeline"), callables
