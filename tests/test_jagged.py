import dataclasses

import pytest
import torch
from hypothesis import given, settings, strategies as st

from gemref.data.jagged import JaggedBatch, check_offsets, lengths_to_offsets, pad, unpad

lengths_st = st.lists(st.integers(0, 9), min_size=1, max_size=8)


@settings(max_examples=40, deadline=None)
@given(lengths_st)
def test_pad_unpad_roundtrip(lengths):
    offsets = lengths_to_offsets(torch.tensor(lengths))
    values = torch.randn(int(offsets[-1]), 3)
    padded, mask = pad(values, offsets, max(lengths) + 1)
    assert padded.shape == (len(lengths), max(lengths) + 1, 3)
    assert mask.sum() == sum(lengths)
    assert torch.equal(unpad(padded, offsets), values)


def test_pad_refuses_to_truncate():
    with pytest.raises(ValueError, match="sequence 1 has length 5 > max_len=4"):
        pad(torch.zeros(6, 2), torch.tensor([0, 1, 6]), 4)


@pytest.mark.parametrize("offsets, total, message", [
    ([1, 2, 3], 3, r"offsets\[0\] must be 0"),
    ([0, 3, 2, 4], 4, r"non-decreasing: offsets\[2\]=2 < offsets\[1\]=3"),
    ([0, 2, 3], 4, r"offsets\[-1\]=3 does not match the number of rows T=4"),
])
def test_bad_offsets(offsets, total, message):
    with pytest.raises(ValueError, match=message):
        check_offsets(torch.tensor(offsets), total)


def test_offsets_dtype_and_rank():
    with pytest.raises(ValueError, match="int64"):
        check_offsets(torch.tensor([0, 1], dtype=torch.int32), 1)
    with pytest.raises(ValueError, match="1-D"):
        check_offsets(torch.zeros(2, 2, dtype=torch.int64), 0)


def _batch(lengths, vocab=10, n_dense=2, F=2):
    offsets = lengths_to_offsets(torch.tensor(lengths))
    T, B = int(offsets[-1]), len(lengths)
    return JaggedBatch(torch.randint(0, 3, (T, 3)), offsets, torch.randint(0, vocab, (B, F)),
                       torch.randn(B, n_dense), torch.randint(0, vocab, (B,)),
                       torch.randint(0, 2, (B, 2)).float())


def _validate(b):
    return b.validate(item_vocab=10, action_vocab=3, time_buckets=3, sparse_vocab=(10, 10), n_dense=2)


def test_validate_names_field_and_index():
    b = _batch([2, 0, 3])
    _validate(b)
    b.values[4, 0] = 10
    with pytest.raises(ValueError, match=r"history.item\[4\]=10 is outside the table's vocab \[0, 10\)"):
        _validate(b)
    b = _batch([2, 1])
    b.sparse_ids[1, 1] = -1
    with pytest.raises(ValueError, match=r"sparse_1\[1\]=-1"):
        _validate(b)
    b = _batch([2, 1])
    b.dense[1, 0] = float("nan")
    with pytest.raises(ValueError, match=r"dense\[1, 0\]=nan is not finite"):
        _validate(b)
    b = _batch([2, 1])
    b.labels[0, 1] = 0.5
    with pytest.raises(ValueError, match=r"labels\[0, 1\]=0.5 is not 0 or 1"):
        _validate(b)


def test_empty_batch_rejected():
    b = _batch([1])
    empty = JaggedBatch(b.values[:0], torch.zeros(1, dtype=torch.int64), b.sparse_ids[:0], b.dense[:0],
                        b.ad_ids[:0], b.labels[:0])
    with pytest.raises(ValueError, match="empty batch"):
        _validate(empty)


@settings(max_examples=30, deadline=None)
@given(lengths_st, st.data())
def test_select_and_concat_roundtrip(lengths, data):
    b = _batch(lengths)
    perm = data.draw(st.permutations(range(len(lengths))))
    cut = data.draw(st.integers(0, len(lengths)))
    parts = [b.select(perm[:cut]), b.select(perm[cut:])] if 0 < cut < len(lengths) else [b.select(perm)]
    joined = JaggedBatch.concat(parts)
    back = joined.select(sorted(range(len(perm)), key=lambda i: perm[i]))
    for name in ("values", "offsets", "sparse_ids", "dense", "ad_ids", "labels"):
        assert torch.equal(getattr(back, name), getattr(b, name)), name


# ----------------------------------------------------------------------------- the model's boundary

def _model_and_batch():
    from gemref.train.presets import get_preset
    from gemref.data.batches import batch_with_lengths
    from gemref.model.gem import GEMRef

    cfg = get_preset("tiny").model
    return GEMRef(cfg, jagged=True), cfg, batch_with_lengths(cfg, [3, 5, 0, 7], seed=1)


