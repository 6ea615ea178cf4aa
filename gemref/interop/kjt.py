"""JaggedBatch <-> TorchRec KeyedJaggedTensor, lossless both ways.

A JaggedBatch's ids become one KeyedJaggedTensor (B samples per key), in this key order:
  * history sequence features `item`, `action`, `time_gap` (HISTORY_FIELDS): sample b has its
    history's length under each key, the same for all three, 0 for an empty history;
  * non-sequence ids `sparse_0` .. `sparse_{F-1}` and the candidate `ad`: length 1 per sample.
`dense` and `labels` are not ids and stay outside the KJT: `kjt_to_batch` takes them back.
Each key's JaggedTensor has int64 `offsets()` (B+1,) and `values()` in sample order, the
layout `gemref.attention.gdpa` takes. Mismatched inputs are a ValueError naming what differs;
nothing is clamped, truncated or dropped (int32 ids from TorchRec widen to int64). TorchRec is imported on first use (lib.py).
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..data.jagged import HISTORY_FIELDS, JaggedBatch, check_offsets, lengths_to_offsets, offsets_to_lengths
from .lib import torchrec

AD_KEY = "ad"


def sparse_keys(n_sparse: int) -> tuple[str, ...]:
    return tuple(f"sparse_{f}" for f in range(n_sparse))


def feature_keys(n_sparse: int) -> tuple[str, ...]:
    """The KJT keys of a batch with `n_sparse` non-sequence features, in batch_to_kjt's order."""
    return HISTORY_FIELDS + sparse_keys(n_sparse) + (AD_KEY,)


def _check_ids(name: str, t, shape: tuple) -> None:
    if not isinstance(t, Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != torch.int64:
        raise ValueError(f"{name} must be int64 ids, got {t.dtype}")
    if t.dim() != len(shape) or any(s is not None and t.shape[i] != s for i, s in enumerate(shape)):
        raise ValueError(f"{name} must have shape {tuple('*' if s is None else s for s in shape)}, "
                         f"got {tuple(t.shape)}")


def batch_to_kjt(batch: JaggedBatch):
    """The batch's ids as one KeyedJaggedTensor (keys: `feature_keys(F)`, stride B, int64)."""
    if not isinstance(batch, JaggedBatch):
        raise ValueError(f"batch_to_kjt takes a JaggedBatch, got {type(batch).__name__}")
    _check_ids("offsets", batch.offsets, (None,))
    B = batch.offsets.numel() - 1
    if B < 1:
        raise ValueError("empty batch: offsets has no samples")
    _check_ids("values", batch.values, (None, len(HISTORY_FIELDS)))
    check_offsets(batch.offsets, batch.values.shape[0])
    _check_ids("sparse_ids", batch.sparse_ids, (B, None))
    _check_ids("ad_ids", batch.ad_ids, (B,))
    F = batch.sparse_ids.shape[1]
    lengths = offsets_to_lengths(batch.offsets)
    ones = torch.ones(B * (F + 1), dtype=torch.int64, device=lengths.device)
    values = torch.cat([batch.values.t().reshape(-1), batch.sparse_ids.t().reshape(-1), batch.ad_ids])
    return torchrec().KeyedJaggedTensor(keys=list(feature_keys(F)), values=values,
                                        lengths=torch.cat([lengths.repeat(len(HISTORY_FIELDS)), ones]), stride=B)


def _per_key(kjt) -> dict:
    """{key: JaggedTensor}, after checking the KJT is one gemref can read."""
    if not isinstance(kjt, torchrec().KeyedJaggedTensor):
        raise ValueError(f"expected a KeyedJaggedTensor, got {type(kjt).__name__}")
    if kjt.weights_or_none() is not None:
        raise ValueError("the KeyedJaggedTensor carries weights, which a JaggedBatch has no field for")
    keys = list(kjt.keys())
    if len(set(keys)) != len(keys):
        raise ValueError(f"duplicate keys in the KeyedJaggedTensor: {keys}")
    F = sum(k.startswith("sparse_") for k in keys)
    missing = [k for k in feature_keys(F) if k not in keys]
    extra = [k for k in keys if k not in feature_keys(F)]
    if missing or extra:
        raise ValueError(f"KeyedJaggedTensor keys {keys} do not match a batch's {list(feature_keys(F))}: "
                         f"missing {missing}, unexpected {extra}")
    if kjt.values().dtype not in (torch.int64, torch.int32):
        raise ValueError(f"KeyedJaggedTensor values must be integer ids, got {kjt.values().dtype}")
    return kjt.to_dict()


def kjt_to_batch(kjt, dense: Tensor, labels: Tensor) -> JaggedBatch:
    """The inverse of batch_to_kjt: a JaggedBatch from a KJT of `feature_keys(F)` (any key order)
    plus the batch's dense (B, n_dense) features and (B, 2) labels."""
    per_key = _per_key(kjt)
    B = kjt.stride()
    if B < 1:
        raise ValueError("empty batch: the KeyedJaggedTensor has stride 0")
    for name, t, cols in (("dense", dense, None), ("labels", labels, 2)):
        if not isinstance(t, Tensor) or t.dim() != 2 or t.shape[0] != B or (cols and t.shape[1] != cols):
            shape = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
            raise ValueError(f"{name} must be ({B}, {cols or 'n_dense'}) for the KJT's {B} samples, got {shape}")
    lengths = per_key[HISTORY_FIELDS[0]].lengths().to(torch.int64)
    for key in HISTORY_FIELDS[1:]:
        other = per_key[key].lengths().to(torch.int64)
        if not torch.equal(other, lengths):
            b = int(torch.nonzero(other != lengths)[0, 0])
            raise ValueError(f"history key {key!r} has length {int(other[b])} at sample {b}, "
                             f"{HISTORY_FIELDS[0]!r} has {int(lengths[b])}: history keys must agree")
    F = sum(k.startswith("sparse_") for k in per_key)
    for key in sparse_keys(F) + (AD_KEY,):
        bad = torch.nonzero(per_key[key].lengths() != 1)
        if bad.numel():
            b = int(bad[0, 0])
            raise ValueError(f"non-sequence key {key!r} has {int(per_key[key].lengths()[b])} ids at sample {b}, "
                             "expected exactly 1")
    values = torch.stack([per_key[k].values().to(torch.int64) for k in HISTORY_FIELDS], dim=1)
    sparse = [per_key[k].values().to(torch.int64) for k in sparse_keys(F)]
    sparse_ids = torch.stack(sparse, dim=1) if sparse else values.new_zeros((B, 0))
    return JaggedBatch(values, lengths_to_offsets(lengths), sparse_ids, dense,
                       per_key[AD_KEY].values().to(torch.int64), labels)
