"""GEMMs over fixed row blocks (gemref/mfu/row_blocks.py): the blocks tile the rows exactly,
every block has one of a few row counts whatever the batch, and the blocked results equal the
whole GEMM (a float64 oracle written here, sharing no code with the module)."""
import pytest
import torch
from hypothesis import given, settings, strategies as st

from gemref.mfu import row_blocks as rb

ROWS = st.one_of(st.integers(0, 40), st.integers(rb.WHOLE_BELOW - 3, rb.WHOLE_BELOW + 3),
                 st.integers(0, 3 * rb.ROW_BLOCK + rb.STEP + 7))


@given(m=ROWS)
def test_blocks_tile_the_rows_in_order_with_a_few_row_counts(m):
    blocks = rb.row_blocks(m)
    starts = ([0] + [stop for _, stop, _ in blocks[:-1]]) if blocks else []
    assert [start for start, _, _ in blocks] == starts and (blocks[-1][1] if blocks else 0) == m
    assert all(stop > start and rows >= stop - start for start, stop, rows in blocks)
    if m >= rb.WHOLE_BELOW:
        assert {rows for _, _, rows in blocks} <= rb.block_shapes()
        assert sum(rows - (stop - start) for start, stop, rows in blocks) < max(rb.MIN_TAIL, rb.STEP // 2)
    else:
        assert blocks == ([(0, m, m)] if m else [])


def test_the_row_counts_are_few_and_independent_of_the_batch():
    seen = {rows for m in range(rb.WHOLE_BELOW, 5 * rb.ROW_BLOCK, 7) for _, _, rows in rb.row_blocks(m)}
    assert seen == rb.block_shapes()
    assert len(seen) == 1 + (rb.ROW_BLOCK // rb.STEP - 1) + len([t for t in (64, 128, 256) if t < rb.STEP])
    assert rb.row_blocks(rb.ROW_BLOCK + 1) == [(0, rb.ROW_BLOCK, rb.ROW_BLOCK), (rb.ROW_BLOCK, rb.ROW_BLOCK + 1, rb.MIN_TAIL)]


@settings(max_examples=25, deadline=None)
@given(m=ROWS, k=st.integers(1, 24), n=st.integers(1, 24))
def test_blocked_rows_and_reduction_equal_the_whole_gemm(m, k, n):
    g = torch.Generator().manual_seed(m * 131 + k * 7 + n)
    a, w = torch.randn(m, k, generator=g, dtype=torch.float64), torch.randn(n, k, generator=g, dtype=torch.float64)
    calls = []

    def rows(x, out):
        calls.append(x.shape[0])
        return x @ w.t() if out is None else out.copy_(x @ w.t())

    got = rb.blocked_rows(rows, a, n)
    want = torch.tensor([[sum(float(a[i, c]) * float(w[j, c]) for c in range(k)) for j in range(n)]
                         for i in range(min(m, 3))], dtype=torch.float64)        # by hand, a few rows
    assert got.shape == (m, n)
    torch.testing.assert_close(got[:3], want.reshape(-1, n), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got, torch.einsum("mk,nk->mn", a, w), rtol=1e-12, atol=1e-12)
    assert m < rb.WHOLE_BELOW or set(calls) <= rb.block_shapes()
    x = torch.randn(m, n, generator=g, dtype=torch.float64)
    total = rb.blocked_reduction(lambda gg, xx: gg.t() @ xx, x, a)
    assert total.dtype == torch.float32 and total.shape == (n, k)
    torch.testing.assert_close(total.double(), torch.einsum("mn,mk->nk", x, a), rtol=1e-5, atol=1e-5 * max(1, m) ** 0.5)


def test_unpadded_blocks_are_written_in_place_into_the_result():
    m, written = rb.ROW_BLOCK + rb.STEP + 7, []      # a full block, a STEP block, a padded tail
    a = torch.arange(m * 2, dtype=torch.float64).reshape(m, 2)

    def rows(x, out):
        written.append(None if out is None else out.data_ptr())
        return x * 3 if out is None else out.copy_(x * 3)

    got = rb.blocked_rows(rows, a, 2)
    assert torch.equal(got, a * 3)
    assert written == [got.data_ptr(), got[rb.ROW_BLOCK:].data_ptr(), None]


def test_padded_rows_are_zeros_so_they_add_nothing():
    seen = []
    m = rb.WHOLE_BELOW + 5                       # one full in-place part, then a padded tail
    x = torch.full((m, 3), float("nan"))
    x[:] = 1.0
    rb.blocked_reduction(lambda gg, xx: seen.append(gg.clone()) or gg.t() @ xx, x, x)
    tail = seen[-1]
    assert tail.shape[0] == rb.MIN_TAIL and bool((tail[5:] == 0).all()) and bool((tail[:5] == 1).all())


def test_bad_inputs_are_clear_errors():
    with pytest.raises(ValueError, match="row count must be >= 0"):
        rb.row_blocks(-1)
    with pytest.raises(ValueError, match="same rows"):
        rb.blocked_reduction(lambda gg, xx: gg.t() @ xx, torch.zeros(3, 2), torch.zeros(4, 2))
