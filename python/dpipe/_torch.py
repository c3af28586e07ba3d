"""The Loader class: a torch.utils.data.IterableDataset when torch is importable (torch's DataLoader
needs the subclass), a plain iterable otherwise. Made on first use, so `import dpipe` never imports
torch."""

from ._loader import LoaderBase


def make_loader_class():
    try:
        from torch.utils.data import IterableDataset
    except ImportError:
        IterableDataset = None
    if IterableDataset is None:
        class Loader(LoaderBase):
            __doc__ = LoaderBase.__doc__
    else:
        class Loader(LoaderBase, IterableDataset):
            __doc__ = LoaderBase.__doc__

            def __init__(self, *args, **kwargs):
                LoaderBase.__init__(self, *args, **kwargs)
    Loader.__module__ = "dpipe"
    Loader.__qualname__ = "Loader"
    return Loader
