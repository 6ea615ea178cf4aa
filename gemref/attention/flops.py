"""Model FLOPs of one attention forward, on the REAL lengths (the MFU numerator).

Convention (docs/design.md, PaLM appendix B): per sequence, QK^T and PV are 2*H*D*Lq*Lk FLOPs
each, halved for causal attention (Lq = Lk = L: 2 * 2*H*D*L^2 / 2), summed over the real
lengths, never B * max_len^2. With a sliding window the count is exact: 2*H*D per allowed
(query, key) pair and per matmul. Padding, masked tiles and recomputation are *executed*
FLOPs, not model FLOPs; each kernel reports those itself (`executed_flops` in api.py).
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor


def _as_lengths(lengths: Tensor | Sequence[int]) -> Tensor:
    return torch.as_tensor(lengths, dtype=torch.int64).reshape(-1).cpu()


def allowed_pairs_per_sequence(q_lengths: Tensor | Sequence[int], kv_lengths: Tensor | Sequence[int],
                               causal: bool, window: int | None) -> Tensor:
    """(B,) int64: the (query i, key j) pairs the mask of reference.py allows, per sequence."""
    q_len, kv_len = _as_lengths(q_lengths), _as_lengths(kv_lengths)
    if window is None and not causal:
        return q_len * kv_len
    # One entry per query row: the allowed keys form the interval [lo, hi] of positions.
    rows = int(q_len.sum())
    seq = torch.repeat_interleave(torch.arange(q_len.numel()), q_len, output_size=rows)
    starts = torch.cumsum(q_len, 0) - q_len
    i = torch.arange(rows) - starts[seq]
    hi = kv_len[seq] - 1
    lo = torch.zeros_like(i)
    if causal:
        hi = torch.minimum(hi, i)
    if window is not None:
        lo = torch.clamp(i - window + 1, min=0)
        if not causal:
            hi = torch.minimum(hi, i + window - 1)
    per_row = torch.clamp(hi - lo + 1, min=0)
    return torch.zeros(q_len.numel(), dtype=torch.int64).index_add_(0, seq, per_row)


def attention_model_flops(q_lengths: Tensor | Sequence[int], kv_lengths: Tensor | Sequence[int],
                          heads: int, head_dim: int, causal: bool, window: int | None) -> int:
    """Forward model FLOPs of attention over a jagged batch (QK^T + PV, real lengths)."""
    per_matmul = 2 * heads * head_dim
    if window is None:
        q_len, kv_len = _as_lengths(q_lengths), _as_lengths(kv_lengths)
        entries = int((q_len * kv_len).sum())
        # "halved for causal": L^2 / 2 per sequence (exact pairs would be L(L+1)/2).
        return 2 * per_matmul * entries // (2 if causal else 1)
    pairs = int(allowed_pairs_per_sequence(q_lengths, kv_lengths, causal, window).sum())
    return 2 * per_matmul * pairs
