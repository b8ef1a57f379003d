"""PyTorch helpers: loader batches as tensors, without copying.

loaderx yields NumPy batches on the CPU. :func:`to_torch` turns one into
tensors that share its memory (``torch.from_numpy``: no copy, the tensor keeps
the batch memory alive); :func:`iter_torch` does it for every batch of a
loader; :func:`device_transform` builds a ``transform`` that copies each batch
to a device, from pinned memory when asked, so ``non_blocking`` copies really
overlap with compute.

``torch`` is imported lazily: importing this module does not need it, calling
a helper does (``ModuleNotFoundError`` otherwise).

Arrays that loaderx marks read-only (batches served by loaderxd) become
tensors over the same read-only memory: PyTorch cannot express that, so do not
write into them in place (copy first, e.g. ``t.clone()``).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch

__all__ = ["device_transform", "iter_torch", "to_torch"]


def _tensor(array: np.ndarray) -> torch.Tensor:
    import torch

    if array.flags.writeable:
        return torch.from_numpy(array)
    with warnings.catch_warnings():
        # "The given NumPy array is not writable": expected for daemon batches.
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(array)


def to_torch(batch: Any) -> Any:
    """Converts a loader batch to tensors sharing its memory.

    ``{name: ndarray (B, *shape)}`` -> ``{name: Tensor (B, *shape)}`` of the
    matching dtype; a ragged value (``list`` of ndarrays) -> ``list`` of
    tensors; tuples and lists of batches are converted element-wise; anything
    else is returned unchanged. ``uint16``/``uint32``/``uint64`` arrays need a
    PyTorch with those dtypes (2.3+).
    """
    if isinstance(batch, np.ndarray):
        return _tensor(batch)
    if isinstance(batch, dict):
        return {k: to_torch(v) for k, v in batch.items()}
    if isinstance(batch, list):
        return [to_torch(v) for v in batch]
    if isinstance(batch, tuple):
        return tuple(to_torch(v) for v in batch)
    return batch


def iter_torch(loader: Iterable[Any]) -> Iterator[Any]:
    """Yields ``to_torch(batch)`` for every batch of ``loader`` (endless like it)."""
    for batch in loader:
        yield to_torch(batch)


def device_transform(
    device: str | torch.device, *, pin_memory: bool = True, non_blocking: bool = True
) -> Any:
    """A ``transform`` for :class:`~loaderx.dataloader.DataLoader` that moves batches to ``device``.

    Each array becomes a tensor (no copy), is copied into pinned (page-locked)
    host memory when ``pin_memory`` and the device is not the CPU, then copied
    to ``device`` with ``non_blocking``. Runs in the loader's transform
    threads, so the copies of several batches overlap with training.
    """
    import torch

    target = torch.device(device)
    pin = pin_memory and target.type != "cpu"

    def move(value: Any) -> Any:
        if isinstance(value, np.ndarray):
            t = _tensor(value)
            if pin:
                t = t.pin_memory()
            return t.to(target, non_blocking=non_blocking)
        if isinstance(value, dict):
            return {k: move(v) for k, v in value.items()}
        if isinstance(value, list):
            return [move(v) for v in value]
        return value

    return move
