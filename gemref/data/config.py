"""A preset's data: the synthetic generator's settings (DataConfig), or a dataset folder from
outside (DatasetFolder), what its manifest says the model needs. Both import only
gemref/config/'s helpers (never torch).

`gemref train --dataset DIR` (and the waterfall, the benches, the chapters) train on a folder
of Parquet shards in the documented schema (data/README.md) with a manifest whose `dataset`
section describes the data (gemref/data/folder.py reads and checks it). That section becomes
a `DatasetFolder`, the `data` of the preset the run trains (in place of the synthetic
generator's `DataConfig`), so the run record's config names the folder, its manifest's
sha256 and what the two label columns mean, and the model's vocab sizes, feature counts and
`max_len` come from the data (`gemref.train.presets.preset_on_dataset`).

`DataShape` is what the data code reads of a model's config (vocab sizes, feature counts,
max_len): a ModelConfig and a DatasetFolder both have it, so data/ takes any of them
and never imports the model (which sits above it: docs/design.md, Layers).

`default_workers` says how many DataLoader worker processes a loader on a device gets when the
caller does not say (gemref/data/loader.py make_loader).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Protocol

from ..config.checks import at_least, check_seed, one_of, positive
from ..config.values import check_field_types
from ..errors import UsageError

LENGTH_PROFILES = ("skewed", "uniform", "fixed")   # DataConfig.length_profile (gemref/data/synthetic.py)

# The loader's workers when a caller does not say (make_loader's num_workers=None). A batch is
# built on the host (EventDataset.__getitems__: numpy gathers of the jagged history, the longest
# length read there). On CUDA the host is otherwise idle while the GPU runs a step, so
# CUDA_WORKERS processes build batches ahead, PREFETCH_BATCHES each, which the loader pins for a
# non-blocking copy: the next batch is ready when the step ends. (TorchRec's DLRM example reads
# its in-memory Criteo arrays in the main process and hides the copy with TrainPipelineSparseDist's
# side stream instead; gemref's loop has no such pipeline, so workers do the overlapping.) On a
# CPU the cores a worker would use run the step itself: 0 workers, the batch built in line.
CUDA_WORKERS = 2
PREFETCH_BATCHES = 2      # torch DataLoader's prefetch_factor: batches built ahead per worker


def default_workers(device_type: str, cores: int | None = None, local_ranks: int | None = None) -> int:
    """DataLoader worker processes for a loader feeding `device_type`: CUDA_WORKERS on CUDA, at
    most what this host's cores leave each local rank beside its own process (cores //
    local_ranks - 1; cores: os.cpu_count(), local_ranks: torchrun's LOCAL_WORLD_SIZE, else 1);
    0 on any other device."""
    if device_type != "cuda":
        return 0
    cores = cores if cores is not None else (os.cpu_count() or 1)
    if local_ranks is None:
        text = os.environ.get("LOCAL_WORLD_SIZE", "1")
        local_ranks = int(text) if text.isdigit() and int(text) > 0 else 1
    return max(0, min(CUDA_WORKERS, cores // local_ranks - 1))


class DataShape(Protocol):
    """The data's half of a ModelConfig: what a batch, a shard or a generator is sized and checked by."""

    item_vocab: int                # ids of the history's items and of the candidate (one table)
    action_vocab: int              # action types of history events
    time_buckets: int              # time-gap buckets of history events
    sparse_vocab: tuple[int, ...]  # one table per non-sequence categorical feature
    n_dense: int                   # dense float features per sample
    max_len: int                   # longest history (events)

    @property
    def n_sparse(self) -> int: ...


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


@dataclass(frozen=True)
class DataConfig:
    """Synthetic ads-event data (gemref/data/synthetic.py)."""

    n_train: int
    n_eval: int
    shard_rows: int = 4096
    length_profile: str = "skewed"   # skewed (log-normal, heavy tail to max_len), uniform, fixed
    median_len: int = 32             # median history length of the skewed profile (events)
    len_sigma: float = 1.1           # log-normal sigma of the skewed profile (tail weight)
    zipf_a: float = 1.2              # Zipf exponent of categorical ids
    pos_rate: float = 0.2            # target base rate of the click label
    seed: int = 0

    def __post_init__(self) -> None:
        check_field_types(self)
        one_of("length_profile", self.length_profile, LENGTH_PROFILES)
        at_least(self, 1, "n_train", "n_eval", "shard_rows", "median_len")
        check_seed(self)                             # numpy's generators take seeds >= 0
        # log-normal lengths need sigma > 0; the truncated-Pareto id sampler needs a > 0 (a = 0
        # would be uniform ids, a < 0 would favour the rarest ids: not a Zipf law)
        positive(self, "len_sigma", "zipf_a")
        if not 0.0 < self.pos_rate < 1.0:
            raise UsageError(f"DataConfig.pos_rate must be in (0, 1), got {self.pos_rate}")
