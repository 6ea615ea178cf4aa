"""Every file a docstring or comment of the package names exists: a reader who follows a
pointer lands on a file, not on a name that moved away.

A reference is a token ending in .py, .md, .cpp, .h, .yaml, .sh or .ipynb, in a docstring or a
comment of gemref/ and scripts/ (Python docstrings and # comments, C++ // comments). It resolves
from the repository root when it starts with one of the repository's folders, else from the
naming file's folder, gemref/ or the root; a bare file name must exist somewhere in the
repository. Paths into PyTorch's own sources (aten/, c10/, torch/) name files outside it."""
from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)*[\w-]+\.(?:py|md|cpp|h|yaml|sh|ipynb))(?!\w)")
REPO_FOLDERS = ("gemref/", "tests/", "docs/", "scripts/", "notebooks/", "benchmarks/", "data/", ".ci/")
EXTERNAL = ("aten/", "c10/", "torch/")


def _texts(path: Path):
    """The docstrings and comments of one source file."""
    source = path.read_text()
    if path.suffix != ".py":
        for line in source.splitlines():
            if "//" in line:
                yield line.split("//", 1)[1]
        return
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                yield doc
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.string


def _resolves(reference: str, path: Path, repo: Path) -> bool:
    if reference.startswith(EXTERNAL):
        return True
    if reference.startswith(REPO_FOLDERS):
        return (repo / reference).exists()
    if "/" in reference:
        return any((base / reference).exists() for base in (path.parent, repo / "gemref", repo))
    # a bare name: a file of the repository's own (not of .venv, .git or other hidden folders)
    return any(not any(part.startswith(".") for part in found.relative_to(repo).parts)
               for found in repo.glob(f"**/{reference}"))


def dangling_references(repo: Path = ROOT, folders=("gemref", "scripts")) -> list[tuple[str, str]]:
    """(file, reference) for every reference in `folders` of `repo` that names no file."""
    found = []
    for folder in folders:
        for path in sorted(p for p in (repo / folder).rglob("*") if p.suffix in (".py", ".cpp", ".h")):
            for text in _texts(path):
                for match in REFERENCE.finditer(text):
                    if "://" not in text[max(0, match.start() - 12):match.start()] and \
                            not _resolves(match.group(1), path, repo):
                        found.append((str(path.relative_to(repo)), match.group(1)))
    return found


def test_every_file_a_docstring_or_comment_names_exists():
    assert dangling_references() == []


def test_the_check_finds_a_moved_file(tmp_path):
    """A planted module naming gemref/ladder.py (moved to gemref/waterfall/ladder.py), a
    figures.py that is nowhere, and a C++ comment naming a missing header are caught; the
    current path, a bare existing name and a URL are not."""
    (tmp_path / "gemref" / "waterfall").mkdir(parents=True)
    (tmp_path / "gemref" / "waterfall" / "ladder.py").write_text("")
    (tmp_path / "gemref" / "planted.py").write_text(
        '"""Rungs of gemref/ladder.py and gemref/waterfall/ladder.py; see ladder.py, or\n'
        'https://example.com/x/notes.md."""\n# figures.py moved too\n')
    (tmp_path / "gemref" / "k.cpp").write_text("// shares planted.py's ideas; see common.h\n")
    assert dangling_references(tmp_path, ("gemref",)) == [
        ("gemref/k.cpp", "common.h"), ("gemref/planted.py", "gemref/ladder.py"), ("gemref/planted.py", "figures.py")]


MARKDOWN_PATH = re.compile(r"(?<![\w/.-])((?:gemref|tests|docs|scripts|notebooks|benchmarks|data)/[\w./-]*[\w/])")


def dangling_markdown_paths(repo: Path = ROOT) -> list[tuple[str, str]]:
    """(page, path) for every repository path that README.md or a page of docs/ names and that does
    not exist (paths are written from the repository root; `data/x.py` may be gemref's data package)."""
    found = []
    for page in [repo / "README.md", *sorted((repo / "docs").glob("*.md"))]:
        for match in MARKDOWN_PATH.finditer(page.read_text()):
            path = match.group(1).rstrip(".")
            if "<" in path or "*" in path or path.endswith("_") or path.startswith("data/generated"):
                continue
            if not (repo / path).exists() and not (path.startswith("data/") and (repo / "gemref" / path).exists()):
                found.append((page.name, path))
    return found


def test_every_path_readme_and_docs_name_exists():
    assert dangling_markdown_paths() == []


def test_the_markdown_check_finds_a_missing_module(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "gemref").mkdir()
    (tmp_path / "gemref" / "here.py").write_text("")
    (tmp_path / "README.md").write_text("copy `gemref/here.py` and [x](gemref/gone.py).")
    assert dangling_markdown_paths(tmp_path) == [("README.md", "gemref/gone.py")]


def test_readme_is_short():
    """A newcomer reads it in five minutes: at most 250 lines (details live in docs/ and benchmarks/)."""
    assert len((ROOT / "README.md").read_text().splitlines()) <= 250
