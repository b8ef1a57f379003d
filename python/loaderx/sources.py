"""Batch sources: where a :class:`~loaderx.dataloader.DataLoader`'s raw batches come from.

One module for both hosts. :func:`open_source` turns the loader's
``daemon=`` argument into a source: the native pipeline in this process
(:class:`EmbeddedSource`, ``daemon=None``) or a loader served by loaderxd
(:class:`DaemonSource`). Both are thin faces over one native binding
(``_loaderx.Source``), so they behave alike in everything the user sees:

* **Values.** A dense stream is one ``(B, *item_shape)`` ndarray, a ragged
  stream a list of ``B`` ndarrays (``ragged="list"``) or one
  :class:`~loaderx.RaggedBatch` (``ragged="packed"``); all arrays of a batch
  view its memory without a copy and share one ``base`` that owns it (a
  loaderxd ring slot goes back to the daemon when the last of them is
  freed).
* **Writeability.** Batches are **writable** on both hosts (through
  loaderxd, private copy-on-write views of the ring slot), read-only only
  with ``DaemonOptions(shared_view=True)``; the rule is stated once, in
  docs/guide.md, "Batches: ownership and writeability".
* **Timeouts.** ``next_raw(timeout)`` takes seconds ``>= 0``; a negative or
  NaN timeout is :class:`~loaderx.errors.InvalidArgumentError` on both.
* **Errors.** Bad arguments are ``InvalidArgumentError`` (``ValueError``),
  a closed source ``LoaderClosedError``, an unreachable or unresponsive
  daemon ``DaemonError`` (``ConnectionError``), every class from
  :mod:`loaderx.errors`.
* **Liveness.** A daemon that dies is noticed within a second (hang-up);
  one that stops answering (SIGSTOP, deadlock) raises ``DaemonError`` after
  ``DaemonOptions.liveness_timeout`` (default 10 s; docs/daemon.md, "What is
  different").
* **Ctrl-C** in ``next_raw`` or ``seek`` raises ``KeyboardInterrupt`` within
  ~20 ms (plus up to 50 ms for a seek waiting on loaderxd) and consumes no
  step. **Interpreter exit** with sources alive, even with a daemon thread
  blocked in ``next_raw``, exits normally.

Imports go one way: ``errors <- sources <- dataloader <- client``.

The source contract (:class:`BatchSource`)
------------------------------------------
``source.step -> int``
    The step the next successful ``next_raw`` returns.
``source.next_raw(timeout: float, stash: list | None = None) -> tuple[int, dict[str, Any]] | None``
    The next ``(step, raw_batch)`` in step order, or ``None`` if it is not
    ready within ``timeout`` seconds (``0`` polls). ``stash`` is the
    caller's one-element list: a batch taken from the producer is stored in
    ``stash[0]`` before anything can raise (Ctrl-C lands between any two
    Python calls), and while ``stash[0]`` holds one, ``next_raw`` returns it
    instead of taking another. The caller empties ``stash[0]`` once it has
    counted the batch (without a stash, a batch lost to an exception is
    lost). If producing that step
    failed, raises the step's exception and advances past it. Raises
    :class:`~loaderx.errors.LoaderClosedError` once closed (also in a thread
    blocked here when another thread closes). Returns within ``timeout``
    (plus a few ms) so the caller can notice Ctrl-C and ``close``.
``source.seek(step: int) -> None``
    Discards anything prefetched; the next ``next_raw`` returns ``step``.
``source.close() -> None``
    Idempotent; stops all work and joins every native thread it started.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from . import _loaderx
from .errors import DaemonError, InvalidArgumentError, StateError

_log = logging.getLogger("loaderx")

__all__ = [
    "DEFAULT_LEASES",
    "DEFAULT_LIVENESS_TIMEOUT",
    "MAX_GROUP_NAME",
    "MIN_GROUP_TIMEOUT",
    "MIN_LIVENESS_TIMEOUT",
    "BatchSource",
    "DaemonOptions",
    "DaemonSource",
    "EmbeddedSource",
    "SourceSpec",
    "default_socket_path",
    "open_source",
]

#: Batches one client may hold at once unless the daemon caps it lower.
DEFAULT_LEASES = 16

#: Seconds a wait on loaderxd may pass without any sign of life from it
#: before ``DaemonError`` (see :class:`DaemonOptions`; the engine's,
#: loaderx/timeouts.h kDefaultLivenessTimeout).
DEFAULT_LIVENESS_TIMEOUT: float = _loaderx.DEFAULT_LIVENESS_TIMEOUT

#: Smallest ``liveness_timeout``: four daemon heartbeats (kMinLivenessTimeout).
MIN_LIVENESS_TIMEOUT: float = _loaderx.MIN_LIVENESS_TIMEOUT

#: Smallest ``DaemonOptions.group_timeout`` in seconds (kMinGroupTimeout).
MIN_GROUP_TIMEOUT: float = _loaderx.MIN_GROUP_TIMEOUT

#: Longest group name in UTF-8 bytes (the protocol's limit, from wire.h).
MAX_GROUP_NAME: int = _loaderx.MAX_GROUP_NAME


@dataclass(frozen=True)
class SourceSpec:
    """Everything a batch source needs to produce the loader's batches.

    ``names`` are the stream names in the order of ``streams``; ``n`` the
    common stream length; ``batch_size`` is per rank (the global batch is
    ``batch_size * world_size``); ``mode`` is ``0`` Sequential, ``1`` IID,
    ``2`` Cyclic. ``ragged`` is how ragged streams are delivered,
    ``"list"`` or ``"packed"`` (checked by the native source).
    ``segments`` are the ``(start_step, base, size)`` segments of a mixture
    schedule of more than one segment (:mod:`loaderx.mix`), else ``()``.
    """

    names: tuple[str, ...]
    n: int
    batch_size: int
    mode: int
    seed: int
    rank: int
    world_size: int
    start_step: int
    prefetch: int
    num_threads: int
    ragged: str = "list"
    segments: tuple[tuple[int, int, int], ...] = ()

    def sampling(self) -> dict[str, int]:
        """The settings both hosts' native sources take by the same keywords."""
        return {
            "batch_size": self.batch_size,
            "mode": self.mode,
            "seed": self.seed,
            "rank": self.rank,
            "world_size": self.world_size,
            "start_step": self.start_step,
            "prefetch": self.prefetch,
        }


