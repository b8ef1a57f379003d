"""The step-based, endless DataLoader over named Zrecord streams.

A :class:`DataLoader` gathers, for every step ``s``, the records the sampler
names for ``s`` from every stream, and yields ``{name: value}``:

* a :class:`~loaderx.zrecord.Dense` stream gives one ``(B, *item_shape)``
  ndarray of the store's dtype, viewing the batch memory without a copy
  (``value.base`` owns it);
* a :class:`~loaderx.zrecord.Ragged` stream gives a ``list`` of ``B`` ndarrays,
  each with its record's exact shape (views as well), or with
  ``ragged="packed"`` one :class:`RaggedBatch`: a flat ``values`` view of all
  the records (contiguous in the batch memory) with ``cu_seqlens``,
  ``offsets`` and ``shapes``.

The raw batch goes through ``transform`` (if any) and the transform's return
value is yielded unchanged. The k-th item yielded is always step
``start_step + k``, byte-identical whatever ``num_threads``, ``prefetch`` or
``transform_threads`` -- except that steps in a skipped range (``skip=``,
:meth:`DataLoader.skip`) are never delivered: the step after it is the
range's end.

Batch sources
-------------
Where raw batches come from is :mod:`loaderx.sources`: the native pipeline
in this process (default) or loaderxd (``daemon=...``), chosen by
:func:`loaderx.sources.open_source`. The loader keeps everything else
(transform pool, ordering, ``step``, ``state_dict``, ``close``) in one place,
so both hosts share every rule (values, writeability, errors, Ctrl-C, exit).

Errors, close, signals
----------------------
* An exception in a gather or in ``transform`` is raised by the ``next()``
  that would have returned that step, with its original traceback. The step
  is consumed: ``loader.step`` moves past it and the loader stays usable, the
  next ``next()`` returns the following step.
* ``close()`` is idempotent and returns within :data:`CLOSE_WAIT_SECONDS`
  (1 s) plus the source's own close, whatever ``transform`` does: it wakes a
  thread blocked in ``next()`` with :class:`~loaderx.errors.LoaderClosedError`,
  cancels every transform call not started yet and waits up to 1 s for the
  calls already running. Python cannot stop a running call: one still
  running after that finishes on its own (daemon) thread, which then ends;
  its result is dropped, and the batch it was given stays valid until it
  returns (through loaderxd its ring slot stays leased until then). A loader
  that is garbage collected or alive at interpreter exit is closed; exit
  never waits for a transform call.
* Ctrl-C during ``next()`` raises ``KeyboardInterrupt`` within ~20 ms, also
  while transform calls run (the wait is sliced; the calls go on); no step
  is consumed, so calling ``next()`` again continues where it was. This
  holds wherever the interrupt lands inside ``next()``: while it waits (the
  native source keeps a batch that arrived meanwhile), and in the loader's
  own Python frames after the batch was taken (the step is given back). In
  ``for batch in loader`` nothing is lost; ``batch = next(loader)`` can, as
  with any Python iterator, lose a batch to an interrupt that lands in the
  caller's frame between ``next()`` returning and the assignment.
"""

from __future__ import annotations

import bisect
import dataclasses
import operator
import os
import queue
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future, wait
from typing import Any

from . import _loaderx, _state, distributed, sources
from ._loaderx import RaggedBatch
from .errors import ArgumentTypeError, InvalidArgumentError, LoaderClosedError
from .mix import Mixture
from .packing import Packing
from .sources import BatchSource, SourceSpec
from .zsampler import Mode, Sampler, _to_mode

__all__ = [
    "BatchSource",
    "DataLoader",
    "RaggedBatch",
    "SourceSpec",
    "default_num_threads",
    "identity",
]

# How long one wait may block before the loader looks at close() and lets
# Python run signal handlers. Ctrl-C must surface within 100 ms.
_POLL_SECONDS = 0.02



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


def identity(batch: Any) -> Any:
    """The default ``transform``: returns the raw batch unchanged (no transform pool runs)."""
    return batch


# The 2.5.4 wheel's defaults (docs/compat.md): transform_workers=4,
# prefetch_size=4, mode=2 (Cyclic).
_DEFAULT_TRANSFORM_WORKERS = 4
_DEFAULT_PREFETCH = 4


class _PackThen:
    """``transform(pack(batch))``: the transform of a packing loader."""

    __slots__ = ("_pack", "_transform")

    def __init__(self, pack: Packing, transform: Callable[[Any], Any]) -> None:
        self._pack = pack
        self._transform = transform

    def __call__(self, batch: Any) -> Any:
        return self._transform(self._pack(batch))


