"""The layout of a distributed job, read from its launcher, and node groups on loaderxd.

A multi-node job runs one ``loaderxd`` per node, each over its own copy of
the stores. The training processes of a node share one loader: a *node
group*, the shard group of the node's data-parallel ranks (docs/guide.md,
"Multi-node and model-parallel jobs"). Which ranks those are comes from the
launcher, never from a coordinator of ours:

* **torchrun**: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
  ``LOCAL_WORLD_SIZE``, ``GROUP_RANK`` (the node), ``TORCHELASTIC_RUN_ID``
  (the job, kept across elastic restarts);
* **Slurm** (``srun``): ``SLURM_PROCID``, ``SLURM_NTASKS``,
  ``SLURM_LOCALID``, ``SLURM_NTASKS_PER_NODE``, ``SLURM_NODEID``,
  ``SLURM_JOB_ID``;
* **torch.distributed**, once initialised, for the rank and world when
  neither set of variables is there (one node is then assumed).

With ``model_parallel_size = k`` (tensor parallelism), global ranks
``k * d .. k * d + k - 1`` form data-parallel replica ``d`` (Megatron's
layout: model-parallel ranks adjacent, inside one node), so a process's
loader has ``rank = global_rank // k`` and ``world_size = global_world // k``,
and the ``k`` processes of a replica are the ``replicas`` of that rank in
the node group: they receive byte-identical batches from the same step.

>>> lay = layout(model_parallel_size=2)        # doctest: +SKIP
>>> loader = node_loader({"tokens": ds}, batch_size=8, layout=lay)  # doctest: +SKIP
"""

from __future__ import annotations

import os
import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .errors import InvalidArgumentError
from .sources import DaemonOptions

__all__ = ["Layout", "check_loader_layout", "layout", "node_daemon_options", "node_loader"]


@dataclass(frozen=True)
class Layout:
    """Where this process sits in its job.

    ``rank``/``world_size``: the global process rank and count;
    ``local_rank``/``local_world_size``: within its node; ``node_rank`` and
    ``num_nodes``; ``job_id`` (stable across restarts of one job, "" if the
    launcher has none); ``launcher`` ("torchrun", "slurm",
    "torch.distributed" or "none"); ``model_parallel_size``.
    """

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    num_nodes: int
    job_id: str
    launcher: str
    model_parallel_size: int = 1

    @property
    def dp_rank(self) -> int:
        """The loader's ``rank``: this process's data-parallel replica."""
        return self.rank // self.model_parallel_size

    @property
    def dp_world_size(self) -> int:
        """The loader's ``world_size``: the number of data-parallel replicas."""
        return self.world_size // self.model_parallel_size

    @property
    def replica(self) -> int:
        """This process's model-parallel rank within its replica."""
        return self.rank % self.model_parallel_size

    @property
    def node_dp_ranks(self) -> range:
        """The data-parallel ranks whose processes run on this node."""
        per_node = self.local_world_size // self.model_parallel_size
        return range(self.node_rank * per_node, (self.node_rank + 1) * per_node)

    def check(self) -> None:
        """``InvalidArgumentError`` naming what does not fit the node-group layout."""
        k = self.model_parallel_size
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise InvalidArgumentError(f"model_parallel_size must be an int >= 1, got {k!r}")
        if not 0 <= self.rank < self.world_size or not 0 <= self.local_rank < self.local_world_size:
            raise InvalidArgumentError(f"{self.launcher}: rank {self.rank} of {self.world_size}, local rank "
                                       f"{self.local_rank} of {self.local_world_size} is not a layout")
        if self.local_world_size % k:
            raise InvalidArgumentError(
                f"model_parallel_size {k} does not divide the {self.local_world_size} processes of a node "
                f"({self.launcher}): a replica's model-parallel ranks must share a node")
        if self.world_size != self.num_nodes * self.local_world_size:
            raise InvalidArgumentError(
                f"{self.launcher}: world_size {self.world_size} is not {self.num_nodes} nodes x "
                f"{self.local_world_size} processes: node groups need the same number of processes per node")
        if self.rank != self.node_rank * self.local_world_size + self.local_rank:
            raise InvalidArgumentError(
                f"{self.launcher}: global rank {self.rank} is not node {self.node_rank} x "
                f"{self.local_world_size} + local rank {self.local_rank}: node groups need consecutive "
                "ranks per node (torchrun's and srun's block layout)")


def _int(env: Mapping[str, str], name: str) -> int:
    raw = env[name]
    try:
        return int(raw)
    except ValueError:
        raise InvalidArgumentError(f"${name}={raw!r} is not an integer") from None


def _tasks_per_node(raw: str) -> int:
    # "4", "4(x2)" or "4(x2),2": node groups need the same count everywhere.
    counts = {int(m.group(1)) for m in re.finditer(r"(\d+)(?:\(x\d+\))?", raw)}
    if len(counts) != 1:
        raise InvalidArgumentError(f"$SLURM_NTASKS_PER_NODE={raw!r}: nodes run different numbers of tasks")
    return counts.pop()


