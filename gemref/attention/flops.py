"""Model FLOPs of one attention forward, on the REAL lengths (the MFU numerator).

Convention used for MFU ("exact"): 2*H*D FLOPs per (query, key) pair the mask allows, per
matmul (QK^T and PV), summed over the real lengths (never B * max_len^2). For causal
self-attention of length L that is L(L+1)/2 pairs (the diagonal included), for a sliding
window the pairs inside it, for non-causal attention Lq * Lk. Why exact: it is the work the
model needs (no kernel can skip an allowed pair), it is the same rule for causal and
windowed masks, and with GEM's short histories (median 12-40 events) the diagonal is not
negligible (L=12: 78 pairs vs 72 for the common L^2/2 approximation, which gemref used
before and which undercounts the work).

The other convention, shown beside it by `gemref flops` ("palm"): PaLM (appendix B) and
torchtitan count the full Lq * Lk rectangle per sequence whatever the mask, so their causal
attention FLOPs are ~2x the exact ones and their MFU is correspondingly higher.

Padding, masked tiles and recomputation are *executed* FLOPs, not model FLOPs; each kernel
reports those itself (`executed_flops` in api.py).

A meter counting a model gemref did not define (gemref/mfu/foreign.py) cannot read these
formulas off a config: it opens `counting_attention()`, and every `gdpa` call inside notes its
model FLOPs on the real lengths and runs its kernel in a region of its own, whose
FlopCounterMode count (the kernel's executed ops, whatever they are) the meter sets aside.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import torch
from torch import Tensor

from ..data.jagged import offsets_to_lengths

CONVENTIONS = ("exact", "palm")


def _as_lengths(lengths: Tensor | Sequence[int]) -> Tensor:
    return torch.as_tensor(lengths, dtype=torch.int64).reshape(-1).cpu()


def allowed_pairs_per_sequence(q_lengths: Tensor | Sequence[int], kv_lengths: Tensor | Sequence[int],
                               causal: bool, window: int | None) -> Tensor:
    """(B,) int64: the (query i, key j) pairs the mask of reference.py allows, per sequence."""
    q_len, kv_len = _as_lengths(q_lengths), _as_lengths(kv_lengths)
    if window is None and not causal:
        return q_len * kv_len
    if window is None:   # causal: query i sees min(i + 1, Lk) keys
        a = torch.minimum(q_len, kv_len)
        return a * (a + 1) // 2 + (q_len - a) * kv_len
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
                          heads: int, head_dim: int, causal: bool, window: int | None,
                          convention: str = "exact") -> int:
    """Forward model FLOPs of attention over a jagged batch (QK^T + PV, real lengths):
    2 matmuls x 2*H*D per counted pair; "exact" counts the allowed pairs (causal: L(L+1)/2),
    "palm" the full Lq x Lk rectangle regardless of causal/window."""
    if convention not in CONVENTIONS:
        raise ValueError(f"convention={convention!r}; valid: {', '.join(CONVENTIONS)}")
    if convention == "palm" or (not causal and window is None):
        pairs = int((_as_lengths(q_lengths) * _as_lengths(kv_lengths)).sum())
    else:
        pairs = int(allowed_pairs_per_sequence(q_lengths, kv_lengths, causal, window).sum())
    return 2 * 2 * heads * head_dim * pairs


# ------------------------------------------------------------------ counting gdpa calls for a meter
@dataclass
class AttentionTally:
    """What the gdpa calls made inside `counting_attention()` noted, summed over the calls (FLOPs).

    `model_flops`: each call's `attention_model_flops` on its REAL lengths, mask and window
    ("exact" convention), whatever kernel ran. `set_aside_flops`: what torch's FlopCounterMode
    counted for the ops inside the calls (the kernel's executed work: padded buckets, masked
    tiles, the reference's padded rectangle; the backward of the calls is not in it). A meter
    that counted a forward with FlopCounterMode takes the second out and puts the first in."""

    model_flops: int = 0
    set_aside_flops: int = 0
    calls: int = 0


_OPEN: list[AttentionTally] = []


@contextmanager
def counting_attention() -> Iterator[AttentionTally]:
    """Open a tally that every gdpa call inside the block adds to (gemref/mfu/foreign.py opens it
    around a forward it counts). Outside such a block gdpa counts nothing and costs nothing extra."""
    tally = AttentionTally()
    _OPEN.append(tally)
    try:
        yield tally
    finally:
        _OPEN.remove(tally)


def counting() -> bool:
    """Whether a tally is open (gdpa then runs its kernel through `counted_call`)."""
    return bool(_OPEN)


def counted_call(run: Callable[[], Tensor], q: Tensor, q_offsets: Tensor, kv_offsets: Tensor,
                 causal: bool, window: int | None) -> Tensor:
    """Run one gdpa kernel call under its own FlopCounterMode (the region set aside) and note its
    model FLOPs and that count in every open tally."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as inside:
        out = run()
    model = attention_model_flops(offsets_to_lengths(q_offsets), offsets_to_lengths(kv_offsets), q.shape[1], q.shape[2], causal, window)
    for tally in _OPEN:
        tally.model_flops += model
        tally.set_aside_flops += int(inside.get_total_flops())
        tally.calls += 1
    return out
