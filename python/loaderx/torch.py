"""PyTorch helpers: loader batches as tensors, without copying.

loaderx yields NumPy batches on the CPU. :func:`to_torch` turns one into
tensors that share its memory (``torch.from_numpy``: no copy, the tensor keeps
the batch memory alive); :func:`iter_torch` does it for every batch of a
loader; :func:`device_transform` builds a ``transform`` that copies each batch
to a device, from pinned memory when asked, so ``non_blocking`` copies really
overlap with compute.

:class:`StatefulLoader` wraps a :class:`~loaderx.dataloader.DataLoader` for a
torch training loop: it yields those tensors and has ``state_dict()`` /
``load_state_dict()`` in the manner of torchdata's ``StatefulDataLoader``, with
a state of plain ints and strings that ``torch.save`` and
``torch.load(weights_only=True)`` carry unchanged::

    loader = StatefulLoader(DataLoader(streams, batch_size=256, mode="Cyclic", seed=1))
    for batch in loader:                      # {name: Tensor}, endless
        ...
        torch.save({"model": model.state_dict(), "loader": loader.state_dict()}, path)

    ckpt = torch.load(path, weights_only=True)
    loader.load_state_dict(ckpt["loader"])    # the next batch is the one after the saved step

``torch`` is imported lazily: importing this module does not need it, calling
a helper does (``ModuleNotFoundError`` otherwise).

Batches are writable on both hosts, so their tensors are too. Only the
read-only views of ``DaemonOptions(shared_view=True)`` become tensors over
read-only memory, which PyTorch cannot express: do not write into those in
place (copy first, e.g. ``t.clone()``). The rule: docs/guide.md, "Batches:
ownership and writeability".
"""

from __future__ import annotations

import operator
import warnings
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from ._loaderx import RaggedBatch

if TYPE_CHECKING:
    import torch

    from .dataloader import DataLoader

__all__ = ["RaggedTensors", "StatefulLoader", "device_transform", "iter_torch", "to_torch"]


def _tensor(array: np.ndarray) -> torch.Tensor:
    import torch

    if array.flags.writeable:
        return torch.from_numpy(array)
    with warnings.catch_warnings():
        # "The given NumPy array is not writable": expected for shared_view batches.
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(array)


class RaggedTensors:
    """A packed ragged stream as tensors: :func:`to_torch` of a :class:`~loaderx.RaggedBatch`.

    ``values`` (1-D, every element of the records, sharing the batch memory),
    ``cu_seqlens`` (int32 ``(B + 1,)``, cumulative first-dimension lengths:
    what variable-length attention kernels take), ``offsets`` (int64 ``(B +
    1,)``, element offsets into ``values``), ``shapes`` (int64 ``(B,
    ndim)``) and ``max_seqlen`` (an int), as in the RaggedBatch.
    :func:`device_transform` moves ``values`` and ``cu_seqlens`` to its
    device and keeps ``offsets`` and ``shapes`` on the CPU. ``len()``,
    ``[k]``, iteration and ``tolist()`` give each record as a view of
    ``values`` with its shape, on ``values``' device.
    """

    __slots__ = ("_offsets", "_shapes", "cu_seqlens", "max_seqlen", "offsets", "shapes", "values")

    def __init__(
        self,
        values: torch.Tensor,
        cu_seqlens: torch.Tensor,
        offsets: torch.Tensor,
        shapes: torch.Tensor,
        max_seqlen: int,
    ) -> None:
        self.values = values
        self.cu_seqlens = cu_seqlens
        self.offsets = offsets
        self.shapes = shapes
        self.max_seqlen = max_seqlen
        self._offsets: list[int] = offsets.tolist()
        self._shapes: list[list[int]] = shapes.tolist()

    def __len__(self) -> int:
        return len(self._shapes)

    def __getitem__(self, index: int) -> torch.Tensor:
        k = operator.index(index)
        n = len(self._shapes)
        if not -n <= k < n:
            raise IndexError(f"record {index} out of range for a batch of {n}")
        k %= n
        return self.values[self._offsets[k] : self._offsets[k + 1]].view(self._shapes[k])

    def __iter__(self) -> Iterator[torch.Tensor]:
        return (self[k] for k in range(len(self._shapes)))

    def tolist(self) -> list[torch.Tensor]:
        """The records as a list of tensor views (what ``to_torch`` makes of the list form)."""
        return list(self)

    def __repr__(self) -> str:
        return (f"RaggedTensors({len(self)} records, dtype={self.values.dtype}, "
                f"ndim={self.shapes.shape[1]}, rows={int(self.cu_seqlens[-1])})")


