"""The one resume state of a Sampler and a DataLoader (docs/guide.md, "Determinism and resume").

Both save ``{"version", "step", "seed", "mode", "n", "global_batch"}``: the
sample order (``seed``, ``mode`` by name, ``n`` records or mixture positions,
``global_batch`` = ``batch_size * world_size``, rank-independent so a state
loads on any world size that keeps it) and the next step. A DataLoader adds
``skip`` (skipped ranges) and ``mix_schedule`` (its mixture schedule, or
``None``). Either loads the other's state: a Sampler refuses one whose
``skip`` or schedule it could not honour.

Versions: 4 is this one. Older states load: a DataLoader's 1-3 (which named
the global batch ``global_batch_size``; 2 added ``skip``, 3
``mix_schedule``) and a Sampler's 1.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .errors import InvalidArgumentError

VERSION = 4
_KNOWN = (1, 2, 3, 4)
ORDER = ("seed", "mode", "n", "global_batch")  # what must match for the step to mean the same
KEYS = ("version", "step", *ORDER)


def make(step: int, seed: int, mode: str, n: int, global_batch: int) -> dict[str, Any]:
    """A state of this version (a DataLoader adds its keys after these)."""
    return {"version": VERSION, "step": step, "seed": seed, "mode": mode, "n": n,
            "global_batch": global_batch}


def read(state: object) -> dict[str, Any]:
    """``state`` in this version's keys (an older one renamed), or an error naming what is wrong.

    Raises:
        TypeError: ``state`` is not a mapping.
        loaderx.errors.InvalidArgumentError: a key is missing or the version unknown.
    """
    if not isinstance(state, Mapping):
        raise TypeError(f"state must be a dict from state_dict(), got {type(state).__name__}")
    out = dict(state)
    if "version" in out and out["version"] not in _KNOWN:
        raise InvalidArgumentError(
            f"state version {out['version']!r} is not supported (this loaderx reads 1..{VERSION})")
    if "global_batch" not in out and "global_batch_size" in out and out.get("version") != VERSION:
        out["global_batch"] = out.pop("global_batch_size")  # DataLoader states 1-3
    missing = [k for k in KEYS if k not in out]
    if missing:
        raise InvalidArgumentError(f"state is missing {', '.join(missing)}")
    return out


def check_order(state: Mapping[str, Any], mine: Mapping[str, Any], who: str) -> None:
    """ValueError naming the first key of the sample order in which ``state`` differs."""
    for key in ORDER:
        if state[key] != mine[key]:
            hint = ""
            if key == "global_batch":
                hint = ("; keep batch_size * world_size equal to resume exactly "
                        "(docs/guide.md, Determinism and resume)")
            raise InvalidArgumentError(
                f"state {key} is {state[key]!r} but this {who}'s is {mine[key]!r}{hint}")
