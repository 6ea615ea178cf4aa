"""A dataset folder describes itself: the manifest's `dataset` section, checked, and opened as a preset's data.

Every dataset folder's manifest.json (gemref/data/manifest.py) carries, beside its shards, a
`dataset` section saying what the model needs from the data (data/README.md documents it):

    "dataset": {"format": 1, "name": "movielens-100k",
                "vocab": {"item": 1682, "action": 5, "time_gap": 26, "sparse": [943, 7, 2, 21, 9]},
                "n_sparse": 5, "n_dense": 19, "max_len": 512,
                "train_lengths": [101 percentiles of the train split's history lengths],
                "labels": {"click": {"name": "like", "means": "rating >= 4"},
                           "conversion": {"name": "five_stars", "means": "rating == 5"}},
                "sparse_names": [...], "dense_names": [...],           (optional)
                "source": {"origin": ..., "licence": ..., "citation": ...},  (optional, text)
                "conversion": {...}}                                   (optional, how it was made)

`check_section` validates it (a UsageError naming the manifest and the field); `open_dataset`
checks a folder's manifest and returns its `DatasetFolder` (gemref/data/config.py), which
gemref/train/presets.py `dataset_preset` puts under a preset's architecture. The folder is only read, never written:
its shards are verified against the manifest without caching the digests in it
(gemref/train/compose.py `setup`), and `check_unchanged` refuses a manifest that changed since
it was opened. The synthetic generator and the MovieLens converter write the section with
`describe`.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from ..errors import UsageError
from .config import DatasetFolder, DataShape
from .manifest import MANIFEST, load_manifest, read_manifest_bytes, sha256_file

SECTION = "dataset"
FORMAT = 1
SPLITS = ("train", "eval")
LABEL_COLUMNS = ("click", "conversion")
PERCENTILES = tuple(range(101))


def length_percentiles(lengths: np.ndarray) -> list[int]:
    """The 101 percentiles (0, 1, ..., 100) of history lengths, rounded down to whole events."""
    return [int(v) for v in np.floor(np.percentile(np.asarray(lengths, dtype=np.float64), PERCENTILES))]


def describe(cfg: DataShape, *, name: str, labels: dict[str, tuple[str, str]], train_lengths: np.ndarray,
             max_len: int, sparse_names: list[str] | None = None, dense_names: list[str] | None = None,
             source: dict[str, str] | None = None, conversion: dict | None = None) -> dict:
    """A `dataset` section for data with `cfg`'s vocab sizes and feature counts; `labels` maps
    click/conversion to (name, meaning); `max_len` is the longest history written."""
    section = {"format": FORMAT, "name": name,
               "vocab": {"item": cfg.item_vocab, "action": cfg.action_vocab, "time_gap": cfg.time_buckets,
                         "sparse": list(cfg.sparse_vocab)},
               "n_sparse": cfg.n_sparse, "n_dense": cfg.n_dense, "max_len": max(1, int(max_len)),
               "train_lengths": length_percentiles(train_lengths),
               "labels": {col: {"name": n, "means": m} for col, (n, m) in labels.items()}}
    for key, value in (("sparse_names", sparse_names), ("dense_names", dense_names), ("source", source),
                       ("conversion", conversion)):
        if value is not None:
            section[key] = value
    check_section(section, "describe")
    return section


def _int(value, where: str, low: int = 1) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise UsageError(f"{where} must be an integer >= {low}, got {value!r}")
    return value


def _text(value, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise UsageError(f"{where} must be a non-empty string, got {value!r}")
    return value


def _names(section: dict, key: str, count: int, where: str) -> None:
    if key in section:
        names = section[key]
        if not isinstance(names, list) or len(names) != count or not all(isinstance(n, str) and n for n in names):
            raise UsageError(f"{where}.{key} must be a list of {count} non-empty strings, got {names!r}")


def check_section(section, where: str) -> dict:
    """The dataset section, its schema checked (module doc); a UsageError names the field."""
    if not isinstance(section, dict):
        raise UsageError(f"{where} must be an object describing the data (data/README.md), got "
                         f"{type(section).__name__}")
    if section.get("format") != FORMAT:
        raise UsageError(f"{where}.format must be {FORMAT}, got {section.get('format')!r}")
    _text(section.get("name"), f"{where}.name")
    vocab = section.get("vocab")
    if not isinstance(vocab, dict):
        raise UsageError(f"{where}.vocab must be an object with item, action, time_gap and sparse, got {vocab!r}")
    for key in ("item", "action", "time_gap"):
        _int(vocab.get(key), f"{where}.vocab.{key}")
    sparse = vocab.get("sparse")
    if not isinstance(sparse, list) or not sparse:
        raise UsageError(f"{where}.vocab.sparse must be a non-empty list of vocab sizes, got {sparse!r}")
    for f, v in enumerate(sparse):
        _int(v, f"{where}.vocab.sparse[{f}]")
    if _int(section.get("n_sparse"), f"{where}.n_sparse") != len(sparse):
        raise UsageError(f"{where}.n_sparse is {section['n_sparse']} but vocab.sparse lists {len(sparse)} tables")
    _int(section.get("n_dense"), f"{where}.n_dense")
    max_len = _int(section.get("max_len"), f"{where}.max_len")
    lengths = section.get("train_lengths")
    if (not isinstance(lengths, list) or len(lengths) != len(PERCENTILES)
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in lengths)
            or min(lengths) < 0 or max(lengths) > max_len or any(a > b for a, b in zip(lengths, lengths[1:]))):
        raise UsageError(f"{where}.train_lengths must be the {len(PERCENTILES)} percentiles 0..100 of the train "
                         f"split's history lengths: non-decreasing integers in [0, max_len={max_len}]")
    labels = section.get("labels")
    if not isinstance(labels, dict) or sorted(labels) != sorted(LABEL_COLUMNS):
        raise UsageError(f"{where}.labels must name what each label column means: "
                         '{"click": {"name": ..., "means": ...}, "conversion": {...}}, got '
                         f"{sorted(labels) if isinstance(labels, dict) else labels!r}")
    for col in LABEL_COLUMNS:
        if not isinstance(labels[col], dict):
            raise UsageError(f"{where}.labels.{col} must be an object with name and means")
        _text(labels[col].get("name"), f"{where}.labels.{col}.name")
        _text(labels[col].get("means"), f"{where}.labels.{col}.means")
    _names(section, "sparse_names", len(sparse), where)
    _names(section, "dense_names", section["n_dense"], where)
    if "source" in section:
        source = section["source"]
        if not isinstance(source, dict) or not all(isinstance(v, str) for v in source.values()):
            raise UsageError(f"{where}.source must be an object of text fields (origin, licence, citation)")
    return section


def described_manifest(folder: str | Path) -> tuple[Path, str, dict]:
    """(the resolved folder, its manifest's sha256, the manifest) of a dataset folder whose
    manifest passes the schema checks and has a dataset section and both splits (the manifest
    is read once: the digest is that of the bytes checked)."""
    path = Path(folder)
    if not path.is_dir():
        raise UsageError(f"dataset {folder}: " + ("is a file, not a folder" if path.exists() else "no such folder"))
    path = path.resolve()
    raw = read_manifest_bytes(path)
    manifest = load_manifest(path, raw)
    where = f"{path / MANIFEST}: {SECTION}"
    if SECTION not in manifest:
        raise UsageError(f"{path / MANIFEST}: no '{SECTION}' section saying what the data holds (vocab sizes, "
                         "feature counts, longest history, labels; data/README.md); gemref data generate and "
                         "gemref data movielens write one")
    check_section(manifest[SECTION], where)
    missing = [s for s in SPLITS if s not in manifest["splits"]]
    if missing:
        raise UsageError(f"{path / MANIFEST}: no {' or '.join(missing)} split (a dataset needs {' and '.join(SPLITS)})")
    return path, hashlib.sha256(raw).hexdigest(), manifest


def open_dataset(folder: str | Path) -> DatasetFolder:
    """The folder's dataset description (`described_manifest`'s checks; nothing is written, and
    the shards are verified when a run loads them)."""
    return dataset_folder(*described_manifest(folder))


def dataset_folder(path: Path, digest: str, manifest: dict) -> DatasetFolder:
    """The DatasetFolder of a manifest `described_manifest` returned."""
    section, rows = manifest[SECTION], {s: sum(e["rows"] for e in manifest["splits"][s]) for s in SPLITS}
    labels = section["labels"]
    return DatasetFolder(
        folder=str(path), manifest_sha256=digest, name=section["name"], item_vocab=section["vocab"]["item"],
        action_vocab=section["vocab"]["action"], time_buckets=section["vocab"]["time_gap"],
        sparse_vocab=tuple(section["vocab"]["sparse"]), n_dense=section["n_dense"], max_len=section["max_len"],
        click_label=f"{labels['click']['name']}: {labels['click']['means']}",
        conversion_label=f"{labels['conversion']['name']}: {labels['conversion']['means']}",
        n_train=rows["train"], n_eval=rows["eval"], train_lengths=tuple(section["train_lengths"]))


def check_unchanged(data: DatasetFolder) -> None:
    """UsageError if the folder's manifest is no longer the one `data` was opened from."""
    path = Path(data.folder) / MANIFEST
    try:
        digest = sha256_file(path)
    except OSError as e:
        raise UsageError(f"{path}: cannot be read ({e.strerror})") from None
    if digest != data.manifest_sha256:
        raise UsageError(f"{path}: changed since the run opened it (sha256 {digest[:16]}..., was "
                         f"{data.manifest_sha256[:16]}...)")


def check_lengths(data: DatasetFolder, lengths: np.ndarray) -> None:
    """UsageError if the train split's history lengths are not what the manifest says."""
    actual = length_percentiles(lengths)
    if actual != list(data.train_lengths):
        bad = next(i for i, (a, b) in enumerate(zip(actual, data.train_lengths)) if a != b)
        raise UsageError(f"{Path(data.folder) / MANIFEST}: dataset.train_lengths[{bad}] is "
                         f"{data.train_lengths[bad]}, the train shards' percentile {bad} of history lengths "
                         f"is {actual[bad]} (the manifest does not describe these shards)")


