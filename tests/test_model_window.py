"""ModelConfig.window: the history self-attention sees only the last W events; the cross
attention (non-sequence tokens over the history) still sees every event."""
import dataclasses

import pytest
import torch
from hypothesis import given, settings, strategies as st

from gemref.train.presets import get_preset
from gemref.train.override import override
from gemref.data.batches import batch_with_lengths
from gemref.errors import UsageError
from gemref.config.values import parse_field
from gemref.model.config import ModelConfig
from gemref.model.gem import GEMRef
from gemref.model.blocks import CrossBlock, SequenceBlock
from gemref.model.layout import SequenceLayout

from model_cases import assert_jagged_matches_padded, skewed_lengths

TINY = get_preset("tiny").model


@pytest.mark.parametrize("bad", [0, -3])
def test_window_must_be_positive(bad):
    with pytest.raises(UsageError, match=rf"ModelConfig.window must be None \(full causal\) or in \[1, max_len=64\].*got {bad}"):
        override(TINY, window=bad)


@pytest.mark.parametrize("bad", [2.5, True, "8"])
def test_window_must_be_an_int_or_none(bad):
    with pytest.raises(UsageError, match="ModelConfig.window expects an integer or none"):
        override(TINY, window=bad)


@pytest.mark.parametrize("text, value", [("16", 16), ("None", None), (" none ", None)])
def test_window_parses_from_text(text, value):
    assert parse_field(ModelConfig, "window", text) == value


@pytest.mark.parametrize("text", ["1.5", "full", ""])
def test_window_text_errors_name_the_field(text):
    with pytest.raises(UsageError, match=r"^ModelConfig.window expects an integer or none, got "):
        parse_field(ModelConfig, "window", text)


def _layout(lengths, padded, kernel):
    offsets = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int64)
    return SequenceLayout.build(offsets, TINY.max_len, padded=padded, kernel=kernel)


def _history(layout, seed):
    g = torch.Generator().manual_seed(seed)
    rows = layout.row_owner.numel()
    return torch.randn(rows, TINY.d_model, generator=g, dtype=torch.float64)


LAYOUTS = [(True, "reference"), (False, "reference"), (False, "cpu_jagged")]


@pytest.mark.parametrize("padded, kernel", LAYOUTS)
@pytest.mark.parametrize("window", [1, 5])
def test_sequence_block_output_ignores_events_older_than_the_window(padded, kernel, window):
    """Perturb event 0 of sample 1: with a window W only positions 0..W-1 may change."""
    torch.manual_seed(0)
    lengths = [9, 20, 3]
    layout = _layout(lengths, padded, kernel)
    x = _history(layout, 1)
    target = torch.nonzero((layout.row_owner == 1) & (layout.row_position == 0)).item()
    x2 = x.clone()
    x2[target] += torch.linspace(-1, 1, TINY.d_model, dtype=x.dtype)   # not a constant: LayerNorm removes those
    sample1 = layout.row_owner == 1
    if layout.row_is_real is not None:
        sample1 &= layout.row_is_real
    pos = layout.row_position[sample1]
    for w, reach in ((window, window), (None, lengths[1])):
        block = SequenceBlock(dataclasses.replace(TINY, window=w)).double()
        changed = (block(x2, layout) - block(x, layout))[sample1].abs().amax(1) > 1e-12
        assert torch.equal(changed, pos < reach), (w, changed)


@pytest.mark.parametrize("padded, kernel", LAYOUTS)
def test_cross_attention_still_sees_events_older_than_the_window(padded, kernel):
    torch.manual_seed(0)
    layout = _layout([9, 20, 3], padded, kernel)
    x = _history(layout, 2)
    z = torch.randn(3, TINY.n_ns_tokens, TINY.d_model, dtype=torch.float64)
    target = torch.nonzero((layout.row_owner == 1) & (layout.row_position == 0)).item()
    x2 = x.clone()
    x2[target] += torch.linspace(-1, 1, TINY.d_model, dtype=x.dtype)   # not a constant: LayerNorm removes those
    block = CrossBlock(dataclasses.replace(TINY, window=2)).double()
    _, z_a = block(x, z, layout)
    _, z_b = block(x2, z, layout)
    assert (z_b[1] - z_a[1]).abs().amax() > 1e-6          # sample 1's tokens saw its first event
    torch.testing.assert_close(z_b[[0, 2]], z_a[[0, 2]])    # other samples did not


@settings(max_examples=10, deadline=None)
@given(skewed_lengths(TINY.max_len, max_size=5),
       st.integers(1, 20), st.sampled_from([("silu", "cpu_jagged"), ("softmax", "cpu_jagged"),
                                            ("silu", "reference")]))
def test_windowed_jagged_model_matches_windowed_padded_model(lengths, window, activation_kernel):
    """The windowed model computes the same loss and gradients in every layout and kernel."""
    activation, kernel = activation_kernel
    assert_jagged_matches_padded(dataclasses.replace(TINY, activation=activation, window=window), lengths, kernel)


def test_a_window_covering_every_history_changes_nothing_but_the_pointwise_scale():
    """window >= max_len is full causal attention (same out scale 1/max_len): identical output."""
    batch = batch_with_lengths(TINY, [5, 64, 0, 17])
    torch.manual_seed(0)
    full = GEMRef(TINY, jagged=True)(batch)
    torch.manual_seed(0)
    wide = GEMRef(dataclasses.replace(TINY, window=TINY.max_len), jagged=True)(batch)
    torch.testing.assert_close(wide, full, rtol=0, atol=0)


def test_gemref_train_attention_window_reaches_the_model_and_the_record(data_root, tmp_path):
    import json

    from gemref.cli import main

    path = tmp_path / "run.json"
    assert main(["train", "--preset", "tiny", "--steps", "2", "--device", "cpu", "--quiet", "--jagged",
                 "--attention-window", "4", "--eval-batches", "1", "--warmup-steps", "1", "--json", str(path)]) == 0
    record = json.loads(path.read_text())
    assert record["config"]["model"]["window"] == 4


@pytest.mark.parametrize("value, message", [("0", "ModelConfig.window must be None (full causal) or in [1, max_len=64]"),
                                            ("x", "ModelConfig.window expects an integer or none, got 'x'")])
def test_gemref_train_bad_attention_window_exits_2(value, message, capsys):
    from gemref.cli import main

    assert main(["train", "--preset", "tiny", "--steps", "2", "--attention-window", value]) == 2
    assert message in capsys.readouterr().err
