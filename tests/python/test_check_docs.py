"""scripts/check_docs.py (`make docs-check`): a cited file that does not exist fails the check, by name."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "check_docs.py"


def run(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), "--root", str(root)],
                          capture_output=True, text=True, timeout=120, check=False)


def write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


GOOD = {
    "README.md": "# x\n\nSee [the guide](docs/guide.md#usage) and `common/src/store.cc`.\n"
                 "Online: <https://example.org/docs/nope.md>, [site](https://example.org/a.md).\n",
    "docs/guide.md": "# Guide\n\nFormat: [format.md](format.md); headers: `loaderx/store.h`;\n"
                     "back to [README](../README.md), [a section](#usage).\n"
                     "Data lives in /usr/share/datasets/x.md; names like `<name>.md` are patterns.\n",
    "docs/format.md": "# Format\n",
    "common/include/loaderx/store.h": "// Store (docs/format.md, common/src/store.cc).\n#pragma once\n",
    "common/src/store.cc": (
        '#include <linux/sched.h>  // <linux/sched.h> is a system header\n'
        '// Reads what format.md describes.\n'
        'const char* kPath = "not/a/comment.md";  // a string, not a citation\n'
    ),
    "python/pkg/mod.py": (
        '"""Module docstring citing docs/guide.md."""\n\n'
        'PATH = "generated/output.json"  # written at run time; see docs/format.md\n\n\n'
        'def f() -> None:\n    """Reads common/src/store.cc."""\n'
    ),
}


def test_a_tree_whose_citations_exist_passes(tmp_path: Path) -> None:
    write(tmp_path, GOOD)
    proc = run(tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip() == "docs-check: every cited file exists"


def test_each_missing_target_fails_the_check_by_file_and_line(tmp_path: Path) -> None:
    broken = dict(GOOD)
    broken["README.md"] = GOOD["README.md"] + "Moved: [daemon](docs/daemon.md).\n"
    broken["docs/guide.md"] = GOOD["docs/guide.md"] + "Design: DESIGN.md section 7.\n"
    broken["common/src/store.cc"] = GOOD["common/src/store.cc"] + "// See common/src/gone.cc.\n"
    broken["python/pkg/mod.py"] = GOOD["python/pkg/mod.py"] + "# docs/old.md has the rest\n"
    write(tmp_path, broken)
    proc = run(tmp_path)
    assert proc.returncode == 1
    assert proc.stdout.splitlines() == [
        "README.md:5: docs/daemon.md: no such file",
        "common/src/store.cc:4: common/src/gone.cc: no such file",
        "docs/guide.md:6: DESIGN.md: no such file",
        "python/pkg/mod.py:8: docs/old.md: no such file",
    ]
    assert "4 reference(s) to files that do not exist" in proc.stderr


def test_a_relative_link_resolves_from_the_citing_file(tmp_path: Path) -> None:
    # docs/guide.md's "format.md" is docs/format.md; from the root it would not exist.
    files = dict(GOOD)
    files["README.md"] = "# x\n\n[format](format.md)\n"
    write(tmp_path, files)
    proc = run(tmp_path)
    assert proc.returncode == 1
    assert proc.stdout.splitlines() == ["README.md:3: format.md: no such file"]
