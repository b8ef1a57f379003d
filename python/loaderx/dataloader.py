"""The step-based, endless DataLoader over named Zrecord streams.

A :class:`DataLoader` gathers, for every step ``s``, the records the sampler
names for ``s`` from every stream, and yields ``{name: value}``:

* a :class:`~loaderx.zrecord.Dense` stream gives one ``(B, *item_shape)``
  ndarray of the store's dtype, viewing the batch memory without a copy
  (``value.base`` owns it);
* a :class:`~loaderx.zrecord.Ragged` stream gives a ``list`` of ``B`` ndarrays,
  each with its record's exact shape (views as well).

The raw batch goes through ``transform`` (if any) and the transform's return
value is yielded unchanged. The k-th item yielded is always step
``start_step + k``, byte-identical whatever ``num_threads``, ``prefetch`` or
``transform_threads``.

Batch sources
-------------
Where raw batches come from is pluggable. The loader keeps everything else
(transform pool, ordering, ``step``, ``state_dict``, ``close``) in one place.
A source is any object with this interface (see :class:`BatchSource`):

``source.step -> int``
    The step the next successful ``next_raw`` returns.
``source.next_raw(timeout: float) -> tuple[int, dict[str, Any]] | None``
    The next ``(step, raw_batch)`` in step order, or ``None`` if it is not
    ready within ``timeout`` seconds (``0`` polls). If producing that step
    failed, raises the step's exception and advances past it. Raises
    :class:`~loaderx.errors.LoaderClosedError` once closed (also in a thread
    blocked here when another thread closes). Must return within ``timeout``
    (plus a few ms) so the caller can notice Ctrl-C and ``close``.
``source.seek(step: int) -> None``
    Discards anything prefetched; the next ``next_raw`` returns ``step``.
``source.close() -> None``
    Idempotent; stops all work and joins every thread the source started.

The embedded source (default) runs the native pipeline in this process. With
``daemon=...`` the loader asks ``loaderx.client.daemon_source(streams, spec,
daemon=daemon)`` for one, passing a :class:`SourceSpec`.

Errors, close, signals
----------------------
* An exception in a gather or in ``transform`` is raised by the ``next()``
  that would have returned that step, with its original traceback. The step
  is consumed: ``loader.step`` moves past it and the loader stays usable, the
  next ``next()`` returns the following step.
* ``close()`` is idempotent, returns promptly (after the transform calls
  already running finish), wakes a thread blocked in ``next()`` with
  :class:`~loaderx.errors.LoaderClosedError` and leaves no thread behind. A
  loader that is garbage collected or alive at interpreter exit is closed.
* Ctrl-C during ``next()`` raises ``KeyboardInterrupt`` within ~20 ms; no step
  is consumed, so calling ``next()`` again continues where it was.
"""

from __future__ import annotations

import operator
import os
import threading
import weakref
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, Protocol

from . import _loaderx
from .errors import InvalidArgumentError, LoaderClosedError, StateError
from .zsampler import Mode, Sampler, _to_mode

__all__ = ["BatchSource", "DataLoader", "SourceSpec", "default_num_threads"]

# How long one wait may block before the loader looks at close() and lets
# Python run signal handlers. Ctrl-C must surface within 100 ms.
_POLL_SECONDS = 0.02

_STATE_VERSION = 1


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - non-Linux
        return os.cpu_count() or 1


def default_num_threads() -> int:
    """Gather threads used when ``num_threads`` is not given: the usable CPUs, at most 16.

    Gather is bound by memory bandwidth and decompression; beyond ~16 threads a
    single loader rarely gains and only takes cores from the training step.
    """
    return max(1, min(16, _cpu_count()))