def layout(model_parallel_size: int = 1, environ: Mapping[str, str] | None = None) -> Layout:
    """This process's :class:`Layout` from torchrun's, Slurm's or torch.distributed's view.

    Checked (:meth:`Layout.check`): ``InvalidArgumentError`` naming the
    launcher and what does not fit. Without a launcher: one process.
    """
    env = os.environ if environ is None else environ
    k = model_parallel_size
    if "RANK" in env and "LOCAL_RANK" in env and "WORLD_SIZE" in env:
        world = _int(env, "WORLD_SIZE")
        local_world = _int(env, "LOCAL_WORLD_SIZE") if "LOCAL_WORLD_SIZE" in env else world
        lay = Layout(_int(env, "RANK"), world, _int(env, "LOCAL_RANK"), local_world,
                     _int(env, "GROUP_RANK") if "GROUP_RANK" in env else 0,
                     max(1, world // max(1, local_world)), env.get("TORCHELASTIC_RUN_ID", ""), "torchrun", k)
    elif "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        world = _int(env, "SLURM_NTASKS")
        local_world = _tasks_per_node(env["SLURM_NTASKS_PER_NODE"]) if "SLURM_NTASKS_PER_NODE" in env else world
        lay = Layout(_int(env, "SLURM_PROCID"), world, _int(env, "SLURM_LOCALID") if "SLURM_LOCALID" in env else 0,
                     local_world, _int(env, "SLURM_NODEID") if "SLURM_NODEID" in env else 0,
                     max(1, world // max(1, local_world)), env.get("SLURM_JOB_ID", ""), "slurm", k)
    else:
        rank, world = 0, 1
        launcher = "none"
        try:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                rank, world, launcher = dist.get_rank(), dist.get_world_size(), "torch.distributed"
        except ImportError:
            pass
        lay = Layout(rank, world, rank, world, 0, 1, "", launcher, k)
    lay.check()
    return lay


def node_daemon_options(lay: Layout | None = None, *, path: str | None = None, group: str | None = None,
                        **options: Any) -> DaemonOptions:
    """The :class:`~loaderx.sources.DaemonOptions` of this process's node group.

    The group is the shard group of ``lay.node_dp_ranks`` with
    ``lay.model_parallel_size`` replicas per rank, named after the job and
    the node (``group`` overrides the name; it must be the same on every
    process of the node). ``path``: the node's loaderxd socket (default
    :func:`~loaderx.sources.default_socket_path`). Other keywords go to
    ``DaemonOptions``.
    """
    lay = layout() if lay is None else lay
    if group is None:
        job = lay.job_id or "job"
        group = f"{job}-node{lay.node_rank}-of{lay.num_nodes}-mp{lay.model_parallel_size}"
    return DaemonOptions(path, group=group, group_mode="shard", ranks=lay.node_dp_ranks,
                         replicas=lay.model_parallel_size, **options)


def node_loader(streams: Mapping[str, Any], batch_size: int, *, layout: Layout | None = None,
                path: str | None = None, group: str | None = None, fallback: bool = True,
                daemon_options: Mapping[str, Any] | None = None, **kwargs: Any) -> Any:
    """A DataLoader of this process's data-parallel slice, through its node group.

    ``batch_size`` is per data-parallel rank; ``rank``/``world_size`` come
    from the layout (do not pass them). ``fallback``: with no loaderxd
    answering, load in this process with a warning (the same batches).
    Other keywords go to :class:`~loaderx.dataloader.DataLoader`.
    """
    from .dataloader import DataLoader

    lay = _layout_of(layout)
    for name in ("rank", "world_size", "daemon"):
        if name in kwargs:
            raise InvalidArgumentError(f"node_loader takes {name} from the layout; do not pass it")
    opts = node_daemon_options(lay, path=path, group=group, fallback=fallback, **dict(daemon_options or {}))
    return DataLoader(streams, batch_size=batch_size, rank=lay.dp_rank, world_size=lay.dp_world_size,
                      daemon=opts, **kwargs)


def _layout_of(lay: Layout | None) -> Layout:
    return layout() if lay is None else lay


def check_loader_layout(rank: int, world_size: int, environ: Mapping[str, str] | None = None) -> None:
    """Warns when a loader's ``rank``/``world_size`` disagree with the launcher's environment.

    Consistent means: ``world_size`` divides the launcher's world (the
    quotient is the model-parallel size) and ``rank`` is the launcher's rank
    divided by it. Silent with no launcher, or a launcher world of 1.
    """
    env = os.environ if environ is None else environ
    for rank_var, world_var, name in (("RANK", "WORLD_SIZE", "torchrun"), ("SLURM_PROCID", "SLURM_NTASKS", "slurm")):
        if rank_var in env and world_var in env:
            try:
                g_rank, g_world = int(env[rank_var]), int(env[world_var])
            except ValueError:
                return
            break
    else:
        return
    if g_world <= 1 or world_size == 1:
        return
    if g_world % world_size == 0 and rank == g_rank // (g_world // world_size):
        return
    want = "" if g_world % world_size else f"; it implies rank {g_rank // (g_world // world_size)} of {world_size}"
    warnings.warn(
        f"DataLoader(rank={rank}, world_size={world_size}) disagrees with the launcher ({name}: "
        f"${rank_var}={g_rank}, ${world_var}={g_world}){want}: ranks may draw overlapping or "
        "missing samples (loaderx.distributed.layout() reads the right values)",
        stacklevel=3,
    )
