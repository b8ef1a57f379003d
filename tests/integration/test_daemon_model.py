"""Model-based test of loaderxd and its client: no silent wrong data, no hang.

A hypothesis ``RuleBasedStateMachine`` drives a real ``loaderxd`` process (a
fresh one per example, so that a leak one example causes cannot fail the next
one, which hypothesis must be able to replay) through the Python
``DataLoader(..., daemon=DaemonOptions(...))`` API: solo loaders and members
of named groups (broadcast, and shard with world size 2 and 3), small
``leases`` and ``prefetch``, a small ``--max-skew``; rules take batches, hold
some (whole, or only one view of them) and drop others, ``seek`` /
``load_state_dict`` (also to steps a group no longer holds), let a ``next``
time out while a member waits at the skew limit, close loaders while they
hold batches, and open new members late.

The model is a re-implementation of the group rules of docs/daemon.md
("Groups": consumed positions, held steps, skew, join and seek rules) and of
protocol 1.2's push (docs/protocol.md "Pushed batches"): the daemon pushes a
member the batch of its consumed position, unasked, when nothing it pushed is
untaken (the push window of one), its client holds fewer leases than its
credit, and the step is within ``--max-skew`` of the slowest consumed
position of the other members. That settled push state is a function of the
operations (not of their timing), so the model computes it after every rule
(``settle``), plus the expected batch of every step (the sampler's indices
over the records the stores were written from, i.e. what the embedded
DataLoader returns). After EVERY rule:

* every batch a loader returned equals the expected batch of its step, and
  every batch (or view) still held equals it too: a slot the daemon rewrote
  while a client viewed it fails here, at the first rule after it happened;
* the daemon's ``stats`` equal the model's exactly, once they settle (a
  bounded poll, then read again: a value the daemon only passes through
  fails): batches served (consumed) and gathered, leases held
  (``slots_held``: batches taken and still held, also past ``close()``, plus
  the one pushed ahead), releases (none stale), sessions, loaders, groups
  and group members. ``consumed`` and ``release`` frames are ordered with
  their own connection's later requests, not with the stats connection's,
  so only the settled values are compared; and since a rule's outcome (a
  join, a refused seek) depends on other members' consumed positions, the
  next rule runs only after the stats (which count every consumed item)
  settled;
* at teardown, after every loader is closed and every batch freed,
  ``slots_held``, ``ring_bytes``, ``loaders``, ``groups`` return to zero.

Every call that may block runs in a helper thread and must finish within
``CALL_TIMEOUT`` seconds: a hang fails the test (and the loaders are closed,
which unblocks it) instead of hanging CI.

Blocking, modelled rather than avoided: one test thread drives every member,
so a ``next`` the daemon would make wait (nothing pushed: a member
``--max-skew`` steps ahead of its group's slowest, including shard ranks that
left or never joined) is only issued by the ``next_waits_at_skew`` rule, with
a short timeout that must expire; nothing is owed afterwards (1.2 has no
request), and the model pushes that member's batch, as the daemon does, once
the slowest catches up. A ``next`` is otherwise issued only when the model
says the batch is pushed (it returns at once) or the loader is at its lease
cap (refused at once). Rules whose effect would depend on timing are not
issued: a group member takes a batch only while the distinct batches its
group's clients took and still hold stay within the ring's lease budget,
the condition under which serving_group.h proves the ring never runs out (the
batches pushed ahead are among the steps the group holds; hoarding beyond
the budget may legitimately wait or fail). Solo loaders are unrestricted.
The daemon runs with ``--group-live-batches 0``: the model is the skew rule's.
The live bound (default 2) withholds a push while the ring has K batches
live, counting the batches clients hold and the one the pipeline made ahead,
and a caller's ``waiting`` flag opens it: with the default daemon the model
fails at once (one broadcast member with leases 3 takes and keeps steps 0
and 1: the model expects step 2 pushed, 3 gathered, 3 slots held; the
daemon, bound at 2 live, has gathered 2 and holds 2). Modelling the bound
is left to do; its own tests are in test_group_memory.py.

``LOADERX_MODEL_EXAMPLES`` (default 30) and ``LOADERX_MODEL_STEPS`` (default
40) scale the run; ``LOADERX_MODEL_RANDOM=1`` draws new examples (default:
the same ones every run), ``LOADERX_MODEL_SHRINK=0`` skips shrinking and
``LOADERX_MODEL_TRACE=FILE`` logs every rule and failure, for long hunts
(``LOADERXD=`` a TSan or ASan build of the daemon checks its side too).
Races between members on their own threads are tests/daemon/group_stress_test.cc's.
"""

from __future__ import annotations

import gc
import itertools
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from loaderx.client import DaemonOptions
from loaderx.dataloader import DataLoader
from loaderx.zsampler import Sampler

MAX_SKEW = 2
WORLDS = {"s2": 2, "s3": 3}  # shard groups by name: their world size
GROUPS = ["b0", "b1", *WORLDS]
MAX_OPEN = 7  # loaders open at once
# client/src/connection.h: the cooldown after a missed deferral is a back-off
# that doubles per miss and halves after a streak of deferrals without one.
DEFER_COOLDOWN_MIN, DEFER_COOLDOWN_MAX, DEFER_STREAK = 8, 256, 64
CALL_TIMEOUT = 20.0  # seconds; far above any legitimate wait on this box
EXAMPLES = int(os.environ.get("LOADERX_MODEL_EXAMPLES", "30"))
STEPS = int(os.environ.get("LOADERX_MODEL_STEPS", "40"))
SHRINK = os.environ.get("LOADERX_MODEL_SHRINK", "1") != "0"
RANDOM = os.environ.get("LOADERX_MODEL_RANDOM", "0") != "0"  # off: the same examples each run
MODES = (Sampler.Mode.Sequential, Sampler.Mode.IID, Sampler.Mode.Cyclic)


