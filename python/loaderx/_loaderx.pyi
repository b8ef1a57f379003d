"""Type stubs for the native engine ``loaderx._loaderx`` (python/src/bind_*.cc).

Internal module: users go through loaderx.zrecord, loaderx.zsampler,
loaderx.dataloader and loaderx.client. Integer parameters take any object
with ``__index__`` (int, NumPy integers); floats and bools are rejected at
run time. Every error is a ``loaderx.errors`` class mapped from the engine's
Status (python/src/module.cc). Kept honest by ``mypy.stubtest``
(tests/python/test_typing.py).
"""

from collections.abc import Callable, Iterator, Sequence
from typing import Any, Literal, SupportsIndex, TypeAlias, final

import numpy as np
import numpy.typing as npt
from typing_extensions import Buffer, Self, disjoint_base

# A stream's batch value: a (B, *item_shape) ndarray for a dense store, a list
# of B ndarrays (one per record, each of its own shape) for a ragged one, or
# a RaggedBatch for a ragged one with ragged="packed".
_Value: TypeAlias = npt.NDArray[Any] | list[npt.NDArray[Any]] | RaggedBatch

# True when the extension was built with the loaderxd client (DaemonLoader,
# daemon_stats); those two names are absent otherwise.
HAVE_DAEMON_CLIENT: bool
MAX_GROUP_NAME: int
# The loaderxd client's timeout bounds in seconds (loaderx/timeouts.h), in every build.
DEFAULT_LIVENESS_TIMEOUT: float
MIN_LIVENESS_TIMEOUT: float
MIN_GROUP_TIMEOUT: float

# --- bind_store.cc -----------------------------------------------------------

@final
class StoreWriter:
    """Native Zrecord builder (use loaderx.zrecord). One thread at a time."""

    def __init__(
        self,
        path: str,
        kind: Literal["dense", "ragged"],
        dtype: str,
        item_shape: Sequence[SupportsIndex],
        ndim: SupportsIndex,
        codec: str,
        data_shards: SupportsIndex,
        dict_bytes: bytes | None,
        level: SupportsIndex = 3,
        metadata: str = "",
        narrow: bool = True,
    ) -> None:
        """Creates the store's temporary files; ``item_shape`` is used for dense, ``ndim`` for ragged."""

    def append_dense(self, data: npt.NDArray[Any], n: SupportsIndex) -> None:
        """Appends ``n`` records from a C-contiguous ``(n, *item_shape)`` array."""

    def append_ragged(
        self, values: npt.NDArray[Any], shapes: npt.ArrayLike, count: SupportsIndex
    ) -> None:
        """Appends ``count`` records packed back to back in C-contiguous ``values``;
        ``shapes`` is ``(count, ndim)`` uint64."""

    def append_ragged_from(
        self,
        it: Iterator[Any],
        dtype: np.dtype[Any],
        ndim: SupportsIndex,
        max_records: SupportsIndex,
        max_bytes: SupportsIndex,
    ) -> tuple[int, Any]:
        """Takes records from ``it`` up to ``max_records`` records or ``max_bytes`` bytes,
        checks them, then appends them all; returns ``(count, None)`` (count 0 at the end of
        ``it``), or ``(i, record)`` for the first record of the batch that is not an ndarray
        of ``dtype`` and rank ``ndim`` (nothing of the batch appended)."""

    def publish(self) -> None:
        """Seals the store and renames it into place."""

    def abort(self) -> None:
        """Removes the temporary files; the builder is closed afterwards."""

    def __len__(self) -> int: ...

@final
class Store:
    """Native read-only Zrecord store (use loaderx.zrecord). Not constructible: use ``open``."""

    @staticmethod
    def open(path: str) -> Store: ...
    @property
    def kind(self) -> Literal["dense", "ragged"]: ...
    @property
    def dtype(self) -> str:
        """NumPy dtype string, e.g. ``'<f4'``."""

    @property
    def item_shape(self) -> list[int]:
        """Dense: the shape of every record. Ragged: empty."""

    @property
    def ndim(self) -> int: ...
    @property
    def codec(self) -> str: ...
    @property
    def data_shards(self) -> int: ...
    @property
    def nbytes(self) -> int:
        """Decoded bytes of all records."""

    @property
    def metadata(self) -> dict[str, Any] | None:
        """The user metadata given at create (parsed JSON); None if none."""

    @property
    def format_version(self) -> tuple[int, int]:
        """(major, minor) of the store's format as written."""

    @property
    def stored_bytes(self) -> int:
        """Bytes on disk."""

    @property
    def label(self) -> str:
        """The path as the opener saw it (used in messages)."""

    def __len__(self) -> int: ...
    def read(self, i: SupportsIndex) -> npt.NDArray[Any]:
        """Record ``i`` as a new ndarray of its own shape."""

    def gather_dense(self, indices: npt.NDArray[np.integer[Any]]) -> npt.NDArray[Any]:
        """Dense: records at ``indices`` (cast to uint64) as one ``(B, *item_shape)`` ndarray."""

    def gather_ragged(self, indices: npt.NDArray[np.integer[Any]]) -> list[npt.NDArray[Any]]:
        """Ragged: records at ``indices`` as B ndarrays viewing one buffer."""

    def record_shape(self, arg0: SupportsIndex, /) -> tuple[int, ...]: ...
    def verify(self, progress: Callable[[int, int], object] | None = None) -> None:
        """Checks every checksum; ``progress(done, total)`` is called between rounds."""

