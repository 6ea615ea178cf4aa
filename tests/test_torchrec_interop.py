"""gemref/interop/kjt.py: JaggedBatch <-> KeyedJaggedTensor, exact both ways on hypothesis-drawn
skewed lengths (empty histories included); its JaggedTensors feed gdpa as they are; mismatched
inputs are ValueErrors; without TorchRec, a one-line UsageError and the native path unaffected."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings, strategies as st

from gemref.train.presets import get_preset
from gemref.data.batches import batch_with_lengths
from gemref.errors import UsageError
from gemref.interop import lib

from gemref.interop.kjt import batch_to_kjt, feature_keys, kjt_to_batch
from model_cases import skewed_lengths

CFG = get_preset("tiny").model
HAVE_TORCHREC = lib.available()
KJT = lib.torchrec().KeyedJaggedTensor if HAVE_TORCHREC else None
needs_torchrec = pytest.mark.skipif(not HAVE_TORCHREC, reason="TorchRec is not installed (requirements-nodeps.txt)")


def assert_batches_equal(a, b) -> None:
    for name in ("values", "offsets", "sparse_ids", "dense", "ad_ids", "labels"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name


def assert_kjts_equal(a, b) -> None:
    assert a.keys() == b.keys() and a.stride() == b.stride()
    assert torch.equal(a.values(), b.values()) and torch.equal(a.lengths(), b.lengths())


@needs_torchrec
@settings(max_examples=60)
@given(skewed_lengths(CFG.max_len, max_size=12), st.integers(0, 2**16))
def test_batch_to_kjt_to_batch_is_exact(lengths, seed):
    batch = batch_with_lengths(CFG, lengths, seed)
    kjt = batch_to_kjt(batch)
    assert kjt.keys() == list(feature_keys(CFG.n_sparse)) and kjt.stride() == len(lengths)
    for j, key in enumerate(("item", "action", "time_gap")):
        jt = kjt[key]
        assert torch.equal(jt.offsets(), batch.offsets) and torch.equal(jt.values(), batch.values[:, j])
    assert_batches_equal(kjt_to_batch(kjt, batch.dense, batch.labels), batch)


@needs_torchrec
@settings(max_examples=60)
@given(skewed_lengths(CFG.max_len, max_size=12), st.integers(0, 2**16), st.randoms(use_true_random=False))
def test_kjt_to_batch_to_kjt_is_exact_in_any_key_order(lengths, seed, rnd):
    batch = batch_with_lengths(CFG, lengths, seed)
    canonical = batch_to_kjt(batch)
    per_key = canonical.to_dict()
    keys = list(per_key)
    rnd.shuffle(keys)
    shuffled = KJT.from_jt_dict({k: per_key[k] for k in keys})
    back = kjt_to_batch(shuffled, batch.dense, batch.labels)
    assert_batches_equal(back, batch)
    assert_kjts_equal(batch_to_kjt(back), canonical)


@needs_torchrec
def test_history_jagged_tensor_feeds_gdpa_directly():
    from gemref.attention import gdpa
    batch = batch_with_lengths(CFG, [0, 5, 1, 17, 0, 3])
    jt = batch_to_kjt(batch)["item"]
    assert jt.offsets().dtype == torch.int64
    table = torch.nn.Embedding(CFG.item_vocab, 2 * 8, dtype=torch.float64)
    qkv = table(jt.values()).view(-1, 2, 8)
    out = gdpa(qkv, qkv, qkv, jt.offsets(), activation="silu", causal=True, kernel="reference")
    ref = gdpa(qkv, qkv, qkv, batch.offsets, activation="silu", causal=True, kernel="reference")
    assert out.shape == (batch.num_tokens, 2, 8) and torch.equal(out, ref)


@needs_torchrec
def test_mismatched_inputs_are_value_errors_naming_what_differs():
    batch = batch_with_lengths(CFG, [2, 0, 3])
    kjt = batch_to_kjt(batch)
    per_key = kjt.to_dict()
    with pytest.raises(ValueError, match="missing \\['ad'\\]"):
        kjt_to_batch(KJT.from_jt_dict({k: v for k, v in per_key.items() if k != "ad"}), batch.dense, batch.labels)
    short = dict(per_key, action=type(per_key["action"])(values=torch.zeros(4, dtype=torch.int64),
                                                         lengths=torch.tensor([2, 1, 1])))
    with pytest.raises(ValueError, match="history key 'action' has length 1 at sample 1"):
        kjt_to_batch(KJT.from_jt_dict(short), batch.dense, batch.labels)
    two = dict(per_key, ad=type(per_key["ad"])(values=torch.zeros(3, dtype=torch.int64),
                                               lengths=torch.tensor([1, 2, 0])))
    with pytest.raises(ValueError, match="'ad' has 2 ids at sample 1"):
        kjt_to_batch(KJT.from_jt_dict(two), batch.dense, batch.labels)
    with pytest.raises(ValueError, match="labels must be \\(3, 2\\)"):
        kjt_to_batch(kjt, batch.dense, batch.labels[:2])
    with pytest.raises(ValueError, match="values must be int64"):
        batch_to_kjt(type(batch)(batch.values.float(), batch.offsets, batch.sparse_ids, batch.dense,
                                 batch.ad_ids, batch.labels))
    with pytest.raises(ValueError, match="offsets\\[-1\\]"):
        batch_to_kjt(type(batch)(batch.values[:-1], batch.offsets, batch.sparse_ids, batch.dense,
                                 batch.ad_ids, batch.labels))


def test_without_torchrec_a_one_line_usage_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchrec", None)   # `import torchrec` now raises ImportError
    with pytest.raises(UsageError, match="TorchRec is not usable here") as e:
        lib.torchrec()
    assert "\n" not in str(e.value) and not lib.available()


def test_gemref_imports_and_trains_natively_without_torchrec():
    """A fresh interpreter where `import torchrec` fails: gemref, its interop package and a native
    model step still work."""
    code = ("import sys; sys.modules['torchrec'] = None\n"
            "import gemref.interop, gemref.interop.kjt, gemref.train.compose\n"
            "from gemref.train.presets import get_preset\nfrom gemref.data.batches import batch_with_lengths\n"
            "from gemref.model.gem import GEMRef, ranking_loss\ncfg = get_preset('tiny').model\n"
            "b = batch_with_lengths(cfg, [3, 0, 2])\nranking_loss(GEMRef(cfg)(b), b.labels).backward()\n"
            "assert 'torchrec' not in [m for m in sys.modules if sys.modules[m] is not None]\nprint('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
