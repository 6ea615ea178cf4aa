"""The Triton GDPA work schedule: which program runs which (sequence, tile, head), in what order.

A grid of (max_len / BLOCK, B, H) programs would launch mostly empty programs on skewed
lengths. Instead the wrapper builds, on the device and without a host sync, one row per
(sequence, tile, head) that exists (grid bound: (ceil(T / BLOCK) + B) * H rows; padding rows
have sequence -1 and exit at once). Each tile's cost is the number of inner tiles it visits
(tile_range mirrors the kernels' _key_tiles / _query_tiles): causal tiles near the end of a
long sequence cost the most. Two orders (Variant.schedule):

  lpt      costliest tile first, the heads of one tile adjacent (longest-processing-time-first:
           the long work starts first and short tiles fill the tail); programs running at the
           same time hold tile t of different sequences, so they share no K/V;
  grouped  sequences by total cost, longest first; within one, all tiles of head 0, then of
           head 1, ... (costliest first): concurrent programs read the same K/V from L2.

Schedules are cached per batch (`cached_schedule`): the key holds the offsets tensors'
identity (weak references, so a freed tensor whose id is reused never hits) and version
counters (an in-place change rebuilds), so the 6 layers x 3 passes of a step build each
schedule once.
"""
from __future__ import annotations

import weakref
from collections import OrderedDict

import torch
from torch import Tensor

from ...data.jagged import offsets_to_lengths

CACHE_ENTRIES = 64
_cache: "OrderedDict[tuple, tuple[tuple, tuple[int, int], Tensor]]" = OrderedDict()
stats = {"built": 0, "hits": 0}


