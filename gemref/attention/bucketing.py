"""Length buckets and query chunks: batched matmuls over jagged sequences without B*max^2 waste.

The CPU kernels (`sdpa` on CPU, `cpu_jagged`) never pad every sequence to the longest one.
They sort the sequences by length and cut the sorted list into *buckets*: consecutive
sequences are added to the current bucket while its padded score entries (n * Lq_max *
Lk_max) stay within MAX_WASTE (25%) of its real entries (sum Lq * Lk), or within an absolute
slack of MIN_SLACK_ENTRIES (one bucket of many short sequences is cheaper than many tiny
calls, so short batches accept more relative padding). A skewed batch of one 4096-long
history and 63 short ones becomes a bucket of one plus a few of short ones, instead of
64 x 4096^2 scores.

Inside a bucket, `sdpa` processes queries in *chunks* of rows so that the score tile of a
chunk (n, H, rows, keys) stays under a memory budget; each chunk only visits the keys its
rows may attend (`key_span`: causal: keys < chunk end; window: keys within W of the chunk),
and a mask is built only for chunks that cut through the causal diagonal, the window edge
or the shorter sequences' ends. `cpu_jagged` covers a bucket with its own pieces
(cpu_jagged/plan.py), from the same buckets and key spans.

Everything here is plain Python on host integers: the plan depends only on the lengths, so
`executed_flops` can replay it exactly.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor

from ..data.jagged import offsets_to_lengths

MAX_WASTE = 0.25             # padded entries may exceed real ones by this fraction ...
MIN_SLACK_ENTRIES = 1 << 14  # ... or by this many score entries (per head)
MIN_CHUNK_ROWS = 16          # a chunk never has fewer query rows (unless the bucket does)


@dataclass(frozen=True)
class Bucket:
    seqs: tuple[int, ...]      # sequence indices, longest keys first
    q_lens: tuple[int, ...]    # their query lengths
    kv_lens: tuple[int, ...]   # their key lengths
    q_len: int                 # padded query length (longest in the bucket)
    kv_len: int                # padded key length

    @property
    def size(self) -> int:
        return len(self.seqs)

    @property
    def min_kv_len(self) -> int:
        return min(self.kv_lens)


@dataclass(frozen=True)
class Chunk:
    """Query rows [q0, q1) of a bucket, attending key positions [k0, k1)."""
    q0: int
    q1: int
    k0: int
    k1: int


def make_buckets(q_lengths: Sequence[int], kv_lengths: Sequence[int], min_slack: int | None = None) -> list[Bucket]:
    """Greedy buckets over sequences sorted by (key length, query length), longest first.

    Sequences with no queries or no keys are left out: their outputs are zero. `min_slack`
    (score entries per head) defaults to MIN_SLACK_ENTRIES.
    """
    max_waste = MAX_WASTE
    min_slack = MIN_SLACK_ENTRIES if min_slack is None else min_slack
    active = [b for b in range(len(q_lengths)) if q_lengths[b] > 0 and kv_lengths[b] > 0]
    order = sorted(active, key=lambda b: (kv_lengths[b], q_lengths[b]), reverse=True)
    buckets: list[Bucket] = []
    members: list[int] = []
    max_q = max_kv = real = 0
    for b in order:
        lq, lk = q_lengths[b], kv_lengths[b]
        if members:
            new_max_q = max(max_q, lq)
            padded = (len(members) + 1) * new_max_q * max_kv
            new_real = real + lq * lk
            if padded <= (1 + max_waste) * new_real or padded - new_real <= min_slack:
                members.append(b)
                max_q, real = new_max_q, new_real
                continue
            buckets.append(_bucket(members, q_lengths, kv_lengths))
        members, max_q, max_kv, real = [b], lq, lk, lq * lk
    if members:
        buckets.append(_bucket(members, q_lengths, kv_lengths))
    return buckets


def _bucket(members: list[int], q_lengths: Sequence[int], kv_lengths: Sequence[int]) -> Bucket:
    q_lens = tuple(q_lengths[b] for b in members)
    kv_lens = tuple(kv_lengths[b] for b in members)
    return Bucket(tuple(members), q_lens, kv_lens, max(q_lens), max(kv_lens))


def key_span(q0: int, q1: int, kv_len: int, causal: bool, window: int | None) -> tuple[int, int]:
    """Key positions [k0, k1) that query rows [q0, q1) may attend (an interval)."""
    k0, k1 = 0, kv_len
    if causal:
        k1 = min(k1, q1)
    if window is not None:
        k0 = max(0, q0 - window + 1)
        if not causal:
            k1 = min(k1, q1 + window - 1)
    return k0, k1


def query_chunks(bucket: Bucket, heads: int, causal: bool, window: int | None,
                 budget_entries: int) -> list[Chunk]:
    """Split the bucket's query rows so each chunk's scores (n*H*rows*keys) fit the budget."""
    span = bucket.kv_len if window is None else min(bucket.kv_len, 2 * window + 15)
    rows = max(MIN_CHUNK_ROWS, budget_entries // max(1, bucket.size * heads * span))
    rows = min(bucket.q_len, rows)
    chunks = []
    for q0 in range(0, bucket.q_len, rows):
        q1 = min(bucket.q_len, q0 + rows)
        k0, k1 = key_span(q0, q1, bucket.kv_len, causal, window)
        if k1 > k0:  # a chunk with no keys contributes nothing (its outputs stay zero)
            chunks.append(Chunk(q0, q1, k0, k1))
    return chunks


def chunk_mask(chunk: Chunk, bucket: Bucket, causal: bool, window: int | None,
               device: torch.device) -> Tensor | None:
    """Bool mask (n|1, 1, rows|1, keys) of allowed pairs in a chunk, or None when all are.

    Query rows past a sequence's own length are not masked: their outputs are dropped when
    the bucket is unpadded, and their output gradients are zero.
    """
    q0, q1, k0, k1 = chunk.q0, chunk.q1, chunk.k0, chunk.k1
    mask = None
    # Keys past a shorter sequence's end need a length mask, except in causal self-attention
    # (right padding): there every real row's diagonal comes before its sequence's end.
    self_causal = causal and bucket.q_lens == bucket.kv_lens
    if k1 > bucket.min_kv_len and not self_causal:
        j = torch.arange(k0, k1, device=device)
        kv_lens = torch.tensor(bucket.kv_lens, device=device)
        mask = (j[None, :] < kv_lens[:, None])[:, None, None, :]
    needs_causal = causal and k1 - 1 > q0
    needs_window = window is not None and (q1 - 1 - k0 >= window or (not causal and k1 - 1 - q0 >= window))
    if needs_causal or needs_window:
        i = torch.arange(q0, q1, device=device)[:, None]
        j = torch.arange(k0, k1, device=device)[None, :]
        pos = torch.ones(q1 - q0, k1 - k0, dtype=torch.bool, device=device)
        if causal:
            pos &= j <= i
        if window is not None:
            pos &= i - j < window
            if not causal:
                pos &= j - i < window
        mask = pos[None, None] if mask is None else mask & pos[None, None]
    return mask


def bucket_rows(offsets: Tensor, bucket: Bucket, lengths: tuple[int, ...], pad_len: int) -> tuple[Tensor, Tensor]:
    """Row indices (src in the jagged tensor, dest in the flat (n * pad_len) padded tensor)."""
    device = offsets.device
    lens = torch.tensor(lengths, dtype=torch.int64, device=device)
    total = sum(lengths)
    local = torch.repeat_interleave(torch.arange(len(lengths), device=device), lens, output_size=total)
    starts = torch.cumsum(lens, 0) - lens
    pos = torch.arange(total, device=device) - starts[local]
    seqs = torch.tensor(bucket.seqs, dtype=torch.int64, device=device)
    src = offsets[seqs][local] + pos
    dest = local * pad_len + pos
    return src, dest


def lengths_list(offsets: Tensor) -> list[int]:
    return offsets_to_lengths(offsets).tolist()