class BatchSource(Protocol):
    """The interface between a DataLoader and a producer of raw batches (module docstring)."""

    @property
    def step(self) -> int: ...

    def next_raw(
        self, timeout: float, stash: list[Any] | None = None
    ) -> tuple[int, dict[str, Any]] | None: ...

    def seek(self, step: int) -> None: ...

    def close(self) -> None: ...


def native_store(name: str, stream: Any) -> Any:
    """The native ``_loaderx.Store`` behind an open Dense/Ragged reader."""
    handle = getattr(stream, "_native", None)
    if handle is None:
        raise StateError(
            f"stream {name!r} is closed or is a builder: pass stores opened with "
            "Dense.open / Ragged.open"
        )
    return handle


class _NativeSource:
    """next_raw/seek/step/close over one ``_loaderx.Source``."""

    _native: Any
    _names: tuple[str, ...]

    @property
    def step(self) -> int:
        """The step the next successful ``next_raw`` returns."""
        return int(self._native.step)

    def next_raw(
        self, timeout: float, stash: list[Any] | None = None
    ) -> tuple[int, dict[str, Any]] | None:
        """The next ``(step, {name: value})`` or ``None`` after ``timeout`` seconds."""
        if stash is None:
            stash = [None]
        got = stash[0]
        if got is None:
            got = self._native.next(timeout, stash)  # also in stash[0], as (step, [value])
            if got is None:
                return None
        if isinstance(got[1], list):  # the native form: named once, in place
            stash[0] = got = (int(got[0]), dict(zip(self._names, got[1])))
        return got

    def seek(self, step: int) -> None:
        """The next ``next_raw`` returns ``step``."""
        self._native.seek(step)

    def close(self) -> None:
        """Stops the source; arrays already returned stay valid. Idempotent."""
        self._native.close()


class EmbeddedSource(_NativeSource):
    """Raw batches from the native pipeline in this process."""

    def __init__(self, streams: Mapping[str, Any], spec: SourceSpec) -> None:
        self._names = spec.names
        self._native = _loaderx.Pipeline(
            [native_store(name, streams[name]) for name in spec.names],
            n=spec.n,
            num_threads=spec.num_threads,
            ragged=spec.ragged,
            segments=list(spec.segments),
            **spec.sampling(),
        )


