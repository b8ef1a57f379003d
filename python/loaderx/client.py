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
  size, fallback).

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
    for dense streams; ragged rings assume records up to twice the mean, so
    raise it if a step fails with ``ResourceExhausted`` naming ring_bytes).
    ``fallback``: load in process (with a warning) if no daemon answers.
    """

    path: str | None = None
    leases: int = DEFAULT_LEASES
    ring_bytes: int = 0
    fallback: bool = False


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
    ) -> None:
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
        return DaemonSource(path, streams, spec, leases=options.leases,
                            ring_bytes=options.ring_bytes)
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
        **kwargs: Any,
    ) -> Any:
        """``DataLoader(streams, batch_size, daemon=DaemonOptions(self.path, leases, ring_bytes), **kwargs)``."""
        from .dataloader import DataLoader

        options = DaemonOptions(self.path, leases=leases, ring_bytes=ring_bytes)
        return DataLoader(streams, batch_size, daemon=options, **kwargs)


def connect(path: str | os.PathLike[str] | None = None) -> Client:
    """Connects to loaderxd at ``path`` (default: :func:`default_socket_path`).

    Raises :class:`~loaderx.errors.DaemonError` if no daemon answers there.
    """
    resolved = default_socket_path() if path is None else os.fspath(path)
    return Client(resolved)
