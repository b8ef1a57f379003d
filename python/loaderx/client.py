"""loaderxd client: batches from a per-host daemon, mapped zero-copy.

``DataLoader(streams, ..., daemon=...)`` uses this module; so does
:func:`connect`. The daemon runs the same engine as the embedded loader, so the
batches are byte-identical; what changes is where the work happens (in
``loaderxd``) and how the batch reaches you (a read-only view of a
shared-memory ring, no copy).

``daemon`` may be

* ``True`` — the default socket (:func:`default_socket_path`);
* a path (``str`` / ``os.PathLike``) — that socket;
* ``"auto"`` — the default socket if a daemon answers there, otherwise the
  embedded loader with a :class:`RuntimeWarning`;
* a :class:`DaemonOptions` — a socket plus per-loader knobs (lease cap, ring
  size, fallback) and, optionally, a **group** to share one pipeline with
  other processes of the same user (``group_mode="shard"``: DDP ranks each
  receive their rows of one global batch; ``"broadcast"``: every member
  receives the same batches, gathered once). See docs/daemon.md, "Groups".

Zero-copy and leases: a dense stream's value is a read-only ``(B,
*item_shape)`` ndarray, a ragged stream's a list of read-only ndarrays; all
arrays of one batch share one ``base`` that owns the ring slot. The slot goes
back to the daemon when the last of them is freed. Holding more than
``leases`` batches (default :data:`DEFAULT_LEASES`) and asking for another
raises :class:`~loaderx.errors.ResourceExhausted` instead of waiting forever.

Failure: if the daemon dies, a ``next()`` raises
:class:`~loaderx.errors.DaemonError` within a second; arrays you hold stay
readable. Reconnect by building a new loader with ``start_step=`` (or
``seek``) at the step you were at: the batches are identical.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from . import _loaderx
from .errors import DaemonError

__all__ = [
    "DEFAULT_LEASES",
    "MAX_GROUP_NAME",
    "Client",
    "DaemonOptions",
    "DaemonSource",
    "connect",
    "daemon_source",
    "default_socket_path",
]

#: Batches one client may hold at once unless the daemon caps it lower.
DEFAULT_LEASES = 16


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


@dataclass(frozen=True)
class DaemonOptions:
    """Where and how a DataLoader talks to loaderxd (``DataLoader(..., daemon=DaemonOptions(...))``).

    ``path``: the socket (``None``: :func:`default_socket_path`). ``leases``:
    batches this loader may hold at once (the daemon may grant fewer).
    ``ring_bytes``: shared ring size; ``0`` lets the daemon size it (exact
    for dense streams; ragged rings assume records up to twice the mean and get twice the
    slots of payload to absorb fragmentation, so
    raise it if a step fails with ``ResourceExhausted`` naming ring_bytes).
    ``fallback``: load in process (with a warning) if no daemon answers.
    ``request_ahead``: as soon as ``next()`` returns a batch, ask the daemon
    for the following one, so the next ``next()`` finds it already queued
    (one receive, no round trip: the hand-off table in docs/benchmarks.md).
    The batch in flight is one more slot held at the daemon (``slots_held``
    counts it, and it counts against ``leases``); it is only requested while
    you hold fewer than ``leases`` batches, and a ``seek`` releases it.

    ``group``: a name (1..256 UTF-8 bytes) to join, or create, that group
    of loaders of this user; every member must pass the same stores,
    ``batch_size``, ``mode``, ``seed``, ``world_size`` and ``group_mode``.
    ``group_mode``: ``"shard"`` (members are ranks ``0..world_size-1``; each
    gets its own ``batch_size`` rows of every global batch, exactly as the
    embedded loader with that ``rank``) or ``"broadcast"`` (every member gets
    the same full batches). ``join``: where a member starts, ``"start_step"``
    (its own ``start_step``; the default for shard) or ``"current"`` (the
    group's oldest held step; the default for broadcast). Bad values raise
    ``ValueError`` naming the argument.
    """

    path: str | None = None
    leases: int = DEFAULT_LEASES
    ring_bytes: int = 0
    fallback: bool = False
    request_ahead: bool = False
    group: str | None = None
    group_mode: str = "shard"
    join: str | None = None

    def __post_init__(self) -> None:
        _check_group(self.group, self.group_mode, self.join)


#: Longest group name in UTF-8 bytes (the protocol's limit, from wire.h).
MAX_GROUP_NAME: int = _loaderx.MAX_GROUP_NAME
_GROUP_MODES = ("shard", "broadcast")
_JOINS = ("start_step", "current")


def _check_group(group: object, group_mode: object, join: object) -> None:
    """ValueError (TypeError for a non-str) naming the first bad group argument."""
    if group is not None:
        if not isinstance(group, str):
            raise TypeError(f"group must be a str or None, got {type(group).__name__}")
        size = len(group.encode("utf-8"))
        if not 1 <= size <= MAX_GROUP_NAME:
            raise ValueError(f"group must be 1..{MAX_GROUP_NAME} UTF-8 bytes, got {size}")
    if group_mode not in _GROUP_MODES:
        raise ValueError(f"group_mode must be 'shard' or 'broadcast', got {group_mode!r}")
    if join is not None and join not in _JOINS:
        raise ValueError(f"join must be 'start_step', 'current' or None, got {join!r}")
    if group is None and join is not None:
        raise ValueError("join only applies to a group member: pass group= as well")


def _resolve(daemon: Any) -> str:
    if isinstance(daemon, DaemonOptions):
        return default_socket_path() if daemon.path is None else os.fspath(daemon.path)
    if daemon is True or daemon == "auto":
        return default_socket_path()
    if isinstance(daemon, (str, os.PathLike)):
        return os.fspath(daemon)
    raise TypeError(f"daemon must be True, 'auto', a socket path or DaemonOptions, got {daemon!r}")


def _store_paths(streams: Mapping[str, Any], names: tuple[str, ...]) -> list[str]:
    paths = []
    for name in names:
        path = getattr(streams[name], "path", None)
        if not isinstance(path, str):
            raise TypeError(f"stream {name!r} has no store path to pass to loaderxd")
        paths.append(os.path.abspath(path))
    return paths


class DaemonSource:
    """A :class:`~loaderx.dataloader.BatchSource` served by loaderxd.

    ``next_raw`` returns ``(step, {name: value})`` with the same shapes and
    dtypes as the embedded source, as read-only views of the ring.
    """

    def __init__(
        self,
        path: str,
        streams: Mapping[str, Any],
        spec: Any,
        *,
        leases: int = DEFAULT_LEASES,
        ring_bytes: int = 0,
        group: str | None = None,
        group_mode: str = "shard",
        join: str | None = None,
    ) -> None:
        _check_group(group, group_mode, join)
        self._names = tuple(spec.names)
        self._path = path
        self._loader = _loaderx.DaemonLoader(
            path,
            _store_paths(streams, self._names),
            spec.batch_size,
            spec.mode,
            spec.seed,
            spec.rank,
            spec.world_size,
            spec.start_step,
            spec.prefetch,
            leases,
            ring_bytes,
            group or "",
            group_mode,
            join or "",
        )

    @property
    def step(self) -> int:
        """The step the next successful ``next_raw`` returns."""
        return int(self._loader.step)

    @property
    def path(self) -> str:
        """The daemon socket this source is connected to."""
        return self._path

    @property
    def lease_cap(self) -> int:
        """Batches this client may hold at once (granted by the daemon)."""
        return int(self._loader.lease_cap)

    @property
    def leases_held(self) -> int:
        """Batches of this loader alive in this process right now."""
        return int(self._loader.leases_held)

    @property
    def request_ahead(self) -> bool:
        """Whether the next batch is requested as soon as one is returned (DaemonOptions)."""
        return bool(self._loader.request_ahead)

    @request_ahead.setter
    def request_ahead(self, on: bool) -> None:
        self._loader.request_ahead = bool(on)

    def next_raw(self, timeout: float) -> tuple[int, dict[str, Any]] | None:
        """The next ``(step, {name: value})`` or ``None`` after ``timeout`` seconds."""
        got = self._loader.next(timeout)
        if got is None:
            return None
        step, values = got
        return int(step), dict(zip(self._names, values))

    def seek(self, step: int) -> None:
        """The next ``next_raw`` returns ``step``."""
        self._loader.seek(step)

    def close(self) -> None:
        """Ends the daemon session; held arrays stay readable. Idempotent."""
        self._loader.close()


def daemon_source(
    streams: Mapping[str, Any], spec: Any, *, daemon: Any = True
) -> Any:
    """The batch source for ``DataLoader(..., daemon=daemon)``.

    Raises :class:`~loaderx.errors.DaemonError` (``ConnectionError``) when no
    daemon answers, except with ``daemon="auto"``, which then falls back to
    the embedded source with a ``RuntimeWarning``.
    """
    options = daemon if isinstance(daemon, DaemonOptions) else DaemonOptions()
    auto = (isinstance(daemon, str) and daemon == "auto") or options.fallback
    try:
        path = _resolve(daemon)
        source = DaemonSource(path, streams, spec, leases=options.leases,
                            ring_bytes=options.ring_bytes, group=options.group,
                            group_mode=options.group_mode, join=options.join)
        source.request_ahead = options.request_ahead
        return source
    except DaemonError as exc:
        if not auto:
            raise
        from .dataloader import _EmbeddedSource

        warnings.warn(
            f"loaderx: no loaderxd answered ({exc}); loading in this process instead",
            RuntimeWarning,
            stacklevel=3,
        )
        return _EmbeddedSource(streams, spec)


class Client:
    """A handle on one loaderxd socket (see :func:`connect`)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.stats()  # fail now, with DaemonError, if nobody answers

    def stats(self) -> dict[str, int]:
        """The daemon's counters: sessions, loaders, slots_held, ring_bytes, ...

        ``uid_sessions`` / ``uid_ring_bytes`` are this user's share.
        """
        return dict(_loaderx.daemon_stats(self.path))

    def loader(
        self,
        streams: Mapping[str, Any],
        batch_size: int = 256,
        *,
        leases: int = DEFAULT_LEASES,
        ring_bytes: int = 0,
        group: str | None = None,
        group_mode: str = "shard",
        join: str | None = None,
        **kwargs: Any,
    ) -> Any:
        """``DataLoader(streams, batch_size, daemon=DaemonOptions(self.path, ...), **kwargs)``.

        ``leases``, ``ring_bytes``, ``group``, ``group_mode`` and ``join`` are
        :class:`DaemonOptions` fields (``group=`` shares one pipeline with
        the group's other members).
        """
        from .dataloader import DataLoader

        options = DaemonOptions(self.path, leases=leases, ring_bytes=ring_bytes, group=group,
                                group_mode=group_mode, join=join)
        return DataLoader(streams, batch_size, daemon=options, **kwargs)


def connect(path: str | os.PathLike[str] | None = None) -> Client:
    """Connects to loaderxd at ``path`` (default: :func:`default_socket_path`).

    Raises :class:`~loaderx.errors.DaemonError` if no daemon answers there.
    """
    resolved = default_socket_path() if path is None else os.fspath(path)
    return Client(resolved)
