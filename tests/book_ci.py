"""The walkthrough's executed chapters for the tests: the reading copy `make test` builds before
pytest (`gemref notebooks build --profile ci --out artifacts/book/ci`, named to pytest by
GEMREF_BOOK), so no chapter runs twice; without GEMREF_BOOK (pytest run by hand) the chapters a
test needs are built here, into a folder of its own.
"""
from __future__ import annotations

import csv
import os
from pathlib import Path

from gemref.walkthrough.book import build_book
from gemref.walkthrough.params import NOTEBOOK_DIR

ENV = "GEMREF_BOOK"


def prebuilt() -> Path | None:
    """The reading copy named by GEMREF_BOOK, or None."""
    return Path(os.environ[ENV]).resolve() if os.environ.get(ENV) else None


def executed(book: Path, name: str) -> Path:
    """A chapter's executed copy in `book`; AssertionError when it is missing or older than the
    notebook (a book from before the notebook changed is not what the tests should read)."""
    path = book / "executed" / f"{name}.ipynb"
    assert path.exists(), f"{name}: no executed copy in {book} (did `gemref notebooks build` stop before it?)"
    source = NOTEBOOK_DIR / f"{name}.ipynb"
    assert path.stat().st_mtime >= source.stat().st_mtime, \
        f"{path} is older than {source}: rebuild the reading copy (make test does)"
    return path


def summary(book: Path) -> dict[str, dict]:
    """{chapter: its summary row} of a built book (times as floats)."""
    with open(book / "executed" / "summary.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        for key in ("seconds", "cpu_seconds", "budget_s"):
            r[key] = float(r[key]) if r.get(key) else None
    return {r["notebook"]: r for r in rows}


def ci_book(names: list[str], folder: Path) -> Path:
    """A reading copy under `ci` holding `names`: GEMREF_BOOK's, else one built into `folder`."""
    book = prebuilt()
    if book is not None:
        for name in names:
            executed(book, name)
        return book
    build_book("ci", folder, names=names, log=lambda s: None)
    return folder
