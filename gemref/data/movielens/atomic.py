"""MovieLens-100K's three RecBole atomic files, read from the recbole wheel or a folder, digests checked.

PyPI's `recbole==1.2.1` wheel ships the ML-100K data under `recbole/dataset_example/ml-100k/`
as RecBole "atomic files": tab-separated, one typed header line (`name:type`), then one record
per line. `ml-100k.inter` without its header is byte for byte GroupLens' `u.data`; `.user` is
`u.user` with tabs; `.item` keeps the title, the year parsed from it and the genres as a
space-separated list. Only these three are read (the wheel's code is never run, nor installed).

Every file is untrusted: its sha256 must equal the pinned one (`ML100K`, or the made-up
sample's `SAMPLE`, shipped in sample/ for the tests and as the chapters' offline fallback)
before it is parsed, and parsing checks the header, the field count of every line, that ids
and ratings are integers in range and that every rating's user and movie are described. Any
problem is a UsageError naming the file and the line.
"""
from __future__ import annotations

import hashlib
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...errors import UsageError

FILES = ("ml-100k.inter", "ml-100k.user", "ml-100k.item")
WHEEL_FOLDER = "recbole/dataset_example/ml-100k/"
# The three members of recbole-1.2.1-py3-none-any.whl (they match the wheel's own RECORD).
ML100K = {"ml-100k.inter": "4edb74e2a81178c2ba9ff381495f754f996c4aea351b1272ca36b43da0935eff",
          "ml-100k.user": "4f670007d9cfbeb9807e757209af1555b9bcc186bde25e767f67cb67c6dd5972",
          "ml-100k.item": "51d7cdf777ce5c0f5b32c1d947a4a81fe07d75e78abbe761e0cd4d0756064532"}
# gemref's own made-up sample in the same format (sample/; a test keeps these equal to the files).
SAMPLE = {"ml-100k.inter": "a26dc278328d0b655973807380d60fd11d7943d132f9be60cc7378f29d901f7b",
          "ml-100k.user": "b8e072ce5762921ae50b1b2bb80427afef21c00e63e86d7fa6424b179f47a0f8",
          "ml-100k.item": "327260ecba708e9b7657f4067cbaccef52696c91e2f8e1684619746dd86edab9"}
SAMPLE_DIR = Path(__file__).resolve().parent / "sample"
HEADERS = {"ml-100k.inter": ("user_id", "item_id", "rating", "timestamp"),
           "ml-100k.user": ("user_id", "age", "gender", "occupation", "zip_code"),
           "ml-100k.item": ("item_id", "movie_title", "release_year", "class")}
GENRES = ("unknown", "Action", "Adventure", "Animation", "Children's", "Comedy", "Crime", "Documentary", "Drama",
          "Fantasy", "Film-Noir", "Horror", "Musical", "Mystery", "Romance", "Sci-Fi", "Thriller", "War", "Western")
MAX_FILE_BYTES = 64 << 20     # the real .inter is 1.9 MB: anything this large is not ML-100K


@dataclass
class MovieLens:
    """The parsed files: one entry per rating (in file order), per user and per movie (by id)."""

    user: np.ndarray        # (R,) int64 user id of each rating, >= 1
    item: np.ndarray        # (R,) int64 movie id, >= 1
    rating: np.ndarray      # (R,) int64 stars, 1..5
    time: np.ndarray        # (R,) int64 seconds since the epoch
    users: dict[int, tuple[int, str, str, str]]   # id -> (age, gender, occupation, zip code)
    items: dict[int, tuple[str, tuple[str, ...]]]  # id -> (release year text, genres)
    digests: dict[str, str]                        # file -> sha256 (checked)


def read_members(source: str | Path) -> dict[str, bytes]:
    """The three files' bytes from a recbole wheel (a zip) or a folder holding them."""
    path = Path(source)
    if path.is_dir():
        out = {}
        for name in FILES:
            member = path / name
            if not member.is_file():
                raise UsageError(f"{path}: no {name} (a folder must hold {', '.join(FILES)})")
            if member.stat().st_size > MAX_FILE_BYTES:
                raise UsageError(f"{member}: {member.stat().st_size:,} bytes, not ML-100K's")
            out[name] = member.read_bytes()
        return out
    if not path.is_file():
        raise UsageError(f"{source}: no such file or folder (give the recbole-1.2.1 wheel or a folder of "
                         f"{', '.join(FILES)})")
    try:
        with zipfile.ZipFile(path) as wheel:
            out = {}
            for name in FILES:
                try:
                    info = wheel.getinfo(WHEEL_FOLDER + name)
                except KeyError:
                    raise UsageError(f"{path}: the wheel has no {WHEEL_FOLDER}{name} (not recbole 1.2.1?)") from None
                if info.file_size > MAX_FILE_BYTES:
                    raise UsageError(f"{path}: {info.filename} unpacks to {info.file_size:,} bytes, not ML-100K's")
                out[name] = wheel.read(info)
            return out
    except (zipfile.BadZipFile, OSError, EOFError) as e:
        raise UsageError(f"{path}: not a readable wheel (zip): {e}") from None


