"""How a Python callable is named in a pipeline's fingerprint and in messages: "module.qualname", and for a
lambda also a digest of its code, so a changed lambda is a changed pipeline (a resume refuses it unless
the user says it computes the same: Loader(same_function=...))."""

import hashlib
import types

_PLAIN = (type(None), bool, int, float, complex, str, bytes)


def _feed(h, code):
    """The parts of a code object that decide what it computes (not its file or line numbers)."""
    h.update(code.co_code)
    h.update(repr((code.co_names, code.co_varnames, code.co_freevars, code.co_argcount,
                   code.co_kwonlyargcount)).encode())
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            _feed(h, const)
        else:
            h.update(_stable_repr(const).encode())


def _stable_repr(value):
    """A constant's text, the same in every process: a frozenset's members sorted (its own order follows
    the string hash, which differs from process to process)."""
    if isinstance(value, frozenset):
        return "frozenset(" + repr(sorted(_stable_repr(v) for v in value)) + ")"
    if isinstance(value, tuple):
        return "(" + ", ".join(_stable_repr(v) for v in value) + ",)"
    return repr(value) if isinstance(value, _PLAIN) else type(value).__name__


def _value(h, value):
    """A default or a captured variable: plain values by their repr, others by their type."""
    if isinstance(value, _PLAIN + (frozenset,)) or (isinstance(value, tuple) and all(isinstance(v, _PLAIN) for v in value)):
        h.update(_stable_repr(value).encode())
    else:
        h.update(type(value).__qualname__.encode())


def code_digest(fn):
    """A 12-hex-digit digest of a function's code, defaults and plain captured values; None for a
    callable without code (a builtin, a class instance)."""
    code = getattr(fn, "__code__", None)
    if not isinstance(code, types.CodeType):
        return None
    h = hashlib.blake2b(digest_size=6)
    _feed(h, code)
    _value(h, getattr(fn, "__defaults__", None))
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            _value(h, cell.cell_contents)
        except ValueError:  # an empty cell
            h.update(b"<empty>")
    return h.hexdigest()


def label(fn):
    """"module.qualname"; for a lambda "module.qualname#digest" (two lambdas of one module share a name)."""
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__
    module = getattr(fn, "__module__", None)
    text = f"{module}.{name}" if module else str(name)
    if getattr(fn, "__name__", None) == "<lambda>":
        digest = code_digest(fn)
        if digest:
            text += "#" + digest
    return text
