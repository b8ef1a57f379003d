"""loaderxd client: batches from a per-host daemon, mapped zero-copy.

``DataLoader(streams, ..., daemon=...)`` uses this module; so does
:func:`connect`. The daemon runs the same engine as the embedded loader, so the
batches are byte-identical; what changes is where the work happens (in
``loaderxd``) and how the batch reaches you (a view of a shared-memory ring,
no copy). The sources themselves live in :mod:`loaderx.sources`; this module
re-exports them and adds :class:`Client` / :func:`connect`.

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

Zero-copy and leases: a dense stream's value is a ``(B, *item_shape)``
ndarray, a ragged stream's a list of ndarrays, all views of one ring slot
that goes back to the daemon when the last of them is freed, or earlier:
code may hold any number of batches, and past ``leases`` (default
:data:`DEFAULT_LEASES`) the oldest held one moves out of the ring into this
process's memory (docs/daemon.md, "Holding batches"); who owns batches and
when they are writable: docs/guide.md, "Batches: ownership and
writeability". Read-only ``shared_view`` batches cannot move: holding
``leases`` of those and asking for another raises
:class:`~loaderx.errors.ResourceExhausted` instead of waiting forever.

Failure: if the daemon dies, a ``next()`` raises
:class:`~loaderx.errors.DaemonError` within a second; arrays you hold stay
readable. Reconnect by building a new loader with ``start_step=`` (or
``seek``) at the step you were at: the batches are identical.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from typing import Any

from . import _loaderx
from .dataloader import DataLoader
from .sources import (
    DEFAULT_LEASES,
    MAX_GROUP_NAME,
    DaemonOptions,
    DaemonSource,
    default_socket_path,
)

__all__ = [
    "DEFAULT_LEASES",
    "MAX_GROUP_NAME",
    "Client",
    "DaemonOptions",
    "DaemonSource",
    "connect",
    "default_socket_path",
]


class Client:
    """A handle on one loaderxd socket (see :func:`connect`)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.stats()  # fail now, with DaemonError, if nobody answers

    def stats(self) -> dict[str, Any]:
        """The daemon's counters and status (every field: docs/daemon.md, "Status").

        The counters are ints at the top level (``sessions``, ``loaders``,
        ``groups``, ``slots_held``, ``ring_bytes``, ...; ``uid_sessions`` /
        ``uid_ring_bytes`` are this user's share). From a protocol 1.2 daemon
        the status document adds ``daemon`` (pid, version, uptime, limits),
        ``named_groups`` (each with its members, cursors, held steps and
        what it waits for), ``solo_loaders`` and ``uids``; a plain user sees
        only their own groups, loaders and usage there (root sees all).
        """
        counters, document = _loaderx.daemon_status(self.path)
        out: dict[str, Any] = dict(counters)
        if document:
            out.update(json.loads(document))
        return out

    def loader(self, streams: Mapping[str, Any], batch_size: int = 256, **kwargs: Any) -> Any:
        """``DataLoader(streams, batch_size=batch_size, daemon=DaemonOptions(self.path, ...), ...)``.

        Every :class:`DaemonOptions` field but ``path`` (``leases``,
        ``group``, ``group_mode``, ``join``, ``group_timeout``, ``ranks``,
        ``replicas``, ...) goes to the options; every other keyword to the
        :class:`~loaderx.dataloader.DataLoader`.
        """
        fields = {f.name for f in dataclasses.fields(DaemonOptions)} - {"path"}
        options = {k: kwargs.pop(k) for k in list(kwargs) if k in fields}
        daemon = DaemonOptions(self.path, **options)
        return DataLoader(streams, batch_size=batch_size, daemon=daemon, **kwargs)


def connect(path: str | os.PathLike[str] | None = None) -> Client:
    """Connects to loaderxd at ``path`` (default: :func:`default_socket_path`).

    Raises :class:`~loaderx.errors.DaemonError` if no daemon answers there.
    """
    resolved = default_socket_path() if path is None else os.fspath(path)
    return Client(resolved)
