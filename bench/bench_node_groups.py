"""Node groups with processes: one node of a 2-node job, 4 ranks, real photos.

The processes of node 0 of a job of ``--nodes`` (2) nodes x ``--per-node`` (4)
ranks, each drawing ``--steps`` batches of ``--batch`` (256) per rank from a
raw and a zstd store of ``uint8[3,224,224]`` photo crops
(``bench/prepare_vision.py``), in the set-ups of the node-group design:

(a) ``embedded``: every rank runs its own embedded ``DataLoader``
    (``rank``, ``world_size`` of the job);
(b) ``solo``: every rank is a solo loaderxd client (one pipeline each);
(c) ``node``: the node's ranks are one loaderxd node group (a shard group
    with ``ranks=range(4)`` of world 8: the node's rows of every global
    batch gathered once, each rank maps its own), writable batches (the
    default: copy-on-write views);
(c') ``node-shared``: the same with ``shared_view=True`` (read-only views of
    the group's ring);
(d) ``torch``: every rank runs a ``torch.utils.data.DataLoader`` with
    ``--torch-workers`` (2) forked workers (bench_groups.py's map-style
    dataset and default collate);
and with tensor-parallel size 2 (Megatron's layout: a replica's 2 ranks
adjacent; data-parallel rank = rank // 2, data-parallel world 4):
(e) ``node-tp``: one node group with ``replicas=2`` over the node's 2
    data-parallel ranks (each batch gathered once per replica pair);
(e') ``node-tp-shared``: the same with ``shared_view=True``;
(f) ``solo-tp``: 4 solo clients (each TP rank loads its replica's batch).
The reference of the (c) CPU goal:
(g) ``embedded-node``: one embedded loader gathering the node's 4 slices
    (batch ``4 * --batch``, rank 0 of world 2).

Each rank's first batch is checked against the embedded loader of its
(data-parallel) rank before timing. Reported per set-up: per-rank batches/s
of the node (``node_rate``; also the mean of the ranks' own and the
slowest), node CPU seconds per global step (every process of the node:
trainers, their workers, loaderxd), and the peak total PSS of all of them
(bench_groups.py's sampler). The goals' set-ups (a), (c), (c'), (g), (e),
(e') and (f) run ``--rounds`` (3) times, in turn, and report the median of
each figure. Goals: (c) total PSS <= 1.3x (g)'s and node
CPU per step <= 1.15x (g)'s (the one embedded loader a node would run for its
4 slices), per-rank batches/s >= (a)'s; (e) node CPU per step <= 0.55x (f)'s.

``--quick`` is a smoke run (never writes docs). A real run writes the table
into docs/benchmarks.md (section "node-groups") and the plot to
docs/bench_node_groups.png. Run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_groups import (
    build_store,
    digest,
    idle_pss,
    run_inputs,
    run_trainers,
    timed_draws,
    torch_draw,
)
from benchlib import DOCS, Daemon, machine_line, markdown_table, update_doc_section
from goals import Part, write_section

SEED = 7
SETUPS = ("embedded", "solo", "node", "node-shared", "torch", "node-tp", "node-tp-shared", "solo-tp", "embedded-node")
GROUPS = ("node", "node-shared", "node-tp", "node-tp-shared")
# The set-ups the goals compare, run --rounds times (their figures are medians).
ROUNDED = ("embedded", "node", "node-shared", "embedded-node", "node-tp", "node-tp-shared", "solo-tp")
LABEL = {"embedded": "(a) embedded", "solo": "(b) solo clients", "node": "(c) node group", "node-shared": "(c') node group, shared_view=True",
         "torch": "(d) torch DataLoader", "node-tp": "(e) node group, TP 2",
         "node-tp-shared": "(e') node group, TP 2, shared_view=True", "solo-tp": "(f) solo clients, TP 2",
         "embedded-node": "(g) one embedded loader, node's 4 slices"}
CODECS = ("raw", "zstd")


def placement(setup: str, local: int, args: argparse.Namespace) -> tuple[int, int, int]:
    """(data-parallel rank, data-parallel world, batch) of node 0's local rank ``local``."""
    if setup == "embedded-node":
        return 0, args.nodes, args.batch * args.per_node
    tp = 2 if "-tp" in setup else 1
    return local // tp, args.nodes * args.per_node // tp, args.batch


def trainers_of(setup: str, args: argparse.Namespace) -> int:
    return 1 if setup == "embedded-node" else args.per_node