TRACE = os.environ.get("LOADERX_MODEL_TRACE")  # a file: every rule and failure, for hunts


def traced(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Logs the rule and any exception it raises to TRACE (if set)."""
    if not TRACE:
        return fn
    import functools
    import traceback

    @functools.wraps(fn)
    def wrapper(self: Any, **kwargs: Any) -> Any:
        with open(TRACE, "a") as log:
            log.write(f"{self.prefix} {fn.__name__} {kwargs}\n")
        try:
            return fn(self, **kwargs)
        except Exception:
            with open(TRACE, "a") as log:
                log.write(traceback.format_exc())
            raise

    return wrapper


class Hang(AssertionError):
    """A call into the daemon client did not return within CALL_TIMEOUT."""


# ---------------------------------------------------------------- the model


@dataclass(frozen=True)
class Spec:
    """What the sampler of one loader draws: (batch_size, mode, seed, rank, world)."""

    batch_size: int
    mode: Any
    seed: int
    rank: int = 0
    world_size: int = 1


@dataclass
class GroupModel:
    """docs/daemon.md "Groups" (and serving_group.h), step for step.

    A solo loader is the only member of a private broadcast group with no
    skew. ``held`` are the steps the group keeps (published once, retained
    until every cursor that needs them passed); ``epoch`` changes when the
    pipeline restarts (the only member seeks), so (uid, epoch, step) names
    one gathered batch, i.e. one ring slot while it is leased or held.
    """

    uid: int
    name: str  # "" for a solo loader
    mode: str  # "broadcast" | "shard"
    spec: Spec  # the creator's (rank ignored for shard)
    leases: int  # the creator's granted lease cap: the ring's lease budget
    skew: int
    start: int
    members: dict[int, int] = field(default_factory=dict)  # loader uid -> rank
    cursors: dict[int, int] = field(default_factory=dict)  # broadcast: loader uid -> cursor
    rank_cursor: list[int] = field(default_factory=list)  # shard
    before: dict[int, int] = field(default_factory=dict)  # shard: loader uid -> its rank's cursor before it joined
    produced: int = 0
    held: set[int] = field(default_factory=set)
    epoch: int = 0
    gathered: int = 0

    def __post_init__(self) -> None:
        self.produced = self.start
        if self.mode == "shard":
            self.rank_cursor = [self.start] * self.spec.world_size

    def cursor(self, lid: int) -> int:
        if self.mode == "shard":
            return self.rank_cursor[self.members[lid]]
        return self.cursors[lid]

    def set_cursor(self, lid: int, step: int) -> None:
        if self.mode == "shard":
            self.rank_cursor[self.members[lid]] = step
        else:
            self.cursors[lid] = step

    def slowest(self) -> int:
        if self.mode == "shard":
            return min(self.rank_cursor)
        return min(self.cursors.values()) if self.cursors else 1 << 62

    def oldest(self) -> int:
        return min(self.held) if self.held else self.produced

    def gone(self, lid: int) -> bool:
        """A shard member that joined below the held steps and never moved: never pushed."""
        c = self.cursor(lid)
        return c not in self.held and c < self.oldest()

    def trim(self) -> None:
        low = self.slowest()
        self.held = {s for s in self.held if s >= low}

    def slowest_others(self, lid: int) -> int | None:
        """The slowest consumed position of the OTHER members (shard: other ranks)."""
        if self.mode == "shard":
            mine = self.members[lid]
            others = [c for r, c in enumerate(self.rank_cursor) if r != mine]
        else:
            others = [c for m, c in self.cursors.items() if m != lid]
        return min(others) if others else None

    def blocked(self, lid: int) -> bool:
        """The push of this member's next step waits for the slowest (skew)."""
        others = self.slowest_others(lid)
        return others is not None and self.cursor(lid) > others + self.skew

    def push(self, lid: int) -> tuple[int, int]:
        """Group::Next: fetches until the consumed position's step is held, pushes it."""
        assert not self.blocked(lid)
        c = self.cursor(lid)
        while c not in self.held:
            target = max(self.produced, self.slowest())
            self.held.add(target)
            self.produced = target + 1
            self.gathered += 1
        return self.epoch, c

    def consume(self, lid: int) -> None:
        """The client's `consumed`: the caller took the step it was pushed."""
        self.set_cursor(lid, self.cursor(lid) + 1)
        self.trim()

    def join(self, lid: int, rank: int, join: str, start: int) -> int:
        if self.mode == "broadcast" and self.name and start != 0:
            # An explicit start_step is honoured in broadcast, never ignored.
            if join == "current":
                raise ValueError("start_step and join='current' contradict")
            join = "start_step"
        if join == "default":
            join = "start_step" if self.mode == "shard" else "current"
        cursor = self.oldest()
        if join == "start_step" and self.members:
            # Shard accepts a step it no longer holds: the member is "not
            # started" until it seeks to a held step (its next() would fail).
            if start < cursor and self.mode != "shard":
                raise IndexError(cursor)
            cursor = start
        elif not self.members:
            cursor = start
        self.members[lid] = rank
        if self.mode == "shard":
            self.before[lid] = self.rank_cursor[rank]
        self.set_cursor(lid, cursor)
        self.trim()
        return cursor

    def leave(self, lid: int) -> bool:
        """True if it was the last member (the group closes)."""
        if self.mode == "shard" and self.cursor(lid) < self.oldest():
            # It never got its step: its rank needs what it needed before.
            self.rank_cursor[self.members[lid]] = max(self.before[lid], self.oldest())
        self.before.pop(lid, None)
        self.members.pop(lid)
        self.cursors.pop(lid, None)  # shard: the rank's cursor stays, frozen
        self.trim()
        return not self.members

    def seek(self, lid: int, step: int) -> None:
        if len(self.members) > 1:
            if step < self.oldest():
                raise IndexError(self.oldest())
            self.set_cursor(lid, step)
            self.trim()
            return
        self.held.clear()
        self.produced = step
        self.epoch += 1
        self.rank_cursor = [step] * len(self.rank_cursor)
        self.set_cursor(lid, step)


@dataclass
class LoaderModel:
    uid: int
    dl: DataLoader
    group: GroupModel
    spec: Spec
    cap: int
    named: bool
    step: int  # the DataLoader's step (the next batch it returns)
    pending: tuple[int, int] | None = None  # pushed, not taken: (epoch, step)
    # A solo loader's take while it held another batch is reported with the
    # client's next frame (a release, a seek, close) or its next wait
    # (docs/protocol.md "Consumed positions"); until then the daemon
    # neither counts it served nor pushes the next batch.
    deferred: bool = False
    cooldown: int = 0  # takes reported at once after a deferral did not pay
    backoff: int = DEFER_COOLDOWN_MIN  # the next miss's cooldown
    streak: int = 0  # deferrals since the last miss or halving
    closed: bool = False
    session: bool = True  # the daemon session is alive

    @property
    def label(self) -> str:
        g = self.group
        kind = f"{g.mode} '{g.name}' rank {self.group.members.get(self.uid, '-')}" if self.named else "solo"
        return f"loader {self.uid} ({kind}, cap={self.cap})"


@dataclass
class Held:
    """Arrays a test keeps from one delivered batch (all of it or one view)."""

    loader: LoaderModel
    ident: tuple[int, int, int]  # (group uid, epoch, step): the ring slot it leases
    step: int
    arrays: list[np.ndarray]
    want: list[np.ndarray]
    # Moved out of the ring (the client took a batch at its lease cap): the
    # arrays are this process's own memory, the slot went back.
    moved: bool = False


# ---------------------------------------------------------------- the test


def flatten(batch: dict[str, Any]) -> list[np.ndarray]:
    out: list[np.ndarray] = []
    for name in ("image", "label", "tokens"):
        v = batch[name]
        out.extend(v if isinstance(v, list) else [v])
    return out


def run_model(daemon_factory: Callable[..., Any], data: dict) -> None:
    streams = data["streams"]
    cache: dict[tuple[Spec, int], list[np.ndarray]] = {}

    def expected(spec: Spec, step: int) -> list[np.ndarray]:
        key = (spec, step)
        if key not in cache:
            cache[key] = expected_batch(data, spec, step)
        return cache[key]

    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="model-call")
    counter = itertools.count(1)

    class DaemonModel(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.all: list[LoaderModel] = []
            self.groups: dict[str, GroupModel] = {}  # live named groups by name
            self.held: list[Held] = []
            self.served = 0
            self.releases = 0
            self.gathered_closed = 0  # of groups no longer in self.groups
            # What the daemon may or may not have done besides the model's
            # prediction, after a deferred take went out just before a seek
            # or close (deferred_take_races): resolved by the next stats.
            # Open races (deferred_take_races): the loader whose seek's
            # outcome may still show (None: settled by the next stats) and
            # what each outcome adds to the stats.
            self.races: list[tuple[LoaderModel | None, list[dict[str, int]]]] = []
            number = next(counter)
            self.prefix = f"m{number}-"
            # A daemon per example: a leak found by one example must not
            # leak into the next (hypothesis replays examples to shrink).
            self.daemon = daemon_factory("--max-skew", str(MAX_SKEW), "--group-live-batches", "0",
                                         name=f"m{number}.sock")
            self.broken = False
            self.closed_groups: set[int] = set()  # group uids that ended
            self.group_uids = itertools.count(1)
            self.loader_uids = itertools.count(1)

        # -- plumbing --------------------------------------------------------

        def call(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
            """fn(*args) in the helper thread, bounded: a hang fails the test."""
            fut = pool.submit(fn, *args)
            try:
                return fut.result(timeout=CALL_TIMEOUT)
            except FutureTimeout:
                self.broken = True
                for lm in self.all:  # unblocks the helper thread
                    lm.dl.close()
                raise Hang(f"{what} did not return within {CALL_TIMEOUT} s") from None

        def open_loaders(self) -> list[LoaderModel]:
            return [lm for lm in self.all if not lm.closed]

        def all_groups(self) -> list[GroupModel]:
            seen: dict[int, GroupModel] = {}
            for lm in self.all:
                seen[lm.group.uid] = lm.group
            return list(seen.values())

        def taken(self, group: GroupModel) -> set[tuple[int, int, int]]:
            """Distinct batches of `group`'s ring its clients took and still hold."""
            return {h.ident for h in self.held
                    if h.loader.group is group and h.loader.session and not h.moved}

        def within_budget(self, lm: LoaderModel) -> bool:
            """Group rings: taking the pushed batch keeps the taken ones in the budget.

            serving_group.h's ring sizing: the held steps (every pushed-unread batch
            among them) fit max_skew + 1 slots; batches the group dropped
            that clients still lease must stay within its `leases`.
            """
            if not lm.named or lm.pending is None:
                return True
            g = lm.group
            return len(self.taken(g) | {(g.uid, *lm.pending)}) <= g.leases

        def client_held(self, lm: LoaderModel) -> int:
            return sum(1 for h in self.held if h.loader is lm and not h.moved)

        def settle(self) -> None:
            """What the daemon does on its own: pushes every member it may.

            A member is pushed the step of its consumed position when nothing
            it was pushed is untaken (the window of one), its client is under
            its credit and the skew rule allows it. Order independent: a push
            moves no consumed position, and the group fetches from
            max(produced, slowest) whichever member asks first.
            """
            changed = True
            while changed:
                changed = False
                for lm in self.all:
                    if (lm.closed or lm.pending is not None or lm.deferred
                            or self.client_held(lm) >= lm.cap or lm.group.blocked(lm.uid)
                            or lm.group.gone(lm.uid)):
                        continue
                    lm.pending = lm.group.push(lm.uid)
                    changed = True

        def end_session_if_done(self, lm: LoaderModel) -> None:
            if lm.closed and lm.session and self.client_held(lm) == 0:
                lm.session = False  # the client hangs up with its last lease
                lm.pending = None

        def report(self, lm: LoaderModel) -> None:
            """The daemon learns a deferred take (it came with another frame)."""
            if lm.deferred:
                lm.deferred = False
                lm.group.consume(lm.uid)
                self.served += 1

        def drop(self, h: Held) -> None:
            self.held.remove(h)
            h.arrays.clear()
            if h.moved:  # its release went when it moved
                return
            self.report(h.loader)  # the release carries it
            self.releases += 1  # sent before a closed loader's client hangs up, too
            self.end_session_if_done(h.loader)
            self.settle()  # credit came back

        def expect_stats(self) -> None:
            live_named = [g for g in self.groups.values() if g.members]
            want = {
                "batches_served": self.served,
                "batches_gathered": self.gathered_closed
                + sum(g.gathered for g in self.all_groups() if g.uid not in self.closed_groups),
                "slots_held": sum(self.client_held(lm) + (lm.pending is not None)
                                  for lm in self.all if lm.session),
                "releases": self.releases,
                "stale_releases": 0,
                "sessions": sum(1 for lm in self.all if lm.session),
                "loaders": len(self.open_loaders()),
                "group_members": sum(1 for lm in self.open_loaders() if lm.named),
                "groups": len(live_named),
            }
            got: dict[str, int] = {}

            def agrees(got: dict[str, int]) -> bool:
                if got == want:
                    return True
                held = any(owner is not None for owner, _ in self.races)
                for pick in itertools.product(*[[{}, *outcomes] for _, outcomes in self.races]):
                    extra = {k: sum(p.get(k, 0) for p in pick) for k in want}
                    if extra["slots_held"] and not held:
                        continue  # settled races hold no slot
                    if got == {k: v + extra[k] for k, v in want.items()}:
                        return True
                return False

            for _ in range(250):  # pushes, consumed, releases are asynchronous: <= 5 s
                s = self.daemon.stats()
                got = {k: s[k] for k in want}
                if agrees(got):
                    threading.Event().wait(0.02)  # settled, not passing through
                    s = self.daemon.stats()
                    got = {k: s[k] for k in want}
                    if agrees(got):
                        if any(owner is not None for owner, _ in self.races):
                            return  # a seek's race may still show: see deferred_take_races
                        if got != want:  # the races' outcomes, now final
                            self.gathered_closed += got["batches_gathered"] - want["batches_gathered"]
                            self.releases += got["releases"] - want["releases"]
                        self.races = []
                        return
                threading.Event().wait(0.02)
            extra = {k: s[k] for k in ("protocol_errors", "refused")}
            raise AssertionError(f"daemon stats {got} != model {want} ({extra})")

        # -- opening ---------------------------------------------------------

        def open(self, group: GroupModel | None, *, name: str, gmode: str, spec: Spec,
                 rank: int, join: str, start: int, leases: int,
                 prefetch: int) -> LoaderModel | None:
            uid = next(self.loader_uids)
            options = DaemonOptions(
                self.daemon.socket, leases=leases,
                group=self.prefix + name if name else None, group_mode=gmode,
                join=None if join == "default" else join,
            )

            def make() -> DataLoader:
                return DataLoader(streams, batch_size=spec.batch_size, mode=spec.mode,
                                  seed=spec.seed, rank=rank, world_size=spec.world_size,
                                  start_step=start, prefetch=prefetch, daemon=options)

            created = group is None
            if created:
                group = GroupModel(uid=next(self.group_uids), name=name, mode=gmode, spec=spec,
                                   leases=leases, skew=MAX_SKEW if name else 0, start=start)
            assert group is not None
            try:
                first = group.join(uid, rank, join, start)
            except IndexError as exc:
                with pytest.raises(IndexError, match=f"oldest step it still holds is {exc.args[0]}"):
                    self.call("open", make)
                return None
            except ValueError:
                with pytest.raises(ValueError, match="join='current' contradict"):
                    self.call("open", make)
                return None
            dl = self.call("open", make)
            cap = min(leases, group.leases)
            lm = LoaderModel(uid=uid, dl=dl, group=group, spec=Spec(
                spec.batch_size, spec.mode, spec.seed, rank, spec.world_size),
                cap=cap, named=bool(name), step=first)
            self.all.append(lm)
            if name:
                self.groups[name] = group
            assert dl.step == first, f"{lm.label} starts at {dl.step}, model {first}"
            assert dl._source.lease_cap == cap
            self.settle()  # its first push; a member joining ahead may unblock others
            return lm

        @precondition(lambda self: len(self.open_loaders()) < MAX_OPEN)
        @rule(mode=st.sampled_from(MODES), batch=st.sampled_from([3, 4]),
              seed=st.integers(0, 3), start=st.integers(0, 30), leases=st.integers(1, 3),
              prefetch=st.integers(1, 2))
        @traced
        def open_solo(self, mode: Any, batch: int, seed: int, start: int, leases: int,
                      prefetch: int) -> None:
            self.open(None, name="", gmode="broadcast", spec=Spec(batch, mode, seed),
                      rank=0, join="default", start=start, leases=leases, prefetch=prefetch)

        @precondition(lambda self: len(self.open_loaders()) < MAX_OPEN)
        @rule(name=st.sampled_from(GROUPS),
              mode=st.sampled_from(MODES), seed=st.integers(0, 3), start=st.integers(0, 12),
              rank=st.integers(0, max(WORLDS.values()) - 1),
              join=st.sampled_from(["default", "current", "start_step"]),
              leases=st.integers(1, 3), prefetch=st.integers(1, 2))
        @traced
        def open_member(self, name: str, mode: Any, seed: int, start: int, rank: int, join: str,
                        leases: int, prefetch: int) -> None:
            gmode = "shard" if name in WORLDS else "broadcast"
            world = WORLDS.get(name, 1)
            rank %= world
            group = self.groups.get(name)
            if group is not None and not group.members:
                group = None
            if group is not None:
                spec = group.spec  # the same spec, or the open is refused
                if gmode == "shard" and rank in group.members.values():
                    with pytest.raises(ValueError, match=f"rank {rank} of {world} is already taken"):
                        self.call("open", lambda: DataLoader(
                            streams, batch_size=spec.batch_size, mode=spec.mode, seed=spec.seed,
                            rank=rank, world_size=world,
                            daemon=DaemonOptions(self.daemon.socket, group=self.prefix + name,
                                                 group_mode=gmode)))
                    return
            else:
                spec = Spec(4 if gmode == "broadcast" else 2, mode, seed,
                            world_size=world)
            if gmode == "broadcast":
                rank = 0
            self.open(group, name=name, gmode=gmode, spec=spec, rank=rank, join=join,
                      start=start, leases=leases, prefetch=prefetch)

        @precondition(lambda self: any(g.members for g in self.groups.values()))
        @rule(name=st.sampled_from(GROUPS))
        @traced
        def open_mismatched_member_is_refused(self, name: str) -> None:
            group = self.groups.get(name)
            if group is None or not group.members:
                return
            spec = group.spec
            options = DaemonOptions(self.daemon.socket, group=self.prefix + name, group_mode=group.mode)
            free = [r for r in range(spec.world_size) if r not in group.members.values()]
            rank = free[0] if group.mode == "shard" and free else 0
            with pytest.raises(ValueError, match=f"batch_size 5 differs from the group's {spec.batch_size}"):
                self.call("open", lambda: DataLoader(
                    streams, batch_size=5, mode=spec.mode, seed=spec.seed, rank=rank,
                    world_size=spec.world_size, daemon=options))

        # -- taking batches --------------------------------------------------

        def can_take(self, lm: LoaderModel) -> bool:
            """next() returns at once: the daemon pushed the batch (never waits)."""
            return not lm.closed and lm.pending is not None and self.within_budget(lm)

        def pick(self, data: st.DataObject, ok: Callable[[LoaderModel], bool]) -> LoaderModel:
            eligible = [lm for lm in self.all if ok(lm)]
            return eligible[data.draw(st.integers(0, len(eligible) - 1), label="loader")]

        @precondition(lambda self: any(self.can_take(lm) for lm in self.all))
        @rule(data=st.data(), keep=st.sampled_from(["all", "all", "image", "record", "none"]))
        @traced
        def take(self, data: st.DataObject, keep: str) -> None:
            self.take_one(self.pick(data, self.can_take), keep)

        @precondition(lambda self: any(self.can_take(lm) for lm in self.all))
        @rule(data=st.data(), keep=st.sampled_from(["all", "none"]))
        @traced
        def take_again(self, data: st.DataObject, keep: str) -> None:  # takes are most of a run
            self.take_one(self.pick(data, self.can_take), keep)

        @precondition(lambda self: any(self.can_take(lm) for lm in self.all))
        @rule(data=st.data())
        @traced
        def take_and_drop(self, data: st.DataObject) -> None:
            self.take_one(self.pick(data, self.can_take), "none")

        def take_one(self, lm: LoaderModel, keep: str) -> None:
            g = lm.group
            batch = self.call(f"next() of {lm.label}", next, lm.dl)
            # Its seek's race shows by now (a stale push is drained first).
            self.races = [(None if o is lm else o, x) for o, x in self.races]
            assert lm.pending is not None
            epoch, step = lm.pending
            lm.pending = None
            if not lm.named and self.client_held(lm) > 0 and lm.cooldown == 0:
                lm.deferred = True  # reported with the next frame
                lm.streak += 1
                if lm.streak >= DEFER_STREAK:
                    lm.backoff, lm.streak = max(DEFER_COOLDOWN_MIN, lm.backoff // 2), 0
            else:
                lm.cooldown = max(0, lm.cooldown - 1)
                g.consume(lm.uid)
                self.served += 1
            assert step == lm.step, f"{lm.label}: model step {step} != loader step {lm.step}"
            lm.step = step + 1
            assert lm.dl.step == lm.step
            arrays = flatten(batch)
            del batch
            want = expected(lm.spec, step)
            check_arrays(arrays, want, f"{lm.label} step {step}")
            for a in arrays:
                assert a.flags.writeable  # a private copy-on-write view (sources.py)
            ident = (g.uid, epoch, step)
            if keep == "all":
                self.held.append(Held(lm, ident, step, arrays, list(want)))
            elif keep == "image":
                self.held.append(Held(lm, ident, step, [arrays[0][1:]], [want[0][1:]]))
            elif keep == "record":
                self.held.append(Held(lm, ident, step, [arrays[-1]], [want[-1]]))
            else:
                self.report(lm)  # its own release, below, carries it
                self.releases += 1  # freed below
            del arrays
            self.settle()

        def deferred_next(self, lm: LoaderModel) -> bool:
            return not lm.closed and lm.deferred and self.client_held(lm) < lm.cap

        @precondition(lambda self: any(self.deferred_next(lm) for lm in self.all))
        @rule(data=st.data(), keep=st.sampled_from(["all", "none"]))
        @traced
        def take_before_the_deferred_take_went(self, data: st.DataObject, keep: str) -> None:
            """next() before anything carried the last take: nothing was pushed, so
            it waits; its wait reports the take, the daemon pushes, and the next
            takes are reported at once for a while (connection.h kDeferCooldownMin..Max)."""
            lm = self.pick(data, self.deferred_next)
            self.report(lm)
            lm.cooldown = lm.backoff
            lm.backoff, lm.streak = min(DEFER_COOLDOWN_MAX, 2 * lm.backoff), 0
            self.settle()
            self.take_one(lm, keep)

        def at_cap(self, lm: LoaderModel) -> bool:
            # Nothing pushed (the credit is taken) and the whole credit held.
            return not lm.closed and lm.pending is None and self.client_held(lm) >= lm.cap

        @precondition(lambda self: any(self.at_cap(lm) for lm in self.all))
        @rule(data=st.data(), keep=st.sampled_from(["all", "none"]))
        @traced
        def take_at_lease_cap_moves_the_oldest_held_out(self, data: st.DataObject, keep: str) -> None:
            """At the cap, next() moves the oldest batch the client holds out of the
            ring (its release goes out, carrying a deferred take) and then takes the
            push that release allows, or waits if the skew rule holds it back."""
            lm = self.pick(data, self.at_cap)
            oldest = next(h for h in self.held if h.loader is lm and not h.moved)
            oldest.moved = True
            self.report(lm)  # the release carries it
            self.releases += 1
            self.settle()
            if lm.pending is not None:
                self.take_one(lm, keep)
                return
            got = self.call(f"next_raw(0.1) of {lm.label}", lm.dl._source.next_raw, 0.1)
            assert got is None, f"{lm.label} got step {got[0]} past the skew limit"
            assert lm.dl.step == lm.step

        def waits(self, lm: LoaderModel) -> bool:
            """next() would wait: nothing pushed, the push waits for the group's slowest."""
            return not (lm.closed or lm.pending is not None or not lm.group.blocked(lm.uid)
                        or self.client_held(lm) >= lm.cap or lm.group.gone(lm.uid))

        @precondition(lambda self: any(self.waits(lm) for lm in self.all))
        @rule(data=st.data())
        @traced
        def next_waits_at_skew(self, data: st.DataObject) -> None:
            lm = self.pick(data, self.waits)
            got = self.call(f"next_raw(0.1) of {lm.label}", lm.dl._source.next_raw, 0.1)
            assert got is None, f"{lm.label} got step {got[0]} past the skew limit"
            assert lm.dl.step == lm.step

        def not_started(self, lm: LoaderModel) -> bool:
            """A shard member that joined below the steps its group holds and never sought."""
            return not lm.closed and lm.pending is None and lm.group.gone(lm.uid)

        @precondition(lambda self: any(self.not_started(lm) for lm in self.all))
        @rule(data=st.data())
        @traced
        def next_of_a_member_not_started_is_refused(self, data: st.DataObject) -> None:
            """Its next() fails at once naming the oldest held step; nothing moves."""
            lm = self.pick(data, self.not_started)
            g = lm.group
            with pytest.raises(IndexError, match=(
                    f"no longer holds step {g.cursor(lm.uid)} .*the oldest step it still holds "
                    f"is {g.oldest()}")):
                self.call(f"next_raw(0.1) of {lm.label}", lm.dl._source.next_raw, 0.1)
            assert lm.dl.step == lm.step

        @precondition(lambda self: self.held)
        @rule(data=st.data())
        @traced
        def drop_held(self, data: st.DataObject) -> None:
            if self.held:  # an index: hypothesis may keep what it draws, for its report
                self.drop(self.held[data.draw(st.integers(0, len(self.held) - 1))])

        @precondition(lambda self: self.held)
        @rule(data=st.data())
        @traced
        def drop_all_of_a_loader(self, data: st.DataObject) -> None:
            if self.held:
                lm = self.held[data.draw(st.integers(0, len(self.held) - 1))].loader
                for h in [h for h in self.held if h.loader is lm]:
                    self.drop(h)

        # -- position --------------------------------------------------------

        def can_seek(self, lm: LoaderModel) -> bool:
            return not lm.closed

        @precondition(lambda self: any(self.can_seek(lm) for lm in self.all))
        @rule(data=st.data(), step=st.integers(0, 40), via_state=st.booleans())
        @traced
        def seek(self, data: st.DataObject, step: int, via_state: bool) -> None:
            lm = self.pick(data, self.can_seek)
            g = lm.group
            # A member that is not alone moves only its cursor, and not
            # below what the group still holds.
            refused = len(g.members) > 1 and step < g.oldest()
            if via_state:
                state = dict(lm.dl.state_dict(), step=step)
                action: Callable[[], None] = lambda: lm.dl.load_state_dict(state)
            else:
                action = lambda: lm.dl.seek(step)
            # The seek releases that push unread (an older generation), or
            # is answered first while the push waits for its gather, which
            # then goes unpushed -- or pushed after the seek's answer, held
            # (a slot) until the client's next call drains and releases it.
            self.deferred_take_races(lm, {"batches_gathered": 1, "releases": 1},
                                     {"batches_gathered": 1},
                                     {"batches_gathered": 1, "slots_held": 1}, hold=True)
            self.report(lm)  # the seek is a request: the deferred take goes first
            if refused:
                with pytest.raises(IndexError, match=f"oldest step it still holds is {g.oldest()}"):
                    self.call(f"seek({step}) of {lm.label}", action)
                # A refused seek changes nothing: the loader stays where it was
                # and the batch pushed before it is still the next one.
                assert lm.dl.step == lm.step
                return
            self.call(f"seek({step}) of {lm.label}", action)
            if lm.pending is not None:  # pushed in the old generation: released unread
                lm.pending = None
                self.releases += 1
            g.seek(lm.uid, step)
            lm.step = step
            assert lm.dl.step == step
            self.settle()

        def deferred_take_races(self, lm: LoaderModel, *outcomes: dict[str, int],
                                hold: bool = False) -> None:
            """A deferred take goes out just before a seek or `close`.

            The daemon may act on it before it reads the request: with
            credit left, it pushes (gathers) the loader's next step, which
            the request then discards (``outcomes``: what that may add to
            the stats). How far it got is timing (measured: each happens),
            so until the stats settle the model accepts each. ``hold``: the
            outcome may show later than the request's answer (a seek's), so
            it is settled only once the loader took its next batch (the
            stale push, if any, is drained before that batch).
            Only a solo loader defers its takes.
            """
            if lm.deferred and self.client_held(lm) < lm.cap:
                assert not lm.named
                self.races.append((lm if hold else None, list(outcomes)))

        # -- closing ---------------------------------------------------------

        @precondition(lambda self: self.open_loaders())
        @rule(data=st.data())
        @traced
        def close(self, data: st.DataObject) -> None:
            lm = self.pick(data, lambda lm: not lm.closed)
            # `close` drops that push unread: no release. Final once the
            # daemon processed `close` (a gather that ends later is not counted).
            self.deferred_take_races(lm, {"batches_gathered": 1})
            self.races = [(None if o is lm else o, x) for o, x in self.races]
            self.call(f"close() of {lm.label}", lm.dl.close)
            self.report(lm)  # sent before `close`
            lm.closed = True
            # Its pushed-unread batch: forgotten by the client, its lease
            # dropped by the daemon (`close` or the hang-up); no release.
            lm.pending = None
            g = lm.group
            last = g.leave(lm.uid)
            if last:
                self.closed_groups.add(g.uid)
                self.gathered_closed += g.gathered
                g.held.clear()
                if lm.named and self.groups.get(g.name) is g:
                    del self.groups[g.name]
            self.end_session_if_done(lm)
            self.settle()

        # -- invariants ------------------------------------------------------

        @invariant()
        @traced
        def held_batches_are_unchanged(self) -> None:
            for h in self.held:
                check_arrays(h.arrays, h.want, f"held step {h.step} of {h.loader.label}")

        @invariant()
        @traced
        def stats_agree_with_the_model(self) -> None:
            self.expect_stats()

        def teardown(self) -> None:
            try:
                self.settle_and_check_zero()
            finally:
                self.daemon.kill()

        def settle_and_check_zero(self) -> None:
            if self.broken:
                for lm in self.all:
                    lm.dl.close()
                return
            for lm in self.open_loaders():
                self.call(f"close() of {lm.label}", lm.dl.close)
            # Batches held past close() are still intact; then free them all.
            for h in self.held:
                check_arrays(h.arrays, h.want, f"held step {h.step} past close")
            for h in list(self.held):
                self.drop(h)
            gc.collect()
            zero = {"slots_held": 0, "ring_bytes": 0, "loaders": 0, "groups": 0,
                    "group_members": 0, "sessions": 0}
            for name, value in zero.items():
                got = self.daemon.wait_stat(name, value)[name]
                assert got == value, f"after everything was closed and freed: {name} = {got}"

    phases = [Phase.explicit, Phase.reuse, Phase.generate, Phase.target]
    if SHRINK:
        phases.append(Phase.shrink)
    DaemonModel.TestCase.settings = settings(
        max_examples=EXAMPLES, stateful_step_count=STEPS, deadline=None, phases=phases,
        derandomize=not RANDOM, suppress_health_check=list(HealthCheck), database=None,
    )
    try:
        run_state_machine_as_test(DaemonModel, settings=DaemonModel.TestCase.settings)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def check_arrays(got: list[np.ndarray], want: list[np.ndarray], what: str) -> None:
    assert len(got) == len(want), what
    for k, (a, b) in enumerate(zip(got, want)):
        assert a.dtype == b.dtype and a.shape == b.shape, f"{what}: array {k} {a.dtype}{a.shape}"
        if a.tobytes() != b.tobytes():
            raise AssertionError(f"{what}: array {k} differs from the embedded batch")


@pytest.mark.daemon
def test_daemon_model(daemon_factory, stores) -> None:
    run_model(daemon_factory, stores)


SETTLED = ("batches_served", "batches_gathered", "releases", "stale_releases", "slots_held")


def settled(daemon: Any, **want: int) -> None:
    """The daemon's counters reach `want` within 5 s and stay there (not passing through)."""
    got: dict[str, int] = {}
    for _ in range(250):
        s = daemon.stats()
        got = {k: s[k] for k in want}
        if got == want:
            threading.Event().wait(0.06)
            s = daemon.stats()
            got = {k: s[k] for k in want}
            if got == want:
                return
        threading.Event().wait(0.02)
    raise AssertionError(f"daemon stats {got} != {want}")


@pytest.mark.daemon
def test_refused_seek_with_a_batch_pushed_ahead_skips_nothing(daemon, stores) -> None:
    # The model's first find (protocol 1.1: a batch requested ahead and
    # answered when the group refused the seek was dropped, so next()
    # returned the following step's batch), in its 1.2 form: the batch the
    # daemon pushed ahead before a refused seek is the one next() returns.
    streams = stores["streams"]
    spec = Spec(4, Sampler.Mode.Cyclic, 1)
    options = DaemonOptions(daemon.socket, group="sweep", group_mode="broadcast")
    with DataLoader(streams, batch_size=4, mode=spec.mode, seed=1, daemon=options) as a:
        # Alone, a is pushed step 0 (waited for: a request arriving while the
        # push still waits for the pipeline is answered first, and then 0 is
        # never pushed); its seek restarts the group at 6 and releases step 0
        # unread (an older generation); 6 is pushed.
        settled(daemon, batches_served=0, batches_gathered=1, releases=0, stale_releases=0,
                slots_held=1)
        a.seek(6)
        settled(daemon, batches_served=0, batches_gathered=2, releases=1, stale_releases=0,
                slots_held=1)
        with DataLoader(streams, batch_size=4, mode=spec.mode, seed=1, daemon=options) as b:
            assert b.step == 6  # join="current": the oldest held step
            check_arrays(flatten(next(a)), expected_batch(stores, spec, 6), "a's step 6")
            # a took 6 and freed it; the window pushes a step 7 (within the
            # skew of b at 6); b's push of 6 is the held batch, not a gather.
            settled(daemon, batches_served=1, batches_gathered=3, releases=2, stale_releases=0,
                    slots_held=2)
            with pytest.raises(IndexError, match="oldest step it still holds is 6"):
                a.load_state_dict(dict(a.state_dict(), step=2))
            assert a.step == 7
            check_arrays(flatten(next(a)), expected_batch(stores, spec, 7),
                         "step 7 after the refused seek")
            assert a.step == 8
            check_arrays(flatten(next(b)), expected_batch(stores, spec, 6), "the other member")
            # Nothing was released unread by the refused seek: 4 releases are
            # the 4 batches taken and freed (+ step 0's), a is pushed 8, b 7.
            settled(daemon, batches_served=3, batches_gathered=4, releases=4, stale_releases=0,
                    slots_held=2)


def expected_batch(data: dict, spec: Spec, step: int) -> list[np.ndarray]:
    """The embedded batch of `step` as flatten() lists it: the sampler's indices over the records."""
    n = len(data["labels"])
    idx = np.array(Sampler(n, spec.batch_size, spec.mode, spec.seed, rank=spec.rank,
                           world_size=spec.world_size).peek(step), copy=True)
    return [data["images"][idx], data["labels"][idx], *[data["tokens"][int(i)] for i in idx]]


@pytest.mark.daemon
def test_close_after_a_deferred_take_gathers_at_most_one_step_more(daemon, stores) -> None:
    # A race the model allows for (deferred_take_races): a solo loader holding a
    # batch defers its next take, which goes out just before `close`. The
    # daemon may push (gather) the following step before it reads `close`,
    # or not; either way that batch is dropped unread, served counts both
    # takes, and no slot stays leased once the batches are freed.
    streams = stores["streams"]
    spec = Spec(4, Sampler.Mode.Cyclic, 1)
    for i in range(20):
        before = daemon.stats()
        dl = DataLoader(streams, batch_size=4, mode=spec.mode, seed=1,
                        daemon=DaemonOptions(daemon.socket, leases=3))
        a, b = next(dl), next(dl)  # b's take is deferred: a is still held
        check_arrays(flatten(a), expected_batch(stores, spec, 0), f"round {i} step 0")
        check_arrays(flatten(b), expected_batch(stores, spec, 1), f"round {i} step 1")
        dl.close()
        del a, b
        after = daemon.settled(loaders=0, sessions=0, slots_held=0)
        assert after["batches_served"] - before["batches_served"] == 2
        assert after["batches_gathered"] - before["batches_gathered"] in (2, 3)


@pytest.mark.daemon
def test_seek_after_a_deferred_take_discards_at_most_one_push(daemon, stores) -> None:
    # The other race the model allows for: the deferred take goes out just
    # before the seek; the daemon may push the next step first, which the
    # seek releases unread. Either way next() returns the sought step.
    streams = stores["streams"]
    spec = Spec(4, Sampler.Mode.Cyclic, 1)
    for i in range(20):
        before = daemon.stats()
        with DataLoader(streams, batch_size=4, mode=spec.mode, seed=1,
                        daemon=DaemonOptions(daemon.socket, leases=3)) as dl:
            a, b = next(dl), next(dl)  # b's take is deferred: a is still held
            dl.seek(10)
            after = daemon.settled(slots_held=3)  # a, b and step 10 pushed
            gathered = after["batches_gathered"] - before["batches_gathered"]
            released = after["releases"] - before["releases"]
            # (4, 0): the seek was answered while that push waited for its
            # gather, which then went unpushed.
            assert (gathered, released) in ((3, 0), (4, 1), (4, 0)), f"round {i}"
            assert after["batches_served"] - before["batches_served"] == 2
            check_arrays(flatten(next(dl)), expected_batch(stores, spec, 10), f"round {i} step 10")
            del a, b
        daemon.settled(loaders=0, sessions=0, slots_held=0)
