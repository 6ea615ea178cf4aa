"""GEMRef: the jagged layout computes what the padded layout computes, loss and gradients."""
import dataclasses

import pytest
import torch
from hypothesis import given, settings, strategies as st

from gemref.data.batches import batch_with_lengths
from gemref.train.presets import get_preset
from gemref.model.gem import GEMRef, ranking_loss

import model_cases
from model_cases import assert_jagged_matches_padded

TINY = get_preset("tiny").model


skewed_lengths = model_cases.skewed_lengths(TINY.max_len)


@settings(max_examples=16, deadline=None)
@given(skewed_lengths, st.sampled_from([("silu", "reference"), ("silu", "cpu_jagged"), ("relu2", "cpu_jagged"),
                                        ("softmax", "reference"), ("softmax", "sdpa"), ("softmax", "cpu_jagged")]))
def test_jagged_matches_padded(lengths, activation_kernel):
    """Rung 1 (jagged layout) and rung 2 (fast kernels) change how the model runs, not what it computes."""
    activation, kernel = activation_kernel
    assert_jagged_matches_padded(dataclasses.replace(TINY, activation=activation), lengths, kernel)


def test_pad_rows_do_not_leak():
    """Changing what sits on pad rows cannot change the padded model's output."""
    batch = batch_with_lengths(TINY, [3, 1, 7])
    model = GEMRef(TINY, jagged=False)
    layout = model.layout(batch)
    x, z = model.embed(batch, layout)
    x_noisy = x + torch.randn_like(x) * (~layout.row_is_real)[:, None]
    outs = []
    for rows in (x, x_noisy):
        h, n = rows, z
        for layer in model.layers:
            h, n = layer(h, n, layout)
        outs.append(layout.mean_pool(h))
    torch.testing.assert_close(outs[0], outs[1])


def test_history_longer_than_max_len_is_an_error():
    batch = batch_with_lengths(TINY, [TINY.max_len + 1])
    for jagged in (False, True):
        with pytest.raises(ValueError, match=f"> max_len={TINY.max_len}"):
            GEMRef(TINY, jagged=jagged)(batch)


def test_model_learns_a_fixed_batch():
    batch = batch_with_lengths(TINY, [5, 9, 2, 30, 1, 12, 7, 3])
    model = GEMRef(TINY, jagged=True)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    first = None
    for _ in range(30):
        opt.zero_grad()
        loss = ranking_loss(model(batch), batch.labels)
        first = first if first is not None else loss.item()
        loss.backward()
        opt.step()
    assert loss.item() < 0.5 * first


def test_loss_normalizer_scales_the_sum():
    logits, labels = torch.randn(4, 2), torch.randint(0, 2, (4, 2)).float()
    torch.testing.assert_close(ranking_loss(logits, labels, normalizer=8), ranking_loss(logits, labels) / 2)