def tile_range(kind: str, start: Tensor, len_q: Tensor, len_k: Tensor, block_m: int,
               block_n: int, causal: bool, window: int | None) -> tuple[Tensor, Tensor]:
    """Inner tiles [t_lo, t_hi) each outer tile visits; mirrors _key_tiles / _query_tiles.

    kind "keys": outer query tiles starting at `start` visit key tiles of block_n;
    kind "queries": outer key tiles starting at `start` are visited by query tiles of block_m.
    """
    zero = torch.zeros_like(start)
    if kind == "keys":
        lo, hi, block = zero, len_k.clone(), block_n
        if causal:
            hi = torch.minimum(hi, start + block_m)
        if window is not None:
            lo = torch.clamp(start - window + 1, min=0)
            if not causal:
                hi = torch.minimum(hi, start + block_m + window - 1)
        hi = torch.where(start < len_q, hi, zero)
    else:
        lo, hi, block = zero, len_q.clone(), block_m
        if causal:
            lo = start.clone()
        if window is not None:
            hi = torch.minimum(hi, start + block_n + window - 1)
            if not causal:
                lo = torch.clamp(start - window + 1, min=0)
        hi = torch.where(start < len_k, hi, zero)
    t_lo = lo // block
    return t_lo, torch.where(hi > lo, (hi + block - 1) // block, t_lo)


def visited_tiles(kind: str, start: Tensor, len_q: Tensor, len_k: Tensor, block_m: int,
                  block_n: int, causal: bool, window: int | None) -> Tensor:
    t_lo, t_hi = tile_range(kind, start, len_q, len_k, block_m, block_n, causal, window)
    return t_hi - t_lo


def _tiles(offsets: Tensor, block: int, total_rows: int) -> tuple[Tensor, Tensor, Tensor]:
    """Every (sequence, tile) of the jagged rows, padded to ceil(T/block) + B slots."""
    lengths = offsets_to_lengths(offsets)
    B = lengths.numel()
    tiles = (lengths + block - 1) // block
    cum = torch.cumsum(tiles, 0)
    slot = torch.arange((total_rows + block - 1) // block + B, device=offsets.device)
    seq = torch.searchsorted(cum, slot, right=True).clamp_(max=B - 1)
    tile = slot - (cum[seq] - tiles[seq])
    valid = slot < cum[-1]
    return seq, tile, valid


def _slot_costs(q_offsets: Tensor, kv_offsets: Tensor, kind: str, block_m: int, block_n: int,
                causal: bool, window: int | None, total_rows: int):
    outer_block = block_m if kind == "keys" else block_n
    seq, tile, valid = _tiles(q_offsets if kind == "keys" else kv_offsets, outer_block, total_rows)
    len_q = (q_offsets[1:] - q_offsets[:-1])[seq]
    len_k = (kv_offsets[1:] - kv_offsets[:-1])[seq]
    cost = visited_tiles(kind, tile * outer_block, len_q, len_k, block_m, block_n, causal, window)
    return seq, tile, valid, torch.where(valid, cost, -1)


def build_schedule(q_offsets: Tensor, kv_offsets: Tensor, kind: str, block_m: int, block_n: int,
                   causal: bool, window: int | None, total_rows: int, heads: int,
                   order: str = "lpt") -> Tensor:
    """(programs, 3) int32 rows (sequence, tile, head) in launch order; padding rows last,
    with sequence -1. kind "keys": tiles of query rows (forward, dQ); "queries": of keys (dK/dV)."""
    seq, tile, valid, cost = _slot_costs(q_offsets, kv_offsets, kind, block_m, block_n, causal,
                                         window, total_rows)
    n = seq.numel()
    idx = torch.sort(cost, descending=True, stable=True).indices
    if order == "lpt":
        slot = idx.repeat_interleave(heads)
        head = torch.arange(heads, device=seq.device).repeat(n)
    elif order == "grouped":
        total = torch.zeros(int(q_offsets.numel()) - 1, dtype=cost.dtype, device=cost.device)
        total.scatter_add_(0, seq, cost.clamp(min=0))
        key_total = torch.where(valid, total[seq], -1)
        idx = idx[torch.sort(seq[idx], stable=True).indices]
        idx = idx[torch.sort(key_total[idx], descending=True, stable=True).indices]
        s, v = seq[idx], valid[idx]
        new_group = torch.ones_like(v)
        new_group[1:] = (s[1:] != s[:-1]) | (v[1:] != v[:-1])
        group = torch.cumsum(new_group.to(torch.int64), 0)
        rank = torch.arange(n, device=seq.device).repeat(heads)
        head = torch.arange(heads, device=seq.device).repeat_interleave(n)
        entry = torch.sort(group[rank] * heads + head, stable=True).indices
        slot, head = idx[rank[entry]], head[entry]
    else:
        raise ValueError(f"unknown schedule order {order!r}")
    rows = torch.stack([torch.where(valid[slot], seq[slot], -1), tile[slot], head], dim=1)
    return rows.to(torch.int32).contiguous()


def _version(t: Tensor) -> int | None:
    try:
        return t._version
    except RuntimeError:   # inference tensors keep no version counter: never cached
        return None


def cached_schedule(q_offsets: Tensor, kv_offsets: Tensor, kind: str, block_m: int, block_n: int,
                    causal: bool, window: int | None, total_rows: int, heads: int, order: str,
                    enabled: bool = True) -> Tensor:
    """build_schedule, reused while the same offsets tensors (unchanged) come back."""
    args = (kind, block_m, block_n, causal, window, total_rows, heads, order)
    versions = (_version(q_offsets), _version(kv_offsets))
    if not enabled or None in versions:
        stats["built"] += 1
        return build_schedule(q_offsets, kv_offsets, *args)
    key = (id(q_offsets), id(kv_offsets), *args)
    hit = _cache.get(key)
    if hit is not None and hit[0][0]() is q_offsets and hit[0][1]() is kv_offsets and hit[1] == versions:
        _cache.move_to_end(key)
        stats["hits"] += 1
        return hit[2]
    stats["built"] += 1
    sched = build_schedule(q_offsets, kv_offsets, *args)
    _cache[key] = ((weakref.ref(q_offsets), weakref.ref(kv_offsets)), versions, sched)
    while len(_cache) > CACHE_ENTRIES:
        _cache.popitem(last=False)
    return sched


def tile_pairs(q_offsets: Tensor, kv_offsets: Tensor, kind: str, block_m: int, block_n: int,
               causal: bool, window: int | None) -> int:
    """(outer tile, inner tile) pairs a pass visits: what its matmuls run over."""
    total_rows = int((q_offsets if kind == "keys" else kv_offsets)[-1])
    _, _, valid, cost = _slot_costs(q_offsets, kv_offsets, kind, block_m, block_n, causal, window, total_rows)
    return int(cost[valid].sum())
