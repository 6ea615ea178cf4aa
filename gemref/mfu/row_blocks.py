"""GEMMs over row blocks of a few fixed sizes, so that oneDNN reuses its kernels when jagged
batches change the row count every step.

oneDNN builds (and JIT-compiles) a primitive for every GEMM shape it meets and caches it by
shape. A jagged batch has a different token count M every step, so each Linear's three GEMMs
meet a new shape every step: measured on a Xeon with AMX (torch 2.13, one thread), a bf16
Linear of 64 -> 192 features at ~5,000 rows took 0.2 ms per GEMM with M repeated and 0.8-1.2
ms with M new each call, its weight gradient (M is the reduction dim there) 3.4 ms instead
of 0.36 ms; fp32 oneDNN lost 2-3x the same way. MKL's fp32 sgemm builds nothing per shape.

`row_blocks(m)` covers rows [0, m) with: full blocks of ROW_BLOCK rows; then one block of the
largest multiple of STEP rows that fits; then the last rows (< STEP) zero-padded to the next
power of two >= MIN_TAIL. So every GEMM a Linear runs has one of at most
1 + (ROW_BLOCK / STEP - 1) + log2(STEP / MIN_TAIL) row counts (11 here), whatever the batch. Row
counts under WHOLE_BELOW run whole: those are the per-sample GEMMs (a batch's samples, or
samples x non-sequence tokens), whose count repeats every step, and where every extra call's
fixed cost (tens of microseconds with cold caches) would outweigh a primitive built once.
The padded rows are computed and dropped: executed work that no FLOP counter sees (fewer
rows than the tail itself, or than MIN_TAIL, per GEMM: under 5% at a few thousand rows).

`blocked_rows(gemm, a, cols)` runs `gemm` on each block of `a`'s rows, each writing into its
rows of one result (the forward and input-gradient GEMMs, whose rows are the tokens: no
concatenation, which cost more than the GEMMs at 64-wide bf16 Linears); `blocked_reduction(gemm, g, x)`
sums `gemm(g_block, x_block)` over blocks in float32 (the weight gradient, whose reduction
dim is the tokens: zero-padded rows add nothing).
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

ROW_BLOCK = 4096     # rows per full block
STEP = 512           # the rest after the full blocks: in place, in a multiple of STEP rows
MIN_TAIL = 64        # the last rows (< STEP) go into a zero-padded power-of-two block >= this
WHOLE_BELOW = 1024   # fewer rows than this: one call, as they are


def row_blocks(m: int) -> list[tuple[int, int, int]]:
    """(start, stop, rows computed) blocks covering [0, m) in order; rows computed >= stop - start
    (more only for the padded last block)."""
    if m < 0:
        raise ValueError(f"row count must be >= 0, got {m}")
    if m < WHOLE_BELOW:
        return [(0, m, m)] if m else []
    blocks, start = [], 0
    while m - start >= ROW_BLOCK:
        blocks.append((start, start + ROW_BLOCK, ROW_BLOCK))
        start += ROW_BLOCK
    middle = (m - start) // STEP * STEP
    if middle:
        blocks.append((start, start + middle, middle))
        start += middle
    if m > start:
        tail = m - start
        blocks.append((start, m, max(MIN_TAIL, 1 << (tail - 1).bit_length())))
    return blocks


def block_shapes() -> set[int]:
    """Every row count `row_blocks` can hand a GEMM at WHOLE_BELOW rows or more (the primitives a
    Linear's GEMM may build there)."""
    tails = {MIN_TAIL << i for i in range((STEP // MIN_TAIL).bit_length()) if MIN_TAIL << i < STEP}
    return {ROW_BLOCK} | set(range(STEP, ROW_BLOCK, STEP)) | tails


def _rows(t: Tensor, start: int, stop: int, rows: int) -> Tensor:
    """t[start:stop], zero-padded to `rows` rows when rows > stop - start."""
    if rows == stop - start:
        return t[start:stop]
    padded = t.new_zeros(rows, *t.shape[1:])
    padded[: stop - start] = t[start:stop]
    return padded


def blocked_rows(gemm: Callable[[Tensor, Tensor | None], Tensor], a: Tensor, cols: int) -> Tensor:
    """gemm(a) for a row-wise gemm (row i of the result depends on row i of a only), run on
    the blocks of `row_blocks(a.shape[0])`; the result has `cols` columns, in a's dtype.
    `gemm(x, out)` computes x's rows into `out` when it is given (a view of the result: an
    unpadded block is written in place, never gathered by a copy) and returns a new tensor
    when `out` is None (a padded block, whose extra rows are dropped)."""
    blocks = row_blocks(a.shape[0])
    if not blocks or (len(blocks) == 1 and blocks[0][2] == a.shape[0]):
        return gemm(a, None)
    out = a.new_empty(a.shape[0], cols)
    for start, stop, rows in blocks:
        if rows == stop - start:
            gemm(a[start:stop], out[start:stop])
        else:
            out[start:stop] = gemm(_rows(a, start, stop, rows), None)[: stop - start]
    return out


def blocked_reduction(gemm: Callable[[Tensor, Tensor], Tensor], g: Tensor, x: Tensor) -> Tensor:
    """sum over row blocks of gemm(g_block, x_block), accumulated in float32 (gemm(g, x) is
    g^T x: its reduction runs over the rows of g and x, which must match)."""
    if g.shape[0] != x.shape[0]:
        raise ValueError(f"g and x need the same rows, got {g.shape[0]} and {x.shape[0]}")
    total = None
    for block in row_blocks(g.shape[0]):
        part = gemm(_rows(g, *block), _rows(x, *block)).float()
        total = part if total is None else total.add_(part)
    return total if total is not None else gemm(g, x).float()
