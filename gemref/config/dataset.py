"""A dataset folder from outside, as a preset's data: what its manifest says the model needs.

`gemref train --dataset DIR` (and the waterfall, the benches, the chapters) train on a folder
of Parquet shards in the documented schema (data/README.md) with a manifest whose `dataset`
section describes the data (gemref/data/folder.py reads and checks it). That section becomes
a `DatasetFolder`, the `data` of the preset the run trains (in place of the synthetic
generator's `DataConfig`), so the run record's config names the folder, its manifest's
sha256 and what the two label columns mean, and the model's vocab sizes, feature counts and
`max_len` come from the data (`gemref.config.preset_on_dataset`).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import UsageError
from .values import check_field_types


@dataclass(frozen=True)
class DatasetFolder:
    """A verified dataset folder: its identity, the data half of a ModelConfig, its splits' sizes."""

    folder: str                    # absolute path of the folder
    manifest_sha256: str           # sha256 of its manifest.json when it was opened
    name: str                      # the dataset's own name (manifest dataset.name)
    item_vocab: int                # ids of the history's items and of the candidate (one table)
    action_vocab: int              # action types of history events
    time_buckets: int              # time-gap buckets of history events
    sparse_vocab: tuple[int, ...]  # one table per non-sequence categorical feature
    n_dense: int                   # dense float features per sample
    max_len: int                   # no history in any split is longer (events): the longest, or the cap it was cut to
    click_label: str               # what the `click` column means, "name: meaning" (e.g. "like: rating >= 4")
    conversion_label: str          # what the `conversion` column means
    n_train: int                   # rows of the train split
    n_eval: int                    # rows of the eval split
    train_lengths: tuple[int, ...]  # percentiles 0, 1, ..., 100 of the train split's history lengths (events)

    def __post_init__(self) -> None:
        check_field_types(self)
        for name in ("item_vocab", "action_vocab", "time_buckets", "n_dense", "max_len", "n_train", "n_eval"):
            if getattr(self, name) < 1:
                raise UsageError(f"{self.folder}: dataset {name} must be >= 1, got {getattr(self, name)}")
        if not self.sparse_vocab or min(self.sparse_vocab) < 1:
            raise UsageError(f"{self.folder}: dataset sparse_vocab needs >= 1 table of vocab >= 1, "
                             f"got {self.sparse_vocab}")
        p = self.train_lengths
        if len(p) != 101 or min(p) < 0 or max(p) > self.max_len or any(a > b for a, b in zip(p, p[1:])):
            raise UsageError(f"{self.folder}: dataset train_lengths must be the 101 percentiles of the train "
                             f"split's history lengths (non-decreasing, in [0, max_len={self.max_len}])")

    @property
    def n_sparse(self) -> int:
        return len(self.sparse_vocab)

    @property
    def labels(self) -> dict[str, str]:
        """{column: "name: meaning"} of the two label columns."""
        return {"click": self.click_label, "conversion": self.conversion_label}