def trainer(args: argparse.Namespace) -> int:
    from loaderx.client import DaemonOptions
    from loaderx.dataloader import DataLoader
    from loaderx.zrecord import Dense

    rank, world, batch = placement(args.setup, args.local, args)
    expected = json.loads(Path(args.expected).read_text())
    close: Any = lambda: None
    if args.setup == "torch":
        draw, want = torch_draw(args.store, batch, args.torch_workers), None
    else:
        store = Dense.open(args.store)
        per_node = args.per_node // (2 if "-tp" in args.setup else 1)
        daemon = None
        if args.setup in ("solo", "solo-tp"):
            daemon = DaemonOptions(args.socket)
        elif args.setup in GROUPS:
            daemon = DaemonOptions(args.socket, group=f"bench-{args.setup}", group_mode="shard",
                                   ranks=range(per_node), replicas=2 if "-tp" in args.setup else 1,
                                   shared_view=args.setup.endswith("-shared"))
        loader = DataLoader({"image": store}, batch_size=batch, seed=SEED, rank=rank, world_size=world,
                            daemon=daemon)

        def draw() -> np.ndarray:
            return next(loader)["image"]

        def close() -> None:
            loader.close()
            store.close()
        want = expected[str(rank)]
    first = draw()
    if want is not None and digest(first) != want:
        print(json.dumps({"error": f"rank {rank}'s first batch differs from the embedded loader's"}), flush=True)
        return 1
    del first
    return timed_draws(draw, args.steps, close)


def expected_first(store: Path, setup: str, args: argparse.Namespace) -> dict[str, str]:
    """The embedded loader's first batch digest of every data-parallel rank of the set-up."""
    from loaderx.dataloader import DataLoader
    from loaderx.zrecord import Dense

    out: dict[str, str] = {}
    if setup == "torch":
        return out
    with Dense.open(str(store)) as s:
        for local in range(trainers_of(setup, args)):
            rank, world, batch = placement(setup, local, args)
            if str(rank) not in out:
                with DataLoader({"image": s}, batch_size=batch, seed=SEED, rank=rank, world_size=world) as dl:
                    out[str(rank)] = digest(next(dl)["image"])
    return out


def run_setup(args: argparse.Namespace, setup: str, store: Path, daemon: Daemon | None) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(expected_first(store, setup, args), f)
    base = [sys.executable, __file__, "--trainer", "--setup", setup, "--store", str(store), "--expected", f.name,
            "--batch", str(args.batch), "--steps", str(args.steps), "--torch-workers", str(args.torch_workers),
            "--nodes", str(args.nodes), "--per-node", str(args.per_node)]
    if daemon is not None:
        base += ["--socket", daemon.sock]
    try:
        cmds = [[*base, "--local", str(i)] for i in range(trainers_of(setup, args))]
        results, sampler, daemon_cpu = run_trainers(setup, cmds, daemon)
    finally:
        os.unlink(f.name)
    rates = [r["batches_per_s"] for r in results]
    cpu = sum(r["cpu_s"] for r in results) + daemon_cpu
    return {"rate_node": node_rate(results, args.steps), "rate_mean": float(np.mean(rates)),
            "rate_min": float(min(rates)), "pss_mib": sampler.peak / 2**20,
            "max_trainer_pss_mib": sampler.max_root / 2**20, "cpu_per_step_ms": cpu / args.steps * 1e3,
            "daemon_cpu_s": daemon_cpu, "sampler_cpu_s": sampler.cpu_s}


