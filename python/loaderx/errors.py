"""The loaderx exception hierarchy.

Catch :class:`LoaderxError` for anything loaderx raises on purpose, or a
narrower class. Each class also derives from the builtin that fits, so code
written against plain Python (``except ValueError``) keeps working.

Where the reference ``loaderx`` 2.5.4 wheel raises a builtin class, ours
derives from that builtin too (a class may derive from several): schema and
argument-value problems are ``ValueError``, store creation and native I/O
failures are :class:`ZrecordError` (a ``RuntimeError``), and so on. The full
mapping is in docs/compat.md.
"""

from __future__ import annotations

__all__ = [
    "ArgumentTypeError",
    "CorruptStoreError",
    "DaemonError",
    "GroupTimeoutError",
    "InvalidArgumentError",
    "InvalidIndexError",
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
    "UnavailableError",
    "ZrecordError",
]


class LoaderxError(Exception):
    """Base class of every error loaderx raises deliberately."""


class InvalidArgumentError(LoaderxError, ValueError):
    """An argument has a bad value (its name is in the message)."""


class RecordIndexError(LoaderxError, IndexError):
    """A record index is outside ``0..len(store)-1``."""


class ArgumentTypeError(InvalidArgumentError, TypeError):
    """An argument of the wrong type (a float or a bool for a count).

    A ``TypeError``, and a ``ValueError`` as the 2.5.4 wheel raises there.
    """


class InvalidIndexError(RecordIndexError, TypeError):
    """An index of a kind that selects no record: a bool, a float, a string.

    An ``IndexError`` (what the 2.5.4 wheel raises for a bool) and a
    ``TypeError`` (what it raises for a float), so either ``except`` catches it.
    """


class SchemaError(LoaderxError, ValueError, TypeError):
    """Data does not match the store's dtype, shape or rank, or the dtype is unsupported.

    A ``ValueError`` (what the 2.5.4 wheel raises for schema, shape and dtype
    problems) and a ``TypeError`` (a wrong kind of object, e.g. a list where an
    ndarray is needed).
    """


class ZrecordError(LoaderxError, RuntimeError):
    """A store could not be created, written or read (the 2.5.4 wheel's ``ZrecordError``)."""


class CorruptStoreError(ZrecordError, OSError):
    """A store file is truncated, corrupted or not a Zrecord store (the file is named)."""


class StoreIOError(ZrecordError, OSError):
    """An operating-system I/O error while reading or writing a store."""


class StoreNotFoundError(LoaderxError, FileNotFoundError):
    """The store path does not exist."""


class StoreExistsError(ZrecordError, FileExistsError):
    """``create`` was given a path that already exists."""


class ResourceExhausted(LoaderxError, RuntimeError):
    """A cap was reached: held batch leases, ring memory or sessions."""


class LoaderClosedError(LoaderxError, RuntimeError):
    """The loader was closed (possibly by another thread) while in use."""


class StateError(LoaderxError, RuntimeError):
    """The object is in the wrong state for the call (reading a builder, appending to a reader)."""


class UnavailableError(StateError, AttributeError):
    """An attribute the object does not have yet (a builder's ``nbytes``).

    An ``AttributeError``, so ``hasattr()`` answers False, as with the 2.5.4 wheel.
    """


class ProtocolError(LoaderxError, RuntimeError):
    """A loaderxd wire message was malformed or of an unsupported protocol version."""


class DaemonError(LoaderxError, ConnectionError):
    """loaderxd is unreachable, refused the request or went away."""


class GroupTimeoutError(LoaderxError, TimeoutError):
    """A loaderxd group member waited longer than its group timeout for other members.

    The message names the group, the step the member waits to take and every
    rank (shard) or member (broadcast) it waits for, e.g. ``group 'ddp': rank 0
    waited 300 s for step 12: rank 1 has not joined (group_timeout 300 s)``.
    The member's step is unchanged: a later ``next()`` waits again.
    Also raised at once, without waiting the timeout, when a shard rank the
    member waits for left the group and that rank's process is gone (killed,
    crashed, exited): the message names the rank, the step it left at and how
    it left (``rank 0 cannot take step 9, which needs rank 1 to reach step 5
    first (max-skew 4), but rank 1 left at step 4 (...) and its process 812
    was killed by signal 9 (SIGKILL): restart rank 1 at step 4 or later ...``);
    once per rank that left: a later ``next()`` waits for a restarted rank.
    See ``DaemonOptions.group_timeout`` and docs/daemon.md, "Group timeout".
    """
