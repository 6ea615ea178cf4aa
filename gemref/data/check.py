"""`gemref data check DIR`: validate a dataset folder the way a run would, and summarise what it holds.

Everything a run checks is checked here, without writing into the folder: the manifest's schema
and dataset section (gemref/data/folder.py), every shard's size, row count and sha256, every
value of every row against the section's vocab sizes, feature counts and longest history
(gemref/data/schema.py), and the train split's length percentiles against the section's. The
summary: rows, shards and history tokens per split, the history length distribution, the
label rates under the labels' names, and how much of each vocabulary the data uses.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .folder import SECTION, SPLITS, check_lengths, dataset_folder, described_manifest
from .loader import EventDataset
from .manifest import verified_shards

LENGTH_QUANTILES = (0.5, 0.9, 0.99)


def split_row(split: str, data: EventDataset, shards: int, labels: dict) -> dict:
    """Rows, tokens, the history length distribution and the label rates of one split."""
    lengths = data.lengths
    row = {"split": split, "shards": shards, "rows": len(data), "tokens": int(lengths.sum()),
           "len_min": int(lengths.min()), "len_mean": float(lengths.mean())}
    row.update({f"len_p{round(q * 100)}": float(np.quantile(lengths, q)) for q in LENGTH_QUANTILES})
    row["len_max"] = int(lengths.max())
    for t, column in enumerate(("click", "conversion")):
        row[f"{labels[column]['name']}_rate"] = float(data.labels[:, t].mean())
    return row


def vocab_rows(sets: list[EventDataset], section: dict) -> list[dict]:
    """Per table: its vocab size, the distinct ids the data uses (all splits) and their share."""
    names = section.get("sparse_names") or [f"sparse_{f}" for f in range(section["n_sparse"])]
    used = {"item (history + candidate)": np.unique(np.concatenate([np.r_[d.history[:, 0], d.ad_ids] for d in sets])),
            "action": np.unique(np.concatenate([d.history[:, 1] for d in sets])),
            "time_gap": np.unique(np.concatenate([d.history[:, 2] for d in sets]))}
    vocab = {"item (history + candidate)": section["vocab"]["item"], "action": section["vocab"]["action"],
             "time_gap": section["vocab"]["time_gap"]}
    for f, name in enumerate(names):
        key = f"sparse_{f} ({name})" if name != f"sparse_{f}" else name
        used[key] = np.unique(np.concatenate([d.sparse[:, f] for d in sets]))
        vocab[key] = section["vocab"]["sparse"][f]
    return [{"table": k, "vocab": vocab[k], "ids_used": int(v.size), "share_used": v.size / vocab[k]}
            for k, v in used.items()]


def check_folder(folder: str | Path) -> dict:
    """Validate `folder` (module doc) and return its summary: the dataset description, per-split
    rows, vocab use, and the section's source and label meanings (UsageError on any problem)."""
    path, digest, manifest = described_manifest(folder)
    data = dataset_folder(path, digest, manifest)
    section = manifest[SECTION]
    sets, rows = [], []
    for split in SPLITS:
        shards = verified_shards(path, split, remember=False, manifest=manifest)
        sets.append(EventDataset(shards, data))       # a DatasetFolder is the data's half of a ModelConfig
        rows.append(split_row(split, sets[-1], len(shards), section["labels"]))
    check_lengths(data, sets[0].lengths)
    return {"kind": "dataset_check", "folder": str(path), "manifest_sha256": digest, "name": data.name,
            "labels": data.labels, "n_sparse": data.n_sparse, "n_dense": data.n_dense, "max_len": data.max_len,
            "splits": rows, "vocab": vocab_rows(sets, section), "source": section.get("source", {}),
            "conversion": section.get("conversion", {})}


def split_lengths(folder: str | Path, split: str = "train") -> np.ndarray:
    """(N,) history length of every row of a split of a checked dataset folder (never written)."""
    path, digest, manifest = described_manifest(folder)
    shards = verified_shards(path, split, remember=False, manifest=manifest)
    return EventDataset(shards, dataset_folder(path, digest, manifest)).lengths
