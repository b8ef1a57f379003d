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

Mixed streams are readers like any store (``streams["label"][i]``).
``DataLoader(mix(...), daemon=...)`` is served by loaderxd, which builds the
same mixture from the parts' store files (docs/guide.md, "Mixing datasets").
"""

from __future__ import annotations

import math
import os
import pathlib
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

import numpy as np

from . import _loaderx
from .errors import InvalidArgumentError
from .zrecord import _TOKEN, Dense, Ragged

__all__ = ["DEFAULT_MIN_POSITIONS", "Mixture", "mix", "mix_counts"]

DEFAULT_MIN_POSITIONS = 1 << 24


class _MixedStream:
    """What a mixed Dense/Ragged reader adds: no store path (it is not on disk),
    but what loaderxd needs to build the same mixture (:mod:`loaderx.sources`)."""

    #: The store paths of the parts (dataset order), ``()`` for the dataset-number
    #: stream, ``None`` when a part has no path (a mixture of mixtures).
    _mix_parts: tuple[str, ...] | None = None
    #: The mixture's counts.
    _mix_counts: tuple[int, ...] = ()

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
        weights: the weights as given.
        counts: positions owned by each dataset (sums to ``positions``).
        positions: ``V``, the length of every stream of the mixture.
        source: the name of the dataset-number stream, or ``None``.
    """

    names: tuple[str, ...]
    weights: tuple[float, ...]
    counts: tuple[int, ...]
    positions: int
    source: str | None

    def shares(self) -> dict[str, float]:
        """``{dataset: counts[k] / positions}``: each dataset's share of the samples.

        The weight shares ``w_k / W`` exactly when ``V`` is a multiple of their
        denominator (see the module doc): ``{"web": 0.7, "books": 0.3}``.
        """
        return {n: c / self.positions for n, c in zip(self.names, self.counts)}

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


def _check_weight(name: str, weight: Any) -> float:
    if isinstance(weight, (bool, np.bool_)) or not isinstance(weight, (int, float, np.integer,
                                                                      np.floating)):
        raise TypeError(f"dataset {name!r}: weight must be a number, got {type(weight).__name__}")
    w = float(weight)
    if not (math.isfinite(w) and w > 0):
        raise InvalidArgumentError(f"dataset {name!r}: weight must be finite and > 0, got {weight!r}")
    return w


def mix(datasets: Mapping[str, tuple[Mapping[str, Any], float]], *, source: str | None = "dataset",
        min_positions: int = DEFAULT_MIN_POSITIONS) -> Mixture:
    """Mixes ``{name: (streams, weight)}`` into one stream dict; see the module docstring.

    Args:
        datasets: dataset name -> ``(streams, weight)``; ``streams`` is a dict
            of open :class:`~loaderx.zrecord.Dense` / ``Ragged`` readers of
            equal length (what one would pass to ``DataLoader``), the same
            stream names in every dataset; ``weight`` a positive number
            (weights need not add up to 1).
        source: name of the added ``int64`` stream of dataset numbers, or
            ``None`` for none. Must not clash with a stream name.
        min_positions: the least number of positions ``V`` (share accuracy).

    Raises:
        TypeError: a dataset is not a ``(streams, weight)`` pair, or a stream
            is not an open reader.
        InvalidArgumentError: no datasets, a bad weight, unequal stream
            lengths within a dataset, different stream names across
            datasets, a ``source`` that clashes.
        SchemaError: one stream differs in kind, dtype or shape across datasets.
    """
    if not isinstance(datasets, Mapping) or not datasets:
        raise InvalidArgumentError("mix needs a non-empty {name: (streams, weight)} mapping")
    names: list[str] = []
    weights: list[float] = []
    lengths: list[int] = []
    stream_sets: list[Mapping[str, Any]] = []
    for name, entry in datasets.items():
        if not isinstance(entry, tuple) or len(entry) != 2:
            raise TypeError(f"dataset {name!r}: expected a (streams, weight) pair, "
                            f"got {type(entry).__name__}")
        streams, weight = entry
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
        weights.append(_check_weight(str(name), weight))
        lengths.append(n)
        stream_sets.append(streams)
    if source is not None and source in stream_sets[0]:
        raise InvalidArgumentError(f"source={source!r} is also a stream name; pick another "
                                   "or source=None")
    counts = mix_counts(lengths, weights, min_positions=min_positions)
    out = Mixture()
    label = "+".join(names)
    for sname, first in stream_sets[0].items():
        native = _loaderx.mixed_store([s[sname]._live_store() for s in stream_sets], counts)
        cls = MixedDense if isinstance(first, Dense) else MixedRagged
        mixed = cls(_TOKEN, f"mix({label})/{sname}", store=native)
        paths = [getattr(s[sname], "path", None) for s in stream_sets]
        on_disk = [os.path.abspath(os.fspath(p)) for p in paths if isinstance(p, (str, os.PathLike))]
        mixed._mix_parts = tuple(on_disk) if len(on_disk) == len(paths) else None
        mixed._mix_counts = tuple(counts)
        out[sname] = mixed
    if source is not None:
        numbers = MixedDense(_TOKEN, f"mix({label})/{source}",
                             store=_loaderx.mix_source_store(counts))
        numbers._mix_parts = ()
        numbers._mix_counts = tuple(counts)
        out[source] = numbers
    out.names = tuple(names)
    out.weights = tuple(weights)
    out.counts = tuple(counts)
    out.positions = sum(counts)
    out.source = source
    return out