def effective_batch_size(
    n: SupportsIndex, batch_size: SupportsIndex, mode: SupportsIndex, world_size: SupportsIndex
) -> int:
    """The per-rank batch a sampler of this spec draws (one Cyclic rank: at most n)."""

def mixed_store(parts: list[Store], counts: list[int], segments: int = 1) -> Store:
    """One stream of a mixture (or of a schedule's segments, one after the other)."""

def mix_source_store(counts: list[int], datasets: int = 0) -> Store:
    """Dense int64 scalars: the dataset number of every mixture position."""

def train_dictionary(
    samples: Sequence[Buffer | npt.NDArray[Any]], capacity: SupportsIndex, narrow_as: str = ""
) -> bytes:
    """Trains a zstd dictionary of at most ``capacity`` bytes from C-contiguous sample buffers.

    With ``narrow_as`` (a dtype string), samples are narrowed as a store of that dtype
    narrows its records."""

# --- bind_pack.cc ------------------------------------------------------------

class Packer:
    """Native sequence packer (internal; use loaderx.packing.Packing)."""

    def __init__(
        self,
        seq_len: object,
        rows: object,
        docs: object,
        policy: object,
        pad: list[object],
        cu_seqlens: object,
        names: list[object],
    ) -> None: ...
    def check(self, batch_size: object, dtypes: list[str]) -> int:
        """Units per batch of batch_size documents with these dtypes; raises if they cannot be packed."""
    def pack(
        self, streams: Sequence[object]
    ) -> tuple[
        list[npt.NDArray[Any]],
        npt.NDArray[np.int32],
        npt.NDArray[np.int32],
        npt.NDArray[np.int32] | None,
        dict[str, int],
    ]:
        """Packs one batch: (arrays, segment_ids, positions, cu_seqlens or None, counts)."""
    @property
    def seq_len(self) -> int: ...
    @property
    def rows(self) -> int: ...
    @property
    def docs(self) -> int: ...
    @property
    def policy(self) -> str: ...

# --- bind_sampler.cc ---------------------------------------------------------

@disjoint_base  # a C type with its own instance layout (PyType_FromSpec)
class SamplerCore:
    """Native counter-based batch index generator; use loaderx.zsampler.Sampler."""

    def __init__(
        self,
        n: SupportsIndex,
        batch_size: SupportsIndex,
        mode: SupportsIndex = 1,
        seed: SupportsIndex = 42,
        *,
        rank: SupportsIndex = 0,
        world_size: SupportsIndex = 1,
        start_step: SupportsIndex = 0,
    ) -> None: ...
    def next(self) -> npt.NDArray[np.uint64]:
        """The batch of the current step, shape ``(batch_size,)``, read-only; advances.

        The same array object every time, overwritten by the next draw."""

    def seek(self, step: SupportsIndex, /) -> None:
        """Positions the sampler so the next draw is the batch of ``step``. O(1)."""

    def peek(self, step: SupportsIndex, /) -> npt.NDArray[np.uint64]:
        """A new writable ``(batch_size,)`` uint64 array with the batch of ``step``."""

    def __iter__(self) -> Self: ...
    def __next__(self) -> npt.NDArray[np.uint64]: ...
    @property
    def step(self) -> int: ...
    @property
    def n(self) -> int: ...
    @property
    def batch_size(self) -> int: ...
    @property
    def mode_value(self) -> int: ...
    @property
    def seed(self) -> int: ...
    @property
    def rank(self) -> int: ...
    @property
    def world_size(self) -> int: ...
    @property
    def global_batch(self) -> int: ...
    @property
    def cycle_steps(self) -> int: ...

# --- bind_client.cc (module attribute) ----------------------------------------

PROTOCOL_VERSION: str  # the loaderxd wire protocol this build speaks, "major.minor"

# --- bind_source.cc ----------------------------------------------------------

class Source:
    """A native batch source: the embedded Pipeline or a DaemonLoader, with one behaviour."""

    def next(
        self, timeout: float | None = None, stash: list[Any] | None = None
    ) -> tuple[int, list[_Value]] | None:
        """``(step, values)`` of the next step (also put in ``stash[0]`` before anything
        can raise), or None after ``timeout`` seconds."""

    def seek(self, step: SupportsIndex) -> None: ...
    @property
    def step(self) -> int: ...
    def close(self) -> None: ...

