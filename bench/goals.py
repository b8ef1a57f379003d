"""The goals of docs/benchmarks.md: one registry, one result file per benchmark, one table.

Each goal is declared once here (``GOALS``, in the order of the page's Goals
table) with the benchmark section that measures it, its threshold and how its
figure is printed. A benchmark script computes, from the same numbers its
tables print, one list of ``Part`` per goal it owns (one part per workload,
codec, size ... the goal covers) and calls ``write_section``, which judges every
part against the goal's threshold and writes ``bench/results/goals-<section>.json``.
``bench/run_all.py`` then rewrites the ``goals`` block of docs/benchmarks.md
with ``render_block``: one row per goal of the registry, each naming the run of
the file it comes from; a goal whose section file is missing reads "not
measured in this run", never a figure.

A part is judged at the precision it is printed with, so a row never says "not
met" beside a figure that reads exactly the threshold.

Result file (``SCHEMA`` 1)::

    {"schema": 1, "section": "daemon", "script": "bench/bench_daemon.py",
     "run": "2026-12-05 16:14 UTC", "machine": "<the tables' machine line>",
     "goals": [{"id": ..., "goal": <text>, "status": "met" | "not met" | "not measured",
                "measured": <the table cell>, "note": <text or "">,
                "parts": [{"label": ..., "value": <float or null>, "limit": <float>,
                           "shown": <text>, "met": <bool or null>}, ...]}, ...]}
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
# Where the goal files live; bench/run_all.py --results passes its choice to the scripts through this.
RESULTS = Path(os.environ.get("LOADERX_BENCH_RESULTS", BENCH_DIR / "results"))
SCHEMA = 1
DOC_KEY = "goals"
NOT_MEASURED = "not measured in this run"

# Section (the bench/run_all.py name) -> the script that measures its goals.
SECTIONS: dict[str, str] = {
    "store": "bench_store.py",
    "loader": "bench_loader.py",
    "daemon": "bench_daemon.py",
    "groups": "bench_groups.py",
    "node-groups": "bench_node_groups.py",
}


@dataclass(frozen=True)
class Goal:
    """One row of the Goals table. A part meets it when its printed value ``op`` ``limit``.

    ``scale``/``decimals``/``unit``: a value ``v`` prints as ``f"{v * scale:.{decimals}f}{unit}"``
    (``sign``: with a leading + or -).
    """

    id: str
    section: str
    text: str
    op: str  # ">=" or "<="
    limit: float
    decimals: int = 2
    unit: str = "x"
    scale: float = 1.0
    sign: bool = False

    def shown(self, value: float) -> str:
        return f"{value * self.scale:{'+' if self.sign else ''}.{self.decimals}f}{self.unit}"

    def meets(self, value: float, limit: float | None = None) -> bool:
        printed = round(value * self.scale, self.decimals)
        bound = (self.limit if limit is None else limit) * self.scale
        return printed >= bound if self.op == ">=" else printed <= bound


GOALS: tuple[Goal, ...] = (
    Goal("store-gather-wheel", "store",
         "store gather >= 1.25x the 2.5.4 wheel, every workload and codec", ">=", 1.25),
    Goal("store-small-zstd-wheel", "store",
         "small compressed records (tokens-dense, tokens-ragged, fmnist) gather >= 1.25x the wheel's zstd",
         ">=", 1.25),
    Goal("store-disk-wheel", "store",
         "compression ratio >= the wheel's (its store's bytes over ours), every workload and codec", ">=", 1.0),
    Goal("store-labels-disk", "store",
         "small records cost little on disk: the raw label store (70,000 one-byte records) <= 1.25x its "
         "logical bytes", "<=", 1.25),
    Goal("store-token-disk-parquet", "store",
         "token stores in their compact setting (`zstd_dict`, docs/guide.md) on disk <= 1.2x Parquet-zstd",
         "<=", 1.2),
    Goal("store-raw-write-ceiling", "store",
         "durable raw writes >= 0.9x the raw ceiling (best write + fdatasync of the same bytes)", ">=", 0.9,
         unit=""),
    Goal("store-zstd-write-ceiling", "store", "durable zstd writes >= 0.95x the compressor alone", ">=", 0.95,
         unit=""),
    Goal("store-raw-write-wheel", "store", "durable raw writes >= 1.25x the wheel's write + `sync`", ">=", 1.25),
    Goal("store-gather-memcpy", "store",
         "raw dense gather >= 80 % of memcpy, 1 thread and 2 (records of 784 bytes and more)", ">=", 0.80,
         decimals=0, unit=" %", scale=100.0),
    Goal("loader-wheel", "loader", "end-to-end loader >= 1.25x the wheel's batches/s, raw and zstd", ">=", 1.25),
    Goal("loader-torch", "loader", "loaderx raw >= 2x torch fork with 4 workers (batches/s)", ">=", 2.0),
    Goal("loader-pss-torch", "loader", "loader peak PSS <= 0.5x torch fork with 4 workers, raw and zstd",
         "<=", 0.5),
    Goal("daemon-cpp-ready", "daemon",
         "loaderxd, C++ client: a ready batch within the machine's floor + 10 µs p50, every size", "<=", 10.0,
         decimals=1, unit=" µs"),
    Goal("daemon-cpp-warm", "daemon", "loaderxd, C++ client: warm within 20 µs p50, every size", "<=", 20.0,
         decimals=1, unit=" µs"),
    Goal("daemon-py-next", "daemon",
         "loaderxd, Python `next()` of a ready batch at most 20 µs p50 above the embedded one, every size",
         "<=", 20.0, decimals=0, unit=" µs", sign=True),
    Goal("daemon-throughput", "daemon",
         "loaderxd, one client >= 1.0x the embedded loader's batches/s on 37 MiB batches (median round)",
         ">=", 1.0),
    Goal("daemon-cpu-share", "daemon",
         "loaderxd, the training process's CPU per batch <= 2 % of the embedded loader's (median round)",
         "<=", 0.02, decimals=1, unit=" %", scale=100.0),
    Goal("groups-broadcast-pss", "groups",
         "4 trainers in one loaderxd broadcast group: total PSS <= 1.3x one embedded trainer's", "<=", 1.3),
    Goal("node-group-pss", "node-groups",
         "node group (c): total PSS <= 1.3x one embedded loader of the node's 4 slices (g)", "<=", 1.3),
    Goal("node-group-cpu", "node-groups",
         "node group (c): node CPU per step <= 1.15x one embedded loader of the node's 4 slices (g)", "<=", 1.15),
    Goal("node-group-rate", "node-groups", "node group (c): per-rank batches/s >= embedded ranks' (a)", ">=", 1.0),
    Goal("node-group-tp", "node-groups",
         "tensor-parallel node group (e): node CPU per step <= 0.55x solo clients (f)", "<=", 0.55),
)
BY_ID: dict[str, Goal] = {g.id: g for g in GOALS}


@dataclass(frozen=True)
class Part:
    """One measured figure of a goal: ``value`` None when it could not be measured in this run.

    ``limit``: a bound of this part only (e.g. the floor + 10 µs measured in the same run)."""

    label: str
    value: float | None
    limit: float | None = None


def section_goals(section: str) -> list[Goal]:
    if section not in SECTIONS:
        raise ValueError(f"unknown goal section {section!r}; known: {', '.join(SECTIONS)}")
    return [g for g in GOALS if g.section == section]


def result_path(section: str, results: Path = RESULTS) -> Path:
    return results / f"goals-{section}.json"


def run_of(machine: str) -> str:
    """'2026-12-05 16:14 UTC' of a benchlib.machine_line() (its first field)."""
    m = re.match(r"\s*(\d{4}-\d\d-\d\d \d\d:\d\d UTC)", machine)
    if not m:
        raise ValueError(f"no 'YYYY-MM-DD HH:MM UTC' run time at the start of {machine!r}")
    return m.group(1)


def _judge(goal: Goal, parts: Sequence[Part], note: str) -> dict:
    rows = []
    for p in parts:
        limit = goal.limit if p.limit is None else p.limit
        if p.value is None:
            rows.append({"label": p.label, "value": None, "limit": limit, "shown": "-", "met": None})
        else:
            rows.append({"label": p.label, "value": float(p.value), "limit": limit, "shown": goal.shown(p.value),
                         "met": goal.meets(p.value, limit)})
    missing = [r for r in rows if r["met"] is None]
    if not rows or missing:
        status = "not measured"
    else:
        status = "met" if all(r["met"] for r in rows) else "not met"
    return {"id": goal.id, "goal": goal.text, "status": status, "measured": _measured(rows, status),
            "note": note, "parts": rows}


def _fig(r: dict) -> str:
    return f"{r['label']} {r['shown']}"


def _span(rows: list[dict]) -> str:
    lo = min(rows, key=lambda r: r["value"])
    hi = max(rows, key=lambda r: r["value"])
    return f"{lo['shown']} ({lo['label']}) to {hi['shown']} ({hi['label']})"


def _measured(rows: list[dict], status: str) -> str:
    """The table cell of a judged goal: every figure when there are at most 4 (those that miss
    the goal marked when others meet it), else the span and the parts that miss the goal
    (each when at most 4, else their span)."""
    if status == "not measured":
        missing = [r["label"] for r in rows if r["met"] is None]
        return "not measured: " + (", ".join(missing) if missing else "no figure")
    if len(rows) <= 4:
        if all(r["met"] for r in rows) or not any(r["met"] for r in rows):
            return ", ".join(_fig(r) for r in rows)
        return ", ".join(_fig(r) + ("" if r["met"] else " (not met)") for r in rows)
    if status == "met":
        return f"all {len(rows)}: {_span(rows)}"
    bad = [r for r in rows if not r["met"]]
    met = len(rows) - len(bad)
    head = f"{met} of {len(rows)} met"
    tail = ", ".join(_fig(r) for r in bad) if len(bad) <= 4 else _span(bad)
    return f"{head}; not met: {tail}"


def section_result(section: str, machine: str, parts: dict[str, Sequence[Part]],
                   notes: dict[str, str] | None = None) -> dict:
    """The result document of ``section``: ``parts`` must name exactly the section's goals."""
    want = [g.id for g in section_goals(section)]
    if set(parts) != set(want):
        extra, lacking = sorted(set(parts) - set(want)), sorted(set(want) - set(parts))
        raise ValueError(f"section {section!r} writes goals {want}; got extra {extra}, missing {lacking}")
    notes = notes or {}
    return {"schema": SCHEMA, "section": section, "script": f"bench/{SECTIONS[section]}", "run": run_of(machine),
            "machine": machine, "goals": [_judge(BY_ID[i], parts[i], notes.get(i, "")) for i in want]}


