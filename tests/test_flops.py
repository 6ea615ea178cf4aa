"""Analytic FLOPs: exact against FlopCounterMode for the executed path; conventions for model FLOPs."""

import pytest
from hypothesis import given, settings, strategies as st

from gemref.config import get_preset
from gemref.mfu.flops import count_with_flop_counter, executed_flops, model_flops, sample_cost_coefficients
from gemref.model import GEMRef, ranking_loss
from gemref.data.batches import batch_with_lengths

TINY = get_preset("tiny").model


@settings(max_examples=8, deadline=None)
@given(st.lists(st.integers(0, TINY.max_len), min_size=1, max_size=5), st.booleans())
def test_executed_flops_match_flop_counter(lengths, jagged):
    batch = batch_with_lengths(TINY, lengths)
    model = GEMRef(TINY, jagged=jagged)
    counted = count_with_flop_counter(lambda: ranking_loss(model(batch), batch.labels).backward())
    assert counted == executed_flops(TINY, batch.lengths, jagged=jagged).total


def test_model_flops_follow_the_convention():
    cfg = TINY
    H, D, L, N = cfg.n_heads, cfg.head_dim, cfg.n_layers, cfg.n_ns_tokens
    a, b = model_flops(cfg, [10]), model_flops(cfg, [10, 0])
    assert a.total == 3 * a.total_forward
    # Causal self-attention: QK^T and PV, 2*H*D*L^2 each, halved.
    assert a.forward["sequence_attention"] == L * 4 * H * D * 100 // 2
    assert a.forward["cross_attention"] == L * 4 * H * D * N * 10
    assert a.forward["embeddings"] == 0
    # An empty history adds only the per-sample work (no attention, no history rows).
    assert b.forward["sequence_attention"] == a.forward["sequence_attention"]
    assert b.forward["interaction"] == 2 * a.forward["interaction"]


def test_sum_of_squares_not_batch_times_max():
    skew = model_flops(TINY, [60, 1, 1, 1]).forward["sequence_attention"]
    assert skew == TINY.n_layers * 2 * TINY.n_heads * TINY.head_dim * (3600 + 3)


def test_padding_is_waste_and_jagged_removes_most_of_it():
    lengths = [3, 50, 7, 1]
    model = model_flops(TINY, lengths).total
    padded = executed_flops(TINY, lengths, jagged=False).total
    jagged = executed_flops(TINY, lengths, jagged=True).total
    assert model < jagged < padded


@pytest.mark.parametrize("L", [0, 1, 7, 64])
def test_sample_cost_coefficients_reproduce_model_flops(L):
    c0, c1, c2 = sample_cost_coefficients(TINY)
    assert c0 + c1 * L + c2 * L * L == model_flops(TINY, [L]).total