def check_digests(members: dict[str, bytes], expected: dict[str, str], where: str) -> dict[str, str]:
    """{file: sha256}, each equal to the pinned one (UsageError naming the first that is not)."""
    digests = {}
    for name in FILES:
        digest = hashlib.sha256(members[name]).hexdigest()
        if digest != expected[name]:
            raise UsageError(f"{where}: {name} has sha256 {digest[:16]}..., expected {expected[name][:16]}... "
                             "(not the pinned MovieLens-100K file; nothing was written)")
        digests[name] = digest
    return digests


def _records(name: str, data: bytes) -> list[list[str]]:
    """The lines of an atomic file after its header, split on tabs; the header checked."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(f"{name}: not UTF-8 text ({e})") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if not lines:
        raise UsageError(f"{name}: empty file")
    header = tuple(field.split(":")[0] for field in lines[0].split("\t"))
    if header != HEADERS[name]:
        raise UsageError(f"{name}: header fields {list(header)}, expected {list(HEADERS[name])}")
    rows = []
    for number, line in enumerate(lines[1:], start=2):
        fields = line.split("\t")
        if len(fields) != len(header):
            raise UsageError(f"{name}: line {number} has {len(fields)} tab-separated fields, expected {len(header)}")
        rows.append(fields)
    if not rows:
        raise UsageError(f"{name}: a header and no records")
    return rows


def _int(text: str, name: str, line: int, field: str, low: int, high: int | None = None) -> int:
    try:
        value = int(text, 10)
    except ValueError:
        raise UsageError(f"{name}: line {line}: {field} {text!r} is not an integer") from None
    if value < low or (high is not None and value > high):
        raise UsageError(f"{name}: line {line}: {field} {value} is outside [{low}, {high if high is not None else 'inf'}]")
    return value


def parse(members: dict[str, bytes], digests: dict[str, str]) -> MovieLens:
    """The three files as arrays and tables (module doc: every line checked)."""
    users = {}
    for line, (uid, age, gender, occupation, zip_code) in enumerate(_records("ml-100k.user", members["ml-100k.user"]), 2):
        key = _int(uid, "ml-100k.user", line, "user_id", 1)
        if key in users:
            raise UsageError(f"ml-100k.user: line {line}: user_id {key} is listed twice")
        if gender not in ("M", "F"):
            raise UsageError(f"ml-100k.user: line {line}: gender {gender!r}, expected M or F")
        if not occupation or not zip_code:
            raise UsageError(f"ml-100k.user: line {line}: empty occupation or zip_code")
        users[key] = (_int(age, "ml-100k.user", line, "age", 1, 120), gender, occupation, zip_code)
    items = {}
    for line, (iid, _title, year, genres) in enumerate(_records("ml-100k.item", members["ml-100k.item"]), 2):
        key = _int(iid, "ml-100k.item", line, "item_id", 1)
        if key in items:
            raise UsageError(f"ml-100k.item: line {line}: item_id {key} is listed twice")
        names = tuple(genres.split())
        unknown = [g for g in names if g not in GENRES]
        if not names or unknown:
            raise UsageError(f"ml-100k.item: line {line}: genres {genres!r}: each must be one of {', '.join(GENRES)}")
        items[key] = (year, names)
    ratings = _records("ml-100k.inter", members["ml-100k.inter"])
    table = np.empty((len(ratings), 4), dtype=np.int64)
    limits = (("user_id", 1, None), ("item_id", 1, None), ("rating", 1, 5), ("timestamp", 0, 2 ** 40))
    for line, fields in enumerate(ratings, 2):
        table[line - 2] = [_int(t, "ml-100k.inter", line, f, lo, hi) for t, (f, lo, hi) in zip(fields, limits)]
    for column, described, what in ((0, users, "ml-100k.user"), (1, items, "ml-100k.item")):
        missing = ~np.isin(table[:, column], np.fromiter(described, dtype=np.int64))
        if missing.any():
            row = int(np.flatnonzero(missing)[0])
            raise UsageError(f"ml-100k.inter: line {row + 2}: {HEADERS['ml-100k.inter'][column]} "
                             f"{int(table[row, column])} is not in {what}")
    return MovieLens(table[:, 0].copy(), table[:, 1].copy(), table[:, 2].copy(), table[:, 3].copy(),
                     users, items, digests)


def load(source: str | Path, expected: dict[str, str] = ML100K) -> MovieLens:
    """Read, check against the pinned digests, parse (UsageError, and nothing written, on any problem)."""
    members = read_members(source)
    return parse(members, check_digests(members, expected, str(source)))
