"""Analytic FLOPs: exact against FlopCounterMode for the executed path; conventions for model FLOPs."""

import dataclasses
import json

import pytest
from hypothesis import given, settings, strategies as st

from gemref.train.presets import get_preset
from gemref.attention.flops import allowed_pairs_per_sequence, attention_model_flops
from gemref.mfu.flops import count_with_flop_counter, executed_flops, model_flops, sample_cost_coefficients
from gemref.model.gem import GEMRef, ranking_loss
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
    # Causal self-attention: QK^T and PV, 2*H*D per allowed pair each; L=10 has 10*11/2 = 55.
    assert a.forward["sequence_attention"] == L * 4 * H * D * 55
    assert a.forward["cross_attention"] == L * 4 * H * D * N * 10
    assert a.forward["embeddings"] == 0
    # An empty history adds only the per-sample work (no attention, no history rows).
    assert b.forward["sequence_attention"] == a.forward["sequence_attention"]
    assert b.forward["interaction"] == 2 * a.forward["interaction"]


def test_the_palm_convention_counts_the_full_square_and_nothing_else_changes():
    exact, palm = model_flops(TINY, [10, 3]), model_flops(TINY, [10, 3], convention="palm")
    H, D, L = TINY.n_heads, TINY.head_dim, TINY.n_layers
    assert palm.forward["sequence_attention"] == L * 4 * H * D * (100 + 9)
    assert {c: v for c, v in palm.forward.items() if c != "sequence_attention"} == \
        {c: v for c, v in exact.forward.items() if c != "sequence_attention"}
    with pytest.raises(ValueError, match="convention='half'"):
        attention_model_flops([3], [3], 1, 1, True, None, convention="half")


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.integers(0, 40)), min_size=1, max_size=6))
def test_causal_pairs_are_the_lower_triangle_even_when_lengths_differ(pairs):
    q, kv = [p[0] for p in pairs], [p[1] for p in pairs]
    by_hand = [sum(1 for i in range(a) for j in range(b) if j <= i) for a, b in pairs]
    assert allowed_pairs_per_sequence(q, kv, causal=True, window=None).tolist() == by_hand


def test_sum_of_squares_not_batch_times_max():
    skew = model_flops(TINY, [60, 1, 1, 1]).forward["sequence_attention"]
    assert skew == TINY.n_layers * 4 * TINY.n_heads * TINY.head_dim * (60 * 61 // 2 + 3)


def test_gemref_flops_states_the_convention_and_shows_palm_beside_it(data_root, tmp_path, capsys):
    from gemref.cli import main

    assert main(["flops", "--preset", "tiny", "--device", "cpu", "--json", str(tmp_path / "f.json")]) == 0
    out = capsys.readouterr().out
    assert "model_train_palm" in out and "L(L+1)/2 allowed (query, key) pairs" in out and "PaLM/torchtitan" in out
    rows = {r["component"]: r for r in json.loads((tmp_path / "f.json").read_text())["components"]}
    attn = rows["sequence_attention"]
    assert attn["model_train"] < attn["model_train_palm"] <= 2 * attn["model_train"]
    assert all(r["model_train"] == r["model_train_palm"] for c, r in rows.items()
               if c not in ("sequence_attention", "total"))


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


def _window_pairs_by_hand(L, W):
    """Causal window W: row i sees keys max(0, i-W+1)..i, i.e. min(i + 1, W) of them."""
    return sum(min(i + 1, W) for i in range(L))


@pytest.mark.parametrize("lengths, W", [([10, 3, 0, 25], 4), ([64, 1], 1), ([5, 7], 64), ([17], 16)])
def test_windowed_model_flops_count_only_the_pairs_inside_the_window(lengths, W):
    cfg = dataclasses.replace(TINY, window=W)
    H, D, L, N = cfg.n_heads, cfg.head_dim, cfg.n_layers, cfg.n_ns_tokens
    windowed, full = model_flops(cfg, lengths), model_flops(TINY, lengths)
    pairs = sum(_window_pairs_by_hand(n, W) for n in lengths)
    assert windowed.forward["sequence_attention"] == L * 4 * H * D * pairs
    # the cross attention never windows: N queries x every event
    assert windowed.forward["cross_attention"] == L * 4 * H * D * N * sum(lengths)
    assert {c: v for c, v in windowed.forward.items() if c != "sequence_attention"} == \
        {c: v for c, v in full.forward.items() if c != "sequence_attention"}
    assert windowed.total == 3 * windowed.total_forward


def test_a_window_as_long_as_the_history_is_full_causal_attention():
    lengths = [12, 40, 1]
    wide = model_flops(dataclasses.replace(TINY, window=TINY.max_len), lengths)
    assert wide.forward == model_flops(TINY, lengths).forward


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, 40), min_size=1, max_size=6), st.integers(1, 45))
def test_causal_window_pairs_are_the_band_below_the_diagonal(lengths, W):
    by_hand = [sum(1 for i in range(n) for j in range(n) if j <= i and i - j < W) for n in lengths]
    assert allowed_pairs_per_sequence(lengths, lengths, causal=True, window=W).tolist() == by_hand
    assert by_hand == [_window_pairs_by_hand(n, W) for n in lengths]


@settings(max_examples=6, deadline=None)
@given(st.lists(st.integers(0, TINY.max_len), min_size=1, max_size=4), st.integers(1, 8), st.booleans())
def test_windowed_reference_path_executes_the_full_matrix_as_flop_counter_sees(lengths, W, jagged):
    """The reference kernel masks the window but materialises every (query, key) entry, so its
    executed FLOPs (FlopCounterMode's count) stay those of full attention."""
    cfg = dataclasses.replace(TINY, window=W)
    batch = batch_with_lengths(cfg, lengths)
    model = GEMRef(cfg, jagged=jagged)
    counted = count_with_flop_counter(lambda: ranking_loss(model(batch), batch.labels).backward())
    assert counted == executed_flops(cfg, batch.lengths, jagged=jagged).total
    assert counted == executed_flops(TINY, batch.lengths, jagged=jagged).total


def test_cpu_jagged_executes_fewer_flops_under_a_window_but_never_fewer_than_the_model():
    lengths = [64, 64, 40, 3]
    cfg = dataclasses.replace(TINY, window=8)
    windowed = executed_flops(cfg, lengths, jagged=True, kernel="cpu_jagged")
    full = executed_flops(TINY, lengths, jagged=True, kernel="cpu_jagged")
    assert windowed.forward["sequence_attention"] < full.forward["sequence_attention"]
    assert windowed.forward["cross_attention"] == full.forward["cross_attention"]
    assert windowed.total >= model_flops(cfg, lengths).total


def test_sample_costs_of_a_windowed_model_are_those_of_full_causal_attention():
    assert sample_cost_coefficients(dataclasses.replace(TINY, window=1)) == sample_cost_coefficients(TINY)