def _default_transform_threads() -> int:
    # Half the CPUs (the other half gathers), between 2 and 8: two keep one
    # call running while the next result is handed over; more than 8 rarely
    # helps a GIL-bound transform and GIL-free ones saturate memory first.
    return max(2, min(8, _cpu_count() // 2))


# Every batch is gathered by all gather threads together, so one batch ready
# while the next is being made keeps them busy; more only costs memory
# (measured: 2, 3 and 4 give the same batches/s on 256x3x224x224 records).
_DEFAULT_PREFETCH = 2


@dataclass(frozen=True)
class SourceSpec:
    """Everything a batch source needs to produce the loader's batches.

    ``names`` are the stream names in the order of ``streams``; ``n`` the
    common stream length; ``batch_size`` is per rank (the global batch is
    ``batch_size * world_size``); ``mode`` is ``0`` Sequential, ``1`` IID,
    ``2`` Cyclic.
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


class BatchSource(Protocol):
    """The interface between :class:`DataLoader` and a producer of raw batches.

    See the module docstring for the exact contract of each member.
    """

    @property
    def step(self) -> int: ...

    def next_raw(self, timeout: float) -> tuple[int, dict[str, Any]] | None: ...

    def seek(self, step: int) -> None: ...

    def close(self) -> None: ...


def _native_store(name: str, stream: Any) -> Any:
    """The native ``_loaderx.Store`` behind an open Dense/Ragged reader."""
    handle = getattr(stream, "_native", None)
    if handle is None:
        raise StateError(
            f"stream {name!r} is closed or is a builder: pass stores opened with "
            "Dense.open / Ragged.open"
        )
    return handle


class _EmbeddedSource:
    """Raw batches from the native pipeline in this process."""

    def __init__(self, streams: Mapping[str, Any], spec: SourceSpec) -> None:
        self._names = spec.names
        self._pipeline = _loaderx.Pipeline(
            [_native_store(name, streams[name]) for name in spec.names],
            spec.n,
            spec.batch_size,
            spec.mode,
            spec.seed,
            spec.rank,
            spec.world_size,
            spec.start_step,
            spec.prefetch,
            spec.num_threads,
        )

    @property
    def step(self) -> int:
        return int(self._pipeline.step)

    def next_raw(self, timeout: float) -> tuple[int, dict[str, Any]] | None:
        got = self._pipeline.next(timeout)
        if got is None:
            return None
        step, values, _indices = got
        return step, dict(zip(self._names, values))

    def seek(self, step: int) -> None:
        self._pipeline.seek(step)

    def close(self) -> None:
        self._pipeline.close()


def _mode_value(mode: Any) -> int:
    return int(_to_mode(mode))


def _mode_name(value: int) -> str:
    return Mode(value).name


def _check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got bool")
    try:
        value = operator.index(value)  # int and NumPy integers
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(value).__name__}") from None
    if value < minimum:
        raise InvalidArgumentError(f"{name} must be >= {minimum}, got {value}")
    if value >= 2**64:
        raise InvalidArgumentError(f"{name} must be < 2**64, got {value}")
    return value


def _check_streams(streams: Any) -> tuple[tuple[str, ...], int]:
    from .zrecord import Dense, Ragged

    if not isinstance(streams, Mapping):
        raise TypeError(
            f"streams must be a dict of name -> Dense/Ragged store, got {type(streams).__name__}"
        )
    if not streams:
        raise TypeError("streams must name at least one Dense/Ragged store, got an empty dict")
    for name, store in streams.items():
        if not isinstance(name, str):
            raise TypeError(f"stream names must be str, got {name!r}")
        if not isinstance(store, (Dense, Ragged)):
            raise TypeError(
                f"stream {name!r} must be an open Dense or Ragged store, got {type(store).__name__}"
            )
        _native_store(name, store)
    lengths = {name: len(store) for name, store in streams.items()}
    if len(set(lengths.values())) > 1:
        shown = ", ".join(f"{name}={n}" for name, n in lengths.items())
        raise InvalidArgumentError(f"streams have different lengths: {shown}")
    n = next(iter(lengths.values()))
    if n == 0:
        raise InvalidArgumentError("streams are empty: a loader needs at least one record")
    return tuple(streams), n


# Set in transform worker threads, so close() called from a transform (a
# misuse) does not wait for itself.
_in_transform = threading.local()


class DataLoader:
    """Endless, step-based loader over a dict of equal-length Zrecord stores.

    Args:
        streams: ``{name: store}`` of open :class:`~loaderx.zrecord.Dense` /
            :class:`~loaderx.zrecord.Ragged` stores of equal length. The loader
            does not own them: close them yourself after ``loader.close()``.
        batch_size: records per batch on this rank (default 256).
        transform: ``f(batch) -> Any``, called once per batch, possibly from
            several threads at once (must be thread-safe); its return value is
            yielded unchanged. ``None`` yields the raw ``{name: value}`` dict.
        mode: ``Sampler.Mode.IID`` (default), ``Sequential`` or ``Cyclic``.
        seed: sampler seed (default 42).
        sampler: an existing :class:`~loaderx.zsampler.Sampler`. Its spec
            (length, batch size, mode, seed, rank, world size) and its current
            step define the loader; ``batch_size``, ``mode``, ``seed``,
            ``rank``, ``world_size`` and ``start_step`` must then be left at
            their defaults or agree with it (else ``ValueError``). The sampler
            itself is not advanced.
        rank, world_size: this process's slice of the global batch of
            ``batch_size * world_size`` records (DESIGN.md §5).
        start_step: the step of the first batch (default 0).
        prefetch: batches gathered ahead of the consumer (default 2). Memory
            is bounded by ``prefetch + transform_threads`` batches, two freed
            buffers kept for reuse, and what the caller holds.
        num_threads: gather threads (default: usable CPUs, at most 16).
        transform_threads: concurrent transform calls (default: half the CPUs,
            between 2 and 8; ignored without ``transform``).
        daemon: ``None`` (default) gathers in this process; anything else is
            passed to ``loaderx.client.daemon_source`` to get batches from
            loaderxd.

    Raises:
        TypeError: ``streams`` is not a non-empty dict of stores, or an
            argument has the wrong type.
        ValueError: lengths differ (the message names each stream and its
            length), or an argument is out of range.
    """

    def __init__(
        self,
        streams: Mapping[str, Any],
        batch_size: int = 256,
        transform: Callable[[dict[str, Any]], Any] | None = None,
        *,
        mode: Any = Sampler.Mode.IID,
        seed: int = 42,
        sampler: Sampler | None = None,
        rank: int = 0,
        world_size: int = 1,
        start_step: int = 0,
        prefetch: int | None = None,
        num_threads: int | None = None,
        transform_threads: int | None = None,
        daemon: Any = None,
    ) -> None:
        self._closed = True  # until fully built: a half-built loader refuses use
        names, n = _check_streams(streams)
        if transform is not None and not callable(transform):
            raise TypeError(f"transform must be callable or None, got {type(transform).__name__}")
        if sampler is not None:
            batch_size, mode, seed, rank, world_size, start_step = _from_sampler(
                sampler, n, batch_size, mode, seed, rank, world_size, start_step
            )
        mode_value = _mode_value(mode)
        batch_size = _check_int("batch_size", batch_size, 1)
        seed = _check_int("seed", seed, 0)
        world_size = _check_int("world_size", world_size, 1)
        rank = _check_int("rank", rank, 0)
        if rank >= world_size:
            raise InvalidArgumentError(f"rank must be < world_size ({world_size}), got {rank}")
        start_step = _check_int("start_step", start_step, 0)
        prefetch = _DEFAULT_PREFETCH if prefetch is None else _check_int("prefetch", prefetch, 1)
        if prefetch > 1024:
            raise InvalidArgumentError(f"prefetch must be <= 1024, got {prefetch}")
        num_threads = (
            default_num_threads()
            if num_threads is None
            else _check_int("num_threads", num_threads, 1)
        )
        if num_threads > 1024:
            raise InvalidArgumentError(f"num_threads must be <= 1024, got {num_threads}")
        if transform_threads is None:
            transform_threads = _default_transform_threads()
        else:
            transform_threads = _check_int("transform_threads", transform_threads, 1)

        self._spec = SourceSpec(
            names=names,
            n=n,
            batch_size=batch_size,
            mode=mode_value,
            seed=seed,
            rank=rank,
            world_size=world_size,
            start_step=start_step,
            prefetch=prefetch,
            num_threads=num_threads,
        )
        if daemon is None:
            source: BatchSource = _EmbeddedSource(streams, self._spec)
        else:
            from . import client  # lazy: the daemon client is optional

            source = client.daemon_source(streams, self._spec, daemon=daemon)
        self._source = source
        self._transform = transform
        self._window = transform_threads
        self._executor: ThreadPoolExecutor | None = None
        if transform is not None:
            self._executor = ThreadPoolExecutor(
                max_workers=transform_threads,
                thread_name_prefix="loaderx-transform",
                initializer=_mark_transform_thread,
            )
        # (step, future) in step order; the future holds the transformed batch
        # or the exception of that step.
        self._pending: deque[tuple[int, Future[Any]]] = deque()
        # The source's first step: start_step, except for a loaderxd group
        # member joining with join="current", which starts where the group is.
        self._step = source.step
        self._lock = threading.Lock()  # serialises next/seek/load_state_dict
        self._close_lock = threading.Lock()
        self._closed = False
        # Closes the source and joins the transform pool when the loader is
        # collected, without keeping the loader alive. Not at exit (atexit
        # hooks run before daemon threads are stopped): waking a daemon thread
        # blocked in next() then would run its Python code during shutdown.
        # An unclosed loader alive at exit is collected with its module, once
        # daemon threads can no longer run; its native threads never need the
        # GIL, so nothing waits for them.
        self._finalizer = weakref.finalize(self, _shutdown, source, self._executor)
        self._finalizer.atexit = False

    # -- iteration -----------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:
        return self

    def __len__(self) -> int:
        raise TypeError("DataLoader is endless (step-based): it has no length")

    def __bool__(self) -> bool:
        """True while the loader is open (``len()`` raises: the loader is endless)."""
        return not self._closed

    def __next__(self) -> Any:
        self._check_open()
        with self._lock:
            if self._transform is None:
                return self._next_untransformed()
            return self._next_transformed()

    def _next_untransformed(self) -> Any:
        while True:
            self._check_open()
            try:
                got = self._source.next_raw(_POLL_SECONDS)
            except LoaderClosedError:
                raise
            except Exception:
                self._step = self._source.step  # the source moved past the failed step
                raise
            if got is not None:
                self._step = got[0] + 1
                return got[1]

    def _next_transformed(self) -> Any:
        if not self._pending:
            self._fetch(block=True)
        step, future = self._pending[0]
        while not future.done():
            self._check_open()
            self._top_up()
            wait([future], timeout=_POLL_SECONDS)
        self._check_open()  # a close() from another thread cancels the futures
        if future.cancelled():  # close() raced in after the check above
            raise LoaderClosedError("the DataLoader is closed")
        self._pending.popleft()
        self._step = step + 1
        return future.result()  # the transform's value, or its exception and traceback

    def _top_up(self) -> None:
        """Submits every raw batch that is ready, up to the transform window."""
        while len(self._pending) < self._window:
            if not self._fetch(block=False):
                return

    def _fetch(self, block: bool) -> bool:
        """Takes the next raw batch from the source into the transform pool."""
        while True:
            self._check_open()
            step = self._source.step
            try:
                got = self._source.next_raw(_POLL_SECONDS if block else 0.0)
            except LoaderClosedError:
                raise
            except Exception as exc:  # noqa: BLE001 - any error of the step, raised in order
                failed: Future[Any] = Future()
                failed.set_exception(exc)
                self._pending.append((step, failed))
                return True
            if got is not None:
                assert self._executor is not None and self._transform is not None
                try:
                    future = self._executor.submit(self._transform, got[1])
                except RuntimeError:
                    # Shut down by a concurrent close(), or by interpreter exit
                    # while a daemon thread still iterates: then run it here.
                    self._check_open()
                    future = Future()
                    try:
                        future.set_result(self._transform(got[1]))
                    except Exception as exc:  # noqa: BLE001 - raised by next() in order
                        future.set_exception(exc)
                self._pending.append((got[0], future))
                return True
            if not block:
                return False

    # -- position and state --------------------------------------------------

    @property
    def step(self) -> int:
        """The step of the batch the next ``next()`` returns."""
        return self._step

    @property
    def batch_size(self) -> int:
        """Records per batch on this rank."""
        return self._spec.batch_size

    def seek(self, step: int) -> None:
        """Makes ``step`` the next batch; discards prefetched and pending work. O(1)."""
        step = _check_int("step", step, 0)
        self._check_open()
        with self._lock:
            self._check_open()
            for _, future in self._pending:
                future.cancel()
            self._pending.clear()
            self._source.seek(step)
            self._step = step

    def state_dict(self) -> dict[str, Any]:
        """The loader's position: a small dict of ints and strings (picklable, JSON-able).

        ``step`` is the next batch's step; ``seed``, ``mode``, ``n`` and
        ``global_batch_size`` identify the sample order it refers to.
        """
        spec = self._spec
        return {
            "version": _STATE_VERSION,
            "step": self._step,
            "seed": spec.seed,
            "mode": _mode_name(spec.mode),
            "n": spec.n,
            "global_batch_size": spec.batch_size * spec.world_size,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continues at ``state["step"]``.

        The state may come from a loader with another ``world_size`` (and
        ``rank``) as long as the global batch, seed, mode and stream length
        are the same; anything else raises ``ValueError`` naming the field,
        since it would silently yield other samples.
        """
        if not isinstance(state, Mapping):
            raise TypeError(f"state must be a dict from state_dict(), got {type(state).__name__}")
        mine = self.state_dict()
        missing = [k for k in mine if k not in state]
        if missing:
            raise InvalidArgumentError(f"state is missing {', '.join(missing)}")
        if state["version"] != _STATE_VERSION:
            raise InvalidArgumentError(f"state version {state['version']!r} is not supported")
        for key in ("seed", "mode", "n", "global_batch_size"):
            if state[key] != mine[key]:
                raise InvalidArgumentError(
                    f"state {key} is {state[key]!r} but this loader's is {mine[key]!r}"
                )
        self.seek(state["step"])

    # -- lifetime ------------------------------------------------------------

    def close(self) -> None:
        """Stops all work and joins every thread. Idempotent; safe from any thread.

        A thread blocked in ``next()`` raises ``LoaderClosedError``. The
        streams stay open (the caller owns them).
        """
        with self._close_lock:  # a second closer returns once the first is done
            self._closed = True
            for _, future in list(self._pending):
                future.cancel()
            self._finalizer()  # runs once

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise LoaderClosedError("the DataLoader is closed")

    def __enter__(self) -> DataLoader:  # noqa: PYI034 - Self needs Python 3.11
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        s = self._spec
        state = "closed" if self._closed else f"step={self._step}"
        return (
            f"DataLoader(streams={list(s.names)}, batch_size={s.batch_size}, "
            f"mode={_mode_name(s.mode)}, seed={s.seed}, {state})"
        )


def _mark_transform_thread() -> None:
    _in_transform.active = True


def _shutdown(source: BatchSource, executor: ThreadPoolExecutor | None) -> None:
    source.close()
    if executor is not None:
        # From inside a transform (a misuse) the pool cannot wait for itself.
        wait = not getattr(_in_transform, "active", False)
        executor.shutdown(wait=wait, cancel_futures=True)


def _from_sampler(
    sampler: Sampler,
    n: int,
    batch_size: int,
    mode: Any,
    seed: int,
    rank: int,
    world_size: int,
    start_step: int,
) -> tuple[int, Any, int, int, int, int]:
    """Takes the loader's spec from `sampler`; explicit arguments must agree."""
    if not isinstance(sampler, Sampler):
        raise TypeError(f"sampler must be a loaderx Sampler, got {type(sampler).__name__}")
    if sampler.n != n:
        raise InvalidArgumentError(f"sampler covers {sampler.n} records but the streams have {n}")
    theirs = {
        "batch_size": (batch_size, 256, sampler.batch_size),
        "mode": (_mode_value(mode), 1, _mode_value(sampler.mode)),
        "seed": (seed, 42, sampler.seed),
        "rank": (rank, 0, sampler.rank),
        "world_size": (world_size, 1, sampler.world_size),
        "start_step": (start_step, 0, sampler.step),
    }
    for name, (given, default, used) in theirs.items():
        if given != default and given != used:
            raise InvalidArgumentError(
                f"{name}={given!r} conflicts with the sampler's {name} {used!r}; "
                "leave it out when passing sampler="
            )
    return (
        sampler.batch_size,
        sampler.mode,
        sampler.seed,
        sampler.rank,
        sampler.world_size,
        sampler.step,
    )
