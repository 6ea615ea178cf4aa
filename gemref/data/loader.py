"""Parquet shards -> JaggedBatch, through a torch DataLoader.

`EventDataset` reads and validates every shard once (files are untrusted: schema.py checks
every value, manifest.py the files themselves) and keeps the split in memory as columnar
arrays (values + offsets). It is a map-style dataset whose `__getitems__` gathers a whole
batch with vectorised numpy, so any batch sampler works: shuffled batches, token-budget
batches, or the load-balanced distributed sampler. Its batches carry `validated_for` (the
model config they were checked against), so the model does not check them again, and their
longest history, read here from numpy, so the model's layout needs no device sync. Workers
share the arrays copy-on-write after fork. On CUDA the loader pins memory (for non-blocking
copies) and, unless told otherwise, builds batches ahead in worker processes
(gemref/data/config.py default_workers: 2 on CUDA, 0 on CPU).
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler, SequentialSampler

from ..errors import UsageError
from .config import PREFETCH_BATCHES, DataShape, default_workers
from .jagged import JaggedBatch, model_contract
from .schema import ShardArrays, table_to_arrays


def read_shard(path: str | Path, cfg: DataShape) -> ShardArrays:
    """Read and validate one Parquet shard; a truncated or foreign file is a ValueError naming it."""
    path = Path(path)
    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as e:
        raise UsageError(f"{path}: cannot read as Parquet ({type(e).__name__}: {e})") from None
    return table_to_arrays(table, cfg, str(path))


class EventDataset(Dataset):
    """All samples of some shards, in memory; `__getitems__(indices) -> JaggedBatch`."""

    def __init__(self, paths: Iterable[str | Path], cfg: DataShape):
        shards = [read_shard(p, cfg) for p in paths]
        if not shards:
            raise UsageError("no shards given")
        lengths = np.concatenate([np.diff(s.offsets) for s in shards])
        self.offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        self.history = np.concatenate([s.history for s in shards])
        self.sparse = np.concatenate([s.sparse for s in shards])
        self.dense = np.concatenate([s.dense for s in shards])
        self.ad_ids = np.concatenate([s.ad_ids for s in shards])
        self.labels = np.concatenate([s.labels for s in shards])
        self.contract = model_contract(cfg)   # what every sample was validated against

    def __len__(self) -> int:
        return len(self.ad_ids)

    @property
    def lengths(self) -> np.ndarray:
        """(N,) history length of every sample (what length-aware samplers need)."""
        return np.diff(self.offsets)

    def __getitems__(self, indices: Sequence[int]) -> JaggedBatch:
        idx = np.asarray(indices, dtype=np.int64)
        if idx.size == 0:
            raise UsageError("empty batch: no indices")
        if idx.min() < 0 or idx.max() >= len(self):
            bad = int(idx[(idx < 0) | (idx >= len(self))][0])
            raise UsageError(f"sample index {bad} out of range [0, {len(self)})")
        starts, lengths = self.offsets[idx], self.offsets[idx + 1] - self.offsets[idx]
        new_offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        rows = np.arange(new_offsets[-1]) - np.repeat(new_offsets[:-1] - starts, lengths)
        return JaggedBatch(values=torch.from_numpy(self.history[rows]),
                           offsets=torch.from_numpy(new_offsets),
                           sparse_ids=torch.from_numpy(self.sparse[idx]),
                           dense=torch.from_numpy(self.dense[idx]),
                           ad_ids=torch.from_numpy(self.ad_ids[idx]),
                           labels=torch.from_numpy(self.labels[idx])).mark_validated(
            self.contract).with_host_max_length(int(lengths.max()))

    def __getitem__(self, index: int) -> JaggedBatch:
        return self.__getitems__([index])


def _whole_batch(batch: JaggedBatch) -> JaggedBatch:
    """collate_fn: `__getitems__` already built the batch (module-level so workers can pickle it)."""
    return batch


def make_loader(dataset: EventDataset, batch_size: int | None = None, *, shuffle: bool = True,
                seed: int = 0, drop_last: bool = True, num_workers: int | None = None,
                device: torch.device | str = "cpu", batch_sampler=None) -> DataLoader:
    """A DataLoader yielding JaggedBatches: shuffled fixed-size batches, or any `batch_sampler`.
    device: where the batches go (CUDA: pinned). num_workers: worker processes building batches
    ahead (PREFETCH_BATCHES each); None: `default_workers(device)`, 2 on CUDA, 0 on CPU. Any
    number of workers yields the same batches in the same order."""
    if batch_sampler is None:
        if batch_size is None or batch_size < 1:
            raise UsageError(f"batch_size must be >= 1, got {batch_size}")
        if drop_last and batch_size > len(dataset):
            raise UsageError(f"batch_size={batch_size} > {len(dataset)} samples: every batch would be dropped")
        generator = torch.Generator().manual_seed(seed)
        sampler = RandomSampler(dataset, generator=generator) if shuffle else SequentialSampler(dataset)
        batch_sampler = BatchSampler(sampler, batch_size, drop_last=drop_last)
    device_type = torch.device(device).type
    workers = default_workers(device_type) if num_workers is None else num_workers
    if workers < 0:
        raise UsageError(f"num_workers must be >= 0, got {workers}")
    # Its own generator for the workers' base seed: a loader draws nothing from torch's global
    # RNG, so creating one (e.g. after a resume) leaves the RNG state a checkpoint restored intact.
    return DataLoader(dataset, batch_sampler=batch_sampler, collate_fn=_whole_batch,
                      num_workers=workers, prefetch_factor=PREFETCH_BATCHES if workers else None,
                      pin_memory=device_type == "cuda", persistent_workers=workers > 0,
                      generator=torch.Generator().manual_seed(seed))