def _ragged_tensors(batch: RaggedBatch) -> RaggedTensors:
    return RaggedTensors(_tensor(batch.values), _tensor(batch.cu_seqlens),
                         _tensor(batch.offsets), _tensor(batch.shapes), batch.max_seqlen)


def to_torch(batch: Any) -> Any:
    """Converts a loader batch to tensors sharing its memory.

    ``{name: ndarray (B, *shape)}`` -> ``{name: Tensor (B, *shape)}`` of the
    matching dtype; a ragged value (``list`` of ndarrays) -> ``list`` of
    tensors, a packed one (:class:`~loaderx.RaggedBatch`) ->
    :class:`RaggedTensors`; tuples and lists of batches are converted
    element-wise; anything else is returned unchanged.
    ``uint16``/``uint32``/``uint64`` arrays need a PyTorch with those dtypes
    (2.3+).
    """
    if isinstance(batch, np.ndarray):
        return _tensor(batch)
    if isinstance(batch, RaggedBatch):
        return _ragged_tensors(batch)
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
    to ``device`` with ``non_blocking``. A :class:`~loaderx.RaggedBatch`
    becomes :class:`RaggedTensors` with ``values`` and ``cu_seqlens`` on
    ``device`` (``offsets`` and ``shapes`` stay on the CPU). Runs in the
    loader's transform threads, so the copies of several batches overlap
    with training.
    """
    import torch

    target = torch.device(device)
    pin = pin_memory and target.type != "cpu"

    def to_device(t: torch.Tensor) -> torch.Tensor:
        if pin:
            t = t.pin_memory()
        return t.to(target, non_blocking=non_blocking)

    def move(value: Any) -> Any:
        if isinstance(value, np.ndarray):
            return to_device(_tensor(value))
        if isinstance(value, RaggedBatch):
            t = _ragged_tensors(value)
            return RaggedTensors(to_device(t.values), to_device(t.cu_seqlens), t.offsets,
                                 t.shapes, t.max_seqlen)
        if isinstance(value, dict):
            return {k: move(v) for k, v in value.items()}
        if isinstance(value, list):
            return [move(v) for v in value]
        return value

    return move


class StatefulLoader:
    """A loaderx DataLoader as a torch data loader with ``state_dict`` / ``load_state_dict``.

    Iterating yields ``to_torch(batch)`` for every batch of ``loader``
    (tensors sharing the batch memory; endless like the loader). The
    conventions of torchdata's ``StatefulDataLoader``:

    * ``state_dict()`` may be called at any time and describes the position
      after the last batch yielded: loading it makes the next batch the one
      that would have come next. It is the DataLoader's state (plain ints,
      strings and its ``skip`` list of int pairs), so it survives ``torch.save`` /
      ``torch.load(weights_only=True)`` and JSON.
    * ``load_state_dict(state)`` is called before iterating again; the next
      batch is step ``state["step"]``, exactly, whatever ``num_threads``,
      ``prefetch``, embedded or loaderxd, and also with another
      ``world_size`` (and ``batch_size``) of the same global batch. A state
      of another sample order (seed, mode, length, global batch) raises
      ``ValueError`` naming the field.

    The wrapped loader is owned: ``close()`` (or the ``with`` block) closes it.
    """

    def __init__(self, loader: DataLoader) -> None:
        from .dataloader import DataLoader

        if not isinstance(loader, DataLoader):
            raise TypeError(f"StatefulLoader wraps a loaderx DataLoader, got {type(loader).__name__}")
        self.loader = loader

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        return self.loader._deliver(to_torch)  # an interrupt consumes no step here either

    def state_dict(self) -> dict[str, Any]:
        """The position after the last batch yielded, with the skipped ranges (plain ints, strings, lists)."""
        return self.loader.state_dict()

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Continues at ``state_dict["step"]``; see the class docstring."""
        state = dict(state_dict)
        for key, value in state.items():  # a loaded checkpoint may hold 0-d tensors
            if hasattr(value, "item") and not isinstance(value, (int, str)):
                state[key] = value.item()
        self.loader.load_state_dict(state)

    @property
    def step(self) -> int:
        """The step of the next batch."""
        return self.loader.step

    def close(self) -> None:
        self.loader.close()

    def __bool__(self) -> bool:
        return bool(self.loader)

    def __enter__(self) -> StatefulLoader:  # noqa: PYI034 - Self needs Python 3.11
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
