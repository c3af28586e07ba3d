"""dpipe from Python: typed C++ pipelines for ML input, with exact snapshots that resume and rescale.

    import dpipe
    p = dpipe.range(0, 10_000) | dpipe.shuffle(buffer=1000) | dpipe.sharding_filter() | dpipe.batch(size=256)
    loader = dpipe.Loader(p, seed=42, workers=2)
    for batch in loader: ...            # numpy int64 arrays over the C++ buffers
    state = loader.state_dict()         # plain Python values; torch.save / pickle keep them

Every node function takes the spec's parameters as keyword arguments (docs/python.md)."""

from . import _dpipe
from ._dpipe import ConfigError, DataError, Error, FileError, NodeError, PendingSave, SnapshotError, write_records
from ._loader import rescale
from ._nodes import NODE_FUNCTIONS as _NODE_FUNCTIONS
from ._nodes import Pipeline, from_spec

globals().update(_NODE_FUNCTIONS)

SNAPSHOT_FORMAT_VERSION = _dpipe.snapshot_format_version()
__version__ = _dpipe.__version__  # the C++ library's version: both come from one build

__all__ = ["Pipeline", "from_spec", "Loader", "rescale", "Error", "ConfigError", "SnapshotError", "DataError",
           "FileError", "NodeError", "PendingSave", "SNAPSHOT_FORMAT_VERSION", "write_records"] + sorted(_NODE_FUNCTIONS)

_loader_class = None


def __getattr__(name):
    # Loader is made on first use: with torch importable it subclasses torch's IterableDataset, and
    # importing torch takes a second or more that `import dpipe` should not cost.
    global _loader_class
    if name == "Loader":
        if _loader_class is None:
            from ._torch import make_loader_class
            _loader_class = make_loader_class()
        return _loader_class
    raise AttributeError(f"module 'dpipe' has no attribute '{name}'")


def __dir__():
    return sorted(set(globals()) | {"Loader"})
