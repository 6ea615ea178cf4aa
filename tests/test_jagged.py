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
