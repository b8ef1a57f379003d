"""Zsampler: the counter-based batch index generator behind every loader.

The indices of step ``s`` are a pure function of ``(n, batch_size, world_size,
mode, seed, s)`` and the rank, so a run resumes exactly with :meth:`Sampler.seek`
(or :meth:`Sampler.load_state_dict`) without tracking an epoch or RNG state::

    from loaderx.zsampler import Sampler

    sampler = Sampler(1_000_000, 256, Sampler.Mode.IID, seed=42)
    indices = sampler.next()   # borrowed until this sampler's next draw
    saved = indices.copy()     # retain across draws only when needed

See docs/guide.md, "## Sampler", for the modes, sharding and resume rules.
"""

from __future__ import annotations

import enum
import operator
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from . import _loaderx, _state
from .errors import InvalidArgumentError

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["Mode", "Sampler"]

class Mode(enum.IntEnum):
    """How a sampler walks ``0..n-1``.

    ``Sequential``: in order, wrapping at the end. ``IID``: uniform with
    replacement. ``Cyclic``: a fresh pseudo-random permutation per cycle,
    without replacement, full global batches only. The upper-case names of the
    reference package (``SEQUENTIAL``, ``IID``, ``CYCLIC``) are aliases.
    """

    Sequential = 0
    IID = 1
    Cyclic = 2
    SEQUENTIAL = 0
    CYCLIC = 2


# The module-level name for annotations inside Sampler, whose class attribute
# ``Mode`` (the public spelling ``Sampler.Mode``) shadows it there.
_ModeT = Mode


def _to_mode(mode: object) -> Mode:
    """Normalises a Mode, its int value or its (case-insensitive) name."""
    if isinstance(mode, Mode):
        return mode
    if isinstance(mode, str):
        for member in Mode:
            if member.name.lower() == mode.lower():
                return member
        raise InvalidArgumentError(
            f"mode: unknown sampler mode {mode!r} (expected Sampler.Mode.Sequential, IID or Cyclic)"
        )
    if isinstance(mode, bool) or not hasattr(mode, "__index__"):
        raise TypeError(f"mode must be a Sampler.Mode, got {type(mode).__name__}")
    value = operator.index(mode)
    try:
        return Mode(value)
    except ValueError:
        raise InvalidArgumentError(
            f"mode: unknown sampler mode {value} (expected Sampler.Mode.Sequential, IID or Cyclic)"
        ) from None


class Sampler(_loaderx.SamplerCore):
    """Batch index generator: ``Sampler(length, batch_size, mode, seed=42, *, rank=0, world_size=1, start_step=0)``.

    Args:
        length: number of records; indices are in ``0..length-1``, ``length
            >= 1`` (the attribute ``n``).
        batch_size: indices per draw for this rank, ``>= 1``. In Cyclic mode
            with ``world_size > 1``, ``batch_size * world_size`` must be
            ``<= length``; with one rank a larger ``batch_size`` draws whole
            cycles (``batch_size`` becomes ``length``: each draw is one
            permutation of ``0..length-1``), as the 2.5.4 wheel does.
        mode: a :class:`Sampler.Mode`, its value (0, 1, 2) or its name.
        seed: ``0 <= seed < 2**64``.
        rank, world_size: this process's slice of the global batch of
            ``batch_size * world_size`` indices, ``0 <= rank < world_size``.
        start_step: the step of the first draw.

    ``next()`` and iteration return a read-only ``uint64`` array of shape
    ``(batch_size,)`` that views the sampler's one reusable buffer: the same
    array object every time, overwritten by the next draw. Call ``.copy()`` to
    keep a plan across draws. Iteration never ends.

    Raises:
        TypeError: an argument is not an int (bools are rejected too).
        loaderx.errors.InvalidArgumentError (a ValueError): an argument is out
            of range or the mode is unknown; the message names the argument.
    """

    __slots__ = ()
    Mode = Mode

    def __init__(
        self,
        length: int,
        batch_size: int,
        mode: _ModeT | str | int = Mode.IID,
        seed: int = 42,
        *,
        rank: int = 0,
        world_size: int = 1,
        start_step: int = 0,
    ) -> None:
        mode = _to_mode(mode)
        # One rank in Cyclic mode with batch_size > length gets whole cycles:
        # the engine's rule (SamplerSpec::Effective), read back as batch_size.
        super().__init__(
            length,
            batch_size,
            int(mode),
            seed,
            rank=rank,
            world_size=world_size,
            start_step=start_step,
        )

    # next(), seek(step), peek(step), __iter__/__next__ and the read-only
    # attributes step, n, batch_size, seed, rank, world_size, global_batch and
    # cycle_steps are native (loaderx._loaderx.SamplerCore); their signatures
    # and docs are in python/loaderx/_loaderx.pyi.

    @property
    def mode(self) -> _ModeT:
        """The sampling mode."""
        return _ModeT(self.mode_value)

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume: ``{"version", "step", "seed", "mode", "n", "global_batch"}``.

        The state of a :class:`~loaderx.dataloader.DataLoader` has the same
        keys (and two of its own), so either loads the other's. The
        rank-independent global batch is recorded instead of ``batch_size``
        and ``world_size``, so a checkpoint loads on any world size that
        keeps the global batch (each rank loads the same dict).
        """
        return _state.make(self.step, self.seed, self.mode.name, self.n, self.global_batch)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resumes from :meth:`state_dict`: the next draw is the batch of ``state["step"]``.

        ``n``, ``mode``, ``seed`` and ``global_batch`` must match this sampler
        (otherwise the step would mean different indices); the message names
        the key that differs. Only the step is restored. A DataLoader's state
        loads too, unless it has skipped ranges or a mixture schedule of
        several segments, which a sampler cannot honour.

        Raises:
            TypeError: ``state`` is not a mapping.
            loaderx.errors.InvalidArgumentError: a key is missing, malformed or differs.
        """
        theirs = _state.read(state)
        if theirs.get("skip"):
            raise InvalidArgumentError(
                f"state skips steps {theirs['skip']!r}, which a Sampler cannot honour: "
                "load it into a DataLoader")
        schedule = theirs.get("mix_schedule")
        if isinstance(schedule, list) and len(schedule) > 1:
            raise InvalidArgumentError(
                "state has a mixture schedule of several segments, which a Sampler cannot "
                "honour: load it into a DataLoader")
        theirs["mode"] = _to_mode(theirs["mode"]).name
        _state.check_order(theirs, self.state_dict(), "sampler")
        self.seek(theirs["step"])

    def close(self) -> None:
        """Does nothing: a sampler holds no resource but its buffer, which the
        last view frees. Present (with ``with`` support) for code written
        against the reference package, whose samplers must be closed."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"Sampler(n={self.n}, batch_size={self.batch_size}, mode=Sampler.Mode.{self.mode.name}, "
            f"seed={self.seed}, rank={self.rank}, world_size={self.world_size}, step={self.step})"
        )

    def __reduce__(self) -> Any:
        return (
            _rebuild,
            (self.n, self.batch_size, int(self.mode), self.seed, self.rank, self.world_size, self.step),
        )


def _rebuild(
    n: int, batch_size: int, mode: int, seed: int, rank: int, world_size: int, step: int
) -> Sampler:
    return Sampler(n, batch_size, mode, seed, rank=rank, world_size=world_size, start_step=step)
