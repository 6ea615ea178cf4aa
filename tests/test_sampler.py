"""gemref.data.sampler: length profiles, token-budget batches, balanced distributed batches (all ranks simulated)."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st
from torch.utils.data import DataLoader, Dataset

from gemref.balance import POLICIES, SampleCost, rank_loads
from gemref.measure.balance_compare import imbalance
from gemref.data.synthetic import draw_lengths
from gemref.data.sampler import BalancedDistributedBatchSampler, TokenBudgetBatcher

SETTINGS = settings(max_examples=30, deadline=None)
COST = SampleCost(1e6, 2e5, 5e2)
# Skewed lengths with a spike at the cap (truncated histories) and some zero-length histories.
skewed_lengths = st.lists(st.one_of(st.integers(0, 40), st.integers(0, 512), st.just(512)), min_size=1, max_size=80)


class IndexDataset(Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i


# ----------------------------------------------------------------------------- draw_lengths

def test_draw_lengths_profiles():
    a = draw_lengths("skewed", 20_000, 512, 40, 1.1, seed=3)
    assert np.array_equal(a, draw_lengths("skewed", 20_000, 512, 40, 1.1, seed=3)), "deterministic"
    assert not np.array_equal(a, draw_lengths("skewed", 20_000, 512, 40, 1.1, seed=4))
    assert a.dtype == np.int64 and a.min() >= 1 and a.max() == 512
    assert 36 <= np.median(a) <= 44
    assert np.mean(a == 512) > 0.005, "truncation leaves a spike at max_len"
    assert np.mean(a == 512) > 5 * np.mean(a == 511)
    u = draw_lengths("uniform", 5000, 100, 10, seed=0)
    assert u.min() == 1 and u.max() == 100
    assert np.array_equal(draw_lengths("fixed", 4, 100, 7), [7, 7, 7, 7])
    assert draw_lengths("skewed", 0, 10, 5).shape == (0,)


@pytest.mark.parametrize("kwargs, match", [
    (dict(profile="zipf"), "profile='zipf'"),
    (dict(n=-1), "n >= 0"),
    (dict(max_len=0, median=1), "max_len >= 1"),
    (dict(median=600), "median=600"),
    (dict(sigma=0.0), "sigma"),
    (dict(sigma=float("nan")), "sigma"),
])
def test_draw_lengths_errors(kwargs, match):
    args = dict(profile="skewed", n=4, max_len=512, median=40, sigma=1.1) | kwargs
    with pytest.raises(ValueError, match=match):
        draw_lengths(**args)


# ----------------------------------------------------------------------------- TokenBudgetBatcher

@SETTINGS
@given(skewed_lengths, st.integers(512, 3000), st.integers(0, 1000), st.booleans())
def test_token_budget_cover_and_budget(lengths, budget, seed, use_flops):
    cost = COST if use_flops else None
    weights = np.asarray(COST.cost(lengths) if use_flops else lengths, dtype=float)
    limit = budget * 3e5 if use_flops else budget   # same order of magnitude for both units
    if weights.max() > limit:
        with pytest.raises(ValueError, match="exceeds budget"):
            TokenBudgetBatcher(lengths, limit, cost=cost, seed=seed)
        return
    sampler = TokenBudgetBatcher(lengths, limit, cost=cost, seed=seed)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        batches = list(sampler)
        assert len(batches) == len(sampler)
        assert sorted(i for b in batches for i in b) == list(range(len(lengths))), "each sample once per epoch"
        assert all(b and weights[b].sum() <= limit for b in batches)
        # greedy packing: the next batch's first sample did not fit into the previous batch
        for prev, nxt in zip(batches, batches[1:]):
            assert weights[prev].sum() + weights[nxt[0]] > limit
        other = TokenBudgetBatcher(lengths, limit, cost=cost, seed=seed)
        other.set_epoch(epoch)
        assert list(other) == batches, "deterministic for (seed, epoch)"


def test_token_budget_shuffles_per_epoch_and_oversize():
    lengths = draw_lengths("skewed", 300, 512, 40, seed=0)
    s = TokenBudgetBatcher(lengths, budget=2048, seed=1)
    first = list(s)
    s.set_epoch(1)
    assert list(s) != first
    assert list(TokenBudgetBatcher(lengths, 2048, shuffle=False))[0][:3] == [0, 1, 2]
    with pytest.raises(ValueError, match=r"sample 2 \(tokens 900\) exceeds budget=800 on its own \(2 such"):
        TokenBudgetBatcher([10, 20, 900, 5, 801], 800)
    s = TokenBudgetBatcher([10, 20, 900, 5, 801], 800, allow_oversize=True, shuffle=False)
    assert list(s) == [[0, 1], [2], [3], [4]]
    assert list(TokenBudgetBatcher([0] * 7, 10, max_samples=3, shuffle=False)) == [[0, 1, 2], [3, 4, 5], [6]]
    for bad, match in ((dict(budget=0), "budget"), (dict(budget=float("nan")), "budget"),
                       (dict(budget=10, max_samples=0), "max_samples")):
        with pytest.raises(ValueError, match=match):
            TokenBudgetBatcher([1, 2], **bad)
    with pytest.raises(ValueError, match=r"lengths\[1\]=-4"):
        TokenBudgetBatcher([1, -4], 10)


def test_token_budget_in_a_dataloader():
    lengths = draw_lengths("skewed", 100, 512, 40, seed=0)
    loader = DataLoader(IndexDataset(100), batch_sampler=TokenBudgetBatcher(lengths, 1024, seed=0))
    got = torch.cat(list(loader))
    assert sorted(got.tolist()) == list(range(100))


# ----------------------------------------------------------------------------- BalancedDistributedBatchSampler

def all_ranks(lengths, gbs, world, **kw):
    return [BalancedDistributedBatchSampler(lengths, gbs, COST, rank=r, world_size=world, **kw) for r in range(world)]


@SETTINGS
@given(skewed_lengths, st.integers(1, 40), st.integers(1, 4), st.booleans(), st.sampled_from(list(POLICIES)),
       st.integers(0, 100))
def test_distributed_cover_simulating_all_ranks(lengths, gbs, world, drop_last, policy, seed):
    n = len(lengths)
    tail = n % gbs
    try:
        samplers = all_ranks(lengths, gbs, world, drop_last=drop_last, policy=policy, seed=seed)
    except ValueError as e:
        assert gbs < world or (tail and not drop_last and tail < world) or (drop_last and n < gbs), str(e)
        return
    for epoch in range(2):
        for s in samplers:
            s.set_epoch(epoch)
        per_rank = [list(s) for s in samplers]
        steps = len(samplers[0])
        assert all(len(b) == steps == len(s) for b, s in zip(per_rank, samplers)), "same step count on every rank"
        used = [i for b in per_rank for batch in b for i in batch]
        assert len(used) == len(set(used)), "no sample twice"
        expected = n - tail if drop_last and tail else n
        assert len(used) == expected, "every sample once per epoch (only the tail dropped, only with drop_last)"
        for step in range(steps):
            batches = [b[step] for b in per_rank]
            assert all(len(b) >= 1 for b in batches)
            assert sum(map(len, batches)) == samplers[0].global_size(step)


def test_every_rank_plans_the_same_lpt_split_alone_and_uses_every_sample_once():
    """Each rank builds its own sampler (nothing exchanged) and takes exactly its part of the
    plan any other rank computes; the LPT split's slowest rank is within Graham's bound of the
    optimum's lower bound."""
    lengths = draw_lengths("skewed", 4096, 512, 40, seed=3)
    world, gbs = 16, 1024
    samplers = all_ranks(lengths, gbs, world, policy="lpt", seed=11)
    plans = [list(s.plan()) for s in samplers]               # every rank's own, independent planning
    assert all(plan == plans[0] for plan in plans)
    own = [list(s) for s in samplers]
    for step, parts in enumerate(plans[0]):
        assert [own[r][step] for r in range(world)] == parts
    used = sorted(i for parts in plans[0] for part in parts for i in part)
    assert used == list(range(len(lengths)))
    costs = COST.cost(lengths)
    for parts in plans[0]:
        loads = [costs[p].sum() for p in parts]
        bound = max(max(costs[i] for p in parts for i in p), sum(loads) / world)
        assert max(loads) <= (4 / 3) * bound


