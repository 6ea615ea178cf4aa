"""JaggedBatch: a batch of ads events whose user histories have different lengths.

The history is stored jagged, as in FBGEMM / torchrec: `values` holds every event of every
sample back to back, and `offsets` (B+1,) says where each sample starts, so sample b owns
rows `values[offsets[b]:offsets[b+1]]`. No padding is stored; `pad` / `unpad` convert to
and from the (B, max_len, ...) layout when a padded baseline wants it.

Validation is strict (docs/design.md): bad offsets, ids out of range, histories longer than
max_len, non-finite dense features and empty batches raise ValueError naming the field and
the first bad index. Nothing is clamped or dropped. A batch built from validated data (the
Parquet loader) carries `validated_for` = `model_contract(cfg)`, so the model's own boundary
check (`check_model_inputs`, called by GEMRef.forward) skips it; any other batch pays one
vectorised check and one host sync.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Sequence

import torch
from torch import Tensor

# Columns of `JaggedBatch.values`, one history event per row.
HISTORY_FIELDS = ("item", "action", "time_gap")


def check_offsets_layout(offsets, name: str = "offsets") -> None:
    """Raise ValueError unless `offsets` is a 1-D int64 tensor with >= 1 entries (no host sync)."""
    if not isinstance(offsets, Tensor):
        raise ValueError(f"{name} must be a 1-D int64 torch.Tensor, got {type(offsets).__name__}")
    if offsets.dim() != 1 or offsets.numel() < 1:
        raise ValueError(f"{name} must be 1-D with B+1 >= 1 entries, got shape {tuple(offsets.shape)}")
    if offsets.dtype != torch.int64:
        raise ValueError(f"{name} must be int64, got {offsets.dtype}")


def check_offsets(offsets: Tensor, total: int, name: str = "offsets") -> None:
    """Raise ValueError unless `offsets` is 1-D int64, starts at 0, is non-decreasing and ends at `total`."""
    check_offsets_layout(offsets, name)
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


def model_contract(cfg) -> tuple:
    """What a batch is validated against: a ModelConfig's vocab sizes, n_dense and max_len."""
    return (cfg.item_vocab, cfg.action_vocab, cfg.time_buckets, tuple(cfg.sparse_vocab), cfg.n_dense,
            cfg.max_len)


TENSOR_FIELDS = ("values", "offsets", "sparse_ids", "dense", "ad_ids", "labels")