def _raised_by(future: Future[Any] | None, exc: BaseException) -> bool:
    """Whether ``exc`` is the outcome of the step itself (its gather or transform failed)."""
    return (
        future is not None and future.done() and not future.cancelled() and future.exception() is exc
    )


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


class _Skips:
    """Sorted, disjoint, non-adjacent half-open ranges ``[start, stop)`` of data steps.

    Built from any pairs through :meth:`parse`, which validates each pair and
    merges overlapping and adjacent ones (the skipped steps are their union).
    Immutable: :meth:`union` returns a new one.
    """

    __slots__ = ("_starts", "_stops")

    def __init__(self, ranges: Iterable[tuple[int, int]] = ()) -> None:
        merged: list[list[int]] = []
        for start, stop in sorted(ranges):
            if merged and start <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], stop)
            else:
                merged.append([start, stop])
        self._starts = [a for a, _ in merged]
        self._stops = [b for _, b in merged]

    @staticmethod
    def pair(value: Any, what: str) -> tuple[int, int]:
        """One ``(start, stop)`` range of ints, ``0 <= start < stop``, else an error naming it."""
        if isinstance(value, (str, bytes, Mapping)) or not hasattr(value, "__len__") or len(value) != 2:
            raise ArgumentTypeError(
                f"{what}: each range must be a (start, stop) pair of steps, got {value!r}")
        start, stop = value
        try:
            start = _check_int("start", start, 0)
            stop = _check_int("stop", stop, 0)
        except (TypeError, ValueError) as e:
            cls = ArgumentTypeError if isinstance(e, TypeError) else InvalidArgumentError
            raise cls(f"{what}: range {tuple(value)!r}: {e}") from None
        if start >= stop:
            raise InvalidArgumentError(
                f"{what}: range ({start}, {stop}) is empty: ranges are half-open [start, stop) "
                "of data steps, with start < stop")
        return start, stop

    @classmethod
    def parse(cls, ranges: Any, what: str) -> _Skips:
        if ranges is None:
            return cls()
        if isinstance(ranges, (str, bytes, Mapping)) or not hasattr(ranges, "__iter__"):
            raise ArgumentTypeError(
                f"{what} must be a list of (start, stop) pairs of steps, got {type(ranges).__name__}")
        return cls(cls.pair(r, what) for r in ranges)

    def union(self, other: _Skips) -> _Skips:
        return _Skips([*self.ranges, *other.ranges])

    @property
    def ranges(self) -> tuple[tuple[int, int], ...]:
        return tuple(zip(self._starts, self._stops))

    def stop_of(self, step: int) -> int | None:
        """The end of the range holding ``step``, or None if ``step`` is delivered."""
        i = bisect.bisect_right(self._starts, step) - 1
        return self._stops[i] if i >= 0 and step < self._stops[i] else None

    def first_from(self, step: int) -> int:
        """The first delivered step at or after ``step`` (ranges never touch: one hop)."""
        stop = self.stop_of(step)
        return step if stop is None else stop


def _as_streams(streams: Any) -> dict[str, Any]:
    """``streams`` (a mapping or an iterable of ``(name, store)`` pairs) as a dict."""
    if isinstance(streams, Mapping):
        return dict(streams)
    if isinstance(streams, (str, bytes)) or not hasattr(streams, "__iter__"):
        raise ArgumentTypeError(
            "streams must be a dict of name -> Dense/Ragged store or an iterable of "
            f"(name, store) pairs, got {type(streams).__name__}"
        )
    try:
        return dict(streams)
    except (TypeError, ValueError) as e:
        raise ArgumentTypeError(f"streams must be (name, store) pairs: {e}") from None


def _mix_segments(streams: Mapping[str, Any], mixture: Mixture | None
                  ) -> tuple[tuple[int, int, int], ...]:
    """The sampler segments of a mixture schedule of more than one segment, else ``()``."""
    if mixture is not None:
        return mixture.segments if len(mixture.segments) > 1 else ()
    for name, stream in streams.items():
        if len(getattr(stream, "_mix_segments", ())) > 1:
            raise InvalidArgumentError(
                f"stream {name!r} belongs to a mixture schedule of more than one segment: pass "
                "the Mixture that mix() returned itself (its streams alone do not say which "
                "positions each step draws from)")
    return ()


def _schedule_json(schedule: Any) -> list[list[Any]]:
    """A schedule as ``[[start, {name: weight}], ...]`` (state_dict form)."""
    return [[int(start), {str(n): float(w) for n, w in weights.items()}]
            for start, weights in schedule]