def _corrupt(name):
    def mutate(b, cfg):
        if name == "non-monotone offsets":
            b.offsets[2] = 1
        elif name == "last offset short":
            b.offsets[-1] -= 2
        elif name == "out-of-vocab item":
            b.values[4, 0] = cfg.item_vocab
        elif name == "negative sparse id":
            b.sparse_ids[1, 2] = -1
        elif name == "ad id out of vocab":
            b.ad_ids[3] = cfg.item_vocab + 5
        elif name == "history longer than max_len":
            return _model_and_batch_long(cfg)
        elif name == "float ids":
            b.values = b.values.float()
        elif name == "nan dense":
            b.dense[0, 1] = float("nan")
        return b
    return mutate


def _model_and_batch_long(cfg):
    from gemref.data.batches import batch_with_lengths
    return batch_with_lengths(cfg, [2, cfg.max_len + 1], seed=0)


@pytest.mark.parametrize("case, message", [
    ("non-monotone offsets", r"offsets must be non-decreasing: offsets\[2\]=1 < offsets\[1\]=3"),
    ("last offset short", r"offsets\[-1\]=13 does not match the number of rows T=15"),
    ("out-of-vocab item", r"history.item\[4\]=2000 is outside the table's vocab \[0, 2000\)"),
    ("negative sparse id", r"sparse_2\[1\]=-1"),
    ("ad id out of vocab", r"ad_id\[3\]=2005"),
    ("history longer than max_len", r"sample 1 has 65 history events > max_len=64"),
    ("float ids", r"values must be int64 ids, got torch.float32"),
    ("nan dense", r"dense\[0, 1\]=nan is not finite"),
])
def test_the_model_checks_a_batch_that_no_loader_validated(case, message):
    model, cfg, batch = _model_and_batch()
    model(batch)
    with pytest.raises(ValueError, match=message):
        model(_corrupt(case)(batch, cfg))


def test_a_loader_validated_batch_is_not_checked_again(tiny_batch, monkeypatch):
    from gemref.train.presets import get_preset
    from gemref.data.jagged import model_contract
    from gemref.model.gem import GEMRef

    cfg = get_preset("tiny").model
    model = GEMRef(cfg, jagged=True)
    assert tiny_batch.validated_for == model_contract(cfg)
    for derived in (tiny_batch.select([3, 1]), JaggedBatch.concat([tiny_batch, tiny_batch]), tiny_batch.to("cpu")):
        assert derived.validated_for == tiny_batch.validated_for

    def checked(*args):
        raise AssertionError("checked again")
    monkeypatch.setattr(JaggedBatch, "_check_layout", checked)
    model(tiny_batch)
    with pytest.raises(AssertionError, match="checked again"):   # another config's batch is checked
        GEMRef(dataclasses.replace(cfg, item_vocab=cfg.item_vocab - 1), jagged=True)(tiny_batch)
    from gemref.data.batches import batch_with_lengths
    assert JaggedBatch.concat([tiny_batch, batch_with_lengths(cfg, [1])]).validated_for is None


def test_the_model_takes_only_a_jagged_batch():
    model, _, batch = _model_and_batch()
    with pytest.raises(ValueError, match="GEMRef takes a JaggedBatch, got dict"):
        model({"values": batch.values})


# ----------------------------------------------------------------------------- gdpa() arguments

def _qkv(T=6, dtype=torch.float32):
    return [torch.randn(T, 2, 4, dtype=dtype) for _ in range(3)]


@pytest.mark.parametrize("change, message", [
    (dict(offsets=[0, 2, 6]), r"offsets must be a 1-D int64 torch.Tensor, got list"),
    (dict(kv_offsets=(0, 6)), r"kv_offsets must be a 1-D int64 torch.Tensor, got tuple"),
    (dict(offsets=torch.tensor([0, 2, 6], dtype=torch.int32)), r"offsets must be int64, got torch.int32"),
    (dict(q=torch.randint(0, 3, (6, 2, 4))), r"q must be a floating-point torch.Tensor, got torch.int64"),
    (dict(v=[[1.0]]), r"v must be a floating-point torch.Tensor, got list"),
    (dict(k=torch.randn(6, 2, 4, dtype=torch.float64)), r"q, k, v must share dtype and device"),
    (dict(window=True), r"window must be None or an int >= 1 \(keys per query\), got True"),
    (dict(window=2.0), r"window must be None or an int >= 1"),
    (dict(causal="yes"), r"causal must be True or False, got 'yes'"),
])
def test_gdpa_rejects_wrong_argument_types(change, message):
    from gemref.attention import gdpa

    q, k, v = _qkv()
    args = dict(q=q, k=k, v=v, offsets=torch.tensor([0, 2, 6]))
    args.update(change)
    with pytest.raises(ValueError, match=message):
        gdpa(args.pop("q"), args.pop("k"), args.pop("v"), args.pop("offsets"), kernel="reference", **args)
