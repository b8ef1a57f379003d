"""This repository's README: its first snippet runs (twice in one directory) and means what it says."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from loaderx.dataloader import DataLoader
from loaderx.zrecord import Dense

README = Path(__file__).resolve().parents[2] / "README.md"


def snippets() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.DOTALL)


def test_first_snippet_runs_twice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    code = snippets()[0]
    first: dict[str, Any] = {}
    exec(compile(code, str(README), "exec"), first)  # noqa: S102 - the snippet under test
    second: dict[str, Any] = {}
    exec(compile(code, str(README), "exec"), second)  # noqa: S102 - the store exists now
    for ns in (first, second):
        batch = ns["batch"]
        assert list(batch) == ["x"]
        assert batch["x"].shape == (256, 28, 28) and batch["x"].dtype == np.uint8
        assert ns["state"]["step"] == 1
        assert ns["loader"].closed
    assert np.array_equal(first["batch"]["x"], second["batch"]["x"])  # same seed, same batch
    with Dense.open(tmp_path / "demo" / "x") as ds:
        assert len(ds) == 1000


def test_bool_of_a_loader_is_whether_it_is_open(tmp_path: Path) -> None:
    with Dense.create(tmp_path / "x", np.int8, (), codec="raw") as w:
        w.append(np.arange(5, dtype=np.int8))
    with Dense.open(tmp_path / "x") as ds:
        loader = DataLoader({"x": ds}, batch_size=2)
        assert bool(loader) is True
        with pytest.raises(TypeError, match="endless"):
            len(loader)
        loader.close()
        assert bool(loader) is False


def test_it_starts_with_the_demo_and_the_test_command() -> None:
    text = README.read_text(encoding="utf-8")
    first_block = re.search(r"```(\w*)\n(.*?)```", text, flags=re.DOTALL)
    assert first_block is not None and first_block.group(1) == "bash"
    commands = [line.split("#")[0].strip() for line in first_block.group(2).splitlines()]
    assert commands == ["make demo", "make test"]
    assert text.index("```bash") < text.index("```python")
    makefile = (README.parent / "Makefile").read_text(encoding="utf-8")
    for target in ("demo", "test"):
        assert re.search(rf"^{target}:", makefile, flags=re.MULTILINE), target
