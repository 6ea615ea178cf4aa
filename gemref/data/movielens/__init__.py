"""MovieLens-100K as a gemref dataset folder: fetch the pinned files, convert, write atomically.

MovieLens 100K (943 users, 1,682 movies, 100,000 ratings with timestamps, 1997-98) is
GroupLens Research's data: free for research, NOT to be redistributed without permission, not
for commercial use, cited as Harper & Konstan, "The MovieLens Datasets: History and Context",
ACM TiiS 5(4):19, 2015 (DOI 10.1145/2827872). gemref therefore ships none of it, nor anything
derived from it: `gemref data movielens` fetches the files at run time from PyPI's
`recbole==1.2.1` wheel (atomic.py, fetch.py), checks their sha256, converts them
(convert.py: the task and the split) and writes Parquet shards with a manifest whose dataset
section names the source, the licence terms and the citation. The folder goes under gemref's
data root (ignored by git), or where --out says.

Writing is atomic: everything goes into a temporary folder beside the destination, renamed
into place at the end; a failure (no network, a digest that does not match, a bad file)
leaves nothing. A destination that already holds this very conversion is reused after its
shards are verified (never rewritten); any other non-empty destination is refused, except
gemref's own default folder, which is rebuilt.
"""
from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path

import pyarrow.parquet as pq

from ...errors import UsageError
from ..folder import describe
from ..manifest import MANIFEST, load_manifest, verified_shards, write_manifest
from ..schema import samples_to_table
from ..shards import default_data_root
from .atomic import ML100K, SAMPLE, SAMPLE_DIR, load
from .convert import LABELS, SPARSE_NAMES, build_samples
from .fetch import fetch_wheel

log = logging.getLogger(__name__)

CONVERTER_VERSION = 1
DEFAULT_MAX_HISTORY = 256     # events; the small preset holds up to 512, tiny 64 (convert with --max-history 64)
SHARD_ROWS = 16_384
SOURCE = {"origin": "MovieLens 100K (GroupLens Research, University of Minnesota), the RecBole atomic files "
                    "shipped in PyPI's recbole==1.2.1 wheel (recbole/dataset_example/ml-100k/)",
          "licence": "GroupLens terms: research use only; do not redistribute without separate permission; no "
                     "commercial use without permission; no endorsement implied; acknowledge it in publications",
          "citation": "F. Maxwell Harper and Joseph A. Konstan. 2015. The MovieLens Datasets: History and Context. "
                      "ACM Transactions on Interactive Intelligent Systems (TiiS) 5, 4, Article 19. "
                      "DOI 10.1145/2827872"}
SAMPLE_SOURCE = {"origin": "gemref's made-up sample in the ML-100K atomic-file format (gemref/data/movielens/"
                           "sample/): NOT MovieLens data, a few dozen invented ratings for tests and offline chapters",
                 "licence": "gemref's own (BSD-3-Clause)"}


def default_folder(max_history: int = DEFAULT_MAX_HISTORY, *, sample: bool = False) -> Path:
    """<data root>/movielens-100k-h<max_history> (or ml-100k-sample-...), data root as for generated data."""
    return default_data_root() / f"{'ml-100k-sample' if sample else 'movielens-100k'}-v{CONVERTER_VERSION}-h{max_history}"


def _conversion(expected: dict[str, str], max_history: int) -> dict:
    return {"converter": "gemref.data.movielens", "version": CONVERTER_VERSION, "source_sha256": dict(expected),
            "max_history": max_history}


def _existing(out: Path, identity: dict, own_cache: bool) -> dict | None:
    """The manifest of `out` when it already holds this conversion (shards verified, nothing
    written); None when `out` is free (absent or empty). Otherwise a UsageError, except for
    gemref's own default folder, which is removed to be rebuilt."""
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out}: is a file, not a folder")
    if not out.exists() or not any(out.iterdir()):
        return None
    try:
        manifest = load_manifest(out)
        conversion = manifest.get("dataset", {}).get("conversion", {})
        if {k: conversion.get(k) for k in identity} == identity:
            for split in manifest["splits"]:
                verified_shards(out, split, remember=False, manifest=manifest)
            return manifest
        problem = "holds another dataset or conversion"
    except UsageError as e:
        problem = f"does not verify ({e})"
    if not own_cache:
        raise UsageError(f"--out {out}: {problem}; remove it or choose another folder (nothing was written)")
    log.warning("rebuilding %s: it %s", out, problem)
    shutil.rmtree(out)
    return None


