"""Policy "local" (gemref/balance/partition.py, `local_schedule`): every sample once per epoch, deterministic, nothing read
from other ranks, never worse than round_robin in expectation; its bench end to end."""
import itertools
import json
import math
import statistics

import numpy as np
import pytest
from hypothesis import assume, given, settings, strategies as st

from gemref.balance import SampleCost, closest_subset, local_rank_batches, local_schedule, round_robin
from gemref.measure.balance_compare import compare, displacement, epoch_plan, exchange_bytes, imbalance
from gemref.cli import main
from gemref.data.sampler import BalancedDistributedBatchSampler
from gemref.data.synthetic import draw_lengths

SETTINGS = settings(max_examples=30, deadline=None)
COST = SampleCost(1e6, 2e5, 5e2)
skewed_lengths = st.lists(st.one_of(st.integers(0, 40), st.integers(0, 512), st.just(512)), min_size=1, max_size=120)


def sampler(lengths, G, world, rank=0, **kw):
    kw = {"policy": "local", "seed": 0, **kw}
    return BalancedDistributedBatchSampler(lengths, G, COST, rank=rank, world_size=world, **kw)


def rr_counts(n, G, world, drop_last):
    """Samples rank r takes at each step under round_robin, by hand: idx[r::world] of each global batch."""
    sizes = [G] * (n // G) + ([] if drop_last or n % G == 0 else [n % G])
    return [[len(range(r, size, world)) for r in range(world)] for size in sizes]


# ----------------------------------------------------------------------------- epoch properties

@SETTINGS
@given(skewed_lengths, st.integers(1, 4), st.integers(1, 6), st.integers(1, 5), st.booleans(), st.integers(0, 99))
def test_every_sample_once_per_epoch_with_round_robin_counts(lengths, world, per_rank, pool_steps, drop_last, seed):
    G, n = world * per_rank, len(lengths)
    tail = n % G
    # the constructor rejects these (tested with the other policies)
    assume(not (n < G or (tail and not drop_last and tail < world)))
    for epoch in range(2):
        per_rank_batches = []
        for r in range(world):
            s = sampler(lengths, G, world, r, pool_steps=pool_steps, drop_last=drop_last, seed=seed)
            s.set_epoch(epoch)
            per_rank_batches.append(list(s))
        used = sorted(i for batches in per_rank_batches for b in batches for i in b)
        expected_n = (n // G) * G if drop_last else n
        assert len(used) == expected_n and len(set(used)) == expected_n, "each sample at most once"
        if not drop_last:
            assert used == list(range(n)), "every sample exactly once, none dropped"
        counts = [[len(per_rank_batches[r][s]) for r in range(world)] for s in range(len(per_rank_batches[0]))]
        assert counts == rr_counts(n, G, world, drop_last), "round_robin's counts: global_size unchanged"


@SETTINGS
@given(st.lists(st.integers(1, 6), min_size=1, max_size=12), st.integers(1, 6), st.integers(1, 6), st.integers(0, 50))
def test_schedule_keeps_samples_within_the_pool_window(raw_counts, per_step, pool_steps, seed):
    counts = [per_step] * (len(raw_counts) - 1) + [min(raw_counts[-1], per_step)]
    rng = np.random.default_rng(seed)
    shares = [rng.lognormal(0, 2, size=c) for c in counts]
    plan = local_schedule(shares, float(np.mean(np.concatenate(shares))), pool_steps)
    assert [len(step) for step in plan] == counts
    assert sorted(p for step in plan for p in step) == sorted((s, i) for s, c in enumerate(counts) for i in range(c))
    assert displacement(plan).max(initial=0) <= pool_steps - 1


def test_one_step_pool_is_round_robin():
    lengths = draw_lengths("skewed", 640, 512, 40, 1.1, seed=2)
    for r in range(4):
        local = list(sampler(lengths, 64, 4, r, pool_steps=1))
        rr = list(sampler(lengths, 64, 4, r, policy="round_robin"))
        order = [np.asarray(b) for b in sampler(lengths, 64, 4).global_batches()]
        assert local == [idx[r::4].tolist() for idx in order] and sorted(map(sorted, rr)) == sorted(map(sorted, local))


def test_deterministic_per_seed_and_reshuffled_per_epoch():
    lengths = draw_lengths("skewed", 1000, 512, 40, 1.1, seed=3)
    a, b, c = (list(sampler(lengths, 40, 4, 1, seed=s)) for s in (7, 7, 8))
    assert a == b and a != c
    s = sampler(lengths, 40, 4, 1, seed=7)
    s.set_epoch(1)
    assert list(s) != a


# ----------------------------------------------------------------------------- zero exchange

@SETTINGS
@given(st.integers(2, 5), st.integers(2, 8), st.integers(1, 6), st.integers(0, 10_000))
def test_a_ranks_plan_reads_only_its_own_samples(world, per_rank, pool_steps, seed):
    rng = np.random.default_rng(seed)
    G = world * per_rank
    lengths = rng.integers(0, 512, size=G * 6)
    rank = int(rng.integers(world))
    target = float(COST.cost(lengths).mean())
    mine = list(sampler(lengths, G, world, rank, pool_steps=pool_steps, target_per_sample=target, seed=seed))
    own = {i for step in sampler(lengths, G, world, rank, policy="round_robin", seed=seed).global_batches()
           for i in step[rank::world].tolist()}
    # 1) every other rank's lengths redrawn: same plan
    other = lengths.copy()
    others = np.array(sorted(set(range(len(lengths))) - own))
    other[others] = rng.integers(0, 512, size=len(others))
    assert list(sampler(other, G, world, rank, pool_steps=pool_steps, target_per_sample=target, seed=seed)) == mine
    # 2) computed in isolation: every other rank's cost is NaN, so reading one would poison the plan
    costs = np.full(len(lengths), np.nan)
    costs[list(own)] = COST.cost(lengths[list(own)])
    order = list(sampler(lengths, G, world, rank, seed=seed).global_batches())
    assert local_rank_batches(order, costs, rank, world, target, pool_steps) == mine


def test_exchange_bytes_by_hand():
    assert exchange_bytes("kk", 1024, 32) == 1024 * 32 * 8 == exchange_bytes("lpt", 1024, 32)
    assert exchange_bytes("local", 1024, 32) == 0 == exchange_bytes("round_robin", 8, 32)
    assert exchange_bytes("kk", 1024, 32, lengths_on_every_rank=True) == 0


# ----------------------------------------------------------------------------- balance

def test_local_beats_round_robin_in_expectation_over_seeds():
    """A statistical statement: the paired difference (round_robin - local) of each seed's mean
    per-step imbalance has a mean over 3 standard errors above 0 (one-sided t > 3, 24 seeds)."""
    diffs = []
    for seed in range(24):
        steps = np.stack([draw_lengths("skewed", 8 * 16, 512, 40, 1.1, seed=[seed, s]) for s in range(24)])
        mean_imb = {}
        for policy in ("round_robin", "local"):
            costs = COST.cost(steps.ravel())
            batches = epoch_plan(steps, COST, 8, policy, pool_steps=6)
            mean_imb[policy] = np.mean([imbalance([costs[b].sum() for b in step]) for step in batches])
        diffs.append(mean_imb["round_robin"] - mean_imb["local"])
    t = statistics.mean(diffs) / (statistics.stdev(diffs) / math.sqrt(len(diffs)))
    assert t > 3, (t, diffs)


def test_compare_rows():
    steps = np.stack([draw_lengths("skewed", 4 * 16, 512, 40, 1.1, seed=s) for s in range(12)])
    rows = {r["policy"]: r for r in compare(steps, COST, 4, ("round_robin", "kk", "local"), pool_steps=4,
                                                       memory=SampleCost(0, 4, 0))}
    assert all(r["once"] for r in rows.values())
    assert rows["round_robin"]["gap_closed"] == 0 and rows["round_robin"]["displacement_max"] == 0
    assert rows["kk"]["of_kk"] == 1.0 and rows["kk"]["of_optimum"] <= 1.0 + 1e-12
    assert rows["local"]["displacement_max"] <= 3 and rows["local"]["exchange_bytes"] == 0
    # round_robin's heaviest rank-step, by hand
    rr_peak = max(steps[s][r::4].sum() for s in range(12) for r in range(4))
    assert rows["round_robin"]["peak_tokens"] == rr_peak and rows["round_robin"]["peak_act_bytes"] == 4 * rr_peak
    assert [len(p) for p in round_robin(np.ones(16), 4)] == [4] * 4


# ----------------------------------------------------------------------------- closest_subset

@SETTINGS
@given(st.lists(st.floats(0, 1e6), min_size=1, max_size=14), st.data())
def test_closest_subset_is_swap_optimal_and_no_worse_than_the_oldest(values, data):
    values = np.asarray(values)
    k = data.draw(st.integers(0, len(values)))
    aim = data.draw(st.floats(0, 1e7))
    chosen = closest_subset(values, k, aim)
    assert chosen.sum() == k
    gap = abs(aim - values[chosen].sum())
    assert gap <= abs(aim - values[:k].sum()) * (1 + 1e-9) + 1e-6
    for i, j in itertools.product(np.flatnonzero(chosen), np.flatnonzero(~chosen)):
        assert abs(aim - (values[chosen].sum() - values[i] + values[j])) >= gap * (1 - 1e-9) - 1e-6


@pytest.mark.parametrize("call, match", [
    (lambda: local_schedule([[1.0]], 1.0, 0), "pool_steps"),
    (lambda: local_schedule([[1.0]], 1.0, True), "pool_steps"),
    (lambda: local_schedule([[1.0]], float("nan"), 2), "target_per_sample"),
    (lambda: local_schedule([[1.0], [1.0, 2.0]], 1.0, 2), "equal counts"),
    (lambda: local_schedule([[1.0, -1.0]], 1.0, 2), r"share_costs\[0\]\[1\]"),
    (lambda: closest_subset(np.ones(3), 4, 1.0), "k=4"),
    (lambda: sampler([1] * 8, 4, 2, pool_steps=0), "pool_steps"),
    (lambda: sampler([1] * 8, 4, 2, target_per_sample=-1.0), "target_per_sample"),
    (lambda: sampler([1] * 8, 4, 2, policy="nope"), "local"),
])
def test_bad_input_is_a_clear_value_error(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# ----------------------------------------------------------------------------- bench

def test_bench_local_balance_simulated_run_writes_its_record(tmp_path, capsys):
    out = tmp_path / "lb.json"
    rc = main(["bench", "local_balance", "--ranks", "4", "--simulated-steps", "6", "--per-rank-batch", "8", "--pool-steps", "3",
               "--no-act-model", "--measure-ranks", "0", "--json", str(out)])
    assert rc == 0
    record = json.loads(out.read_text())
    assert {r["policy"] for r in record["simulated"]} == {"round_robin", "lpt", "kk", "local"}
    assert all(r["plan_ms"] > 0 for r in record["simulated"])
    assert all(r["once"] for r in record["simulated"]) and record["measured"] == []
    assert "local" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--policies", "kk,nope"], "nope"),
    (["--ranks", "x"], "integers"),
    (["--pool-steps", "0"], "--pool-steps"),
])
def test_bench_local_balance_user_errors_exit_2(argv, message, capsys):
    assert main(["bench", "local_balance", "--no-act-model", "--measure-ranks", "0", *argv]) == 2
    assert message in capsys.readouterr().err


def test_bench_local_balance_measures_two_gloo_ranks(tmp_path):
    """The measured path end to end: 2 gloo ranks, the real sampler per policy, the tiny GEM step."""
    out = tmp_path / "lb.json"
    rc = main(["bench", "local_balance", "--ranks", "2", "--simulated-steps", "2", "--per-rank-batch", "4", "--no-act-model",
               "--policies", "round_robin,local", "--measure-ranks", "2", "--measure-steps", "3",
               "--measure-warmup", "0", "--measure-per-rank-batch", "4", "--pool-steps", "2", "--json", str(out)])
    assert rc == 0
    rows = {r["policy"]: r for r in json.loads(out.read_text())["measured"]}
    assert set(rows) == {"round_robin", "local"} and all(r["once"] for r in rows.values())
    assert rows["local"]["exchange_bytes"] == 0 and rows["round_robin"]["speedup_vs_rr"] == 1.0
    assert all(r["peak_act_mb"] > 0 and r["step_ms"] > 0 for r in rows.values())
