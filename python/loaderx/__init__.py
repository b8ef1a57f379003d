"""loaderx: typed Zrecord stores, a counter-based sampler and a step-based loader.

Submodules: :mod:`loaderx.zrecord` (Dense, Ragged), :mod:`loaderx.zsampler`
(Sampler), :mod:`loaderx.dataloader` (DataLoader), :mod:`loaderx.utils`
(train_dict), :mod:`loaderx.errors`.
"""

from __future__ import annotations

__version__ = "0.1.0"

from . import errors  # noqa: F401

__all__ = ["errors", "__version__"]