def default_socket_path() -> str:
    """The socket ``loaderxd`` listens on by default.

    ``$LOADERXD_SOCKET`` if set; else ``/run/loaderx/loaderxd.sock`` for root
    and ``$XDG_RUNTIME_DIR/loaderx/loaderxd.sock`` for other users (the same
    rule as the daemon's ``--socket`` default).
    """
    env = os.environ.get("LOADERXD_SOCKET")
    if env:
        return env
    if os.geteuid() == 0:
        return "/run/loaderx/loaderxd.sock"
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if not runtime:
        raise DaemonError("XDG_RUNTIME_DIR is not set: pass the daemon socket path explicitly")
    return os.path.join(runtime, "loaderx", "loaderxd.sock")


def joins_where_the_group_is(daemon: Any, start_step: int) -> bool:
    """Whether ``DataLoader(..., start_step=start_step, daemon=daemon)`` starts at its
    group's current step rather than at ``start_step``: ``join="current"``, or a
    broadcast member with no ``join`` and no ``start_step`` (:class:`DaemonOptions`)."""
    if not isinstance(daemon, DaemonOptions) or daemon.group is None:
        return False
    if daemon.join is not None:
        return daemon.join == "current"
    return daemon.group_mode == "broadcast" and start_step == 0


@dataclass(frozen=True)
class DaemonOptions:
    """Where and how a DataLoader talks to loaderxd (``DataLoader(..., daemon=DaemonOptions(...))``).

    ``path``: the socket (``None``: :func:`default_socket_path`). ``leases``:
    batches this loader may hold at once (the daemon may grant fewer).
    ``ring_bytes``: shared ring size; ``0`` lets the daemon size it (exact
    for dense streams; ragged rings assume records up to twice the mean and
    get twice the slots of payload to absorb fragmentation, so raise it if a step fails with ``ResourceExhausted`` naming ring_bytes).
    ``fallback``: load in process (with a warning) if no daemon answers.
    ``shared_view``: batches as read-only views of the shared ring instead
    of writable copy-on-write mappings (docs/guide.md, "Batches: ownership
    and writeability").
    ``leases``: the batches this process may hold at once, which is also
    the daemon's credit: it pushes ready batches while this process holds
    fewer (batches pushed but not yet returned by ``next()`` count).
    ``liveness_timeout``: seconds a wait may hear nothing from the daemon
    (no batch, no reply and none of the heartbeats it sends every 0.25 s
    while this process may be waiting) before ``DaemonError``: a stopped
    (SIGSTOP), deadlocked or swapped-out daemon. At least 1.0 (four
    heartbeats); default :data:`DEFAULT_LIVENESS_TIMEOUT`. A stall shorter
    than this just delays the batch, which is then the right one: if the
    daemon resumes, the next ``next()`` returns it.

    ``group``: a name (1..256 UTF-8 bytes) to join, or create, that group
    of loaders of this user; every member must pass the same stores (and
    mixture weights), ``batch_size``, ``mode``, ``seed``, ``world_size`` and
    ``group_mode``.
    ``group_mode``: ``"shard"`` (members are ranks ``0..world_size-1``; each
    gets its own ``batch_size`` rows of every global batch, exactly as the
    embedded loader with that ``rank``) or ``"broadcast"`` (every member gets
    the same full batches). ``join``: where a member starts, ``"start_step"``
    (its own ``start_step``; the default for shard, where a step the group
    no longer holds is refused only if the member's first ``next()`` comes
    before a ``seek``/``load_state_dict`` to a held step: resuming ranks
    construct, load their checkpoint, then iterate) or ``"current"`` (the
    group's oldest held step; the default for broadcast, unless the loader
    has a ``start_step`` other than 0, which a broadcast member then honours:
    it starts there, or the open fails with ``IndexError`` naming the
    oldest step the group still holds; ``join="current"`` with such a
    ``start_step`` is refused). ``group_timeout``: seconds one ``next()`` of a
    group member may wait for the group's other members (a shard rank that
    never joined, left or is stuck; a broadcast member that fell
    ``max-skew`` steps behind) before it raises
    :class:`~loaderx.errors.GroupTimeoutError` naming the ranks it waits for
    and the step (at once, not after the timeout, when a shard rank it waits
    for left and that rank's process is gone: killed, crashed or exited);
    ``None`` takes loaderxd's ``--group-timeout`` (default 300 s).
    0.1..86400; only with a ``group``. Bad values raise ``ValueError`` naming
    the argument.

    ``ranks`` (shard groups): a ``range`` of the data-parallel ranks this
    group serves, when it serves only some of ``0..world_size-1``: the local
    ranks of one node of a multi-node job, each node with a loaderxd of its
    own (docs/guide.md, "Multi-node and model-parallel jobs";
    :func:`loaderx.distributed.node_daemon_options` derives it from the
    launcher). ``None``: all of them. ``replicas``: members per rank, which
    all receive byte-identical batches from the same step (the
    model-parallel ranks of one data-parallel replica); default 1. Members
    must agree on both; loaderxd checks the values (a range that does not
    divide the world evenly, a rank outside it) and names what is wrong.
    """

    path: str | None = None
    leases: int = DEFAULT_LEASES
    ring_bytes: int = 0
    fallback: bool = False
    group: str | None = None
    group_mode: str = "shard"
    join: str | None = None
    shared_view: bool = False
    liveness_timeout: float = DEFAULT_LIVENESS_TIMEOUT
    group_timeout: float | None = None
    ranks: range | None = None
    replicas: int = 1

    def __post_init__(self) -> None:
        _check_types(self)
        # The rules themselves are the engine's (LoaderSpec, client.h), checked
        # here so that a bad option fails where it is written. A build without
        # the client (not Linux) refuses when a loader is opened with them.
        if _loaderx.HAVE_DAEMON_CLIENT:
            self.native_spec().validate_options()

    def native_spec(self, stores: list[str] | None = None, **loader: Any) -> Any:
        """These options as a native ``_loaderx.LoaderSpec``, with the loader's
        ``stores`` and sampler settings (``loader``) when given."""
        ranks = self.ranks
        return _loaderx.LoaderSpec(
            stores=[] if stores is None else stores,
            leases=self.leases,
            ring_bytes=self.ring_bytes,
            group=self.group,
            group_mode=self.group_mode,
            join=self.join,
            shared_view=bool(self.shared_view),
            liveness_timeout=float(self.liveness_timeout),
            group_timeout=None if self.group_timeout is None else float(self.group_timeout),
            ranks_first=0 if ranks is None else ranks.start,
            ranks_count=0 if ranks is None else len(ranks),
            ranks_step=1 if ranks is None else ranks.step,
            replicas=self.replicas,
            **loader,
        )


