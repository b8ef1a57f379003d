"""Weighted mixing of several datasets into one stream dict for :class:`~loaderx.dataloader.DataLoader`.

::

    from loaderx.mix import mix

    streams = mix({
        "web":   ({"tokens": Ragged.open("web/tokens"),   "label": Dense.open("web/label")},   0.7),
        "books": ({"tokens": Ragged.open("books/tokens"), "label": Dense.open("books/label")}, 0.3),
    })
    loader = DataLoader(streams, batch_size=256, mode="Cyclic", seed=1)
    batch = next(loader)     # {"tokens": [...], "label": (256,), "dataset": (256,) int64}

How it works
------------
A mixture is one index space of ``V`` *positions* (:attr:`Mixture.positions`).
Dataset ``k`` (in the order of the mapping) owns ``counts[k]`` consecutive
positions, and its ``j``-th position stands for its record ``j mod n_k``. The
loader's sampler draws positions exactly as it draws records, so

* which dataset every sample comes from is a pure function of
  ``(seed, step, position in the batch)``: batches are the same whatever the
  thread counts, resume from ``state_dict()`` is exact, and a job may resume on
  another world size with the same global batch;
* nothing runs per sample in Python: a gather splits the batch by dataset in
  C++ and reads each part with its own store (``common/include/loaderx/mix.h``);
* ``IID`` draws positions uniformly with replacement: each sample comes from
  dataset ``k`` with probability ``counts[k] / V``, independently, so realised
  shares are within binomial sampling error of the weights. ``Cyclic`` walks a
  permutation of all ``V`` positions: every cycle holds exactly ``counts[k]``
  samples of dataset ``k`` and, as ``counts[k] >= n_k``, every record of every
  dataset at least once (datasets scarce for their weight repeat records
  within a cycle). ``Sequential`` walks dataset 0's positions, then 1's...:
  it does not interleave.

Each weight is read as the simplest fraction that rounds to it (``0.7`` is
7/10, ``1 / 3`` is 1/3), so the shares ``w_k / W`` (``W`` the weight total) are
the fractions the user wrote. ``V`` is the smallest size at which every dataset
owns at least its own length (``V >= n_k * W / w_k`` for each ``k``) and at
least ``min_positions`` (default 2**24) -- rounded up to a multiple of ``D``,
the shares' common denominator, when ``D`` is at most that size. Then
``counts[k] = V * w_k / W`` exactly and :meth:`Mixture.shares` gives the weight
shares exactly (0.7 for a weight of 0.7 beside 0.3). Weights whose shares need
a larger denominator (more than about seven significant digits at the default
size) get ``counts`` apportioned by largest remainder, each share within
``1 / V``.

The streams the datasets share become the mixture's streams; each must have
one kind, dtype and item shape (or rank) across datasets. ``source=`` (default
``"dataset"``) adds an ``int64`` stream holding each sample's dataset number
(:attr:`Mixture.names` maps numbers to names); ``source=None`` leaves it out.

Mixture schedules
-----------------
``mix({name: streams, ...}, schedule=[(0, {"web": 0.7, "books": 0.3}),
(10_000, {"web": 0.5, "books": 0.5})])`` makes the weights piecewise constant
over steps: segment ``k`` holds from its start step to the next one's. Each
segment has its own counts over its own ``V_k`` positions (the rule above,
per segment; a dataset missing from a segment's dict has weight 0 there),
laid out one after the other in one index space of ``V = V_0 + V_1 + ...``
positions. The loader's sampler draws a step of segment ``k`` from that
segment's positions only: what a plain sampler over ``V_k`` positions with
the segment's own seed draws at ``step - start_k`` (``loaderx/sampler.h``,
"Segments"), so every segment's walk starts fresh at its first step, a
``Cyclic`` cycle of segment ``k`` holds its exact shares, and appending a
segment (:meth:`~loaderx.dataloader.DataLoader.append_mix`) changes no step
before its start. Segment 0 draws what a plain mixture draws: a one-segment
schedule is the plain mixture. Weights change in steps, not linearly: a
warm-up is a few short segments.

Mixed streams are readers like any store (``streams["label"][i]``).
``DataLoader(mix(...), daemon=...)`` is served by loaderxd, which builds the
same mixture from the parts' store files (docs/guide.md, "Mixing datasets").
"""

