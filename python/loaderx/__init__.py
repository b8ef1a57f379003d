"""loaderx: typed Zrecord stores, a counter-based sampler and a step-based loader.

Submodules: :mod:`loaderx.zrecord` (Dense, Ragged), :mod:`loaderx.zsampler`
(Sampler), :mod:`loaderx.dataloader` (DataLoader), :mod:`loaderx.utils`
(train_dict), :mod:`loaderx.errors`, :mod:`loaderx.client` (loaderxd;
``loaderx.connect(path)``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import errors
from ._version import __version__, mixed_install

if (_mixed := mixed_install(__path__[0])) is not None:
    import warnings

    warnings.warn(_mixed, RuntimeWarning, stacklevel=2)

if TYPE_CHECKING:
    import os

    from .client import Client

__all__ = ["__version__", "connect", "errors"]


def connect(path: str | os.PathLike[str] | None = None) -> Client:
    """Connects to loaderxd; see :func:`loaderx.client.connect` (imported lazily)."""
    from .client import connect as _connect

    return _connect(path)
