"""Generated datasets on disk: Parquet shards per split plus manifest.json.

`generate_dataset` writes them (each file atomically, via a temp file and rename; the manifest
last, so an interrupted generation leaves no dataset: it removes the shards it wrote);
`ensure_dataset` reuses a folder whose manifest matches the config and whose shards pass the
manifest's checks (gemref/data/manifest.py), and regenerates it otherwise: these folders are
gemref's own cache, a deterministic function of the config. (A dataset folder given with
`--dataset` is never regenerated nor written: gemref/data/folder.py.) The manifest records, per
shard, rows, bytes, sha256, history tokens and label rates, and describes the data in its
`dataset` section (gemref/data/folder.py), so a generated folder also trains with `--dataset`.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import shutil
import tempfile
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
from tqdm import tqdm

from ..env import env_folder
from ..errors import UsageError
from .config import DataConfig, DataShape
from .manifest import load_manifest, verified_shards, write_manifest
from .schema import SCHEMA_VERSION, samples_to_table

log = logging.getLogger(__name__)

GENERATOR_VERSION = 2   # 2: the manifest's dataset section


def dataset_fingerprint(model: DataShape, data: DataConfig) -> dict:
    """What the generated files depend on (JSON-normalised, so it compares with a loaded manifest)."""
    fp = {"schema_version": SCHEMA_VERSION, "generator_version": GENERATOR_VERSION, "data": asdict(data),
          "vocab": {"item_vocab": model.item_vocab, "action_vocab": model.action_vocab,
                    "time_buckets": model.time_buckets, "sparse_vocab": list(model.sparse_vocab),
                    "n_dense": model.n_dense, "max_len": model.max_len}}
    return json.loads(json.dumps(fp))


def min_dataset_bytes(model: DataShape, data: DataConfig) -> int:
    """A lower bound of a dataset's size on disk (bytes): its float32 dense features at 2 bytes
    each (random floats; zstd keeps well over half of them), every other column left out."""
    return (data.n_train + data.n_eval) * model.n_dense * 2


def check_disk_space(model: DataShape, data: DataConfig, out_dir: Path) -> None:
    """UsageError, before any shard is written, when the folder's disk cannot hold the dataset."""
    folder = out_dir.absolute()
    while not folder.exists():
        folder = folder.parent
    need, free = min_dataset_bytes(model, data), shutil.disk_usage(folder).free
    if need > free:
        raise UsageError(f"{out_dir}: n_train + n_eval = {data.n_train + data.n_eval:,} rows need at least "
                         f"{need / 1e9:,.1f} GB (their dense features alone), {folder} has {free / 1e9:,.1f} GB free")


def generate_dataset(model: DataShape, data: DataConfig, out_dir: str | Path, *,
                     progress: bool = False) -> dict:
    """Write train/eval shards and manifest.json into out_dir; return the manifest."""
    out = Path(out_dir)
    check_disk_space(model, data, out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "manifest.json").unlink(missing_ok=True)     # no dataset here until the new manifest is written
    written: list[Path] = []
    try:
        return _generate(model, data, out, written, progress)
    except BaseException:          # interrupted or failed: the shards of this call go too (complete or absent)
        for path in written:
            path.unlink(missing_ok=True)
        raise


def _generate(model: DataShape, data: DataConfig, out: Path, written: list[Path], progress: bool) -> dict:
    from .folder import describe       # generating only: a cached dataset is read without them
    from .synthetic import Teacher
    teacher = Teacher.create(model, data)
    splits: dict[str, list[dict]] = {}
    train_lengths = []
    jobs = [(split, i, min(data.shard_rows, total - i * data.shard_rows))
            for split, total in (("train", data.n_train), ("eval", data.n_eval))
            for i in range(-(-total // data.shard_rows))]
    for split, shard, rows in tqdm(jobs, desc="generate", disable=not progress, unit="shard"):
        s = teacher.draw(model, data, split, shard, rows)
        path = out / f"{split}-{shard:05d}.parquet"
        fd, tmp = tempfile.mkstemp(dir=out, prefix=f".{path.name}.", suffix=".tmp")
        os.close(fd)
        try:
            pq.write_table(samples_to_table(s, model.n_sparse), tmp, compression="zstd")
            os.replace(tmp, path)
            written.append(path)
        finally:
            Path(tmp).unlink(missing_ok=True)
        if split == "train":
            train_lengths.append(np.diff(s["offsets"]))
        splits.setdefault(split, []).append({
            "file": path.name, "tokens": int(s["offsets"][-1]),
            "click_rate": float(s["click"].mean()), "conversion_rate": float(s["conversion"].mean())})
    section = describe(model, name=f"synthetic ({data.length_profile} lengths, seed {data.seed})",
                       labels={"click": ("click", "a click drawn from the hidden teacher (gemref/data/synthetic.py)"),
                               "conversion": ("conversion", "a conversion drawn from the teacher")},
                       train_lengths=np.concatenate(train_lengths), max_len=model.max_len,
                       source={"origin": "generated by gemref (gemref/data/synthetic.py)"})
    return write_manifest(out, splits, {**dataset_fingerprint(model, data), "dataset": section})


def shard_paths(folder: str | Path, split: str) -> list[Path]:
    """The shards of `split`, confined to `folder` and verified against its manifest."""
    return verified_shards(folder, split)


def fingerprint_hash(model: DataShape, data: DataConfig) -> str:
    """8 hex digits naming a dataset folder, so different configs never share one."""
    text = json.dumps(dataset_fingerprint(model, data), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:8]


@contextmanager
def _folder_lock(folder: Path):
    """An exclusive lock, so parallel processes (pytest-xdist, ranks) generate a folder once."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        lock = open(folder / ".lock", "w")
    except OSError as e:     # the data folder the user chose (--data, $GEMREF_DATA_DIR) cannot be written
        raise UsageError(f"data folder {folder}: cannot create it or write in it ({e.strerror}); "
                         "choose another with --data DIR or $GEMREF_DATA_DIR") from None
    with lock as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def ensure_dataset(model: DataShape, data: DataConfig, out_dir: str | Path, *,
                   progress: bool = False) -> dict:
    """Reuse out_dir when its manifest matches (model vocab, data config, versions); else generate."""
    folder = Path(out_dir)
    with _folder_lock(folder):
        if (folder / "manifest.json").exists():
            try:
                manifest = load_manifest(folder)
                if all(manifest.get(k) == v for k, v in dataset_fingerprint(model, data).items()):
                    for split in manifest["splits"]:
                        verified_shards(folder, split)
                    return manifest
            except ValueError as e:
                log.warning("regenerating %s: %s", folder, e)
        return generate_dataset(model, data, folder, progress=progress)


PROJECT_ROOT = Path(__file__).resolve().parents[2]   # the source checkout, when run from one


def default_data_root() -> Path:
    """$GEMREF_DATA_DIR, else data/generated in a source checkout, else ~/.cache/gemref/data."""
    root = env_folder("GEMREF_DATA_DIR")
    if root is not None:
        return root
    if (PROJECT_ROOT / "pyproject.toml").exists():
        return PROJECT_ROOT / "data" / "generated"
    return Path.home() / ".cache" / "gemref" / "data"


def dataset_dir(name: str, model: DataShape, data: DataConfig, data_root: str | Path | None = None) -> Path:
    """Where the synthetic data of preset `name` (its `model`, `data`) is cached: `data_root`, else
    `default_data_root()`, then NAME-FINGERPRINT, so a changed config never reads stale shards."""
    root = Path(data_root) if data_root else default_data_root()
    return root / f"{name}-{fingerprint_hash(model, data)}"