def test_exchange_depends_on_where_the_lengths_are_not_on_the_policy_name():
    from gemref.measure.balance_compare import compare

    lengths = draw_lengths("skewed", 8 * 64, 512, 40, seed=5).reshape(8, 64)
    own = {r["policy"]: r for r in compare(lengths, COST, 8, ("kk", "lpt", "local"))}
    every = {r["policy"]: r for r in compare(lengths, COST, 8, ("kk", "lpt", "local"), lengths_on_every_rank=True)}
    assert own["lpt"]["exchange_bytes"] == own["kk"]["exchange_bytes"] == 8 * 8 * 8 and own["local"]["exchange_bytes"] == 0
    assert all(r["exchange_bytes"] == 0 for r in every.values())
    assert own["lpt"]["once"] and own["lpt"]["plan_ms"] > 0 and own["lpt"]["of_optimum"] > 0.9
    assert own["lpt"]["of_optimum"] == every["lpt"]["of_optimum"]


def test_shared_is_refused_with_the_policy_it_was():
    from gemref.train.presets import get_preset
    from gemref.train.override import override
    from gemref.errors import UsageError
    for old, new in (("shared", "lpt"), ("round_robin", "none")):
        with pytest.raises(UsageError, match=f"balance='{old}' is policy '{new}' under another name"):
            override(get_preset("tiny").train, balance=old)