def _check_streams(streams: Mapping[str, Any]) -> tuple[tuple[str, ...], int]:
    from .zrecord import Dense, Ragged

    if not streams:
        raise InvalidArgumentError("streams must name at least one Dense/Ragged store, got none")
    for name, store in streams.items():
        if not isinstance(name, str):
            raise TypeError(f"stream names must be str, got {name!r}")
        if not isinstance(store, (Dense, Ragged)):
            raise ArgumentTypeError(
                f"stream {name!r} must be an open Dense or Ragged store, got {type(store).__name__}"
            )
        if not store._is_reader:
            raise InvalidArgumentError(
                f"stream {name!r} is a builder: close() it and pass Dense.open / Ragged.open"
            )
        sources.native_store(name, store)
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

#: Longest time ``close()`` waits for transform calls already running.
CLOSE_WAIT_SECONDS = 1.0


class _TransformPool:
    """``transform`` calls on daemon threads, so nothing waits for a call forever.

    Python cannot stop a running call. ``shutdown`` cancels every call not yet
    started and waits at most ``timeout`` for the running ones; a call still
    running then finishes on its own thread, which ends right after it (its
    result is dropped). Daemon threads: interpreter exit never waits for a
    call either (``concurrent.futures`` joins its workers at exit).
    """

    def __init__(self, workers: int, fn: Callable[[Any], Any]) -> None:
        self._fn = fn
        self._queue: queue.SimpleQueue[tuple[Future[Any], Any] | None] = queue.SimpleQueue()
        self._shut = False
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._work, name=f"loaderx-transform_{i}", daemon=True)
            for i in range(workers)
        ]
        for t in self._threads:
            t.start()

    def submit(self, batch: Any) -> Future[Any]:
        future: Future[Any] = Future()
        with self._lock:
            if self._shut:
                raise RuntimeError("the transform pool is shut down")
            self._queue.put((future, batch))
        return future

    def _work(self) -> None:
        _in_transform.active = True
        while True:
            item = self._queue.get()
            if item is None:
                return
            future, batch = item
            del item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = self._fn(batch)
            except BaseException as exc:  # noqa: BLE001 - raised by next() for its step
                future.set_exception(exc)
            else:
                future.set_result(result)
            del batch, future

    def cancel_queued(self) -> None:
        """Cancels every call not started yet: its future ends cancelled, no worker runs it.

        Drains the queue (thread-safe on any build) rather than walking the
        loader's pending deque, which a consumer may be changing: iterating
        a deque that another thread appends to raises RuntimeError on a
        free-threaded build. Stop marks already queued are put back.
        """
        stops = 0
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is None:
                stops += 1
            else:
                item[0].cancel()
        for _ in range(stops):
            self._queue.put(None)

    def shutdown(self, timeout: float) -> None:
        self.cancel_queued()
        with self._lock:
            if not self._shut:
                self._shut = True
                for _ in self._threads:
                    self._queue.put(None)
        deadline = time.monotonic() + timeout
        me = threading.current_thread()
        for t in self._threads:
            if t is not me:  # close() from inside a transform (a misuse)
                t.join(max(0.0, deadline - time.monotonic()))


