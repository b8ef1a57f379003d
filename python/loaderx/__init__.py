"""loaderx: typed Zrecord stores, a counter-based sampler and a step-based loader.

Submodules: :mod:`loaderx.zrecord` (Dense, Ragged), :mod:`loaderx.zsampler`
(Sampler), :mod:`loaderx.dataloader` (DataLoader), :mod:`loaderx.utils`
(train_dict), :mod:`loaderx.errors`, :mod:`loaderx.client` (loaderxd;
``loaderx.connect(path)``).
"""

from __future__ import annotations

__version__ = "0.1.0"

from . import errors  # noqa: F401

__all__ = ["__version__", "connect", "errors"]


def connect(path: str | None = None):  # type: ignore[no-untyped-def]
    """Connects to loaderxd; see :func:`loaderx.client.connect` (imported lazily)."""
    from .client import connect as _connect

    return _connect(path)