def convert(source: str | Path, out: str | Path, *, max_history: int = DEFAULT_MAX_HISTORY, sample: bool = False,
            own_cache: bool = False) -> dict:
    """Convert the ML-100K files in `source` (the recbole wheel or a folder of the three atomic
    files; with sample=True, gemref's made-up sample and its digests) into a dataset folder
    `out`; return its manifest. Nothing is written unless every check passes."""
    if max_history < 1:
        raise UsageError(f"--max-history must be >= 1, got {max_history}")
    expected = SAMPLE if sample else ML100K
    out, identity = Path(out), _conversion(expected, max_history)
    manifest = _existing(out, identity, own_cache)
    if manifest is not None:
        return manifest
    ml = load(source, expected)
    try:
        splits, facts = build_samples(ml, max_history)
    except ValueError as e:
        raise UsageError(f"{source}: {e}") from None
    cfg = facts.pop("sizes")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.tmp-"))
    try:
        listing = {}
        for split, s in splits.items():
            rows = len(s["offsets"]) - 1
            for shard, start in enumerate(range(0, rows, SHARD_ROWS)):
                stop = min(rows, start + SHARD_ROWS)
                part = {k: v[start:stop] for k, v in s.items() if k not in ("offsets", "items", "actions", "gaps")}
                lo, hi = int(s["offsets"][start]), int(s["offsets"][stop])
                part.update(offsets=s["offsets"][start:stop + 1] - lo,
                            **{k: s[k][lo:hi] for k in ("items", "actions", "gaps")})
                name = f"{split}-{shard:05d}.parquet"
                pq.write_table(samples_to_table(part, cfg.n_sparse), tmp / name, compression="zstd")
                listing.setdefault(split, []).append({"file": name, "tokens": hi - lo,
                                                      "click_rate": float(part["click"].mean()),
                                                      "conversion_rate": float(part["conversion"].mean())})
        train = splits["train"]["offsets"]
        section = describe(cfg, name="ml-100k-sample" if sample else "movielens-100k",
                           labels=LABELS, train_lengths=train[1:] - train[:-1], max_len=cfg.max_len,
                           sparse_names=list(SPARSE_NAMES), dense_names=[f"genre:{g}" for g in facts["genres"]],
                           source=SAMPLE_SOURCE if sample else SOURCE,
                           conversion={**identity, **facts,
                                       "split": "per user, by time: the latest max(1, floor(10%)) of each user's "
                                                "ratings are eval, the rest train",
                                       "order": "each user's ratings by timestamp, ties broken by line in "
                                                "ml-100k.inter (file order)",
                                       "history": f"the user's earlier ratings, the latest {max_history} kept",
                                       "row_order": "rows of each split shuffled (numpy seed 0)"})
        manifest = write_manifest(tmp, listing, {"dataset": section})
        try:
            if out.exists():
                out.rmdir()                  # empty when checked above (another process may have filled it since)
            os.rename(tmp, out)
        except OSError:                      # another process converted into `out` meanwhile
            manifest = _existing(out, identity, own_cache=False)
            if manifest is None:
                raise
            shutil.rmtree(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest


def prepare(out: str | Path | None = None, wheel: str | Path | None = None, *,
            max_history: int = DEFAULT_MAX_HISTORY, sample: bool = False, fallback_to_sample: bool = False,
            index_url: str | None = None, say=print) -> tuple[Path, bool]:
    """The converted folder and whether it is the sample: from `wheel` (a file or folder), the
    shipped sample (sample=True), or the pinned wheel fetched into the cache. With
    fallback_to_sample, a fetch that fails says so (through `say`) and converts the sample
    instead (for the chapters: they must run offline)."""
    if not sample and wheel is None:
        try:
            wheel = fetch_wheel(index_url=index_url)
        except UsageError as e:
            if not fallback_to_sample:
                raise
            say(f"MovieLens could not be fetched ({e}). Falling back to gemref's made-up sample in the ML-100K "
                "format: the figures below are NOT MovieLens results.")
            sample = True
    source = SAMPLE_DIR if sample else wheel
    folder = Path(out) if out else default_folder(max_history, sample=sample)
    convert(source, folder, max_history=max_history, sample=sample, own_cache=out is None)
    return folder, sample


def chapter_dataset(spec: str | None, *, max_history: int = DEFAULT_MAX_HISTORY, say=print) -> tuple[Path | None, str]:
    """(folder, what it is) for a chapter's DATASET parameter: None -> (None, "synthetic"), the
    preset's own data; "movielens" -> MovieLens-100K fetched and converted with `max_history`
    (offline: gemref's made-up sample, said through `say`); "sample" -> that sample; anything
    else -> a dataset folder (UsageError when there is none)."""
    if spec is None:
        return None, "synthetic"
    if spec in ("movielens", "sample"):
        folder, is_sample = prepare(max_history=max_history, sample=spec == "sample", fallback_to_sample=True, say=say)
        return folder, "made-up ML-100K-format sample (NOT MovieLens)" if is_sample else "MovieLens-100K"
    if not Path(spec).is_dir():
        raise UsageError(f"DATASET={spec!r}: not movielens, sample, None or a dataset folder")
    return Path(spec), Path(spec).name


__all__ = ["DEFAULT_MAX_HISTORY", "MANIFEST", "chapter_dataset", "convert", "default_folder", "fetch_wheel", "prepare"]
