"""JaggedBatch: a batch of ads events whose user histories have different lengths.

The history is stored jagged, as in FBGEMM / torchrec: `values` holds every event of every
sample back to back, and `offsets` (B+1,) says where each sample starts, so sample b owns
rows `values[offsets[b]:offsets[b+1]]`. No padding is stored; `pad` / `unpad` convert to
and from the (B, max_len, ...) layout when a padded baseline wants it.

Validation is strict (docs/design.md): bad offsets, ids out of range, non-finite dense features
and empty batches raise ValueError naming the field and the first bad index. Nothing is
clamped or dropped.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Sequence

import torch
from torch import Tensor

# Columns of `JaggedBatch.values`, one history event per row.
HISTORY_FIELDS = ("item", "action", "time_gap")


def check_offsets(offsets: Tensor, total: int, name: str = "offsets") -> None:
    """Raise ValueError unless `offsets` is 1-D int64, starts at 0, is non-decreasing and ends at `total`."""
    if offsets.dim() != 1 or offsets.numel() < 1:
        raise ValueError(f"{name} must be 1-D with B+1 >= 1 entries, got shape {tuple(offsets.shape)}")
    if offsets.dtype != torch.int64:
        raise ValueError(f"{name} must be int64, got {offsets.dtype}")
    if int(offsets[0]) != 0:
        raise ValueError(f"{name}[0] must be 0, got {int(offsets[0])}")
    steps = offsets_to_lengths(offsets)
    bad = torch.nonzero(steps < 0)
    if bad.numel():
        i = int(bad[0, 0]) + 1
        raise ValueError(f"{name} must be non-decreasing: {name}[{i}]={int(offsets[i])} < {name}[{i - 1}]={int(offsets[i - 1])}")
    if int(offsets[-1]) != total:
        raise ValueError(f"{name}[-1]={int(offsets[-1])} does not match the number of rows T={total}")


def check_ids(ids: Tensor, vocab: int, name: str) -> None:
    """Raise ValueError naming the first id outside [0, vocab)."""
    bad = torch.nonzero((ids < 0) | (ids >= vocab))
    if bad.numel():
        idx = tuple(int(i) for i in bad[0])
        raise ValueError(f"{name}{list(idx)}={int(ids[idx])} is outside the table's vocab [0, {vocab})")


def check_finite(x: Tensor, name: str) -> None:
    bad = torch.nonzero(~torch.isfinite(x))
    if bad.numel():
        idx = tuple(int(i) for i in bad[0])
        raise ValueError(f"{name}{list(idx)}={float(x[idx])} is not finite")


def offsets_to_lengths(offsets: Tensor) -> Tensor:
    """(B+1,) offsets -> (B,) lengths (the one place this subtraction is written)."""
    return offsets[1:] - offsets[:-1]


def lengths_to_offsets(lengths: Tensor) -> Tensor:
    """(B,) lengths -> (B+1,) int64 offsets."""
    return torch.cat([lengths.new_zeros(1), torch.cumsum(lengths, 0)]).to(torch.int64)


def pad(values: Tensor, offsets: Tensor, max_len: int) -> tuple[Tensor, Tensor]:
    """Jagged (T, ...) -> padded (B, max_len, ...) with zeros, plus the (B, max_len) bool mask of real rows.

    A sequence longer than `max_len` is a ValueError (padding never truncates silently).
    """
    lengths = offsets_to_lengths(offsets)
    B = lengths.numel()
    if B and int(lengths.max()) > max_len:
        b = int(torch.argmax(lengths))
        raise ValueError(f"sequence {b} has length {int(lengths[b])} > max_len={max_len}")
    positions = torch.arange(max_len, device=values.device)
    mask = positions[None, :] < lengths[:, None]
    out = values.new_zeros((B, max_len) + tuple(values.shape[1:]))
    out[mask] = values
    return out, mask


def unpad(padded: Tensor, offsets: Tensor) -> Tensor:
    """Padded (B, L, ...) -> jagged (T, ...), the inverse of `pad` (rows in sample order)."""
    lengths = offsets_to_lengths(offsets)
    positions = torch.arange(padded.shape[1], device=padded.device)
    return padded[positions[None, :] < lengths[:, None]]


def segment_ids(offsets: Tensor, total: int) -> Tensor:
    """(T,) index of the sample that owns each row."""
    lengths = offsets_to_lengths(offsets)
    return torch.repeat_interleave(torch.arange(lengths.numel(), device=offsets.device), lengths,
                                   output_size=total)


@dataclass
class JaggedBatch:
    """One training batch. Shapes: B samples, T history events in total, F sparse features."""

    values: Tensor      # (T, 3) int64: item id, action type, time-gap bucket of each history event
    offsets: Tensor     # (B+1,) int64: sample b owns values[offsets[b]:offsets[b+1]]
    sparse_ids: Tensor  # (B, F) int64: one id per non-sequence categorical table
    dense: Tensor       # (B, n_dense) float32 dense features
    ad_ids: Tensor      # (B,) int64: the candidate ad (an item id)
    labels: Tensor      # (B, 2) float32: click, conversion in {0, 1}

    @property
    def batch_size(self) -> int:
        return self.offsets.numel() - 1

    @property
    def num_tokens(self) -> int:
        return self.values.shape[0]

    @property
    def lengths(self) -> Tensor:
        return offsets_to_lengths(self.offsets)

    def validate(self, item_vocab: int, action_vocab: int, time_buckets: int,
                 sparse_vocab: Sequence[int], n_dense: int) -> "JaggedBatch":
        """Check every contract of docs/design.md; return self so calls chain."""
        B = self.batch_size
        if B < 1:
            raise ValueError("empty batch: offsets has no samples")
        if self.values.dim() != 2 or self.values.shape[1] != len(HISTORY_FIELDS):
            raise ValueError(f"values must be (T, {len(HISTORY_FIELDS)}), got {tuple(self.values.shape)}")
        check_offsets(self.offsets, self.values.shape[0])
        for j, (name, vocab) in enumerate(zip(HISTORY_FIELDS, (item_vocab, action_vocab, time_buckets))):
            check_ids(self.values[:, j], vocab, f"history.{name}")
        F = len(sparse_vocab)
        if tuple(self.sparse_ids.shape) != (B, F):
            raise ValueError(f"sparse_ids must be ({B}, {F}), got {tuple(self.sparse_ids.shape)}")
        for f, vocab in enumerate(sparse_vocab):
            check_ids(self.sparse_ids[:, f], vocab, f"sparse_{f}")
        if tuple(self.dense.shape) != (B, n_dense):
            raise ValueError(f"dense must be ({B}, {n_dense}), got {tuple(self.dense.shape)}")
        check_finite(self.dense, "dense")
        if tuple(self.ad_ids.shape) != (B,):
            raise ValueError(f"ad_ids must be ({B},), got {tuple(self.ad_ids.shape)}")
        check_ids(self.ad_ids, item_vocab, "ad_id")
        if tuple(self.labels.shape) != (B, 2):
            raise ValueError(f"labels must be ({B}, 2), got {tuple(self.labels.shape)}")
        bad = torch.nonzero((self.labels != 0) & (self.labels != 1))
        if bad.numel():
            i, j = (int(x) for x in bad[0])
            raise ValueError(f"labels[{i}, {j}]={float(self.labels[i, j])} is not 0 or 1")
        return self

    def validate_for(self, model_cfg) -> "JaggedBatch":
        """`validate` against a ModelConfig's vocab sizes."""
        return self.validate(model_cfg.item_vocab, model_cfg.action_vocab, model_cfg.time_buckets,
                             model_cfg.sparse_vocab, model_cfg.n_dense)

    def to(self, device: torch.device | str, non_blocking: bool = False) -> "JaggedBatch":
        return JaggedBatch(**{f.name: getattr(self, f.name).to(device, non_blocking=non_blocking)
                              for f in fields(self)})

    def pin_memory(self) -> "JaggedBatch":
        """Called by DataLoader(pin_memory=True) on CUDA hosts."""
        return JaggedBatch(**{f.name: getattr(self, f.name).pin_memory() for f in fields(self)})

    def select(self, indices: Sequence[int] | Tensor) -> "JaggedBatch":
        """A new batch holding the chosen samples, in the given order (for rank partitioning)."""
        idx = torch.as_tensor(indices, dtype=torch.int64, device=self.offsets.device)
        lengths = self.lengths[idx]
        starts = self.offsets[:-1][idx]
        new_offsets = lengths_to_offsets(lengths)
        T = int(new_offsets[-1])
        rows = torch.arange(T, device=idx.device) - torch.repeat_interleave(new_offsets[:-1], lengths, output_size=T)
        rows = rows + torch.repeat_interleave(starts, lengths, output_size=T)
        return JaggedBatch(self.values[rows], new_offsets, self.sparse_ids[idx], self.dense[idx],
                           self.ad_ids[idx], self.labels[idx])

    @staticmethod
    def concat(batches: Sequence["JaggedBatch"]) -> "JaggedBatch":
        """Join batches sample-wise (the inverse of splitting with `select`)."""
        if not batches:
            raise ValueError("concat needs at least one batch")
        lengths = torch.cat([b.lengths for b in batches])
        return JaggedBatch(torch.cat([b.values for b in batches]), lengths_to_offsets(lengths),
                           torch.cat([b.sparse_ids for b in batches]), torch.cat([b.dense for b in batches]),
                           torch.cat([b.ad_ids for b in batches]), torch.cat([b.labels for b in batches]))