def write_section(section: str, machine: str, parts: dict[str, Sequence[Part]],
                  notes: dict[str, str] | None = None, results: Path = RESULTS) -> Path:
    """Judges and writes ``goals-<section>.json`` (atomically); returns its path."""
    return write_result(section_result(section, machine, parts, notes), results)


def write_result(doc: dict, results: Path = RESULTS) -> Path:
    """Writes a ``section_result`` document as ``goals-<section>.json`` (atomically)."""
    results.mkdir(parents=True, exist_ok=True)
    path = result_path(doc["section"], results)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
    tmp.replace(path)
    return path


def bullets(doc: dict) -> list[str]:
    """A section's goals as Markdown list items, for the text under its own tables."""
    return [f"* {r['goal']}: **{r['status']}** ({r['measured']}" + (f"; {r['note']}" if r["note"] else "") + ")"
            for r in doc["goals"]]


def clear_section(section: str, results: Path = RESULTS) -> None:
    """Removes the section's result file, so a run that fails shows its goals as not measured."""
    section_goals(section)
    result_path(section, results).unlink(missing_ok=True)


def load_results(results: Path = RESULTS) -> dict[str, dict]:
    """section -> its result document, for every section whose file is present."""
    out = {}
    for section, script in SECTIONS.items():
        path = result_path(section, results)
        if not path.exists():
            continue
        doc = json.loads(path.read_text())
        if doc.get("schema") != SCHEMA or doc.get("section") != section:
            raise ValueError(f"{path}: not a schema-{SCHEMA} goals file of section {section!r}")
        ids = [g["id"] for g in doc["goals"]]
        want = [g.id for g in section_goals(section)]
        if ids != want:
            raise ValueError(f"{path}: goals {ids}, the registry's are {want}: rerun bench/{script}")
        out[section] = doc
    return out


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_table(results: Path = RESULTS) -> str:
    """The Goals table: one row per goal of ``GOALS``, in its order."""
    docs = load_results(results)
    lines = ["| goal | status | measured | run |", "|---|---|---|---|"]
    for g in GOALS:
        doc = docs.get(g.section)
        script = f"`bench/{SECTIONS[g.section]}`"
        if doc is None:
            lines.append(f"| {_cell(g.text)} | {NOT_MEASURED} | - | {script} |")
            continue
        r = next(x for x in doc["goals"] if x["id"] == g.id)
        measured = r["measured"] + (f" ({r['note']})" if r["note"] else "")
        lines.append(f"| {_cell(g.text)} | {r['status']} | {_cell(measured)} | {script}, {doc['run']} |")
    return "\n".join(lines)


def render_block(results: Path = RESULTS) -> str:
    """The body of the docs' ``goals`` block: the table and where it comes from."""
    return render_table(results) + "\n\nGenerated by `bench/run_all.py` from `bench/results/goals-<section>.json`.\n"


def update_doc(doc: Path, results: Path = RESULTS) -> None:
    """Rewrites the ``goals`` block of ``doc`` from the result files in ``results``."""
    from benchlib import update_doc_section

    update_doc_section(DOC_KEY, render_block(results), doc)