def _check_types(o: DaemonOptions) -> None:
    """TypeError naming the first field of a type the engine cannot take.

    The values are checked by the engine (``DaemonOptions.native_spec``).
    """
    if o.group is not None and not isinstance(o.group, str):
        raise TypeError(f"group must be a str or None, got {type(o.group).__name__}")
    for name in ("group_mode", "join"):
        value = getattr(o, name)
        if not isinstance(value, str) and not (name == "join" and value is None):
            raise TypeError(f"{name} must be a str, got {type(value).__name__}")
    t = o.liveness_timeout
    if isinstance(t, bool) or not isinstance(t, (int, float)):
        raise TypeError(f"liveness_timeout must be a number of seconds, got {type(t).__name__}")
    g = o.group_timeout
    if g is not None and (isinstance(g, bool) or not isinstance(g, (int, float))):
        raise TypeError(f"group_timeout must be a number of seconds or None, got {type(g).__name__}")
    if o.ranks is not None and not isinstance(o.ranks, range):
        raise TypeError(f"ranks must be a range of data-parallel ranks or None, got {type(o.ranks).__name__}")
    for name in ("leases", "ring_bytes", "replicas"):
        value = getattr(o, name)
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")


def _wire_streams(streams: Mapping[str, Any], names: tuple[str, ...]
                  ) -> tuple[list[str], list[int], list[list[str]]]:
    """``(stores, mix_counts, mix_parts)`` for ``_loaderx.DaemonLoader``: a store's path,
    or for the streams of one mixture (:mod:`loaderx.mix`) their parts' paths, so
    loaderxd builds the same mixture from the same files."""
    paths: list[str] = []
    parts: list[list[str]] = []
    counts: tuple[int, ...] = ()
    for name in names:
        stream = streams[name]
        if hasattr(stream, "_mix_parts"):
            mixed: tuple[str, ...] | None = stream._mix_parts
            if mixed is None:
                raise TypeError(f"stream {name!r} mixes a mixture: loaderxd serves mixtures of "
                                "stores only (mix the stores themselves)")
            if counts and counts != stream._mix_counts:
                raise InvalidArgumentError(f"stream {name!r} belongs to another mixture than the "
                                           "other mixed streams (counts differ): one loader "
                                           "through loaderxd serves one mixture's positions")
            counts = stream._mix_counts
            paths.append(str(stream._path) if mixed else "")
            parts.append(list(mixed))
            continue
        path = getattr(stream, "path", None)
        if not isinstance(path, (str, os.PathLike)):  # a store's path is a pathlib.Path
            raise TypeError(f"stream {name!r} has no store path to pass to loaderxd")
        paths.append(os.path.abspath(os.fspath(path)))
        parts.append([])
    return paths, list(counts), parts if counts else []


