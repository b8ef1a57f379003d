"""Differential suite: every scenario of scenarios.py, run by the loaderx 2.5.4
wheel and by this package, must end the same way.

Both interpreters run the whole scenario file once (in parallel, one process
each); each scenario is then one test here that compares the two normalised
outcomes:

* both returned: the normalised values are equal (types, dtypes, shapes,
  bytes, writeability);
* both raised: every builtin exception class in the wheel's exception's MRO is
  in ours too (ours may add builtins and our own classes);
* anything else is a divergence.

A divergence fails unless docs/compat.md lists the scenario (a glob in the
last cell of a table row, in backticks) as a difference on purpose; and every
glob listed there must match at least one scenario that does diverge, so the
document cannot claim a difference that is gone. The wheel is installed by
bench/refvenv.py into bench/.venv-ref (from PyPI); if that fails the suite
skips, saying why.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "bench"))

import refvenv
import scenarios

COMPAT_MD = ROOT / "docs" / "compat.md"
# Both interpreters together take ~20 s on the 2-core CI box; this bounds a hang.
RUN_TIMEOUT_S = 240

NAMES = list(scenarios.SCENARIOS)


def _allowed() -> dict[str, str]:
    """``{glob: row text}`` from docs/compat.md's tables (last cell's backticked globs)."""
    out: dict[str, str] = {}
    for line in COMPAT_MD.read_text().splitlines():
        if not line.startswith("|") or line.startswith(("|--", "| --", "|:--")):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        for glob in re.findall(r"`([^`]+)`", cells[-1]):
            out[glob] = cells[0]
    return out


def _run(python: str, pythonpath: str | None, out: Path) -> subprocess.Popen[str]:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    env.pop("VIRTUAL_ENV", None)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    return subprocess.Popen([python, str(HERE / "scenarios.py"), str(out)], env=env,
                            cwd=tempfile.gettempdir(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Any, Any]]:
    try:
        ref = refvenv.ensure()
    except (refvenv.RefVenvError, OSError, subprocess.CalledProcessError) as e:
        pytest.skip(f"the loaderx 2.5.4 wheel could not be installed into bench/.venv-ref "
                    f"(pip install loaderx==2.5.4 from PyPI): {e}")
    if ref["version"] != "2.5.4":
        pytest.skip(f"pip installed loaderx {ref['version']}, not 2.5.4: nothing to compare with")
    d = tmp_path_factory.mktemp("compat")
    procs = {"ref": _run(ref["python"], None, d / "ref.json"),
             "ours": _run(sys.executable, str(ROOT / "python"), d / "ours.json")}
    for name, p in procs.items():
        try:
            _, err = p.communicate(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            for q in procs.values():
                q.kill()
            pytest.fail(f"{name}: the scenarios did not finish within {RUN_TIMEOUT_S} s")
        assert p.returncode == 0, f"{name}: scenarios.py failed:\n{err[-3000:]}"
    ref_out = json.loads((d / "ref.json").read_text())
    ours_out = json.loads((d / "ours.json").read_text())
    return {n: (ref_out[n], ours_out[n]) for n in NAMES}


def diverges(ref: dict[str, Any], ours: dict[str, Any]) -> bool:
    if "raises" in ref and "raises" in ours:
        return not set(ref["raises"]) <= set(ours["raises"])
    return "ok" not in ref or "ok" not in ours or ref["ok"] != ours["ok"]


def _show(o: dict[str, Any]) -> str:
    if "raises" in o:
        return f"raises {o['type']} (builtins {o['raises']}): {o['msg']}\n{o['where']}"
    return "returns " + json.dumps(o["ok"], sort_keys=True)[:1500]


def _matches(name: str, globs: list[str]) -> list[str]:
    return [g for g in globs if fnmatch.fnmatchcase(name, g)]


@pytest.mark.parametrize("name", NAMES)
def test_scenario(name: str, outcomes: dict[str, tuple[Any, Any]]) -> None:
    ref, ours = outcomes[name]
    if not diverges(ref, ours):
        return
    listed = _matches(name, list(_allowed()))
    if listed:
        return  # a difference on purpose: docs/compat.md says which and why
    pytest.fail(f"{name} diverges from loaderx 2.5.4 and docs/compat.md does not list it\n"
                f"  2.5.4: {_show(ref)}\n  ours:  {_show(ours)}")


def test_every_listed_difference_still_exists(outcomes: dict[str, tuple[Any, Any]]) -> None:
    divergent = [n for n, (r, o) in outcomes.items() if diverges(r, o)]
    stale = [g for g in _allowed() if not any(fnmatch.fnmatchcase(n, g) for n in divergent)]
    assert not stale, f"docs/compat.md lists differences no scenario shows any more: {stale}"


def test_scenarios_cover_the_api() -> None:
    """The suite keeps its breadth: hundreds of scenarios across every area."""
    areas: dict[str, int] = {}
    for n in NAMES:
        areas[n.split(".")[0]] = areas.get(n.split(".")[0], 0) + 1
    assert len(NAMES) >= 500
    for area in ("dense", "ragged", "index", "getitems", "create", "open", "life", "sampler",
                 "loader", "train_dict", "surface", "converter"):
        assert areas.get(area, 0) >= 1, area


def test_normalisation_sees_what_it_compares() -> None:
    """The comparison would notice a changed dtype, shape, byte or writeability."""
    import numpy as np

    a = np.arange(6, dtype="<i4").reshape(2, 3)
    base = scenarios.norm(a)
    ro = a.copy()
    ro.flags.writeable = False
    for other in (a.astype(">i4"), a.reshape(3, 2), a + 1, ro, list(a), np.int32(0)):
        assert scenarios.norm(other) != base
    assert scenarios.norm(a.copy()) == base
    e = scenarios.outcome(lambda: {}["k"])
    assert e["raises"] == ["KeyError", "LookupError"]
    assert diverges({"raises": ["ValueError"]}, {"raises": ["TypeError"]})
    assert not diverges({"raises": ["ValueError"]}, {"raises": ["ValueError", "TypeError"]})
    assert diverges({"ok": 1}, {"raises": ["ValueError"]})