class DataLoader:
    """Endless, step-based loader over a dict of equal-length Zrecord stores.

    The positional order and defaults are the 2.5.4 wheel's
    (``DataLoader(streams, transform_workers, batch_size, prefetch_size, mode,
    seed, transform)``); every other argument is keyword-only.

    Args:
        streams: ``{name: store}`` (any mapping, or an iterable of ``(name,
            store)`` pairs) of open :class:`~loaderx.zrecord.Dense` /
            :class:`~loaderx.zrecord.Ragged` stores of equal length. The loader
            does not own them: close them yourself after ``loader.close()``.
        transform_workers: concurrent transform calls (default 4; unused with
            the default ``transform``). ``transform_threads`` is the same.
        batch_size: records per batch on this rank (default 256). In Cyclic
            mode with one rank, a ``batch_size`` above the stream length is
            the length (each batch is one whole permutation).
        prefetch_size: batches gathered ahead of the consumer (default 4).
            ``prefetch`` is the same. Memory is bounded by ``prefetch_size +
            transform_workers`` batches, two freed buffers kept for reuse, and
            what the caller holds.
        mode: ``Sampler.Mode.CYCLIC`` (2, default), ``SEQUENTIAL`` (0) or
            ``IID`` (1).
        seed: sampler seed (default 42).
        transform: ``f(batch) -> Any``, called once per batch, possibly from
            several threads at once (must be thread-safe); its return value is
            yielded unchanged. The default :func:`identity` (or ``None``)
            yields the raw ``{name: value}`` dict without a transform pool.
        sampler: an existing :class:`~loaderx.zsampler.Sampler`. Its spec
            (length, batch size, mode, seed, rank, world size) and its current
            step define the loader; ``batch_size``, ``mode``, ``seed``,
            ``rank``, ``world_size`` and ``start_step`` must then be left at
            their defaults or agree with it (else ``ValueError``). The sampler
            itself is not advanced.
        rank, world_size: this process's slice of the global batch of
            ``batch_size * world_size`` records (docs/guide.md, "Sharding").
        start_step: the step of the first batch (default 0).
        prefetch: another name of ``prefetch_size``.
        num_threads: gather threads (default: usable CPUs, at most 16).
        transform_threads: another name of ``transform_workers``.
        daemon: ``None`` (default) gathers in this process; ``True``, a
            socket path, ``"auto"`` or a :class:`~loaderx.sources.DaemonOptions`
            gets batches from loaderxd (:func:`loaderx.sources.open_source`).
        skip: data steps never delivered: ``(start, stop)`` pairs, each the
            half-open range ``[start, stop)`` (e.g. ``[(1200, 1261)]``: after
            step 1199 comes step 1261), in any order; overlapping and
            adjacent ranges merge. Recorded in ``state_dict()``; more can
            be added while running with :meth:`skip` (docs/guide.md,
            "Skipping steps").
        ragged: how a Ragged stream is delivered: ``"list"`` (default, as
            the 2.5.4 wheel: a list of ``B`` ndarrays) or ``"packed"`` (one
            :class:`RaggedBatch`; docs/guide.md, "Ragged batches"). Any
            other value raises ``ValueError`` naming it.
        pack: a :class:`~loaderx.packing.Packing`: each batch is packed
            into dense ``(rows, seq_len)`` rows by the native packer on the
            transform threads, before ``transform`` (docs/guide.md,
            "Sequence packing"). The same on both hosts (packing runs in
            this process, after delivery); ``step``, ``seek`` and
            ``state_dict`` count data steps as without it.

    Raises:
        TypeError: ``streams`` is not a dict of stores, or an argument has the
            wrong type.
        ValueError: ``streams`` is empty or holds something other than open
            stores, lengths differ (the message names each stream and its
            length), or an argument is out of range.
    """

    def __init__(
        self,
        streams: Mapping[str, Any] | Iterable[tuple[str, Any]],
        transform_workers: int = _DEFAULT_TRANSFORM_WORKERS,
        batch_size: int = 256,
        prefetch_size: int = _DEFAULT_PREFETCH,
        mode: Any = Sampler.Mode.CYCLIC,
        seed: int = 42,
        transform: Callable[[dict[str, Any]], Any] | None = identity,
        *,
        sampler: Sampler | None = None,
        rank: int = 0,
        world_size: int = 1,
        start_step: int = 0,
        prefetch: int | None = None,
        num_threads: int | None = None,
        transform_threads: int | None = None,
        daemon: Any = None,
        skip: Iterable[tuple[int, int]] | None = None,
        ragged: str = "list",
        pack: Packing | None = None,
    ) -> None:
        self._closed = True  # until fully built: a half-built loader refuses use
        mixture = streams if isinstance(streams, Mixture) else None
        streams = _as_streams(streams)
        names, n = _check_streams(streams)
        segments = _mix_segments(streams, mixture)
        if transform is identity:
            transform = None
        if transform is not None and not callable(transform):
            raise TypeError(f"transform must be callable or None, got {type(transform).__name__}")
        workers_name, transform_threads = _same_arg(
            "transform_workers", transform_workers, _DEFAULT_TRANSFORM_WORKERS,
            "transform_threads", transform_threads)
        prefetch_name, prefetch = _same_arg("prefetch_size", prefetch_size, _DEFAULT_PREFETCH,
                                            "prefetch", prefetch)
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
        skips = _Skips.parse(skip, "skip")
        if not sources.joins_where_the_group_is(daemon, start_step):
            # Opened there: no skipped step is gathered, and every rank of a
            # shard group joins at the same step. A member joining where its
            # group is seeks past a range it lands in once it has joined.
            start_step = skips.first_from(start_step)
        # One Cyclic rank with batch_size > n draws whole cycles (the engine's rule).
        batch_size = _loaderx.effective_batch_size(n, batch_size, mode_value, world_size)
        prefetch = _check_int(prefetch_name, prefetch, 1)
        if prefetch > 1024:
            raise InvalidArgumentError(f"{prefetch_name} must be <= 1024, got {prefetch}")
        num_threads = (
            default_num_threads()
            if num_threads is None
            else _check_int("num_threads", num_threads, 1)
        )
        if num_threads > 1024:
            raise InvalidArgumentError(f"num_threads must be <= 1024, got {num_threads}")
        transform_threads = _check_int(workers_name, transform_threads, 1)
        distributed.check_loader_layout(rank, world_size)
        if pack is not None:
            if not isinstance(pack, Packing):
                raise ArgumentTypeError(
                    f"pack must be a loaderx.packing.Packing, got {type(pack).__name__}")
            pack.check(streams, batch_size)
            # Packed on the transform threads, before the transform: one
            # native call per batch, with the GIL released.
            transform = pack if transform is None else _PackThen(pack, transform)

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
            ragged=ragged,
            segments=segments,
        )
        source = sources.open_source(streams, self._spec, daemon)
        self._source = source
        self._mixture = mixture
        self._daemon = daemon
        # The source the finalizer closes (append_mix swaps it).
        self._source_box: list[BatchSource] = [source]
        self._skips = skips
        # The position skip() owes the source (it had handed out steps of the
        # new range, now dropped): sought before the next fetch, and kept
        # until that seek succeeds.
        self._resync: int | None = None
        self._transform = transform
        self._window = transform_threads
        self._pool: _TransformPool | None = None
        if transform is not None:
            self._pool = _TransformPool(transform_threads, transform)
        # (step, future) in step order; the future holds the transformed batch
        # or the exception of that step.
        self._pending: deque[tuple[int, Future[Any]]] = deque()
        # A batch taken from the source and not counted yet (see _deliver):
        # filled by the source before anything can raise, emptied once counted.
        self._stash: list[Any] = [None]
        # The source's first step: start_step, except for a loaderxd group
        # member joining with join="current", which starts where the group is.
        self._step = skips.first_from(source.step)
        self._lock = threading.Lock()  # serialises next/seek/skip/load_state_dict
        self._close_lock = threading.Lock()
        self._closed = False
        # Closes the source and joins the transform pool when the loader is
        # collected, without keeping the loader alive. Not at exit (atexit
        # hooks run before daemon threads are stopped): waking a daemon thread
        # blocked in next() then would run its Python code during shutdown.
        # An unclosed loader alive at exit is collected with its module, once
        # daemon threads can no longer run; its native threads never need the
        # GIL, so nothing waits for them.
        self._finalizer = weakref.finalize(self, _shutdown, self._source_box, self._pool)
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
        return self._deliver(None)

    def _deliver(self, convert: Callable[[Any], Any] | None) -> Any:
        """The next batch (``convert``-ed, e.g. to tensors); an interrupt consumes nothing.

        A batch taken from the source sits in ``self._stash`` until it is
        counted here, so an exception raised before that (Ctrl-C while the
        source waits, or in any frame on the way) leaves it for the next
        call. One raised after it was counted and before it leaves this
        frame gives it back (to the stash, or to the front of the transform
        queue), unless it is the step's own error (its gather or transform).
        """
        self._check_open()
        taken: tuple[int, Any, Future[Any] | None] | None = None
        try:
            with self._lock:
                # The batch stays where the source or the transform queue left
                # it until the step is counted. Counting is two stores with no
                # call between them, where CPython never raises a pending
                # signal; _give_back undoes it when an exception lands after.
                if self._pool is None:
                    taken = self._next_untransformed()
                    after = self._skips.first_from(taken[0] + 1)
                    self._step = after
                    self._stash[0] = None
                else:  # the stash is _fetch's: it may hold a later step not queued yet
                    taken = self._next_transformed()
                    after = self._skips.first_from(taken[0] + 1)
                    self._step = after
                    self._pending.popleft()
            value, future = taken[1], taken[2]
            if future is not None:
                value = future.result()  # the transform's value, or its exception and traceback
            return value if convert is None else convert(value)
        except BaseException as exc:
            if taken is not None and not _raised_by(taken[2], exc):
                self._give_back(taken)
            raise

    def _give_back(self, taken: tuple[int, Any, Future[Any] | None]) -> None:
        """Undoes the counting of ``taken`` (idempotent: the exception may have
        landed before the batch left the stash or the queue)."""
        step, raw, future = taken
        with self._lock:
            if self._closed or self._step != self._skips.first_from(step + 1):
                # not counted yet (it is still in place), or a seek or another
                # thread came between
                return
            self._step = step
            if future is None:
                self._stash[0] = (step, raw)
            elif not (self._pending and self._pending[0][1] is future):
                self._pending.appendleft((step, future))

    def _source_target(self) -> int | None:
        """Where the source must be sought before its next step is fetched, or None.

        Past the skipped range it stands at, or the position :meth:`skip`
        owes it. None while the stash holds a batch: that step comes first.
        """
        if self._stash[0] is not None:
            return None
        if self._resync is not None:
            return self._resync
        return self._skips.stop_of(self._source.step)

    def _sync_source(self) -> None:
        """Seeks the source to :meth:`_source_target`, if any, under the lock.

        One O(1) seek: the native pipeline discards what it prefetched inside
        the range and gathers none of the rest. Only a fetch for the step
        ``next()`` is about to return seeks (never a transform window's
        top-up), so a loaderxd group member moves its position when its
        caller has taken every step before the range (docs/guide.md,
        "Skipping steps", on groups).
        """
        target = self._source_target()
        if target is None:
            return
        self._resync = target  # until the source confirms it
        self._source.seek(target)
        self._resync = None

    def _next_untransformed(self) -> tuple[int, Any, None]:
        while True:
            self._check_open()
            self._sync_source()
            try:
                got = self._source.next_raw(_POLL_SECONDS, self._stash)
            except LoaderClosedError:
                raise
            except Exception:
                # The source moved past the failed step.
                self._step = self._skips.first_from(self._source.step)
                raise
            if got is not None:
                return got[0], got[1], None

    def _next_transformed(self) -> tuple[int, None, Future[Any]]:
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
        return step, None, future  # still first in the queue: _deliver takes it off

    def _top_up(self) -> None:
        """Submits every raw batch that is ready, up to the transform window."""
        while len(self._pending) < self._window:
            if not self._fetch(block=False):
                return

    def _fetch(self, block: bool) -> bool:
        """Takes the next raw batch from the source into the transform pool."""
        while True:
            self._check_open()
            stash = self._stash
            if stash[0] is not None and self._pending and stash[0][0] <= self._pending[-1][0]:
                stash[0] = None  # queued already: the interrupt came after the append
            if not block and self._source_target() is not None:
                return False  # the seek waits for the next() of the step after the range
            self._sync_source()
            step = self._source.step
            try:
                got = self._source.next_raw(_POLL_SECONDS if block else 0.0, stash)
            except LoaderClosedError:
                raise
            except Exception as exc:  # noqa: BLE001 - any error of the step, raised in order
                failed: Future[Any] = Future()
                failed.set_exception(exc)
                self._pending.append((step, failed))
                return True
            if got is not None:
                assert self._pool is not None and self._transform is not None
                try:
                    future = self._pool.submit(got[1])
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
                stash[0] = None
                return True
            if not block:
                return False

    # -- position and state --------------------------------------------------

    @property
    def step(self) -> int:
        """The data step of the batch the next ``next()`` returns (never a skipped one)."""
        return self._step

    @property
    def batch_size(self) -> int:
        """Records per batch on this rank."""
        return self._spec.batch_size

    @property
    def skip_ranges(self) -> tuple[tuple[int, int], ...]:
        """The skipped data steps: sorted, disjoint half-open ``(start, stop)`` ranges."""
        return self._skips.ranges

    def seek(self, step: int) -> None:
        """Makes ``step`` the next batch (or, if it is skipped, the end of its range).

        Discards prefetched and pending work. O(1).
        """
        step = _check_int("step", step, 0)
        self._check_open()
        with self._lock:
            self._seek(self._skips.first_from(step))

    def _seek(self, step: int) -> None:
        self._check_open()
        for _, future in self._pending:
            future.cancel()
        self._pending.clear()
        self._stash[0] = None
        self._resync = None
        # Counted first: a seek interrupted by Ctrl-C is settled by the
        # next next(), which returns `step`.
        self._step = step
        try:
            self._source.seek(step)
        except Exception:
            self._step = self._skips.first_from(self._source.step)  # refused: nothing changed
            raise

    def skip(self, start: int, stop: int) -> None:
        """Never delivers the data steps ``[start, stop)``; ``start >= loader.step``.

        The range is added to those given as ``skip=`` (overlapping or
        adjacent ones merge) and recorded in ``state_dict()``. If it starts
        at ``loader.step``, the next batch is ``stop``. Batches of the range
        already prefetched or being transformed are discarded. A range that
        starts before ``loader.step`` (steps delivered or passed already)
        raises ``ValueError`` naming it; nothing changes then. The source
        is sought past the range at the next fetch (an error of that seek
        is raised by the next ``next()``).
        """
        start, stop = _Skips.pair((start, stop), "skip")
        self._check_open()
        with self._lock:
            self._check_open()
            if start < self._step:
                raise InvalidArgumentError(
                    f"skip({start}, {stop}): step {start} is before loader.step ({self._step}), "
                    "the next batch; steps delivered or passed already cannot be skipped "
                    f"(skip from {self._step}, or seek back first)")
            self._skips = self._skips.union(_Skips([(start, stop)]))
            while self._pending and self._pending[-1][0] >= start:
                self._pending.pop()[1].cancel()
            if self._stash[0] is not None and self._stash[0][0] >= start:
                self._stash[0] = None
            self._step = self._skips.first_from(self._step)
            # Where the source goes on: it stays put unless it handed out
            # steps from `start` on (dropped above) or is owed a position
            # already; sought before the next fetch.
            owed = self._source.step if self._resync is None else self._resync
            if owed > start or self._resync is not None:
                self._resync = self._skips.first_from(min(owed, start))

    @property
    def mixture(self) -> Mixture | None:
        """The :class:`~loaderx.mix.Mixture` this loader draws from (after :meth:`append_mix`,
        the extended one), or ``None`` when its streams are not a mixture."""
        return self._mixture

    def append_mix(self, start_step: int, weights: Mapping[str, Any]) -> None:
        """Adds a mixture schedule segment: from data step ``start_step`` on, ``weights``.

        ``start_step`` must be after ``loader.step`` (the next batch) and
        after the schedule's last start; ``weights`` is ``{dataset: weight}``
        as in ``mix(schedule=...)`` (a dataset left out has weight 0). Every
        step before ``start_step`` keeps its batch: the loader swaps to
        :meth:`Mixture.appended <loaderx.mix.Mixture.appended>` and continues
        at ``loader.step``; prefetched batches are discarded. The schedule is
        recorded in ``state_dict()``. Through loaderxd the new segment reaches
        this loader's daemon loader (reopened at ``loader.step``); a member
        of a loaderxd group is refused (``ValueError``): the segment would not
        reach the other members. Nothing changes when a call is refused.

        Raises:
            ValueError: the streams are not a mixture, ``start_step`` is at or
                before ``loader.step`` or the last segment's start, an unknown
                dataset, a negative weight, all weights 0.
            TypeError: ``weights`` is not a dict of numbers.
        """
        start_step = _check_int("start_step", start_step, 0)
        self._check_open()
        with self._lock:
            self._check_open()
            if self._mixture is None:
                raise InvalidArgumentError("append_mix: this loader's streams are not a Mixture "
                                           "(pass the value of loaderx.mix.mix() as streams)")
            if start_step <= self._step:
                raise InvalidArgumentError(
                    f"append_mix({start_step}, ...): a new segment must start after loader.step "
                    f"({self._step}), the next batch: batches up to it are fixed")
            self._swap_mixture(self._mixture.appended(start_step, weights))

    def _swap_mixture(self, mixture: Mixture) -> None:
        """Continues at ``self._step`` from ``mixture`` (a superset of the current one's
        schedule). Opens the new source first: a refusal changes nothing."""
        group = getattr(self._daemon, "group", None)
        if group is not None:
            raise InvalidArgumentError(
                f"this loader is a member of loaderxd group {group!r}: a mixture segment "
                "appended by one member would not reach the others, so a group's schedule "
                "is fixed when it opens; close every member and reopen each with the "
                "extended schedule (mix(schedule=...))")
        spec = dataclasses.replace(
            self._spec, n=mixture.positions, start_step=self._step,
            segments=mixture.segments if len(mixture.segments) > 1 else ())
        source = sources.open_source(dict(mixture), spec, self._daemon)
        for _, future in self._pending:
            future.cancel()
        self._pending.clear()
        self._stash[0] = None
        self._resync = None
        old, self._source = self._source, source
        self._source_box[0] = source
        self._spec = spec
        self._mixture = mixture
        old.close()
        if self._closed:  # a close() from another thread ran its finalizer on the old one
            source.close()

    def state_dict(self) -> dict[str, Any]:
        """The loader's position: a small dict of ints, strings and lists (picklable, JSON-able).

        The keys of a Sampler's state (``python/loaderx/_state.py``): ``step`` is
        the next batch's data step; ``seed``, ``mode``, ``n`` and
        ``global_batch`` identify the sample order it refers to. Then
        ``skip``, the skipped ranges as ``[start, stop]`` pairs, and
        ``mix_schedule``, the mixture schedule as ``[start_step, {dataset:
        weight}]`` pairs (``None`` when the streams are not a mixture).
        """
        spec = self._spec
        mixture = self._mixture
        state = _state.make(self._step, spec.seed, _mode_name(spec.mode), spec.n,
                            spec.batch_size * spec.world_size)
        state["skip"] = [list(r) for r in self._skips.ranges]
        state["mix_schedule"] = None if mixture is None else _schedule_json(mixture.schedule)
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continues at ``state["step"]``, skipping the state's ranges as well as this loader's.

        The state may come from a loader with another ``world_size`` (and
        ``rank``) as long as the global batch, seed, mode and stream length
        are the same; anything else raises ``ValueError`` naming the field,
        since it would silently yield other samples. The skipped ranges
        become the union of this loader's and the state's (a state without
        ``skip``, e.g. of version 1, has none); a state step inside a
        skipped range continues at the range's end.

        Mixture schedules: one schedule must begin with the other (a state
        older than ``mix_schedule`` has a one-segment one). A state with more
        segments extends this loader's schedule (as :meth:`append_mix`); a
        loader with more needs them to start after the state's step. A
        difference in a common segment raises ``ValueError`` naming it.
        """
        state = _state.read(state)
        mine = self.state_dict()
        step = _check_int("state step", state["step"], 0)
        extended, n = self._state_mixture(state, step)
        if n is not None:
            mine["n"] = n
        _state.check_order(state, mine, "loader")
        theirs = _Skips.parse(state.get("skip"), "state skip")
        self._check_open()
        with self._lock:
            if extended is not None:
                self._swap_mixture(extended)
            skips, self._skips = self._skips, self._skips.union(theirs)
            try:
                self._seek(self._skips.first_from(step))
            except Exception:
                self._skips = skips  # refused: nothing changed
                raise

    def _state_mixture(self, state: Mapping[str, Any], step: int
                       ) -> tuple[Mixture | None, int | None]:
        """(the mixture a state's longer schedule makes, or None; the ``n`` the state
        must have, or None for the loader's own) -- or ValueError naming a difference."""
        mixture = self._mixture
        theirs = state.get("mix_schedule") if state["version"] >= 3 else None
        if mixture is None:
            if theirs is not None:
                raise InvalidArgumentError("state has a mix_schedule but this loader's streams "
                                           "are not a mixture")
            return None, None
        mine = _schedule_json(mixture.schedule)
        if state["version"] < 3 or "mix_schedule" not in state:  # older, or a Sampler's
            theirs = mine[:1]  # one segment: its weights are checked through n
        elif not isinstance(theirs, list) or not theirs:
            raise InvalidArgumentError(f"state mix_schedule must be a non-empty list, got "
                                       f"{theirs!r} (this loader's is {mine!r})")
        for i in range(min(len(mine), len(theirs))):
            if list(theirs[i]) != mine[i]:
                raise InvalidArgumentError(f"state mix_schedule segment {i} is {theirs[i]!r} "
                                           f"but this loader's is {mine[i]!r}")
        extended = mixture.with_schedule(theirs) if len(theirs) > len(mine) else None
        if len(mine) > len(theirs) and mine[len(theirs)][0] <= step:
            raise InvalidArgumentError(
                f"this loader's mix_schedule segment {len(theirs)} starts at step "
                f"{mine[len(theirs)][0]}, not after the state's step {step}: the state's "
                f"schedule has {len(theirs)} segment(s) and its run may have passed there")
        final = extended if extended is not None else mixture
        return extended, sum(size for _, _, size in final.segments[:len(theirs)])

    # -- lifetime ------------------------------------------------------------

    def close(self) -> None:
        """Stops all work and joins every thread. Idempotent; safe from any thread.

        A thread blocked in ``next()`` raises ``LoaderClosedError``. Waits at
        most :data:`CLOSE_WAIT_SECONDS` for transform calls already running;
        one still running then finishes in the background and its result is
        dropped (module docstring). The streams stay open (the caller owns
        them).
        """
        with self._close_lock:  # a second closer returns once the first is done
            self._closed = True
            if self._pool is not None:
                self._pool.cancel_queued()
            self._stash[0] = None  # its lease (loaderxd) goes back with the rest
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


def _shutdown(box: list[BatchSource], pool: _TransformPool | None) -> None:
    box[0].close()
    if pool is not None:
        pool.shutdown(CLOSE_WAIT_SECONDS)


def _same_arg(name: str, value: Any, default: Any, alias: str, alias_value: Any) -> tuple[str, Any]:
    """One setting given by the wheel's name or our keyword-only alias (None if absent).

    Returns the name the caller used (for error messages) and the value.
    """
    if alias_value is None:
        return name, value
    if value is not default and value != alias_value:
        raise InvalidArgumentError(f"{name}={value!r} and {alias}={alias_value!r} name the same "
                                   "setting; give one")
    return alias, alias_value


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
        "mode": (_mode_value(mode), int(Mode.Cyclic), _mode_value(sampler.mode)),
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
