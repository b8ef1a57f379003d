"""Sequence packing: a batch of token documents as dense ``(rows, seq_len)`` rows.

::

    from loaderx.packing import Packing

    pack = Packing(seq_len=2048, rows=8, docs=32, policy="best_fit",
                   streams=("tokens", "loss_mask"), pad_id={"tokens": 50256, "loss_mask": 0},
                   cu_seqlens=True)
    loader = DataLoader({"tokens": tokens, "loss_mask": mask}, batch_size=64, pack=pack)
    batch = next(loader)
    # {"tokens": (16, 2048), "loss_mask": (16, 2048), "segment_ids": (16, 2048) int32,
    #  "positions": (16, 2048) int32, "cu_seqlens": (k,) int32, "pack_counts": {...}}

The packer is native (``common/include/loaderx/pack.h``): one call per batch,
with the GIL released, nothing per document in Python. The design, the
determinism rule (``docs`` and the world size) and the trade-offs of the two
policies are in docs/guide.md, "Sequence packing".

A packed batch holds, per packed stream, a ``(units * rows, seq_len)`` array
of the stream's dtype; ``segment_ids`` (``int32``: ``1, 2, ...`` per row,
``0`` for padding), ``positions`` (``int32``: the offset within the token's
segment), ``cu_seqlens`` (``int32`` segment boundaries over the flattened
rows, when asked for) and ``pack_counts`` (a dict of ints: ``tokens``,
``tokens_padded``, ``tokens_dropped``, ``docs_split``, ``docs_truncated``).
The batch's other streams are kept as delivered, one entry per document.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import _loaderx
from .errors import ArgumentTypeError, InvalidArgumentError

__all__ = ["OUTPUTS", "Packing"]

#: The names a packed batch adds; no stream may carry one of them.
OUTPUTS = ("segment_ids", "positions", "cu_seqlens", "pack_counts")


def _names(streams: Any) -> tuple[str, ...]:
    if isinstance(streams, str):
        return (streams,)
    if not isinstance(streams, Sequence):
        raise ArgumentTypeError(
            f"packing streams must be a stream name or a sequence of names, got "
            f"{type(streams).__name__}"
        )
    return tuple(streams)


def _pads(pad_id: Any, names: tuple[str, ...]) -> list[Any]:
    if not isinstance(pad_id, Mapping):
        return [pad_id] * len(names)
    unknown = [k for k in pad_id if k not in names]
    if unknown:
        raise InvalidArgumentError(
            f"packing pad_id names {unknown!r}, which are not packed streams {list(names)!r}"
        )
    return [pad_id.get(name, 0) for name in names]


@dataclass(frozen=True)
class Packing:
    """How a :class:`~loaderx.dataloader.DataLoader` packs each batch (``pack=``).

    Args:
        seq_len: tokens per row (``>= 1``).
        rows: rows per pack unit (``>= 1``); ``rows * seq_len <= 2**31 - 1``.
        docs: documents per pack unit, or ``None``: the whole (local) batch is
            one unit. The local batch size must be a multiple of ``docs``.
            Packed batches are the same for every world size only with
            ``docs`` set (docs/guide.md, "Sequence packing").
        policy: ``"concat"`` (documents end to end, cut every ``seq_len``
            tokens; only a unit's tail is padded or dropped) or
            ``"best_fit"`` (documents split into ``seq_len`` chunks, placed
            best-fit decreasing; rows padded; chunks that fit no row dropped).
        streams: the packed streams: Ragged streams of 1-D integer (or bool)
            records, aligned (document ``i`` has one length in all of them).
            The first decides the layout.
        pad_id: the padding value, one for all packed streams or a
            ``{stream: value}`` dict (streams left out pad with 0). It must
            fit each stream's dtype.
        cu_seqlens: also return ``cu_seqlens``.

    Raises:
        InvalidArgumentError: a value out of range, an unknown policy, a
            repeated stream name (names the setting).
        ArgumentTypeError: a setting of the wrong type.
    """

    seq_len: int
    rows: int
    docs: int | None = None
    policy: str = "concat"
    streams: tuple[str, ...] | str = ("tokens",)
    pad_id: int | Mapping[str, int] = 0
    cu_seqlens: bool = False
    _native: Any = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        names = _names(self.streams)
        object.__setattr__(self, "streams", names)
        native = _loaderx.Packer(
            self.seq_len,
            self.rows,
            self.docs,
            self.policy,
            _pads(self.pad_id, names),
            self.cu_seqlens,
            list(names),
        )
        object.__setattr__(self, "_native", native)

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickles as its settings (the native packer is made again on load)."""
        return (
            Packing,
            (
                self.seq_len,
                self.rows,
                self.docs,
                self.policy,
                self.streams,
                self.pad_id,
                self.cu_seqlens,
            ),
        )

    def check(self, streams: Mapping[str, Any], batch_size: int) -> None:
        """Raises unless a loader over ``streams`` with ``batch_size`` per rank can be packed.

        Every packed stream must be a Ragged stream of 1-D records whose
        dtype holds its pad value; ``batch_size`` a multiple of ``docs``;
        no stream may be named like an output (:data:`OUTPUTS`).
        """
        from .zrecord import Ragged

        for name in OUTPUTS:
            if name in streams:
                raise InvalidArgumentError(
                    f"stream {name!r} has the name of a packing output; rename it"
                )
        dtypes = []
        for name in self.streams:
            store = streams.get(name)
            if store is None:
                raise InvalidArgumentError(
                    f"packed stream {name!r} is not a stream of the loader ({list(streams)!r})"
                )
            if not isinstance(store, Ragged) or store.ndim != 1:
                raise InvalidArgumentError(
                    f"packed stream {name!r} must be a Ragged stream of 1-D records"
                )
            dtypes.append(store.dtype.str)
        self._native.check(batch_size, dtypes)

    def __call__(self, batch: Mapping[str, Any]) -> dict[str, Any]:
        """Packs one delivered batch (``{name: value}``); the packed batch is described above."""
        arrays, segment_ids, positions, cu_seqlens, counts = self._native.pack(
            [batch[name] for name in self.streams]
        )
        packed = dict(zip(self.streams, arrays))
        out = {name: packed.get(name, value) for name, value in batch.items()}
        out["segment_ids"] = segment_ids
        out["positions"] = positions
        if cu_seqlens is not None:
            out["cu_seqlens"] = cu_seqlens
        out["pack_counts"] = counts
        return out
