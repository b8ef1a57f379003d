"""loaderx: typed Zrecord stores, a counter-based sampler and a step-based loader.

The names most code needs are here::

    from loaderx import DataLoader, Dense, Ragged, RaggedBatch

They are the classes of :mod:`loaderx.dataloader` and :mod:`loaderx.zrecord`
(the 2.5.4 import paths, which keep working), imported on first use so that
``import loaderx`` stays cheap. Other submodules: :mod:`loaderx.zsampler`
(Sampler), :mod:`loaderx.utils` (train_dict), :mod:`loaderx.errors`,
:mod:`loaderx.client` (loaderxd; ``loaderx.connect(path)``),
:mod:`loaderx.torch`, :mod:`loaderx.mix`, :mod:`loaderx.packing`, :mod:`loaderx.converter`,
:mod:`loaderx.idx` (idx files, Fashion-MNIST).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from . import errors
from ._version import __version__, mixed_install

if (_mixed := mixed_install(__path__[0])) is not None:
    import warnings

    warnings.warn(_mixed, RuntimeWarning, stacklevel=2)

if TYPE_CHECKING:
    import os

    from .client import Client
    from .dataloader import DataLoader, RaggedBatch
    from .zrecord import Dense, Ragged

__all__ = ["DataLoader", "Dense", "Ragged", "RaggedBatch", "__version__", "connect", "errors"]

# Top-level name -> the submodule that defines it (imported on first access).
_LAZY = {
    "DataLoader": "dataloader",
    "Dense": "zrecord",
    "Ragged": "zrecord",
    "RaggedBatch": "dataloader",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'loaderx' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # later accesses skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


def connect(path: str | os.PathLike[str] | None = None) -> Client:
    """Connects to loaderxd; see :func:`loaderx.client.connect` (imported lazily)."""
    from .client import connect as _connect

    return _connect(path)