from __future__ import annotations

import bisect
import math
import os
import pathlib
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

import numpy as np

from . import _loaderx
from .errors import ArgumentTypeError, InvalidArgumentError
from .zrecord import _TOKEN, Dense, Ragged

__all__ = ["DEFAULT_MIN_POSITIONS", "Mixture", "Schedule", "mix", "mix_counts"]

#: A mixture schedule: ``(start_step, {dataset: weight})`` segments, starts increasing from 0.
Schedule = tuple[tuple[int, dict[str, float]], ...]

DEFAULT_MIN_POSITIONS = 1 << 24


class _MixedStream:
    """What a mixed Dense/Ragged reader adds: no store path (it is not on disk),
    but what loaderxd needs to build the same mixture (:mod:`loaderx.sources`)."""

    #: The store paths of the parts (dataset order), ``()`` for the dataset-number
    #: stream, ``None`` when a part has no path (a mixture of mixtures).
    _mix_parts: tuple[str, ...] | None = None
    #: The mixture's counts (every segment's, one after the other).
    _mix_counts: tuple[int, ...] = ()
    #: The schedule's ``(start_step, base, size)`` segments.
    _mix_segments: tuple[tuple[int, int, int], ...] = ()

    @property
    def path(self) -> pathlib.Path:
        raise AttributeError("a mixed stream has no store path: it is gathered from its "
                             "datasets' stores")


class MixedDense(_MixedStream, Dense):
    """A dense reader over a mixture's positions (see :mod:`loaderx.mix`)."""


class MixedRagged(_MixedStream, Ragged):
    """A ragged reader over a mixture's positions (see :mod:`loaderx.mix`)."""


class Mixture(dict[str, Any]):
    """``{stream: reader}`` over the mixture's positions, for ``DataLoader(mixture, ...)``.

    Attributes:
        names: dataset names, index ``k`` = the number in the source stream.
        weights: the weights of the first segment (the weights as given
            without a schedule), 0 for a dataset it leaves out.
        counts: positions owned by each dataset in the first segment (with
            one segment they sum to ``positions``).
        positions: ``V``, the length of every stream of the mixture (all
            segments).
        source: the name of the dataset-number stream, or ``None``.
        schedule: ``((start_step, {dataset: weight}), ...)``, one segment
            without ``schedule=``.
        segment_counts: each segment's counts, in dataset order.
        segments: ``(start_step, base, size)`` of each segment: the
            positions ``[base, base + size)`` its steps draw from.
    """

    names: tuple[str, ...]
    weights: tuple[float, ...]
    counts: tuple[int, ...]
    positions: int
    source: str | None
    schedule: Schedule
    segment_counts: tuple[tuple[int, ...], ...]
    segments: tuple[tuple[int, int, int], ...]
    # What appending a segment rebuilds from: each dataset's streams, its length.
    _stream_sets: tuple[Mapping[str, Any], ...]
    _lengths: tuple[int, ...]
    _min_positions: int

    def shares(self, step: int = 0) -> dict[str, float]:
        """``{dataset: count / V_k}`` in the segment of ``step``: each dataset's share.

        The weight shares ``w / W`` exactly when ``V_k`` is a multiple of their
        denominator (see the module doc): ``{"web": 0.7, "books": 0.3}``.
        """
        k = self.segment_of(step)
        size = self.segments[k][2]
        return {n: c / size for n, c in zip(self.names, self.segment_counts[k])}

    def segment_of(self, step: int) -> int:
        """The number of the segment ``step`` belongs to."""
        return bisect.bisect_right([s[0] for s in self.segments], step) - 1

    def appended(self, start_step: int, weights: Mapping[str, Any]) -> Mixture:
        """A new mixture of the same datasets: this schedule plus a segment from ``start_step``.

        Its positions up to this one's ``positions`` are this mixture's (the
        new segment's come after them); ``source`` and ``min_positions`` are
        kept. Readers of this mixture stay valid (the caller closes them).
        :meth:`~loaderx.dataloader.DataLoader.append_mix` swaps a running
        loader over to it.
        """
        return self.with_schedule((*self.schedule, (start_step, weights)))

    def with_schedule(self, schedule: Any) -> Mixture:
        """A new mixture of the same datasets (same ``source``, ``min_positions``) under
        ``schedule`` (as :func:`mix` takes it)."""
        return _build(self.names, self._stream_sets, self._lengths, schedule, self.source,
                      self._min_positions)

    def close(self) -> None:
        """Closes the mixed readers (the datasets' own stores stay open: the caller owns them)."""
        for stream in self.values():
            stream.close()