@dataclass
class JaggedBatch:
    """One training batch. Shapes: B samples, T history events in total, F sparse features."""

    values: Tensor      # (T, 3) int64: item id, action type, time-gap bucket of each history event
    offsets: Tensor     # (B+1,) int64: sample b owns values[offsets[b]:offsets[b+1]]
    sparse_ids: Tensor  # (B, F) int64: one id per non-sequence categorical table
    dense: Tensor       # (B, n_dense) float32 dense features
    ad_ids: Tensor      # (B,) int64: the candidate ad (an item id)
    labels: Tensor      # (B, 2) float32: click, conversion in {0, 1}
    # model_contract() this batch passed, else None: per instance via `mark_validated`, not a
    # dataclass field, so fields(batch) stays the six tensors
    validated_for: ClassVar[tuple | None] = None
    # The longest history, read on the host where the batch was built (the loader's numpy
    # lengths; `select` on CPU), so the model's layout needs no device sync to size its
    # kernels. None: unknown, and the layout reads it from `offsets` (one sync on a GPU).
    host_max_length: ClassVar[int | None] = None

    @property
    def batch_size(self) -> int:
        return self.offsets.numel() - 1

    @property
    def num_tokens(self) -> int:
        return self.values.shape[0]

    @property
    def lengths(self) -> Tensor:
        return offsets_to_lengths(self.offsets)

    def tensors(self) -> list[Tensor]:
        """The six tensors (TENSOR_FIELDS): what existed before a forward (AutoAC's `inputs`)."""
        return [getattr(self, name) for name in TENSOR_FIELDS]

    def _check_layout(self, F: int, n_dense: int) -> None:
        """Shapes and dtypes (no host sync)."""
        for name in TENSOR_FIELDS:
            if not isinstance(getattr(self, name), Tensor):
                raise ValueError(f"{name} must be a torch.Tensor, got {type(getattr(self, name)).__name__}")
        check_offsets_layout(self.offsets)
        B = self.batch_size
        if B < 1:
            raise ValueError("empty batch: offsets has no samples")
        if self.values.dim() != 2 or self.values.shape[1] != len(HISTORY_FIELDS):
            raise ValueError(f"values must be (T, {len(HISTORY_FIELDS)}), got {tuple(self.values.shape)}")
        for name, shape in (("sparse_ids", (B, F)), ("dense", (B, n_dense)), ("ad_ids", (B,)), ("labels", (B, 2))):
            if tuple(getattr(self, name).shape) != shape:
                raise ValueError(f"{name} must be {shape}, got {tuple(getattr(self, name).shape)}")
        for name in ("values", "sparse_ids", "ad_ids"):
            if getattr(self, name).dtype != torch.int64:
                raise ValueError(f"{name} must be int64 ids, got {getattr(self, name).dtype}")
        if not self.dense.is_floating_point():
            raise ValueError(f"dense must be floating point, got {self.dense.dtype}")

    def validate(self, item_vocab: int, action_vocab: int, time_buckets: int,
                 sparse_vocab: Sequence[int], n_dense: int, max_len: int | None = None) -> "JaggedBatch":
        """Check every contract of docs/design.md; return self so calls chain."""
        self._check_layout(len(sparse_vocab), n_dense)
        check_offsets(self.offsets, self.values.shape[0])
        if max_len is not None:
            lengths = self.lengths
            if int(lengths.max()) > max_len:
                b = int(torch.argmax(lengths))
                raise ValueError(f"sample {b} has {int(lengths[b])} history events > max_len={max_len}")
        for j, (name, vocab) in enumerate(zip(HISTORY_FIELDS, (item_vocab, action_vocab, time_buckets))):
            check_ids(self.values[:, j], vocab, f"history.{name}")
        for f, vocab in enumerate(sparse_vocab):
            check_ids(self.sparse_ids[:, f], vocab, f"sparse_{f}")
        check_finite(self.dense, "dense")
        check_ids(self.ad_ids, item_vocab, "ad_id")
        bad = torch.nonzero((self.labels != 0) & (self.labels != 1))
        if bad.numel():
            i, j = (int(x) for x in bad[0])
            raise ValueError(f"labels[{i}, {j}]={float(self.labels[i, j])} is not 0 or 1")
        return self

    def validate_for(self, model_cfg) -> "JaggedBatch":
        """`validate` against a ModelConfig (vocab sizes, n_dense, max_len)."""
        return self.validate(model_cfg.item_vocab, model_cfg.action_vocab, model_cfg.time_buckets,
                             model_cfg.sparse_vocab, model_cfg.n_dense, model_cfg.max_len)

    def check_model_inputs(self, model_cfg) -> None:
        """The model's boundary check: free when `validated_for` matches this config, else one
        vectorised pass over offsets, ids, lengths and dense values and one host sync; on a
        violation `validate_for` names the field and the first bad index."""
        contract = model_contract(model_cfg)
        if self.validated_for == contract:
            return
        self._check_layout(len(model_cfg.sparse_vocab), model_cfg.n_dense)
        lengths = self.lengths
        vocabs = torch.tensor(contract[:3], device=self.values.device)
        sparse_vocab = torch.tensor(contract[3], device=self.sparse_ids.device)
        bad = torch.stack([
            self.offsets[0] != 0, (lengths < 0).any(), self.offsets[-1] != self.values.shape[0],
            (lengths > model_cfg.max_len).any(),
            ((self.values < 0) | (self.values >= vocabs)).any(),
            ((self.sparse_ids < 0) | (self.sparse_ids >= sparse_vocab)).any(),
            ((self.ad_ids < 0) | (self.ad_ids >= model_cfg.item_vocab)).any(),
            (~torch.isfinite(self.dense)).any()])
        if bool(bad.any()):
            self.validate_for(model_cfg)
            raise AssertionError("check_model_inputs found a violation that validate_for did not name")

    def mark_validated(self, contract: tuple | None) -> "JaggedBatch":
        """Record that this batch satisfies `contract` (model_contract(cfg)); only for batches built
        from validated data. Returns self."""
        self.validated_for = contract
        return self

    def with_host_max_length(self, longest: int | None) -> "JaggedBatch":
        """Record the longest history, computed on the host from this batch's own lengths. Returns self."""
        if longest is not None and (isinstance(longest, bool) or not isinstance(longest, int) or longest < 0):
            raise ValueError(f"host_max_length must be None or an int >= 0, got {longest!r}")
        self.host_max_length = longest
        return self

    def _map(self, fn) -> "JaggedBatch":
        return JaggedBatch(*(fn(getattr(self, name)) for name in TENSOR_FIELDS)).mark_validated(
            self.validated_for).with_host_max_length(self.host_max_length)

    def to(self, device: torch.device | str, non_blocking: bool = False) -> "JaggedBatch":
        return self._map(lambda t: t.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> "JaggedBatch":
        """Called by DataLoader(pin_memory=True) on CUDA hosts."""
        return self._map(lambda t: t.pin_memory())

    def select(self, indices: Sequence[int] | Tensor) -> "JaggedBatch":
        """A new batch holding the chosen samples, in the given order (for rank partitioning)."""
        idx = torch.as_tensor(indices, dtype=torch.int64, device=self.offsets.device)
        lengths = self.lengths[idx]
        starts = self.offsets[:-1][idx]
        new_offsets = lengths_to_offsets(lengths)
        T = int(new_offsets[-1])
        rows = torch.arange(T, device=idx.device) - torch.repeat_interleave(new_offsets[:-1], lengths, output_size=T)
        rows = rows + torch.repeat_interleave(starts, lengths, output_size=T)
        # the longest history, where reading it costs no device sync (None: the layout reads it)
        longest = 0 if not lengths.numel() else int(lengths.max()) if lengths.device.type == "cpu" else None
        return JaggedBatch(self.values[rows], new_offsets, self.sparse_ids[idx], self.dense[idx],
                           self.ad_ids[idx], self.labels[idx]).mark_validated(
            self.validated_for).with_host_max_length(longest)

    @staticmethod
    def concat(batches: Sequence["JaggedBatch"]) -> "JaggedBatch":
        """Join batches sample-wise (the inverse of splitting with `select`)."""
        if not batches:
            raise ValueError("concat needs at least one batch")
        lengths = torch.cat([b.lengths for b in batches])
        contracts = {b.validated_for for b in batches}
        known = [b.host_max_length for b in batches]
        return JaggedBatch(torch.cat([b.values for b in batches]), lengths_to_offsets(lengths),
                           torch.cat([b.sparse_ids for b in batches]), torch.cat([b.dense for b in batches]),
                           torch.cat([b.ad_ids for b in batches]), torch.cat([b.labels for b in batches])
                           ).mark_validated(contracts.pop() if len(contracts) == 1 else None).with_host_max_length(
            None if None in known else max(known))