class DaemonSource(_NativeSource):
    """A :class:`BatchSource` served by loaderxd.

    ``next_raw`` returns ``(step, {name: value})`` with the same shapes,
    dtypes and writeability as :class:`EmbeddedSource` (module docstring).
    """

    def __init__(
        self, path: str, streams: Mapping[str, Any], spec: SourceSpec, options: DaemonOptions
    ) -> None:
        self._names = tuple(spec.names)
        self._path = path
        self._moved_noted = False
        stores, mix_counts, mix_parts = _wire_streams(streams, self._names)
        schedule: dict[str, Any] = {}
        if spec.segments:  # protocol 1.6: K counts per segment, the sampler's segments
            schedule = {"mix_datasets": len(mix_counts) // len(spec.segments),
                        "segments": list(spec.segments)}
        native = options.native_spec(
            stores, mix_counts=mix_counts, mix_parts=mix_parts, **schedule, **spec.sampling()
        )
        self._native = _loaderx.DaemonLoader(path, native, spec.ragged)

    @property
    def path(self) -> str:
        """The daemon socket this source is connected to."""
        return self._path

    @property
    def lease_cap(self) -> int:
        """Batches this client may hold at once (granted by the daemon)."""
        return int(self._native.lease_cap)

    @property
    def leases_held(self) -> int:
        """Batches of this loader alive in this process right now, in the ring."""
        return int(self._native.leases_held)

    @property
    def batches_moved_out(self) -> int:
        """Held batches moved out of the ring so far to stay under the lease cap."""
        return int(self._native.batches_moved_out)

    def next_raw(
        self, timeout: float, stash: list[Any] | None = None
    ) -> tuple[int, dict[str, Any]] | None:
        got = super().next_raw(timeout, stash)
        if not self._moved_noted and self._native.batches_moved_out:
            self._moved_noted = True
            _log.info(
                "loaderxd loader on %s: holding more than %d batches; the oldest held ones "
                "move out of the shared ring into this process's memory (raise "
                "DaemonOptions.leases to keep more in the ring)", self._path, self.lease_cap)
        return got


def _resolve(daemon: Any) -> str:
    if isinstance(daemon, DaemonOptions):
        return default_socket_path() if daemon.path is None else os.fspath(daemon.path)
    if daemon is True or (isinstance(daemon, str) and daemon == "auto"):
        return default_socket_path()
    if isinstance(daemon, (str, os.PathLike)):
        return os.fspath(daemon)
    raise TypeError(f"daemon must be True, 'auto', a socket path or DaemonOptions, got {daemon!r}")


def open_source(streams: Mapping[str, Any], spec: SourceSpec, daemon: Any = None) -> BatchSource:
    """The batch source for ``DataLoader(..., daemon=daemon)``.

    ``daemon`` is ``None`` (gather in this process), ``True`` (the default
    socket), a socket path, ``"auto"`` (the default socket if a daemon
    answers there, else this process with a ``RuntimeWarning``) or a
    :class:`DaemonOptions` (``fallback=True`` falls back like ``"auto"``).
    Raises :class:`~loaderx.errors.DaemonError` (``ConnectionError``) when
    no daemon answers and there is no fallback.
    """
    if daemon is None:
        return EmbeddedSource(streams, spec)
    if daemon is False:
        raise TypeError("daemon must be None, True, 'auto', a socket path or DaemonOptions, got False")
    options = daemon if isinstance(daemon, DaemonOptions) else DaemonOptions()
    auto = (isinstance(daemon, str) and daemon == "auto") or options.fallback
    try:
        if not _loaderx.HAVE_DAEMON_CLIENT:
            raise DaemonError(
                f"this build of loaderx has no loaderxd client (loaderxd and its client are "
                f"Linux-only; this is {sys.platform}): load in this process with daemon=None")
        path = _resolve(daemon)
        return DaemonSource(path, streams, spec, options)
    except DaemonError as exc:
        if not auto:
            raise
        warnings.warn(
            f"loaderx: no loaderxd answered ({exc}); loading in this process instead",
            RuntimeWarning,
            stacklevel=3,
        )
        return EmbeddedSource(streams, spec)