@final
class RaggedBatch:
    """One ragged stream of one batch, packed (``DataLoader(..., ragged="packed")``).

    Made only by a source's ``next``: no constructor.
    """

    @property
    def values(self) -> npt.NDArray[Any]:
        """Every element of the batch's records, flat, without a copy."""
    @property
    def cu_seqlens(self) -> npt.NDArray[np.int32]:
        """int32 (B + 1,): cumulative first-dimension lengths."""
    @property
    def offsets(self) -> npt.NDArray[np.int64]:
        """int64 (B + 1,): element offsets of the records in values."""
    @property
    def shapes(self) -> npt.NDArray[np.int64]:
        """int64 (B, ndim): record shapes."""
    @property
    def max_seqlen(self) -> int:
        """The largest first dimension of a record."""
    def __len__(self) -> int: ...
    def __getitem__(self, index: SupportsIndex) -> npt.NDArray[Any]:
        """Record ``index`` as an ndarray view of the batch memory."""
    def __iter__(self) -> Iterator[npt.NDArray[Any]]: ...
    def tolist(self) -> list[npt.NDArray[Any]]:
        """The records as a list of ndarray views: the ragged='list' form."""

# --- bind_loader.cc ----------------------------------------------------------

@final
class Pipeline(Source):
    """Native prefetching batch pipeline (internal; use loaderx.dataloader.DataLoader)."""

    def __init__(
        self,
        stores: Sequence[Store],
        *,
        n: SupportsIndex,
        batch_size: SupportsIndex,
        mode: SupportsIndex,
        seed: SupportsIndex,
        rank: SupportsIndex,
        world_size: SupportsIndex,
        start_step: SupportsIndex,
        prefetch: SupportsIndex,
        num_threads: SupportsIndex,
        ragged: str = "list",
        segments: Sequence[tuple[SupportsIndex, SupportsIndex, SupportsIndex]] = [],
    ) -> None: ...

# --- bind_client.cc (present when HAVE_DAEMON_CLIENT) ------------------------

@final
class LoaderSpec:
    """Everything a loaderxd loader is opened with, built from keywords (client.h LoaderSpec)."""

    def __init__(
        self,
        *,
        stores: Sequence[str] = ...,
        batch_size: SupportsIndex = 0,
        mode: SupportsIndex = 1,
        seed: SupportsIndex = 42,
        rank: SupportsIndex = 0,
        world_size: SupportsIndex = 1,
        start_step: SupportsIndex = 0,
        prefetch: SupportsIndex = 4,
        leases: SupportsIndex = 8,
        ring_bytes: SupportsIndex = 0,
        group: str | None = None,
        group_mode: str = "shard",
        join: str | None = None,
        shared_view: bool = False,
        liveness_timeout: float = 10.0,
        group_timeout: float | None = None,
        mix_counts: Sequence[SupportsIndex] = ...,
        mix_parts: Sequence[Sequence[str]] = ...,
        ranks_first: SupportsIndex = 0,
        ranks_count: SupportsIndex = 0,
        ranks_step: SupportsIndex = 1,
        replicas: SupportsIndex = 1,
        mix_datasets: SupportsIndex = 0,
        segments: Sequence[tuple[SupportsIndex, SupportsIndex, SupportsIndex]] = ...,
        ragged: str = "list",
    ) -> None:
        """``group`` joins that loaderxd group (``group_mode`` 'shard' | 'broadcast',
        ``join`` None (the mode's default) | 'start_step' | 'current'); ``group_timeout``
        seconds a ``next`` may wait for the other members (None: loaderxd's --group-timeout).
        A mixture: ``mix_counts`` (one per dataset) and one ``mix_parts`` entry per stream
        (its parts' store paths; none for the dataset-number stream, whose ``stores``
        entry is '', or for a plain store). A shard group over part of the ranks:
        ``ranks_first``, ``ranks_count`` (0: all), ``ranks_step`` (the range's step:
        only 1 is valid); ``replicas`` members per rank. A
        mixture schedule: ``mix_datasets`` (K) with K counts per segment in ``mix_counts``
        and the sampler ``segments`` as ``(start_step, base, size)``."""

    def validate_options(self) -> None:
        """Raises ValueError naming the first DaemonOptions field that breaks a rule."""

    def validate(self) -> None:
        """Raises ValueError naming the first field that breaks a rule."""

class DaemonLoader(Source):
    """A loader served by loaderxd; batches are zero-copy views of its ring."""

    def __init__(self, path: str, spec: LoaderSpec, ragged: str = "list") -> None: ...
    @property
    def lease_cap(self) -> int: ...
    @property
    def leases_held(self) -> int: ...
    @property
    def batches_moved_out(self) -> int:
        """Held batches moved out of the ring to stay under the lease cap."""
    @property
    def ring_bytes(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def last_publish_ns(self) -> int:
        """When loaderxd published the last batch ``next()`` returned (``time.monotonic_ns()`` clock)."""

def daemon_stats(path: str) -> dict[str, int]:
    """loaderxd's counters (sessions, loaders, slots_held, ring_bytes, ...)."""

def daemon_status(path: str) -> tuple[dict[str, int], str]:
    """(counters, status JSON) of loaderxd; the JSON is '' from a daemon older than 1.2."""
