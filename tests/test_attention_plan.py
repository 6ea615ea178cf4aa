"""Model FLOPs of attention and the CPU kernels' plans (length buckets, query chunks, masks;
cpu_jagged's pieces)."""
from __future__ import annotations

import torch
from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from gemref.attention.testing import CPU_KERNEL_EXAMPLES, counted, kernel_settings

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


@given(q_lens=LENGTHS, data=st.data(), mask=MASK)
@counted
def test_allowed_pairs_match_the_reference_mask(q_lens, data, mask):
    causal, window = mask
    kv_lens = q_lens if causal else data.draw(st.lists(st.integers(0, 60), min_size=len(q_lens),
                                                       max_size=len(q_lens)))
    q, kv = torch.tensor(q_lens), torch.tensor(kv_lens)
    expected = allowed_mask(q, kv, max(q_lens), max(kv_lens), causal=causal, window=window).sum((1, 2))
    assert allowed_pairs_per_sequence(q_lens, kv_lens, causal, window).tolist() == expected.tolist()


@given(q_lens=LENGTHS, data=st.data(), mask=MASK, budget=st.sampled_from([64, 1 << 10, 1 << 20]))
@counted
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


# ------------------------------------------------------------------ cpu_jagged's plans
def _rows_of(side, heads):
    """Each padded row's (sequence-local jagged row t, head) or None for padding, via gather."""
    T_H = side.scatter.numel()
    return [None if g == T_H else (g // heads, g % heads) for g in side.gather.tolist()]


@kernel_settings(at_least=CPU_KERNEL_EXAMPLES)
@given(q_lens=LENGTHS, data=st.data(), mask=MASK, softmax=st.booleans(),
       budget=st.sampled_from([64, 1 << 10, 1 << 18]), leaf=st.sampled_from([1, 2, 4, 32]))
@counted
def test_cpu_jagged_plan_covers_every_allowed_pair_once(q_lens, data, mask, softmax, budget, leaf):
    """Replaying a plan's pieces (views, masks) on the padded layout visits every allowed
    (query, key) pair of every sequence exactly once; a piece that writes (not adds) its
    rows writes rows no earlier piece wrote, and Plan.q_written / k_written say whether
    writing pieces cover every row; softmax pieces hold whole rows and carry the
    padding bias whenever an unmasked key of a real row is padding; waves fit the budget."""
    from gemref.attention.cpu_jagged import plan as plan_module
    causal, window = mask
    kv_lens = q_lens if causal else data.draw(st.lists(st.integers(0, 60), min_size=len(q_lens),
                                                       max_size=len(q_lens)))
    heads = 2
    q_off = [0] + torch.cumsum(torch.tensor(q_lens), 0).tolist()
    kv_off = [0] + torch.cumsum(torch.tensor(kv_lens), 0).tolist()
    saved = plan_module.LEAF_MIN
    plan_module.LEAF_MIN = leaf
    try:
        plan = plan_module.make_plan(q_off, kv_off, heads, causal, window, softmax, budget)
    finally:
        plan_module.LEAF_MIN = saved
    q_rows, k_rows = _rows_of(plan.q, heads), _rows_of(plan.kv, heads)
    seq_q = torch.repeat_interleave(torch.arange(len(q_lens)), torch.tensor(q_lens)).tolist()
    seq_k = torch.repeat_interleave(torch.arange(len(kv_lens)), torch.tensor(kv_lens)).tolist()
    covered: dict[tuple, int] = {}
    q_written, k_written, softmax_rows = set(), set(), Counter()
    q_by_writes, k_by_writes = set(), set()   # rows some writing piece writes
    for wave in plan.waves:
        assert sum(p.entries for p in wave) <= budget or len(wave) == 1
        for p in wave:
            assert p.entries <= max(budget, p.keys)   # split down to one row if need be
            for e in range(p.batch):
                qr = [p.q_start + e * p.q_stride + r for r in range(p.rows)]
                kr = [p.k_start + e * p.k_stride + c for c in range(p.keys)]
                if not p.q_acc:
                    assert not q_written & set(qr), "a writing piece overwrites rows"
                if not p.k_acc:
                    assert not k_written & set(kr), "a writing piece overwrites key rows"
                q_written |= set(qr)
                k_written |= set(kr)
                q_by_writes |= set() if p.q_acc else set(qr)
                k_by_writes |= set() if p.k_acc else set(kr)
                if softmax:
                    softmax_rows.update(q_rows[row] for row in qr if q_rows[row] is not None)
                for r, row in enumerate(qr):
                    for c, col in enumerate(kr):
                        if (p.tril is not None and c - r > p.tril) or (p.triu is not None and c - r < p.triu):
                            continue
                        a, b = q_rows[row], k_rows[col]
                        if a is None:
                            continue          # a padding query row: dropped on unpadding
                        if b is None:
                            assert not softmax or p.pad_keys, "softmax sees a padding key unbiased"
                            continue          # a zero key: weight act(0) = 0, or biased away
                        (t, h), (u, h2) = a, b
                        assert h == h2 and seq_q[t] == seq_k[u], "a tile pairs different sequences or heads"
                        key = (h, t, u)
                        covered[key] = covered.get(key, 0) + 1
    expected = {}
    for s, (lq, lk) in enumerate(zip(q_lens, kv_lens)):
        if not (lq and lk):
            continue
        allowed = allowed_mask(torch.tensor([lq]), torch.tensor([lk]), lq, lk, causal=causal, window=window)[0]
        for i, j in allowed.nonzero().tolist():
            for h in range(heads):
                expected[(h, q_off[s] + i, kv_off[s] + j)] = 1
    assert covered == expected
    assert max(softmax_rows.values(), default=1) == 1, "a softmax row is split over pieces"
    # The kernel skips zeroing its padded results exactly when writing pieces cover every row.
    assert plan.q_written == (q_by_writes == set(range(plan.q.rows)))
    assert plan.k_written == (k_by_writes == set(range(plan.kv.rows)))


@given(q_lens=LENGTHS, kv_lens=LENGTHS, slack=st.sampled_from([0, 1 << 10, 1 << 14]))
@counted
def test_bucket_slack_bounds_the_padding_of_every_bucket(q_lens, kv_lens, slack):
    """Every bucket of two or more sequences pads within MAX_WASTE or within `min_slack`
    entries; no slack argument means sdpa's MIN_SLACK_ENTRIES."""
    kv_lens = (kv_lens * len(q_lens))[:len(q_lens)]
    buckets = make_buckets(q_lens, kv_lens, slack)
    for b in buckets:
        padded, real = b.size * b.q_len * b.kv_len, sum(x * y for x, y in zip(b.q_lens, b.kv_lens))
        assert padded <= (1 + MAX_WASTE) * real or padded - real <= slack or b.size == 1
    assert make_buckets(q_lens, kv_lens) == make_buckets(q_lens, kv_lens, MIN_SLACK_ENTRIES)


def test_cpu_jagged_cross_attention_pads_few_key_rows():
    """Few queries over skewed histories: cpu_jagged's own, smaller slack keeps the padded key
    rows (gathered in and out each pass) near the real ones, where sdpa's would not."""
    from gemref.attention.cpu_jagged import plan as plan_module
    gen = torch.Generator().manual_seed(0)
    kv_lens = (torch.randn(64, generator=gen) * 1.1 + 3.7).exp().clamp(1, 512).long().tolist()
    q_off, kv_off = list(range(0, 65 * 10, 10)), [0] + torch.cumsum(torch.tensor(kv_lens), 0).tolist()
    plan = plan_module.make_plan(q_off, kv_off, 1, False, None, False, 1 << 18)
    real = sum(kv_lens)
    assert plan.kv.rows <= real + len(make_buckets([10] * 64, kv_lens, plan_module.SLACK_ENTRIES)) * \
        plan_module.SLACK_ENTRIES // 10 + MAX_WASTE * real
    sdpa_rows = sum(b.size * b.kv_len for b in make_buckets([10] * 64, kv_lens))
    assert plan.kv.rows < 0.85 * sdpa_rows, (plan.kv.rows, sdpa_rows, real)
