"""The loaderx exception hierarchy.

Catch :class:`LoaderxError` for anything loaderx raises on purpose, or a
narrower class. Each class also derives from the builtin that fits, so code
written against plain Python (``except ValueError``) keeps working.
"""

from __future__ import annotations

__all__ = [
    "CorruptStoreError",
    "DaemonError",
    "InvalidArgumentError",
    "LoaderClosedError",
    "LoaderxError",
    "ProtocolError",
    "RecordIndexError",
    "ResourceExhausted",
    "SchemaError",
    "StateError",
    "StoreExistsError",
    "StoreIOError",
    "StoreNotFoundError",
]


class LoaderxError(Exception):
    """Base class of every error loaderx raises deliberately."""


class InvalidArgumentError(LoaderxError, ValueError):
    """An argument has a bad value (its name is in the message)."""


class RecordIndexError(LoaderxError, IndexError):
    """A record index is outside ``0..len(store)-1``."""


class SchemaError(LoaderxError, TypeError):
    """Data does not match the store's dtype, shape or rank, or the dtype is unsupported."""


class CorruptStoreError(LoaderxError, OSError):
    """A store file is truncated, corrupted or not a Zrecord store (the file is named)."""


class StoreIOError(LoaderxError, OSError):
    """An operating-system I/O error while reading or writing a store."""


class StoreNotFoundError(LoaderxError, FileNotFoundError):
    """The store path does not exist."""


class StoreExistsError(LoaderxError, FileExistsError):
    """``create`` was given a path that already exists."""


class ResourceExhausted(LoaderxError, RuntimeError):
    """A cap was reached: held batch leases, ring memory or sessions."""


class LoaderClosedError(LoaderxError, RuntimeError):
    """The loader was closed (possibly by another thread) while in use."""


class StateError(LoaderxError, RuntimeError):
    """The object is in the wrong state for the call (reading a builder, appending to a reader)."""


class ProtocolError(LoaderxError, RuntimeError):
    """A loaderxd wire message was malformed or of an unsupported protocol version."""


class DaemonError(LoaderxError, ConnectionError):
    """loaderxd is unreachable, refused the request or went away."""