def node_rate(reports: list[dict[str, Any]], steps: int) -> float:
    """Per-rank batches/s of the node: ``steps`` over the span from the first rank's start to the last
    rank's end. Ranks of a training job move in step (each step ends in a collective), so the node's
    rate is what a rank gets; the mean of the ranks' own rates credits independent ranks (a) with the
    cores their finished peers left them."""
    return steps / (max(r["end"] for r in reports) - min(r["start"] for r in reports))


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Every figure of several runs of one set-up: its median over the runs."""
    return {k: float(np.median([r[k] for r in runs])) for k in runs[0]}


def _x(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b > 0 else "-"


def goals(results: dict[tuple[str, str], dict[str, Any]], codecs: list[str], ranks: int) -> list[str]:
    lines = []
    for c in codecs:
        a, cg, g = results[(c, "embedded")], results[(c, "node")], results[(c, "embedded-node")]
        e, f = results[(c, "node-tp")], results[(c, "solo-tp")]
        cs, es = results[(c, "node-shared")], results[(c, "node-tp-shared")]
        one = a["max_trainer_pss_mib"]
        lines.append(
            f"{c}: (c) total PSS {cg['pss_mib']:.0f} MiB = {_x(cg['pss_mib'], g['pss_mib'])} (g)'s "
            f"{g['pss_mib']:.0f} MiB (goal <= 1.3x; {_x(cg['pss_mib'], one)} the largest rank of (a), "
            f"{one:.0f} MiB, which loads one of the {ranks} slices); node CPU per step "
            f"{cg['cpu_per_step_ms']:.1f} ms = {_x(cg['cpu_per_step_ms'], g['cpu_per_step_ms'])} (g)'s "
            f"{g['cpu_per_step_ms']:.1f} ms (goal <= 1.15x); per-rank {cg['rate_node']:.1f} batches/s = "
            f"{_x(cg['rate_node'], a['rate_node'])} (a)'s (goal >= 1x). (c') with read-only views: total PSS "
            f"{cs['pss_mib']:.0f} MiB = {_x(cs['pss_mib'], g['pss_mib'])} (g)'s, node CPU per step {cs['cpu_per_step_ms']:.1f} ms = "
            f"{_x(cs['cpu_per_step_ms'], g['cpu_per_step_ms'])} (g)'s, per-rank {cs['rate_node']:.1f} batches/s = "
            f"{_x(cs['rate_node'], a['rate_node'])} (a)'s. (e) node CPU per step "
            f"{e['cpu_per_step_ms']:.1f} ms = {_x(e['cpu_per_step_ms'], f['cpu_per_step_ms'])} (f)'s "
            f"{f['cpu_per_step_ms']:.1f} ms (goal <= 0.55x); (e') with read-only views "
            f"{es['cpu_per_step_ms']:.1f} ms = {_x(es['cpu_per_step_ms'], f['cpu_per_step_ms'])} (f)'s.")
    return lines


def node_goals(results: dict[tuple[str, str], dict[str, Any]], codecs: list[str]) -> dict[str, list[Part]]:
    """The node groups' goal figures (bench/goals.py), from the numbers of the table: (c) and (c')
    against (g)'s PSS and CPU and (a)'s batches/s; (e) against (f)."""

    def ratio(c: str, top: str, bottom: str, key: str, bottom_key: str | None = None) -> float | None:
        t, b = results.get((c, top)), results.get((c, bottom))
        return t[key] / b[bottom_key or key] if c in codecs and t and b else None

    both = [(c, s, lab) for c in CODECS for s, lab in (("node", "(c)"), ("node-shared", "(c') shared_view"))]
    return {
        "node-group-pss": [Part(f"{c} {lab}", ratio(c, s, "embedded-node", "pss_mib")) for c, s, lab in both],
        "node-group-cpu": [Part(f"{c} {lab}", ratio(c, s, "embedded-node", "cpu_per_step_ms")) for c, s, lab in both],
        "node-group-rate": [Part(f"{c} {lab}", ratio(c, s, "embedded", "rate_node")) for c, s, lab in both],
        "node-group-tp": [Part(f"{c} {lab}", ratio(c, s, "solo-tp", "cpu_per_step_ms")) for c in CODECS
                          for s, lab in (("node-tp", "(e)"), ("node-tp-shared", "(e') shared_view"))],
    }


def node_notes(results: dict[tuple[str, str], dict[str, Any]], codecs: list[str]) -> dict[str, str]:
    """What the PSS goal's cell adds: (c) against the largest single rank of (a), which holds one
    rank's slice where the group holds the node's four (docs/benchmarks.md, "Node groups")."""
    parts = [f"{c} {results[(c, 'node')]['pss_mib'] / results[(c, 'embedded')]['max_trainer_pss_mib']:.2f}x"
             for c in codecs if results.get((c, "node")) and results.get((c, "embedded"))]
    return {"node-group-pss": "against one rank of (a), which loads a quarter of the node's data: "
            + ", ".join(parts)} if parts else {}


def plot(path: Path, results: dict[tuple[str, str], dict[str, Any]], codecs: list[str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8), dpi=110)
    shown = [s for s in SETUPS if s != "embedded-node"]
    x = np.arange(len(codecs))
    width = 0.8 / len(shown)
    for k, setup in enumerate(shown):
        for ax, key in zip(axes, ("rate_node", "cpu_per_step_ms", "pss_mib")):
            ax.bar(x + (k - (len(shown) - 1) / 2) * width, [results[(c, setup)][key] for c in codecs], width,
                   label=LABEL[setup])
    for ax, title in zip(axes, ("batches/s per rank", "node CPU ms per global step", "total PSS of the node, MiB")):
        ax.set_xticks(x, codecs)
        ax.set_title(title, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trainer", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--setup", choices=SETUPS, help=argparse.SUPPRESS)
    ap.add_argument("--local", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--store", help=argparse.SUPPRESS)
    ap.add_argument("--expected", help=argparse.SUPPRESS)
    ap.add_argument("--socket", help=argparse.SUPPRESS)
    ap.add_argument("--loaderxd", help="the loaderxd binary (default: $LOADERXD or build/daemon/loaderxd)")
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--per-node", type=int, default=4)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--torch-workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3,
                    help="runs of the goals' set-ups (a), (c), (c'), (g), (e), (e'), (f); each figure their median "
                         "(default 3)")
    ap.add_argument("--codecs", default=",".join(CODECS))
    ap.add_argument("--quick", action="store_true", help="smoke run: batch 16, 5 steps, 512 records; no docs")
    ap.add_argument("--no-doc", action="store_true")
    args = ap.parse_args()
    if args.trainer:
        return trainer(args)
    exe, codecs, src, what, root = run_inputs(args, "lxnode-stores-")
    if args.quick:
        args.rounds = 1
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    try:
        for codec in codecs:
            store = build_store(root, src, codec)
            # The goals' set-ups again, in turn, after the first round of all.
            order = [*SETUPS, *[s for _ in range(args.rounds - 1) for s in ROUNDED]]
            for setup in order:
                daemon = Daemon(exe) if setup in ("solo", "solo-tp", *GROUPS) else None
                try:
                    run = run_setup(args, setup, store, daemon)
                finally:
                    if daemon:
                        daemon.close()
                runs.setdefault((codec, setup), []).append(run)
                print(codec, setup, json.dumps({k: round(v, 3) for k, v in run.items()}), flush=True)
    finally:
        if args.quick:
            shutil.rmtree(root, ignore_errors=True)
    results = {key: median_run(r) for key, r in runs.items()}
    bare = idle_pss("embedded") / 2**20
    rows = [[c, LABEL[s], f"{r['rate_node']:.1f}", f"{r['rate_mean']:.1f}", f"{r['rate_min']:.1f}",
             f"{r['cpu_per_step_ms']:.1f}", f"{r['pss_mib']:.0f}", f"{r['daemon_cpu_s']:.1f}"]
            for c in codecs for s in SETUPS for r in [results[(c, s)]]]
    table = markdown_table(["codec", "set-up", "batches/s per rank (node)", "mean of the ranks' own", "slowest rank",
                            "node CPU ms per step", "total PSS MiB", "of which loaderxd CPU s"], rows,
                           align="llrrrrrr")
    machine = machine_line()
    rounded = ", ".join(LABEL[s].split(" ", 1)[0] for s in ROUNDED)
    body = (
        "### Node groups with processes (bench/bench_node_groups.py)\n\n"
        f"{machine}\n\n"
        f"Node 0 of a {args.nodes}-node job with {args.per_node} ranks per node (one node at a time on this box), "
        f"batch {args.batch} per rank, {args.steps} IID steps of uint8[3,224,224] images ({what}, {len(src)} "
        "records), every page of every batch touched; each rank's first batch checked against the embedded "
        "loader of its rank. Per-rank batches/s of the node: the steps over the span from the first rank's "
        "start to the last rank's end (a job's ranks move in step; the mean of the ranks' own rates, beside it, "
        "credits independent ranks with the cores their finished peers left them). Node CPU: every process of "
        "the node (ranks, their workers, loaderxd) per global step; PSS: peak of their total, sampled by the "
        "parent every 0.1 s while their RSS grows (a bare rank process, interpreter and imports only, is "
        f"{bare:.0f} MiB). "
        + (f"{rounded}: the median of {args.rounds} runs each, run in turn after one run of every set-up; the "
           "others one run. " if args.rounds > 1 else "One run each. ")
        + f"Load average {os.getloadavg()[0]:.1f} at the end.\n\n{table}\n\n"
        + "\n".join(goals(results, codecs, args.per_node)) + "\n\n![node groups](bench_node_groups.png)\n")
    print(body)
    if not args.no_doc:
        plot(DOCS / "bench_node_groups.png", results, codecs)
        update_doc_section("node-groups", body, DOCS / "benchmarks.md")
        write_section("node-groups", machine, node_goals(results, codecs), notes=node_notes(results, codecs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