def test_distributed_balances_and_is_deterministic():
    lengths = draw_lengths("skewed", 2048, 512, 40, seed=0)
    imb = {}
    for policy in ("round_robin", "kk"):
        samplers = all_ranks(lengths, 512, 8, policy=policy, seed=7)
        per_rank = [list(s) for s in samplers]
        imb[policy] = max(imbalance(rank_loads(COST.cost(lengths), [b[step] for b in per_rank]))
                          for step in range(len(samplers[0])))
    assert imb["kk"] <= 1.02 < imb["round_robin"]
    a, b = all_ranks(lengths, 512, 8, seed=7)[3], all_ranks(lengths, 512, 8, seed=7)[3]
    assert list(a) == list(b)
    b.set_epoch(1)
    assert list(a) != list(b)


def test_distributed_last_partial_batch_and_errors():
    lengths = [5] * 10
    samplers = all_ranks(lengths, 4, 2)
    assert len(samplers[0]) == 3 and [samplers[0].global_size(s) for s in range(3)] == [4, 4, 2]
    assert len(all_ranks(lengths, 4, 2, drop_last=True)[0]) == 2
    with pytest.raises(ValueError, match="step=3 is outside"):
        samplers[0].global_size(3)
    with pytest.raises(ValueError, match="last global batch would hold 1 samples"):
        all_ranks([5] * 9, 4, 2)
    with pytest.raises(ValueError, match="global_batch_size=3 cannot give 4 ranks"):
        all_ranks(lengths, 3, 4)
    with pytest.raises(ValueError, match="min_per_rank must be >= 1"):
        all_ranks(lengths, 4, 2, min_per_rank=0)
    assert all(len(b) == 2 for s in all_ranks([5] * 12, 4, 2, min_per_rank=2) for b in s)
    with pytest.raises(ValueError, match="leaves no batch"):
        all_ranks([5] * 3, 4, 2, drop_last=True)
    with pytest.raises(ValueError, match="lengths is empty"):
        all_ranks([], 4, 2)
    with pytest.raises(ValueError, match="rank=2"):
        BalancedDistributedBatchSampler(lengths, 4, COST, rank=2, world_size=2)
    with pytest.raises(ValueError, match="policy='fair'"):
        BalancedDistributedBatchSampler(lengths, 4, COST, rank=0, world_size=2, policy="fair")
    with pytest.raises(ValueError, match="cost must be a SampleCost"):
        BalancedDistributedBatchSampler(lengths, 4, None, rank=0, world_size=2)
    with pytest.raises(ValueError, match=r"lengths\[0\]=-1"):
        BalancedDistributedBatchSampler([-1, 2], 2, COST, rank=0, world_size=1)
    if not torch.distributed.is_initialized():
        with pytest.raises(ValueError, match="torch.distributed is not initialised"):
            BalancedDistributedBatchSampler(lengths, 4, COST)


def test_distributed_in_a_dataloader():
    lengths = draw_lengths("skewed", 50, 512, 40, seed=1)
    got = []
    for s in all_ranks(lengths, 16, 2):
        got += torch.cat(list(DataLoader(IndexDataset(50), batch_sampler=s))).tolist()
    assert sorted(got) == list(range(50))