def mix_counts(lengths: list[int], weights: list[float], *,
               min_positions: int = DEFAULT_MIN_POSITIONS) -> list[int]:
    """The positions each dataset owns: ``V`` apportioned by ``weights``, see the module doc."""
    if len(lengths) != len(weights) or not lengths:
        raise InvalidArgumentError("a mixture needs one length and one weight per dataset")
    if min_positions < 1:
        raise InvalidArgumentError(f"min_positions must be >= 1, got {min_positions}")
    fractions = [_simplest(float(w)) for w in weights]
    total = sum(fractions)
    shares = [f / total for f in fractions]
    v = max(min_positions, *(math.ceil(n / s) for n, s in zip(lengths, shares)))
    d = math.lcm(*(s.denominator for s in shares))
    if d <= v:  # V grows by less than D <= V: every share becomes exact
        v = -(-v // d) * d
    quotas = [s * v for s in shares]
    counts = [math.floor(q) for q in quotas]
    # Largest remainder: the positions left go to the largest fractional parts
    # (ties to the earlier dataset), so |counts[k] - quota[k]| < 1.
    left = v - sum(counts)
    order = sorted(range(len(counts)), key=lambda k: (-(quotas[k] - counts[k]), k))
    for k in order[:left]:
        counts[k] += 1
    if v >= 1 << 63:
        raise InvalidArgumentError(f"the mixture needs {v} positions, more than 2**63: a weight "
                                   "is too small for its dataset's length")
    return counts


def _simplest(w: float) -> Fraction:
    """The fraction with the smallest denominator that rounds to the float ``w`` > 0
    (0.7 -> 7/10, 1 / 3 -> 1/3, 3.0 -> 3): for a short decimal, the one written."""
    if w.is_integer():
        return Fraction(int(w))
    exact = Fraction(w)
    lo = (Fraction(math.nextafter(w, 0.0)) + exact) / 2
    hi = (exact + Fraction(math.nextafter(w, math.inf))) / 2
    return _simplest_between(lo, hi)


def _simplest_between(lo: Fraction, hi: Fraction | None) -> Fraction:
    """The simplest fraction in the open interval (lo, hi), 0 <= lo < hi; hi None is
    infinity (Stern-Brocot descent by continued fractions)."""
    n = math.floor(lo)
    if hi is None or n + 1 < hi:
        return Fraction(n + 1)
    # lo < hi <= n + 1: the answer is n + 1 / x with x simplest in (1 / (hi - n), 1 / (lo - n)).
    return n + 1 / _simplest_between(1 / (hi - n), None if lo == n else 1 / (lo - n))


def _check_weight(name: str, weight: Any, zero: bool = False) -> float:
    """``weight`` as a float: finite and > 0 (``zero``: >= 0), else an error naming ``name``."""
    if isinstance(weight, (bool, np.bool_)) or not isinstance(weight, (int, float, np.integer,
                                                                      np.floating)):
        raise TypeError(f"dataset {name!r}: weight must be a number, got {type(weight).__name__}")
    w = float(weight)
    if not (math.isfinite(w) and (w >= 0 if zero else w > 0)):
        raise InvalidArgumentError(f"dataset {name!r}: weight must be finite and "
                                   f"{'>= 0' if zero else '> 0'}, got {weight!r}")
    return w


def _check_schedule(names: tuple[str, ...], schedule: Any) -> Schedule:
    """The schedule as ``((start, {name: weight}), ...)``, every dataset named, or an error."""
    if isinstance(schedule, (str, bytes, Mapping)) or not isinstance(schedule, (list, tuple)):
        raise ArgumentTypeError("schedule must be a list of (start_step, {dataset: weight}) "
                                f"pairs, got {type(schedule).__name__}")
    if not schedule:
        raise InvalidArgumentError("schedule must have at least one segment")
    out: list[tuple[int, dict[str, float]]] = []
    for i, seg in enumerate(schedule):
        if not isinstance(seg, (list, tuple)) or len(seg) != 2 or not isinstance(seg[1], Mapping):
            raise ArgumentTypeError(f"schedule[{i}] must be a (start_step, {{dataset: weight}}) "
                                    f"pair, got {seg!r}")
        start, given = seg
        if isinstance(start, (bool, np.bool_)) or not isinstance(start, (int, np.integer)):
            raise ArgumentTypeError(f"schedule[{i}]: start_step must be an int, got "
                                    f"{type(start).__name__}")
        start = int(start)
        if i == 0 and start != 0:
            raise InvalidArgumentError(f"schedule[0] starts at step {start}: the first segment "
                                       "must start at step 0")
        if out and start <= out[-1][0]:
            raise InvalidArgumentError(f"schedule[{i}] starts at step {start}, not after "
                                       f"schedule[{i - 1}] (step {out[-1][0]}): start steps "
                                       "must increase")
        unknown = [str(n) for n in given if n not in names]
        if unknown:
            raise InvalidArgumentError(f"schedule[{i}]: unknown dataset {unknown[0]!r} "
                                       f"(datasets: {', '.join(names)})")
        weights = {n: _check_weight(n, given[n], zero=True) if n in given else 0.0
                   for n in names}
        if not any(weights.values()):
            raise InvalidArgumentError(f"schedule[{i}]: every weight is 0; a segment needs a "
                                       "weight > 0")
        out.append((start, weights))
    return tuple(out)


def _build(names: tuple[str, ...], stream_sets: tuple[Mapping[str, Any], ...],
           lengths: tuple[int, ...], schedule: Any, source: str | None,
           min_positions: int) -> Mixture:
    """The mixture of ``stream_sets`` (checked by :func:`mix`) under ``schedule``."""
    sched = _check_schedule(names, schedule)
    segment_counts: list[tuple[int, ...]] = []
    for _, weights in sched:
        used = [k for k, n in enumerate(names) if weights[n] > 0]
        some = mix_counts([lengths[k] for k in used], [weights[names[k]] for k in used],
                          min_positions=min_positions)
        counts = [0] * len(names)
        for k, c in zip(used, some):
            counts[k] = c
        segment_counts.append(tuple(counts))
    flat = [c for seg in segment_counts for c in seg]
    segments: list[tuple[int, int, int]] = []
    base = 0
    for (start, _), seg in zip(sched, segment_counts):
        segments.append((start, base, sum(seg)))
        base += sum(seg)
    out = Mixture()
    label = "+".join(names)
    for sname, first in stream_sets[0].items():
        native = _loaderx.mixed_store([s[sname]._live_store() for s in stream_sets], flat,
                                      len(segments))
        cls = MixedDense if isinstance(first, Dense) else MixedRagged
        mixed = cls(_TOKEN, f"mix({label})/{sname}", store=native)
        paths = [getattr(s[sname], "path", None) for s in stream_sets]
        on_disk = [os.path.abspath(os.fspath(p)) for p in paths if isinstance(p, (str, os.PathLike))]
        mixed._mix_parts = tuple(on_disk) if len(on_disk) == len(paths) else None
        mixed._mix_counts = tuple(flat)
        mixed._mix_segments = tuple(segments)
        out[sname] = mixed
    if source is not None:
        numbers = MixedDense(_TOKEN, f"mix({label})/{source}",
                             store=_loaderx.mix_source_store(flat, len(names)))
        numbers._mix_parts = ()
        numbers._mix_counts = tuple(flat)
        numbers._mix_segments = tuple(segments)
        out[source] = numbers
    out.names = names
    out.weights = tuple(sched[0][1][n] for n in names)
    out.counts = segment_counts[0]
    out.positions = base
    out.source = source
    out.schedule = sched
    out.segment_counts = tuple(segment_counts)
    out.segments = tuple(segments)
    out._stream_sets = stream_sets
    out._lengths = lengths
    out._min_positions = min_positions
    return out


def mix(datasets: Mapping[str, Any], *, source: str | None = "dataset",
        min_positions: int = DEFAULT_MIN_POSITIONS, schedule: Any = None) -> Mixture:
    """Mixes ``{name: (streams, weight)}`` into one stream dict; see the module docstring.

    Args:
        datasets: dataset name -> ``(streams, weight)``; ``streams`` is a dict
            of open :class:`~loaderx.zrecord.Dense` / ``Ragged`` readers of
            equal length (what one would pass to ``DataLoader``), the same
            stream names in every dataset; ``weight`` a positive number
            (weights need not add up to 1). With ``schedule``: dataset name
            -> ``streams`` (the weights are the schedule's).
        source: name of the added ``int64`` stream of dataset numbers, or
            ``None`` for none. Must not clash with a stream name.
        min_positions: the least number of positions ``V`` (share accuracy),
            per segment.
        schedule: ``[(start_step, {name: weight}), ...]``: piecewise constant
            weights (module doc, "Mixture schedules"); the first segment
            starts at step 0, starts increase; a weight is a number >= 0, a
            dataset left out of a segment has weight 0 there; every segment
            and every dataset needs one weight > 0.

    Raises:
        TypeError: a dataset is not a ``(streams, weight)`` pair (or, with
            ``schedule``, a streams dict), a stream is not an open reader, a
            schedule entry is not a ``(start_step, {name: weight})`` pair.
        InvalidArgumentError: no datasets, a bad weight, unequal stream
            lengths within a dataset, different stream names across
            datasets, a ``source`` that clashes; in a schedule: a first
            start other than 0, starts that do not increase, an unknown
            dataset name, a negative weight, a segment or dataset with no
            weight > 0.
        SchemaError: one stream differs in kind, dtype or shape across datasets.
    """
    if not isinstance(datasets, Mapping) or not datasets:
        raise InvalidArgumentError("mix needs a non-empty {name: (streams, weight)} mapping")
    names: list[str] = []
    weights: list[float] = []
    lengths: list[int] = []
    stream_sets: list[Mapping[str, Any]] = []
    for name, entry in datasets.items():
        if schedule is None:
            if not isinstance(entry, tuple) or len(entry) != 2:
                raise TypeError(f"dataset {name!r}: expected a (streams, weight) pair, "
                                f"got {type(entry).__name__}")
            streams, weight = entry
        else:
            if not isinstance(entry, Mapping):
                raise TypeError(f"dataset {name!r}: with schedule=, expected its streams dict "
                                f"(the weights are the schedule's), got {type(entry).__name__}")
            streams, weight = entry, None
        if not isinstance(streams, Mapping) or not streams:
            raise TypeError(f"dataset {name!r}: streams must be a non-empty dict of stores")
        for sname, store in streams.items():
            if not isinstance(store, (Dense, Ragged)):
                raise TypeError(f"dataset {name!r}: stream {sname!r} must be an open Dense or "
                                f"Ragged store, got {type(store).__name__}")
            store._live_store()  # a builder or a closed store raises StateError here
        sizes = {s: len(st) for s, st in streams.items()}
        if len(set(sizes.values())) != 1:
            raise InvalidArgumentError(f"dataset {name!r}: streams have different lengths: "
                                       + ", ".join(f"{s}={n}" for s, n in sizes.items()))
        n = next(iter(sizes.values()))
        if n == 0:
            raise InvalidArgumentError(f"dataset {name!r} is empty")
        if stream_sets and set(streams) != set(stream_sets[0]):
            raise InvalidArgumentError(
                f"dataset {name!r} has streams {sorted(streams)} but {names[0]!r} has "
                f"{sorted(stream_sets[0])}: every dataset needs the same stream names")
        names.append(str(name))
        if weight is not None:
            weights.append(_check_weight(str(name), weight))
        lengths.append(n)
        stream_sets.append(streams)
    if source is not None and source in stream_sets[0]:
        raise InvalidArgumentError(f"source={source!r} is also a stream name; pick another "
                                   "or source=None")
    if schedule is None:
        schedule = [(0, dict(zip(names, weights)))]
    return _build(tuple(names), tuple(stream_sets), tuple(lengths), schedule, source,
                  min_positions)
