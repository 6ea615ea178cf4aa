"""The plan of one `cpu_jagged` call: padded row layout and the batched matmuls ("pieces").

Layout. The length buckets of gemref/attention/bucketing.py are padded to a common length
L' and stacked into ONE buffer per tensor, rows ordered (bucket, sequence, head, position),
so that bucket b is a contiguous (n*H, L', D) block. One `index_select` with the `gather`
index fills the buffer from the jagged (T*H, D) rows (padding rows read an appended zero
row); one `index_select` with `scatter` reads the results back (rows of sequences in no
bucket read an appended zero row). Four ops per call instead of several per bucket.

Pieces. A piece is one batched matmul: `batch` score tiles of rows x keys, where tile e
takes query rows q_start + e*q_stride .. + rows and key rows k_start + e*k_stride .. + keys
of the padded buffers - every operand is a strided *view*, never a gathered copy. Its entry
(r, c) pairs query position p and key position p - delta + c - r (delta is the same for
every tile of a piece), so one triangular op (tril_/triu_ with an offset derived from delta)
or one cached additive bias masks the whole piece. Two schemes per bucket:

  * tree (causal self-attention with a pointwise activation): L' = C * 2^r leaves of C >=
    LEAF_MIN rows. All diagonal leaves form one piece (batch n*H*2^r, C x C, lower triangle);
    at level j = 1..r every odd block of size C*2^(j-1) meets the even block before it,
    one mask-free piece per level (the odd blocks sit at a uniform stride, so the views
    merge with the (sequence, head) axis). r + 1 matmuls cover the triangle; the work is
    L'^2/2 + L'*C/2 entries per sequence and head instead of L'^2.
  * rows (everything else; softmax always, as its rows must be normalised in one piece):
    chunks of query rows, each with the key interval its rows may attend
    (bucketing.key_span). Causal chunks have C rows over the same L' as the tree, so both
    schemes execute the same number of score entries (`executed_entries` need not know the
    activation).

Pieces larger than `budget` score entries are split by rows, then by batch. The kernel
runs pieces in *waves* of at most `budget` entries: each wave's score tiles share one
workspace, and pointwise activations run once per wave instead of once per tile.

Everything here is host integers except the index tensors; plans are cached by lengths.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import cached_property, lru_cache

import torch
from torch import Tensor

from .. import bucketing
from ..bucketing import Bucket, key_span, make_buckets

LEAF_MIN = 32   # leaf (tree) / chunk (causal rows) size floor: smaller matmuls run far below peak
# Bucket slack (score entries per head; bucketing.MIN_SLACK_ENTRIES is sdpa's): a padded row
# costs this kernel a gather in and out in forward and backward (6 row moves per key row),
# as much as ~10 score entries of its matmuls, so it takes less padding for fewer calls.
# Cross attention with a few queries per sample pays most: there 16 Ki entries of slack
# were 1.6 Ki padded key rows per head and bucket (71% more key rows than real ones on the
# small preset; 24% with this slack).
SLACK_ENTRIES = 1 << 10


@dataclass(frozen=True)
class Piece:
    """One batched matmul: `batch` score tiles of rows x keys (strided views, module doc)."""
    batch: int
    rows: int
    keys: int
    q_start: int     # padded query row of tile 0's first row
    q_stride: int    # padded query rows between consecutive tiles
    k_start: int
    k_stride: int
    delta: int       # query position - key position at tile entry (0, 0)
    q_acc: bool      # add into out / dq (an earlier piece wrote these rows) instead of writing
    k_acc: bool      # add into dk / dv
    pad_keys: bool   # softmax: some keys are padding and need the additive masking bias
    tril: int | None = None   # keep entries with c - r <= tril (causal; right window edge)
    triu: int | None = None   # keep entries with c - r >= triu (left window edge)

    @property
    def entries(self) -> int:
        return self.batch * self.rows * self.keys


@dataclass(frozen=True)
class Side:
    """Padded layout of the queries (or keys): `rows` padded rows of D."""
    rows: int
    gather: Tensor    # (rows,) jagged row (t*H + h) of each padded row, or T*H (zero row) for padding
    scatter: Tensor   # (T*H,) padded row of each jagged row, or `rows` (zero row) if in no bucket


@dataclass(frozen=True)
class Plan:
    """Both layouts and the pieces, grouped in waves of at most `budget` score entries."""
    q: Side
    kv: Side
    waves: tuple[tuple[Piece, ...], ...]

    @property
    def entries(self) -> int:
        return sum(p.entries for wave in self.waves for p in wave)

    @property
    def workspace(self) -> int:
        """Score entries of the largest wave."""
        return max((sum(p.entries for p in wave) for wave in self.waves), default=0)

    @cached_property
    def q_written(self) -> bool:
        """Whether the pieces that write (not add to) query rows cover every padded query row,
        so the kernel's padded out / dq need no zeroing first. Writing pieces never overlap
        (tests/test_attention_plan.py), so counting their rows is enough."""
        return sum(p.batch * p.rows for wave in self.waves for p in wave if not p.q_acc) == self.q.rows

    @cached_property
    def k_written(self) -> bool:
        """The same for key rows (padded dk, dv)."""
        return sum(p.batch * p.keys for wave in self.waves for p in wave if not p.k_acc) == self.kv.rows


def tree_levels(length: int) -> int:
    """r for a causal bucket of this length: the most halvings that keep leaves >= LEAF_MIN."""
    r = 0
    while 2 ** (r + 1) <= length and math.ceil(length / 2 ** (r + 1)) >= LEAF_MIN:
        r += 1
    return r


def _padded_lengths(b: Bucket, causal: bool) -> tuple[int, int, int]:
    """(padded query length, padded key length, leaf/chunk rows) of a bucket."""
    if not causal:
        return b.q_len, b.kv_len, b.q_len
    r = tree_levels(b.q_len)
    leaf = math.ceil(b.q_len / 2 ** r)
    return leaf * 2 ** r, leaf * 2 ** r, leaf


def _tree(nh: int, length: int, leaf: int, q0: int, k0: int) -> list[Piece]:
    pieces = [Piece(nh * length // leaf, leaf, leaf, q0, leaf, k0, leaf, 0, False, False, False)]
    block = leaf
    while block < length:
        pairs = length // (2 * block)
        pieces.append(Piece(nh * pairs, block, block, q0 + block, 2 * block, k0, 2 * block, block,
                            True, True, False))
        block *= 2
    return pieces


def _rows(b: Bucket, nh: int, lq: int, lk: int, chunk: int, causal: bool, window: int | None,
          q0: int, k0: int, softmax: bool) -> list[Piece]:
    pieces, written = [], False
    for r0 in range(0, lq, chunk):
        r1 = min(lq, r0 + chunk)
        c0, c1 = key_span(r0, r1, lk, causal, window)
        if c1 <= c0:
            continue   # rows with no key: their outputs stay zero
        # Padding keys need a softmax bias, except in causal self-attention (right padding:
        # a real row's keys all come before its sequence's end).
        pad = softmax and not (causal and b.q_lens == b.kv_lens) and c1 > b.min_kv_len
        pieces.append(Piece(nh, r1 - r0, c1 - c0, q0 + r0, lq, k0 + c0, lk, r0 - c0, False, written, pad))
        written = True
    return pieces


def _split(p: Piece, budget: int) -> list[Piece]:
    """Pieces of at most `budget` entries (by rows, then by batch); same work, same views."""
    out = []
    rows = max(1, min(p.rows, budget // max(1, p.keys)))
    for r0 in range(0, p.rows, rows):
        part = replace(p, rows=min(rows, p.rows - r0), q_start=p.q_start + r0, delta=p.delta + r0,
                       k_acc=p.k_acc or r0 > 0)
        per_tile = part.rows * part.keys
        step = max(1, budget // per_tile)
        for e0 in range(0, p.batch, step):
            out.append(replace(part, batch=min(step, p.batch - e0), q_start=part.q_start + e0 * p.q_stride,
                               k_start=part.k_start + e0 * p.k_stride))
    return out


def _masks(p: Piece, causal: bool, window: int | None) -> Piece:
    """The triangular masks of a piece. Entry (r, c) pairs positions i - j = delta + r - c."""
    tril = triu = None
    if causal and p.keys - 1 > p.delta:                                # j <= i
        tril = p.delta
    if window is not None:
        if p.delta + p.rows - 1 >= window:                             # i - j < W
            triu = p.delta - window + 1
        if not causal and p.keys - 1 > p.delta + window - 1:           # j - i < W
            tril = p.delta + window - 1
    return replace(p, tril=tril, triu=triu)


def _waves(pieces: list[Piece], budget: int) -> tuple[tuple[Piece, ...], ...]:
    waves, wave, size = [], [], 0
    for p in pieces:
        if wave and size + p.entries > budget:
            waves.append(tuple(wave))
            wave, size = [], 0
        wave.append(p)
        size += p.entries
    if wave:
        waves.append(tuple(wave))
    return tuple(waves)


def _side(offsets: list[int], buckets: list[Bucket], lens: list[tuple[int, ...]], padded: list[int],
          heads: int) -> Side:
    """gather / scatter indices of one side (queries or keys) for these buckets.

    Slot i of bucket b (sequence s, length l, padded length L) owns the padded rows
    base + (i*H + h)*L + p, for head h and position p < L, and reads jagged row
    (offsets[s] + p)*H + h when p < l (else the zero row T*H)."""
    T, B, H = offsets[-1], len(offsets) - 1, heads
    gather, seq_base, seq_len, base = [], [-1] * B, [1] * B, 0
    for b, b_lens, L in zip(buckets, lens, padded):
        starts = torch.tensor([offsets[s] for s in b.seqs], dtype=torch.int64)[:, None, None]
        pos = torch.arange(L)
        src = (starts + pos) * H + torch.arange(H)[:, None]
        real = pos < torch.tensor(b_lens)[:, None, None]
        gather.append(torch.where(real, src, T * H).reshape(-1))
        for i, s in enumerate(b.seqs):
            seq_base[s], seq_len[s] = base + i * H * L, L
        base += len(b.seqs) * H * L
    offs = torch.tensor(offsets)
    owner = torch.repeat_interleave(torch.arange(B), offs[1:] - offs[:-1], output_size=T)
    pos = torch.arange(T) - offs.index_select(0, owner)
    row0 = torch.tensor(seq_base).index_select(0, owner)
    dest = row0[:, None] + torch.arange(H) * torch.tensor(seq_len).index_select(0, owner)[:, None] + pos[:, None]
    scatter = torch.where(row0[:, None] >= 0, dest, base).reshape(-1)
    return Side(base, torch.cat(gather) if gather else torch.zeros(0, dtype=torch.int64), scatter)


@lru_cache(maxsize=8)   # a step needs 2-4 (self and cross attention); each holds O(T*H) indices
def _cached_plan(q_offs: tuple[int, ...], kv_offs: tuple[int, ...], heads: int, causal: bool,
                 window: int | None, softmax: bool, budget: int, leaf_min: int, waste: float,
                 slack: int) -> Plan:
    """`slack`: the bucket slack, min(SLACK_ENTRIES, bucketing.MIN_SLACK_ENTRIES) (tests
    lower the latter to cut more buckets)."""
    q_lens = [b - a for a, b in zip(q_offs, q_offs[1:])]
    kv_lens = [b - a for a, b in zip(kv_offs, kv_offs[1:])]
    buckets = make_buckets(q_lens, kv_lens, slack)
    pieces, q_base, k_base, lq_pad, lk_pad = [], 0, 0, [], []
    for b in buckets:
        nh = b.size * heads
        win = None if window is not None and window >= max(b.q_len, b.kv_len) else window
        lq, lk, leaf = _padded_lengths(b, causal and win is None)
        if causal and win is None and not softmax:
            bucket_pieces = _tree(nh, lq, leaf, q_base, k_base)
        else:
            chunk = leaf if win is None else min(lq, max(LEAF_MIN, win))
            bucket_pieces = _rows(b, nh, lq, lk, chunk, causal, win, q_base, k_base, softmax)
        pieces += [_masks(s, causal, win) for p in bucket_pieces for s in _split(p, budget)]
        lq_pad.append(lq)
        lk_pad.append(lk)
        q_base += nh * lq
        k_base += nh * lk
    q_side = _side(list(q_offs), buckets, [b.q_lens for b in buckets], lq_pad, heads)
    kv_side = q_side if q_offs == kv_offs and lq_pad == lk_pad else \
        _side(list(kv_offs), buckets, [b.kv_lens for b in buckets], lk_pad, heads)
    return Plan(q_side, kv_side, _waves(pieces, budget))


def make_plan(q_offsets: list[int], kv_offsets: list[int], heads: int, causal: bool, window: int | None,
              softmax: bool, budget: int) -> Plan:
    """The plan for these offsets (host lists), cached: forward, backward and every layer of
    a step share the batch's offsets. The tunables are part of the key (tests patch them)."""
    return _cached_plan(tuple(q_offsets), tuple(kv_offsets), heads, causal, window, softmax, budget,
                        LEAF_MIN, bucketing.MAX_WASTE, min(SLACK_ENTRIES, bucketing.MIN_SLACK_ENTRIES))
