"""Random batches of chosen lengths: for profiling, benchmarks and tests, where what matters is
the shape of a batch (its history lengths), not the ids in it. A batch "like the preset's data"
draws its lengths from the synthetic length profile or, for a dataset folder, from the train
split's length percentiles that its manifest records. The lengths of one benchmark batch in a
named profile are gemref/data/lengths.py's `make_lengths`."""
from __future__ import annotations

import numpy as np
import torch

from .config import DataConfig, DatasetFolder, DataShape
from .jagged import JaggedBatch, lengths_to_offsets
from .synthetic import draw_lengths


def batch_with_lengths(cfg: DataShape, lengths, seed: int = 0) -> JaggedBatch:
    """A batch of random ids, dense features and labels whose histories have these lengths."""
    g = torch.Generator().manual_seed(seed)
    offsets = lengths_to_offsets(torch.as_tensor(np.asarray(lengths), dtype=torch.int64))
    T, B = int(offsets[-1]), offsets.numel() - 1
    values = torch.stack([torch.randint(0, v, (T,), generator=g)
                          for v in (cfg.item_vocab, cfg.action_vocab, cfg.time_buckets)], dim=1)
    sparse = torch.stack([torch.randint(0, v, (B,), generator=g) for v in cfg.sparse_vocab], dim=1)
    return JaggedBatch(values, offsets, sparse, torch.randn(B, cfg.n_dense, generator=g),
                       torch.randint(0, cfg.item_vocab, (B,), generator=g),
                       torch.randint(0, 2, (B, 2), generator=g).float())


def lengths_from_percentiles(percentiles, n: int, rng: np.random.Generator) -> np.ndarray:
    """(n,) int64 lengths drawn from a distribution given by its 101 percentiles (0..100): a
    uniform draw u in [0, 100] maps to the percentile curve, linearly between the two nearest
    percentiles, rounded to the nearest event count (inverse-CDF sampling)."""
    curve = np.asarray(percentiles, dtype=np.float64)
    u = rng.uniform(0.0, 100.0, size=n)
    return np.rint(np.interp(u, np.arange(curve.size, dtype=np.float64), curve)).astype(np.int64)


def representative_batch(cfg: DataShape, data: DataConfig | DatasetFolder, batch_size: int,
                         device: torch.device | str = "cpu", seed: int = 0) -> JaggedBatch:
    """A batch shaped like a preset's data (`preset.model, preset.data`): ids within `cfg`'s
    vocabularies, lengths drawn from `data`'s length profile, or from a dataset folder's
    train-length percentiles (activation memory depends on the lengths, not on the ids)."""
    rng = np.random.default_rng([seed, 4242])
    if isinstance(data, DatasetFolder):
        lengths = lengths_from_percentiles(data.train_lengths, batch_size, rng)
    else:
        lengths = draw_lengths(data.length_profile, batch_size, cfg.max_len, min(data.median_len, cfg.max_len),
                               data.len_sigma, rng)
    return batch_with_lengths(cfg, lengths, seed).to(device)
