#!/usr/bin/env python3
"""Fails when the docs or the source comments cite a file that does not exist.

``make docs-check`` (part of ``make test``) runs it from the repository root.
It reads

* every tracked Markdown file (README.md, docs/*.md, ...): the targets of
  Markdown links ``[text](target)`` and every path-like word;
* the comments of every tracked C++ file (``.h``, ``.cc``) and the comments
  and docstrings of every tracked Python file (``.py``, ``.pyi``): every
  path-like word.

A path-like word is a relative path ending in a file extension of this tree
(``common/src/fd_posix.cc``, ``docs/daemon.md``, ``loaderx/ring.h``) or a bare
Markdown name (``README.md``). It resolves if it names a file or directory
relative to the repository root or to the citing file's directory, or if it
is the trailing part of a tracked path (``loaderx/ring.h`` for
``common/internal/loaderx/ring.h``, as an ``#include`` spells it). A link
target must resolve from the citing file's directory, as a viewer resolves
it. URLs, absolute paths, system headers (``<linux/sched.h>``), patterns
(``*``, ``<name>``, ``{a,b}``) and paths git ignores (outputs such as
``bench/results/sampler.json``) are not checked.
Anchors (``#section``) are stripped: the check is about files.

Each missing target is printed as ``file:line: target: no such file`` and the
exit status is 1; with none the status is 0. Standard library only.

Usage: scripts/check_docs.py [--root DIR]   (default: the repository holding this script)
"""

from __future__ import annotations

import argparse
import ast
import io
import os
import re
import subprocess
import sys
import tokenize
from collections.abc import Iterator
from pathlib import Path

# Extensions of files a comment or a document may cite.
EXTENSIONS = ("md", "h", "cc", "py", "pyi", "toml", "txt", "sh", "service", "socket", "cmake", "png", "json")
_EXT = "|".join(EXTENSIONS)
# A relative path with at least one directory, or a bare file name: the word
# must not be glued to a longer word, a URL or an absolute path.
PATH_RE = re.compile(
    rf"(?<![\w/.:~$<-])((?:\.\.?/)*(?:[\w.-]+/)*[\w-][\w.-]*\.(?:{_EXT}))(?![\w/-])"
)
# Bare names are checked only when they are Markdown files or carry a
# directory: `foo.py` alone in a comment is too often an example name.
LINK_RE = re.compile(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
SKIP_PREFIXES = ("http://", "https://", "mailto:", "file:", "#", "/", "~")


def tracked_files(root: Path) -> list[str]:
    """Paths relative to `root`: git's tracked files, or every file when `root` is no repository."""
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "ls-files", "-z"], capture_output=True, check=True, timeout=60
        ).stdout.decode()
        files = [f for f in out.split("\0") if f]
        if files:
            return files
    except (OSError, subprocess.SubprocessError):
        pass
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        for name in filenames:
            found.append(os.path.relpath(os.path.join(dirpath, name), root))
    return sorted(found)


def cpp_comments(text: str) -> Iterator[tuple[int, str]]:
    """(line, text) of every // and /* */ comment, skipping string and char literals."""
    i, line, n = 0, 1, len(text)
    while i < n:
        c = text[i]
        if c == "\n":
            line += 1
            i += 1
        elif text.startswith("//", i):
            end = text.find("\n", i)
            end = n if end < 0 else end
            yield line, text[i:end]
            i = end
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
            yield line, text[i:end]
            line += text.count("\n", i, end)
            i = end
        elif text.startswith('R"', i) and (m := re.match(r'R"([^(\s]*)\(', text[i:])):
            end = text.find(")" + m.group(1) + '"', i)
            end = n if end < 0 else end + len(m.group(1)) + 2
            line += text.count("\n", i, end)
            i = end
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            i = j + 1
        else:
            i += 1


def python_comments(text: str) -> Iterator[tuple[int, str]]:
    """(line, text) of every comment and every docstring of a Python file."""
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.COMMENT:
                yield tok.start[0], tok.string
    except (tokenize.TokenError, SyntaxError):
        pass
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body:
            first = body[0]
            if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str)):
                yield first.lineno, first.value.value


def markdown_text(text: str) -> Iterator[tuple[int, str]]:
    yield from enumerate(text.splitlines(), 1)


def references(kind: str, text: str) -> Iterator[tuple[int, str, bool]]:
    """(line, target, is_link) of every file reference in `text` of the given kind ("md", "cpp", "py")."""
    chunks = {"md": markdown_text, "cpp": cpp_comments, "py": python_comments}[kind](text)
    for line, chunk in chunks:
        seen = set()
        if kind == "md":
            for m in LINK_RE.finditer(chunk):
                target = m.group(1)
                seen.add(target.split("#", 1)[0])
                yield line + chunk.count("\n", 0, m.start()), target, True
        for m in PATH_RE.finditer(chunk):
            word = m.group(1)
            if word in seen:
                continue
            if "/" not in word and not word.endswith(".md"):
                continue  # `foo.py` alone: an example name as often as a file
            yield line + chunk.count("\n", 0, m.start()), word, False


def is_checkable(target: str) -> bool:
    return bool(target) and not target.startswith(SKIP_PREFIXES) and not re.search(r"[*<>{}$|]", target)


class Tree:
    def __init__(self, root: Path, files: list[str]) -> None:
        self.root = root
        self.files = set(files)
        self.dirs = {str(Path(f).parent) for f in files}
        for d in list(self.dirs):
            while d not in ("", "."):
                d = str(Path(d).parent)
                self.dirs.add(d)

    def exists(self, target: str, citing: str, is_link: bool) -> bool:
        """A link resolves from the citing file's directory only, as a Markdown viewer resolves it."""
        target = target.split("#", 1)[0].rstrip("/")
        if not target:
            return True  # a link to an anchor of the same page
        for base in (Path(citing).parent,) if is_link else (Path(citing).parent, Path()):
            path = os.path.normpath(base / target)
            if path in self.files or path in self.dirs or (self.root / path).exists():
                return True
        if is_link:
            return False
        suffix = "/" + target.lstrip("./")
        return any(f.endswith(suffix) for f in self.files)


def check(root: Path) -> list[str]:
    """Every missing reference as 'file:line: target: no such file'."""
    files = tracked_files(root)
    tree = Tree(root, files)
    problems = []
    for name in files:
        ext = name.rsplit(".", 1)[-1]
        kind = {"md": "md", "h": "cpp", "cc": "cpp", "py": "py", "pyi": "py"}.get(ext)
        if kind is None:
            continue
        try:
            text = (root / name).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        for line, target, is_link in references(kind, text):
            if is_checkable(target) and not tree.exists(target, name, is_link):
                problems.append(f"{name}:{line}: {target}: no such file")
    return [p for p in problems if p.split(": ", 2)[1] not in ignored(root, problems)]


def ignored(root: Path, problems: list[str]) -> set[str]:
    """The targets among `problems` that git ignores (outputs, not cited files)."""
    targets = sorted({p.split(": ", 2)[1] for p in problems})
    if not targets:
        return set()
    try:
        out = subprocess.run(["git", "-C", str(root), "check-ignore", "--no-index", "--stdin"],
                             input="\n".join(targets), capture_output=True, text=True, timeout=60,
                             check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return set()
    return set(out.splitlines())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    args = ap.parse_args(argv)
    problems = check(args.root.resolve())
    for p in problems:
        print(p)
    sys.stdout.flush()
    if problems:
        print(f"docs-check: {len(problems)} reference(s) to files that do not exist", file=sys.stderr)
        return 1
    print("docs-check: every cited file exists")
    return 0


if __name__ == "__main__":
    sys.exit(main())
