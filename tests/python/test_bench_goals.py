"""The Goals table of docs/benchmarks.md (bench/goals.py, bench/run_all.py --goals-only).

The table is generated from the goal files the benchmark scripts write; these
tests render it from hand-written files and pin down what a reader relies on:
one row per registered goal in the registry's order, met / not met as judged
at the printed precision, a missing file shown as not measured and never as a
figure, and every registered goal written by exactly one script's goal function.
No benchmark runs here.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import goals
from goals import Part

NM = "not measured in this run"


def _goal(gid: str, status: str, measured: str, note: str = "") -> dict:
    return {"id": gid, "goal": goals.BY_ID[gid].text, "status": status, "measured": measured, "note": note,
            "parts": []}


def _write(results: Path, section: str, run: str, rows: list[dict]) -> None:
    results.mkdir(exist_ok=True)
    doc = {"schema": 1, "section": section, "script": f"bench/{goals.SECTIONS[section]}", "run": run,
           "machine": f"{run}, 2 cores", "goals": rows}
    (results / f"goals-{section}.json").write_text(json.dumps(doc))


def _fixtures(results: Path) -> None:
    """Hand-written files of two sections; store, loader and node-groups have none."""
    _write(results, "daemon", "2026-12-03 12:38 UTC", [
        _goal("daemon-cpp-ready", "met", "~1 KiB 16.6 µs, 37 MiB 14.3 µs", "floor 16.7 µs"),
        _goal("daemon-cpp-warm", "not met", "~1 KiB 21.0 µs"),
        _goal("daemon-py-next", "met", "~1 KiB -17 µs"),
        _goal("daemon-throughput", "not measured", "not measured: 37 MiB"),
        _goal("daemon-cpu-share", "met", "37 MiB 1.5 %"),
    ])
    _write(results, "groups", "2026-12-05 16:39 UTC", [
        _goal("groups-broadcast-pss", "not met", "raw 0.86x, zstd 1.31x (not met)"),
    ])


def _missing(gid: str) -> str:
    g = goals.BY_ID[gid]
    return f"| {g.text} | {NM} | - | `bench/{goals.SECTIONS[g.section]}` |"


def test_goals_table_rows_in_registry_order_with_status_and_run(tmp_path):
    _fixtures(tmp_path)
    lines = goals.render_table(tmp_path).splitlines()
    assert lines[:2] == ["| goal | status | measured | run |", "|---|---|---|---|"]
    rows = lines[2:]
    assert len(rows) == len(goals.GOALS) == 22
    by_id = dict(zip([g.id for g in goals.GOALS], rows))
    d = "`bench/bench_daemon.py`, 2026-12-03 12:38 UTC"
    T = {g.id: g.text for g in goals.GOALS}
    assert by_id["daemon-cpp-ready"] == (
        f"| {T['daemon-cpp-ready']} | met | ~1 KiB 16.6 µs, 37 MiB 14.3 µs (floor 16.7 µs) | {d} |")
    assert by_id["daemon-cpp-warm"] == f"| {T['daemon-cpp-warm']} | not met | ~1 KiB 21.0 µs | {d} |"
    assert by_id["daemon-throughput"] == f"| {T['daemon-throughput']} | not measured | not measured: 37 MiB | {d} |"
    assert by_id["groups-broadcast-pss"] == (f"| {T['groups-broadcast-pss']} | not met | raw 0.86x, zstd 1.31x "
                                             "(not met) | `bench/bench_groups.py`, 2026-12-05 16:39 UTC |")
    # The registry's order: store, loader, daemon, groups, node groups.
    assert [r.split(" | ")[0][2:] for r in rows] == [g.text for g in goals.GOALS]
    assert [g.section for g in goals.GOALS] == sorted(
        (g.section for g in goals.GOALS), key=list(goals.SECTIONS).index)


def test_a_missing_goal_file_never_yields_a_figure(tmp_path):
    _fixtures(tmp_path)
    rows = dict(zip([g.id for g in goals.GOALS], goals.render_table(tmp_path).splitlines()[2:]))
    absent = [g.id for g in goals.GOALS if g.section in ("store", "loader", "node-groups")]
    assert len(absent) == 16
    for gid in absent:
        assert rows[gid] == _missing(gid)
    # With no file at all, every row is not measured.
    empty = tmp_path / "none"
    assert goals.render_table(empty).splitlines()[2:] == [_missing(g.id) for g in goals.GOALS]


def test_a_removed_file_turns_its_rows_to_not_measured(tmp_path):
    _fixtures(tmp_path)
    goals.clear_section("daemon", tmp_path)
    rows = goals.render_table(tmp_path).splitlines()[2:]
    assert [r for r in rows if "bench_daemon.py" in r] == [
        _missing(g.id) for g in goals.GOALS if g.section == "daemon"]
    assert (tmp_path / "goals-groups.json").exists()


def test_goal_file_of_another_registry_is_refused(tmp_path):
    _write(tmp_path, "groups", "2026-12-05 16:39 UTC", [_goal("groups-broadcast-pss", "met", "x"),
                                                         _goal("daemon-cpu-share", "met", "y")])
    with pytest.raises(ValueError, match="rerun bench/bench_groups.py"):
        goals.render_table(tmp_path)
    (tmp_path / "goals-groups.json").write_text(json.dumps({"schema": 0, "section": "groups", "goals": []}))
    with pytest.raises(ValueError, match="not a schema-1 goals file"):
        goals.render_table(tmp_path)


def test_run_all_goals_only_rewrites_only_the_goals_block(tmp_path):
    _fixtures(tmp_path / "res")
    doc = tmp_path / "b.md"
    doc.write_text("# B\n\n## Goals\n\n<!-- BEGIN goals -->\n| old | 9.99x |\n<!-- END goals -->\n\n"
                   "<!-- BEGIN daemon -->\nkept\n<!-- END daemon -->\n")
    proc = subprocess.run([sys.executable, str(BENCH / "run_all.py"), "--goals-only", "--results",
                           str(tmp_path / "res"), "--doc", str(doc)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    text = doc.read_text()
    want = goals.render_block(tmp_path / "res").rstrip()
    assert text == ("# B\n\n## Goals\n\n<!-- BEGIN goals -->\n" + want + "\n<!-- END goals -->\n\n"
                    "<!-- BEGIN daemon -->\nkept\n<!-- END daemon -->\n")
    assert "9.99x" not in text
    assert text.count("| not measured in this run | - |") == 16


def _judged(section: str, parts: dict[str, list[Part]], notes: dict[str, str] | None = None) -> dict[str, dict]:
    doc = goals.section_result(section, "2026-12-05 16:14 UTC, 2 cores (test)", parts, notes)
    assert doc["run"] == "2026-12-05 16:14 UTC" and doc["script"] == f"bench/{goals.SECTIONS[section]}"
    return {g["id"]: g for g in doc["goals"]}


def test_parts_are_judged_at_the_printed_precision():
    got = _judged("groups", {"groups-broadcast-pss": [Part("raw", 1.3049), Part("zstd", 1.3051)]})
    g = got["groups-broadcast-pss"]
    assert [(p["shown"], p["met"]) for p in g["parts"]] == [("1.30x", True), ("1.31x", False)]
    assert g["status"] == "not met" and g["measured"] == "raw 1.30x, zstd 1.31x (not met)"
    got = _judged("daemon", {
        "daemon-cpp-ready": [Part("~1 KiB", 26.64, limit=26.7), Part("37 MiB", 26.76, limit=26.7)],
        "daemon-cpp-warm": [Part("~1 KiB", 21.0), Part("37 MiB", 22.0)],
        "daemon-py-next": [Part("~1 KiB", -17.2), Part("37 MiB", 12.6)],
        "daemon-throughput": [Part("37 MiB", None)],
        "daemon-cpu-share": [Part("37 MiB", 0.01504)],
    }, {"daemon-cpp-ready": "floor 16.7 µs"})
    assert got["daemon-cpp-ready"]["measured"] == "~1 KiB 26.6 µs, 37 MiB 26.8 µs (not met)"
    assert got["daemon-cpp-ready"]["note"] == "floor 16.7 µs"
    assert got["daemon-cpp-warm"]["status"] == "not met"
    assert got["daemon-cpp-warm"]["measured"] == "~1 KiB 21.0 µs, 37 MiB 22.0 µs"  # none met: nothing marked
    assert got["daemon-py-next"]["measured"] == "~1 KiB -17 µs, 37 MiB +13 µs"
    assert got["daemon-py-next"]["status"] == "met"
    assert got["daemon-throughput"]["status"] == "not measured"
    assert got["daemon-throughput"]["measured"] == "not measured: 37 MiB"
    assert got["daemon-cpu-share"]["measured"] == "37 MiB 1.5 %" and got["daemon-cpu-share"]["status"] == "met"


def test_many_parts_read_as_a_span_and_the_misses():
    names = ["a", "b", "c", "d", "e", "f"]
    store = {g.id: [Part(n, 2.0) for n in names] for g in goals.GOALS if g.section == "store"}
    store["store-gather-wheel"] = [Part(n, v) for n, v in zip(names, [1.36, 90.06, 1.5, 2.0, 3.0, 4.0])]
    store["store-raw-write-ceiling"] = [Part(n, v) for n, v in zip(names, [0.92, 0.75, 0.91, 0.77, 0.29, 0.9])]
    store["store-zstd-write-ceiling"] = [Part(n, v) for n, v in zip(names, [0.82, 0.02, 0.9, 0.7, 0.69, 0.8])]
    store["store-gather-memcpy"] = [Part(n, v) for n, v in zip(names, [1.05, 0.794, 0.7951, 1.1, 0.9, 0.91])]
    got = _judged("store", store)
    assert got["store-gather-wheel"]["measured"] == "all 6: 1.36x (a) to 90.06x (b)"
    assert got["store-raw-write-ceiling"]["measured"] == "3 of 6 met; not met: b 0.75, d 0.77, e 0.29"
    assert got["store-zstd-write-ceiling"]["measured"] == "0 of 6 met; not met: 0.02 (b) to 0.90 (c)"
    # 79.51 % prints as 80 %: met; 79.4 % prints as 79 %: not met.
    assert got["store-gather-memcpy"]["measured"] == "5 of 6 met; not met: b 79 %"
    assert got["store-gather-memcpy"]["status"] == "not met"


def test_a_section_writes_exactly_its_goals(tmp_path):
    with pytest.raises(ValueError, match=r"missing \['node-group-tp'\]"):
        goals.section_result("node-groups", "2026-12-05 16:14 UTC", {
            "node-group-pss": [], "node-group-cpu": [], "node-group-rate": []})
    with pytest.raises(ValueError, match=r"extra \['loader-torch'\]"):
        goals.section_result("groups", "2026-12-05 16:14 UTC", {"groups-broadcast-pss": [], "loader-torch": []})
    with pytest.raises(ValueError, match="unknown goal section 'sampler'"):
        goals.clear_section("sampler", tmp_path)
    with pytest.raises(ValueError, match="no 'YYYY-MM-DD HH:MM UTC' run time"):
        goals.run_of("yesterday, 2 cores")
    path = goals.write_section("groups", "2026-12-05 16:39 UTC, 2 cores", {"groups-broadcast-pss": [Part("raw", 0.86)]},
                               results=tmp_path)
    assert path == tmp_path / "goals-groups.json"
    assert goals.load_results(tmp_path)["groups"]["goals"][0]["parts"] == [
        {"label": "raw", "value": 0.86, "limit": 1.3, "shown": "0.86x", "met": True}]
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary left
    doc = goals.section_result("daemon", "2026-12-03 12:38 UTC, x", {
        "daemon-cpp-ready": [Part("~1 KiB", 16.6, limit=26.7)], "daemon-cpp-warm": [Part("~1 KiB", 16.3)],
        "daemon-py-next": [Part("~1 KiB", -17.0)], "daemon-throughput": [Part("37 MiB", 0.995)],
        "daemon-cpu-share": [Part("37 MiB", 0.015)]}, {"daemon-cpp-ready": "floor 16.7 µs"})
    assert goals.bullets(doc) == [
        f"* {goals.BY_ID['daemon-cpp-ready'].text}: **met** (~1 KiB 16.6 µs; floor 16.7 µs)",
        f"* {goals.BY_ID['daemon-cpp-warm'].text}: **met** (~1 KiB 16.3 µs)",
        f"* {goals.BY_ID['daemon-py-next'].text}: **met** (~1 KiB -17 µs)",
        f"* {goals.BY_ID['daemon-throughput'].text}: **not met** (37 MiB 0.99x)",
        f"* {goals.BY_ID['daemon-cpu-share'].text}: **met** (37 MiB 1.5 %)"]


# --------------------------------------------------------------------------
# Every registered goal is written by exactly one script: the registry names
# the script of each section, run_all runs it under that name, and that
# script's goal function returns exactly the section's goals.
# --------------------------------------------------------------------------

def test_registry_sections_are_run_all_benchmarks():
    import run_all

    assert len({g.id for g in goals.GOALS}) == len(goals.GOALS)
    for section, script in goals.SECTIONS.items():
        assert run_all.SUITE[section][0] == script
        assert (BENCH / script).is_file()
        assert goals.section_goals(section), section


def test_loader_goal_function_measures_the_table_ratios():
    import bench_loader

    def row(label: str, bs: float, pss: float) -> tuple[dict, dict]:
        return {"label": label}, {"batches_s": bs, "peak_pss": pss}

    rows = [row("loaderx raw", 216.0, 447.0), row("loaderx zstd", 55.4, 412.0),
            row("reference 2.5.4 raw", 104.8, 381.0), ({"label": "reference 2.5.4 zstd"}, {"error": "boom"}),
            row("torch fork 4w", 46.4, 970.0)]
    got = _judged("loader", bench_loader.loader_goals(rows))
    assert [p["shown"] for p in got["loader-wheel"]["parts"]] == ["2.06x", "-"]
    assert got["loader-wheel"]["status"] == "not measured"
    assert got["loader-torch"]["measured"] == "raw 4.66x" and got["loader-torch"]["status"] == "met"
    assert got["loader-pss-torch"]["measured"] == "raw 0.46x, zstd 0.42x"


def test_node_rate_is_the_steps_over_the_nodes_span_and_runs_combine_by_median():
    import bench_node_groups

    reports = [{"start": 10.0, "end": 20.0}, {"start": 11.0, "end": 14.0}, {"start": 10.5, "end": 30.0}]
    assert bench_node_groups.node_rate(reports, 200) == 10.0  # 200 steps from 10.0 to 30.0
    runs = [{"rate_node": 3.0, "pss_mib": 10.0}, {"rate_node": 1.0, "pss_mib": 30.0},
            {"rate_node": 2.0, "pss_mib": 20.0}]
    assert bench_node_groups.median_run(runs) == {"rate_node": 2.0, "pss_mib": 20.0}
    assert bench_node_groups.median_run(runs[:1]) == runs[0]


def test_groups_and_node_goal_functions_measure_the_table_ratios():
    import bench_groups
    import bench_node_groups

    r = {("raw", "embedded"): {"max_trainer_pss_mib": 213.0}, ("raw", "broadcast"): {"pss_mib": 184.0}}
    got = _judged("groups", bench_groups.groups_goals(r, ["raw"]))
    assert got["groups-broadcast-pss"]["measured"] == "not measured: zstd"

    def s(rate: float, cpu: float, pss: float, one: float = 0.0) -> dict:
        # The goal is judged on the node's rate; the mean of the ranks' own rates does not enter.
        return {"rate_node": rate, "rate_mean": 1e9, "cpu_per_step_ms": cpu, "pss_mib": pss,
                "max_trainer_pss_mib": one}

    res = {}
    for c, k in (("raw", 1.0), ("zstd", 2.0)):
        res[(c, "embedded")] = s(100.0, 0.0, 0.0, one=200.0)
        res[(c, "embedded-node")] = s(0.0, 10.0 * k, 200.0 * k)
        res[(c, "node")] = s(75.0, 13.1 * k, 502.0 * k)
        res[(c, "node-shared")] = s(101.0, 11.5 * k, 260.0 * k)
        res[(c, "node-tp")] = s(0.0, 5.4 * k, 0.0)
        res[(c, "node-tp-shared")] = s(0.0, 5.6 * k, 0.0)
        res[(c, "solo-tp")] = s(0.0, 10.0 * k, 0.0)
    got = _judged("node-groups", bench_node_groups.node_goals(res, ["raw", "zstd"]))
    assert got["node-group-pss"]["measured"] == (
        "raw (c) 2.51x (not met), raw (c') shared_view 1.30x, zstd (c) 2.51x (not met), zstd (c') shared_view 1.30x")
    assert got["node-group-cpu"]["measured"] == (
        "raw (c) 1.31x (not met), raw (c') shared_view 1.15x, zstd (c) 1.31x (not met), zstd (c') shared_view 1.15x")
    assert got["node-group-rate"]["measured"] == (
        "raw (c) 0.75x (not met), raw (c') shared_view 1.01x, zstd (c) 0.75x (not met), zstd (c') shared_view 1.01x")
    assert got["node-group-tp"]["measured"] == (
        "raw (e) 0.54x, raw (e') shared_view 0.56x (not met), zstd (e) 0.54x, zstd (e') shared_view 0.56x (not met)")
    assert got["node-group-tp"]["status"] == "not met"
    for c, k in (("raw", 1.0), ("zstd", 2.0)):
        res[(c, "node-tp-shared")] = s(0.0, 5.0 * k, 0.0)
    got = _judged("node-groups", bench_node_groups.node_goals(res, ["raw", "zstd"]))
    assert got["node-group-tp"]["status"] == "met"
    # (c) against one rank of (a): 502 / 200 MiB; (a)'s own PSS and (g)'s do not enter.
    res[("raw", "embedded-node")]["pss_mib"] = 1004.0
    res[("raw", "embedded")]["pss_mib"] = 9999.0
    assert bench_node_groups.node_notes(res, ["raw"]) == {
        "node-group-pss": "against one rank of (a), which loads a quarter of the node's data: raw 2.51x"}
    assert bench_node_groups.node_notes(res, []) == {}


def test_store_goal_function_measures_the_table_ratios_and_names_missing_workloads():
    import bench_store
    from benchlib import DenseWorkload

    MiB = 1024 * 1024
    w = DenseWorkload("fmnist", np.zeros((64, 1024, 1024), np.uint8), "test")  # 64 MiB logical

    def r(backend: str, mibs: float, disk_mib: float, write_s: float, **kw: float) -> bench_store.Row:
        return bench_store.Row(backend, write_s=write_s, disk=int(disk_mib * MiB), mibs=[mibs], **kw)

    rows = [r("loaderx-raw", 17254.0, 64.0, 0.5, raw_ceiling_s=0.4),
            r("loaderx-zstd", 913.0, 32.0, 1.0, zstd_ceiling_s=0.9, raw_ceiling_s=0.05),
            r("loaderx-zstd_dict", 959.0, 30.0, 1.0, zstd_ceiling_s=0.8, raw_ceiling_s=0.05),
            r("reference-2.5.4-raw", 1065.0, 64.0, 0.6), r("reference-2.5.4-zstd", 494.0, 33.0, 1.1),
            r("parquet-zstd", 7.0, 25.0, 2.0)]
    names = ["vision-dense", "fmnist"]
    got = _judged("store", bench_store.store_goals(names, {"fmnist": (w, rows)}, {1: 18944.0, 2: 19251.2}))
    assert got["store-gather-wheel"]["measured"] == "not measured: vision-dense raw, vision-dense zstd"
    parts = {p["label"]: p["shown"] for p in got["store-gather-wheel"]["parts"]}
    assert parts == {"vision-dense raw": "-", "vision-dense zstd": "-", "fmnist raw": "16.20x",
                     "fmnist zstd": "1.85x"}
    assert [(p["label"], p["shown"]) for p in got["store-raw-write-ceiling"]["parts"]] == [
        ("vision-dense", "-"), ("fmnist", "0.80")]
    assert [(p["label"], p["shown"]) for p in got["store-zstd-write-ceiling"]["parts"]][2:] == [
        ("fmnist zstd", "0.90"), ("fmnist zstd_dict", "0.80")]
    assert [(p["label"], p["shown"]) for p in got["store-raw-write-wheel"]["parts"]] == [
        ("vision-dense", "-"), ("fmnist", "1.20x")]
    assert got["store-disk-wheel"]["parts"][2:] == [
        {"label": "fmnist raw", "value": 1.0, "limit": 1.0, "shown": "1.00x", "met": True},
        {"label": "fmnist zstd", "value": 33.0 / 32.0, "limit": 1.0, "shown": "1.03x", "met": True}]
    memcpy = {p["label"]: p["shown"] for p in got["store-gather-memcpy"]["parts"]}
    assert memcpy == {"vision-dense, 1 thread": "-", "vision-dense, 2 threads": "-", "tokens-dense, 1 thread": "-",
                      "tokens-dense, 2 threads": "-", "fmnist, 1 thread": "91 %", "fmnist, 2 threads": "90 %"}
    assert got["store-labels-disk"]["measured"] == "not measured: labels raw"
    assert got["store-token-disk-parquet"]["status"] == "not measured"
