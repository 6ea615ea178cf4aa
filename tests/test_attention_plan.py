"""Model FLOPs of attention and the CPU kernels' plan (length buckets, query chunks, masks)."""
from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gemref.attention import attention_model_flops
from gemref.attention.bucketing import (MAX_WASTE, MIN_SLACK_ENTRIES, chunk_mask, make_buckets,
                                        query_chunks)
from gemref.attention.flops import allowed_pairs_per_sequence
from gemref.attention.reference import allowed_mask

LENGTHS = st.lists(st.one_of(st.sampled_from([0, 1, 2]), st.integers(0, 60)), min_size=1, max_size=8)
MASK = st.tuples(st.booleans(), st.one_of(st.none(), st.integers(1, 20)))


def test_model_flops_convention():
    # Full attention: QK^T and PV, 2*H*D*Lq*Lk each, over the real lengths only.
    assert attention_model_flops([3, 0, 5], [3, 0, 5], 2, 8, False, None) == 2 * 2 * 2 * 8 * (9 + 25)
    # Causal: the allowed pairs, L(L+1)/2 per sequence (the exact convention).
    assert attention_model_flops([4, 6], [4, 6], 1, 16, True, None) == 2 * 2 * 16 * (10 + 21)
    # Cross attention: 4 queries over each history.
    assert attention_model_flops([4, 4], [100, 0], 3, 8, False, None) == 2 * 2 * 3 * 8 * 400
    # Window: the exact allowed pairs. L=4, W=2, causal: rows see 1, 2, 2, 2 keys.
    assert attention_model_flops([4], [4], 1, 1, True, 2) == 2 * 2 * 7


@settings(max_examples=40, deadline=None)
@given(q_lens=LENGTHS, data=st.data(), mask=MASK)
def test_allowed_pairs_match_the_reference_mask(q_lens, data, mask):
    causal, window = mask
    kv_lens = q_lens if causal else data.draw(st.lists(st.integers(0, 60), min_size=len(q_lens),
                                                       max_size=len(q_lens)))
    q, kv = torch.tensor(q_lens), torch.tensor(kv_lens)
    expected = allowed_mask(q, kv, max(q_lens), max(kv_lens), causal=causal, window=window).sum((1, 2))
    assert allowed_pairs_per_sequence(q_lens, kv_lens, causal, window).tolist() == expected.tolist()


@settings(max_examples=40, deadline=None)
@given(q_lens=LENGTHS, data=st.data(), mask=MASK, budget=st.sampled_from([64, 1 << 10, 1 << 20]))
def test_buckets_and_chunks_cover_every_allowed_pair_once(q_lens, data, mask, budget):
    causal, window = mask
    kv_lens = q_lens if causal else data.draw(st.lists(st.integers(0, 60), min_size=len(q_lens),
                                                       max_size=len(q_lens)))
    buckets = make_buckets(q_lens, kv_lens)
    seqs = sorted(s for b in buckets for s in b.seqs)
    assert seqs == [i for i in range(len(q_lens)) if q_lens[i] and kv_lens[i]]
    for b in buckets:
        padded, real = b.size * b.q_len * b.kv_len, sum(x * y for x, y in zip(b.q_lens, b.kv_lens))
        assert padded <= (1 + MAX_WASTE) * real or padded - real <= MIN_SLACK_ENTRIES or b.size == 1
        allowed = allowed_mask(torch.tensor(b.q_lens), torch.tensor(b.kv_lens), b.q_len, b.kv_len,
                               causal=causal, window=window)
        covered = torch.zeros_like(allowed, dtype=torch.int64)
        rows_seen = torch.zeros(b.q_len, dtype=torch.int64)
        for c in query_chunks(b, heads=2, causal=causal, window=window, budget_entries=budget):
            rows_seen[c.q0:c.q1] += 1
            m = chunk_mask(c, b, causal, window, torch.device("cpu"))
            m = torch.ones(1, 1, 1, 1, dtype=torch.bool) if m is None else m
            block = m.expand(b.size, 1, c.q1 - c.q0, c.k1 - c.k0)[:, 0].long()
            covered[:, c.q0:c.q1, c.k0:c.k1] += block
        assert rows_seen.max() <= 1  # chunks never overlap
        real_rows = torch.arange(b.q_len)[None, :, None] < torch.tensor(b.q_lens)[:, None, None]
        # On real query rows the chunks' masks allow exactly the reference's pairs, once.
        assert torch.equal(covered * real_rows, allowed.long())
