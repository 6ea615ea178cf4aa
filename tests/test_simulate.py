"""The simulator: hand-derived cases with the arithmetic written out, properties, bad inputs, the CLI,
and the structure of one measured validation run (how close it comes is a benchmark: `gemref
simulate validate`).

No expected value here is computed by the function under test or by a copy of its formula
over symbols: each is worked out by hand on concrete numbers in the comment beside it.
"""
import json
import math

import numpy as np
import pytest

from gemref.balance import SampleCost, lpt, rank_loads, round_robin
from gemref.cli import main
from gemref.parallel.config import MeshShape
from gemref.train.presets import get_preset
from gemref.measure.balance_compare import imbalance
from gemref.mfu.flops import sample_cost_coefficients
from gemref.simulate.collectives import LinkTier, collective_time
from gemref.simulate.cost_model import HardwareProfile, get_profile, sm_count
from gemref.simulate.projection import LADDER, Options, draw_batches, load_stats, project
from gemref.simulate.step_model import comm_rows, exposed_only, one_step, predict_step, with_sm_shares
from gemref.simulate.summary import (compare_transports, contention_findings, findings, load_waterfall, measured_mfu,
                                     mfu_at, parse_mfu_assumption, required_local_mfu, rung_deltas,
                                     rung_that_matters)
from gemref.simulate.validate import fit_tier

FREE = LinkTier("free", 0.0, math.inf, "no cost")
FREE_HW = HardwareProfile("free", 8, FREE, FREE, "H100")
TINY = get_preset("tiny")
EVERY_RUNG_40 = {r.key: (0.4, "test") for r in LADDER}


# ----------------------------------------------------------------------------- collectives by hand


def test_ring_all_reduce_by_hand():
    # N = 1e8 bytes over R = 8 ranks at B = 1e10 B/s, alpha = 5 us:
    #   2 (R-1)/R N/B + 2 alpha = 2 * 7/8 * 0.01 s + 14 * 5e-6 s = 0.0175 + 0.00007 = 0.01757 s
    tier = LinkTier("t", 5e-6, 1e10, "test")
    assert collective_time("all_reduce", 1e8, 8, tier, "ring") == pytest.approx(0.01757, rel=1e-12)
    # the double binary tree: 2 log2(R) alpha + 2 N/B = 6 * 5e-6 + 2 * 0.01 = 0.02003 s: ring wins, auto takes it
    assert collective_time("all_reduce", 1e8, 8, tier, "tree") == pytest.approx(0.02003, rel=1e-12)
    assert collective_time("all_reduce", 1e8, 8, tier, "auto") == pytest.approx(0.01757, rel=1e-12)
    # a 1 kB all-reduce over 1024 ranks: ring 2 * 1023 * 5e-6 = 0.01023 s (+ ~2e-7 s of bytes);
    # tree 2 * 10 * 5e-6 + 2 * 1e3 / 1e10 = 1.002e-4 s: latency-bound, auto takes the tree
    assert collective_time("all_reduce", 1e3, 1024, tier, "auto") == pytest.approx(1.002e-4, rel=1e-12)


def test_fit_tier_recovers_alpha_and_beta_from_hand_computed_times():
    # reduce-scatter ring over 4 ranks, alpha = 2e-4 s, beta = 5e8 B/s: 3 alpha + 3/4 B / beta
    #   B = 4e3: 6e-4 + 0.75 * 8e-6  = 6.06e-4 s
    #   B = 6e4: 6e-4 + 0.75 * 1.2e-4 = 6.9e-4 s
    #   B = 1e6: 6e-4 + 0.75 * 2e-3  = 2.1e-3 s
    fitted = fit_tier("reduce_scatter", [(4e3, 6.06e-4), (6e4, 6.9e-4), (1e6, 2.1e-3)], 4)
    assert fitted.alpha_s == pytest.approx(2e-4) and fitted.bandwidth_bytes_per_s == pytest.approx(5e8)


def test_priced_collectives_by_hand():
    tier = LinkTier("t", 1e-5, 1e9, "test")
    hw = HardwareProfile("t", 8, tier, tier, "H100")
    rows = [{"kind": "all_gather", "dim": "shard", "group_size": 4, "count": 2, "bytes": 8e6, "overlappable_bytes": 8e6},
            {"kind": "all_reduce", "dim": "replicate", "group_size": 8, "count": 1, "bytes": 1e6},
            {"kind": "all_reduce", "dim": "tables", "group_size": 8, "count": 1, "bytes": 4e6}]
    priced = comm_rows(rows, MeshShape(2, 4), hw, table_sync_every=4)
    # all-gather, 2 calls of 4e6 B over 4 ranks: 2 * (3 * 1e-5 + 3/4 * 4e6 / 1e9) = 2 * 0.00303 = 0.00606 s
    # all-reduce of 1e6 B over 8 ranks, ring: 14 * 1e-5 + 2 * 7/8 * 1e-3 = 0.00014 + 0.00175 = 0.00189 s
    #   (tree: 6 * 1e-5 + 2 * 1e-3 = 0.00206 s, slower)
    # the table replicas' 4e6 B every 4 steps: (14 * 1e-5 + 2 * 7/8 * 4e-3) / 4 = 0.00714 / 4 = 0.001785 s
    assert [r["seconds"] for r in priced] == pytest.approx([0.00606, 0.00189, 0.001785], rel=1e-12)
    assert [r["overlappable_s"] for r in priced] == pytest.approx([0.00606, 0.0, 0.0])
    # no compute: nothing to hide under, the step is all of it: 0.00606 + 0.00189 + 0.001785 = 0.009735 s
    assert predict_step(0.0, 1.0, priced)["step_s"] == pytest.approx(0.009735, rel=1e-12)


# ----------------------------------------------------------------------------- the step-time model


def test_step_and_scaling_ratio_by_hand():
    # compute 2 s, imbalance 1.25: the slowest rank computes 2.5 s; nothing to communicate
    out = predict_step(2.0, 1.25, [])
    assert out["step_s"] == 2.5 and out["bubble_s"] == 0.5 and out["scaling_ratio"] == pytest.approx(2.0 / 2.5)
    rows = [{"kind": "all_gather", "dim": "shard", "seconds": 1.0, "overlappable_s": 0.8}]
    # 0.8 s could overlap but the step computes only 0.5 s: 0.5 s hidden, 0.5 s exposed, step 1.0 s
    out = predict_step(0.5, 1.0, rows)
    assert out["exposed_s"] == pytest.approx(0.5) and out["step_s"] == pytest.approx(1.0)
    assert out["scaling_ratio"] == pytest.approx(0.5)
    # 0.8 s hidden under 2 s of compute; SMs taken half the hidden time: 2 + 0.2 exposed + 0.4 slowdown
    assert predict_step(2.0, 1.0, rows, sm_share=0.5)["step_s"] == pytest.approx(2.6)
    # nothing allowed to overlap: 2 + 1 = 3 s
    assert predict_step(2.0, 1.0, exposed_only(rows))["step_s"] == pytest.approx(3.0)


def test_e2e_mfu_is_local_mfu_times_scaling_ratio_by_hand():
    # rank FLOPs 1e15, peak 1e15 FLOP/s, imbalance 1.25, 1 s of exposed comm.
    # local MFU 0.5 -> compute 2 s, busy 2.5 s, step 3.5 s -> E2E = 1e15 / (3.5 s * 1e15) = 1/3.5
    row = {"rank_flops": 1e15, "peak_flops": 1e15, "imbalance": 1.25, "sm_share": 0.0,
           "collectives": [{"kind": "all_to_all", "dim": "shard", "seconds": 1.0, "overlappable_s": 0.0}]}
    assert mfu_at(row, 0.5) == pytest.approx(1 / 3.5, rel=1e-12)
    assert 0.5 * (2.0 / 3.5) == pytest.approx(1 / 3.5)                  # local x scaling ratio (2 s / 3.5 s)
    # E2E 0.25 needs 1.25 / m + 1 = 4, i.e. a local MFU of 1.25 / 3 = 0.41667
    assert required_local_mfu(row, 0.25) == pytest.approx(1.25 / 3, rel=1e-6)
    assert required_local_mfu(row, 0.5) is None                       # 1 s of comm caps E2E at 1/2.25 < 0.5


def test_projected_rows_carry_the_two_factors():
    for row in project(get_preset("large"), [8, 64], options=Options(batch_per_gpu=64, batches=1)):
        assert row["scaling_ratio"] == pytest.approx(row["compute_s"] / row["step_s"], rel=1e-12)
        assert row["local_mfu"] * row["scaling_ratio"] == pytest.approx(row["mfu"], rel=1e-12)
        assert 0 < row["scaling_ratio"] <= 1


def test_one_gpu_has_no_comm_no_imbalance_so_e2e_is_local():
    for row in project(TINY, [1], mfu=EVERY_RUNG_40, options=Options(batches=1)):
        assert row["comm_s"] == 0 and row["imbalance"] == 1.0 and row["scaling_ratio"] == 1.0
        assert row["mfu"] == pytest.approx(0.4, rel=1e-12)


def test_one_node_without_comm_is_compute_times_the_hand_computed_imbalance():
    options = Options(hardware=FREE_HW, batches=1, batch_per_gpu=16)
    rows = project(TINY, [8], mfu=EVERY_RUNG_40, options=options)
    cost = SampleCost(*sample_cost_coefficients(TINY.model))
    (lengths,) = draw_batches(TINY, 8 * 16, 1, options.seed + 8)
    costs = cost.cost(lengths)
    by_hand = [costs[r::8].sum() for r in range(8)]              # round robin: sample i -> rank i % 8
    for row in rows:
        assert row["exposed_s"] == 0
        assert row["step_s"] == pytest.approx(row["compute_s"] * row["imbalance"], rel=1e-12)
        if row["key"] in ("jagged", "fused_attention", "compile"):       # jagged, round robin, batch 16
            assert row["imbalance"] == pytest.approx(max(by_hand) / np.mean(by_hand), rel=1e-12)
        if row["key"] == "baseline":                                      # padded: every sample costs the same
            assert row["imbalance"] == 1.0


def test_one_step_on_free_links_is_its_compute():
    # 1e15 model FLOPs at local MFU 0.5 of an H100's 989.4e12 dense bf16 FLOP/s (datasheet): 1e15 / 494.7e12 s
    out = one_step(get_preset("base").model, MeshShape(2, 8), FREE_HW, batch=64, tokens=64 * 160,
                   model_flops=1e15, local_mfu=0.5)
    assert out["compute_s"] == pytest.approx(1e15 / 494.7e12, rel=1e-12)
    assert out["comm_s"] == 0 and out["step_s"] == out["compute_s"] and out["comm_share_no_overlap"] == 0


def test_comm_share_grows_with_ranks_at_fixed_per_rank_batch():
    hw = get_profile("h100_ib_ndr")
    shares = [one_step(get_preset("base").model, MeshShape(world // 8, 8), hw, batch=64, tokens=64 * 160,
                       model_flops=5e13, local_mfu=0.35)["comm_share_no_overlap"] for world in (8, 64, 512)]
    assert shares == sorted(shares) and 0 < shares[0] < shares[-1] < 1


def test_more_bandwidth_is_never_slower():
    rows = {scale: project(TINY, [8, 64], options=Options(bandwidth_scale=scale, batches=1)) for scale in (0.5, 1, 2)}
    for slow, mid, fast in zip(rows[0.5], rows[1], rows[2]):
        assert slow["step_s"] >= mid["step_s"] >= fast["step_s"] and fast["mfu"] >= slow["mfu"]


def test_projection_imbalance_is_the_balancers():
    """The projection's imbalance is gemref.balance's split of the same drawn batch."""
    costs = SampleCost(*sample_cost_coefficients(TINY.model)).cost(draw_batches(TINY, 8 * 5, 1, 3 + 8)[0])
    for policy, split in (("round_robin", round_robin), ("lpt", lpt)):
        by_hand = imbalance(rank_loads(costs, split(costs, 8)))
        assert load_stats(TINY, 8, 5, policy, False, 1, 3)["imbalance"] == pytest.approx(by_hand)


def test_ladder_at_scale_large_preset():
    rows = project(get_preset("large"), [8, 64], options=Options(batch_per_gpu=64, batches=1))
    assert len(rows) == 2 * len(LADDER)
    top = rows[len(LADDER):]
    assert top[-1]["mfu"] > 5 * top[0]["mfu"]                      # the ladder pays off at 64 GPUs
    assert not top[0]["fits"] and top[-1]["fits"]                   # replicated tables do not fit an H100
    deltas = rung_deltas(rows, 64)
    assert sum(d["delta"] for d in deltas) == pytest.approx(top[-1]["mfu"] - top[0]["mfu"])
    assert required_local_mfu(top[-1], 0.99) is None               # comm alone rules that out
    assert len(findings(rows)) == 6
    matters = rung_that_matters(rows, 64)                          # only configurations that fit are ranked
    assert top[0]["rung"] in matters["not_fitting"]
    for pick in (matters["largest"], matters["grows_most"]):
        assert pick is None or pick["fits"] is not False


# ----------------------------------------------------------------------------- SM contention


def _overlapped(ms: float, share: float, kind: str = "all_gather") -> dict:
    return {"kind": kind, "dim": "shard", "seconds": ms / 1e3, "overlappable_s": ms / 1e3, "sm_share": share}


def test_sm_contention_when_compute_outlasts_the_collective_by_hand():
    # compute 10 ms; an 8 ms all-gather runs under it holding 24 of the H100's 132 SMs.
    # During those 8 ms the compute has 108 of 132 SMs: it does 8 * 108/132 = 6.5454 ms of its
    # work, the other 10 - 6.5454 = 3.4545 ms runs alone afterwards: step 8 + 3.4545 = 11.4545 ms,
    # i.e. 1512/132 ms; the slowdown is 8 * 24/132 = 1.4545 ms, nothing is exposed.
    out = predict_step(0.010, 1.0, [_overlapped(8, 24 / 132)])
    assert out["step_s"] == pytest.approx(0.0114545454545, rel=1e-9)
    assert out["sm_slowdown_s"] == pytest.approx(0.00145454545454, rel=1e-9)
    assert out["exposed_s"] == pytest.approx(0.0, abs=1e-15) and out["overlapped_s"] == pytest.approx(0.008)
    # SM-free, 1 SM: 10 + 8/132 = 10.0606 ms (1328/132 ms). QPS gain = 1512/1328 - 1 = +13.855%
    free = predict_step(0.010, 1.0, [_overlapped(8, 1 / 132)])
    assert free["step_s"] == pytest.approx(0.0100606060606, rel=1e-9)
    assert out["step_s"] / free["step_s"] - 1 == pytest.approx(0.138554216867, rel=1e-9)
    # all 132 SMs: the compute makes no progress under the collective, step 10 + 8 = 18 ms
    assert predict_step(0.010, 1.0, [_overlapped(8, 1.0)])["step_s"] == pytest.approx(0.018, rel=1e-12)


def test_sm_contention_when_the_collective_outlasts_compute_by_hand():
    # compute 2 ms under an 8 ms collective holding 24 of 132 SMs: at 108/132 of its rate the
    # compute takes 2 * 132/108 = 2.4444 ms, all inside the 8 ms: step 8 ms; 2.4444 ms of the
    # collective hidden, 8 - 2.4444 = 5.5556 ms exposed, slowdown 2.4444 - 2 = 0.4444 ms
    out = predict_step(0.002, 1.0, [_overlapped(8, 24 / 132)])
    assert out["step_s"] == pytest.approx(0.008, rel=1e-12)
    assert out["overlapped_s"] == pytest.approx(0.00244444444444, rel=1e-9)
    assert out["exposed_s"] == pytest.approx(0.00555555555556, rel=1e-9)
    assert out["sm_slowdown_s"] == pytest.approx(0.000444444444444, rel=1e-9)
    # so an SM-free transport buys nothing there: the step is the collective either way
    assert predict_step(0.002, 1.0, [_overlapped(8, 1 / 132)])["step_s"] == pytest.approx(0.008, rel=1e-12)
    # no compute at all: the collective is the step whatever SMs it holds
    assert predict_step(0.0, 1.0, [_overlapped(8, 1.0)])["step_s"] == pytest.approx(0.008, rel=1e-12)


def test_ncclx_smfree_frees_the_all_gather_and_keeps_the_reduction_by_hand():
    # H100 (132 SMs), NCCLX's SM-free transport: all-gather 1 SM, reduce-scatter keeps NCCL's 24.
    # compute 10 ms with 4 ms of each overlapped: lost = (4 * 1 + 4 * 24) / 132 = 100/132 = 0.7576 ms,
    # step 10.7576 ms; with NCCL both at 24: 10 + 8 * 24/132 = 11.4545 ms
    hw = get_profile("h100_ib_ndr")
    rows = [_overlapped(4, 0.0, "all_gather"), _overlapped(4, 0.0, "reduce_scatter")]
    smfree = with_sm_shares(rows, hw, "ncclx_smfree")
    assert [r["sms"] for r in smfree] == [1, 24]
    assert predict_step(0.010, 1.0, smfree)["step_s"] == pytest.approx(0.0107575757576, rel=1e-9)
    assert predict_step(0.010, 1.0, with_sm_shares(rows, hw, "nccl"))["step_s"] == pytest.approx(0.0114545454545,
                                                                                                  rel=1e-9)
    # one k for every kind (collective_sms=1): 10 + 8/132 = 10.0606 ms; a given share wins over both
    assert predict_step(0.010, 1.0, with_sm_shares(rows, hw, "nccl", 1))["step_s"] == pytest.approx(0.0100606060606,
                                                                                                     rel=1e-9)
    assert predict_step(0.010, 1.0, with_sm_shares(rows, hw, "nccl", 1, sm_share=0.5))["step_s"] == pytest.approx(
        0.014, rel=1e-12)                                                       # 10 + 8 * 0.5


def test_sm_counts_of_the_profiles():
    # H100 SXM5: 132 SMs (NVIDIA H100 whitepaper); H200: the same GH100; B200: 2 x 74 = 148
    assert [sm_count(get_profile(n)) for n in ("h100_ib_ndr", "h200_ib_ndr", "h100_roce_400", "gb200_nvl72")] == [
        132, 132, 132, 148]
    assert sm_count(HardwareProfile("x", 8, FREE, FREE, "H100", sm_count=114)) == 114


def test_projection_slowdown_is_the_overlapped_time_times_the_sm_share():
    rows = {t: project(TINY, [16], options=Options(transport=t, batches=1)) for t in ("nccl", "ncclx_smfree")}
    for nccl, smfree in zip(rows["nccl"], rows["ncclx_smfree"]):
        if nccl["overlapped_s"] < nccl["compute_s"] * nccl["imbalance"]:   # compute outlasts the overlap
            assert nccl["sm_slowdown_s"] == pytest.approx(nccl["overlapped_s"] * 24 / 132, rel=1e-12)
        assert smfree["step_s"] <= nccl["step_s"] and smfree["mfu"] >= nccl["mfu"]
        assert mfu_at(nccl, nccl["local_mfu"]) == pytest.approx(nccl["mfu"], rel=1e-12)   # rows keep their shares


def test_more_sms_per_collective_is_never_faster():
    steps = [[r["step_s"] for r in project(TINY, [16], options=Options(collective_sms=k, batches=1))]
             for k in (0, 1, 24, 132)]
    for a, b in zip(steps, steps[1:]):
        assert all(x <= y * (1 + 1e-12) for x, y in zip(a, b))       # equal where the comm outlasts compute
    assert steps[-1] > steps[0]
    assert steps[0] == [r["step_s"] for r in project(TINY, [16], options=Options(sm_share=0.0, batches=1))]


def test_compare_transports_gain_and_contention():
    options = Options(batches=1)
    rows = compare_transports(TINY, [8, 16], options)
    for r in rows:
        assert r["qps_gain_ncclx_smfree"] == pytest.approx(r["step_s_nccl"] / r["step_s_ncclx_smfree"] - 1)
        assert 0 <= r["qps_gain_ncclx_smfree"] <= r["qps_gain_all_smfree"]
        assert r["step_s_nccl"] * r["mfu_nccl"] == pytest.approx(r["step_s_all_smfree"] * r["mfu_all_smfree"])
    assert any(r["contention"] > 0 for r in rows)
    assert len(contention_findings(rows, options)) == 3
    # no links to pay for: nothing to overlap, nothing to gain
    free = compare_transports(TINY, [8], Options(hardware=FREE_HW, batches=1))
    assert all(r["qps_gain_all_smfree"] == 0 and r["contention"] == 0 for r in free)


# ----------------------------------------------------------------------------- inputs from a waterfall


def test_measured_mfu_takes_local_mfu_and_carries_rungs_that_did_not_run(tmp_path):
    rungs = [{"key": "baseline", "status": "ran", "mfu": 0.008, "local_mfu": 0.01},
             {"key": "jagged", "status": "ran", "mfu": 0.02, "local_mfu": 0.03},
             {"key": "fused_attention", "status": "ran", "mfu": 0.04, "local_mfu": 0.05},
             {"key": "load_balance", "status": "n/a here: needs data-parallel ranks"}]
    path = tmp_path / "waterfall.json"
    path.write_text(json.dumps({"preset": "small", "device": "cpu", "ranks": 2, "rungs": rungs}))
    mfu = measured_mfu(load_waterfall(tmp_path))
    assert mfu["jagged"][0] == 0.03 and "measured" in mfu["jagged"][1] and "2 rank(s)" in mfu["jagged"][1]
    assert mfu["low_precision"][0] == 0.05 and "carried to low_precision" in mfu["low_precision"][1]


@pytest.mark.parametrize("call, message", [
    (lambda: project(TINY, [8], options=Options(hardware="h999")), "unknown hardware profile 'h999'"),
    (lambda: project(TINY, [8, 0]), r"gpus\[1\]=0: GPU counts must be integers >= 1"),
    (lambda: project(TINY, [12], options=Options(batches=1)), "gpus=12 is not a multiple of the shard group 8"),
    (lambda: project(TINY, [8], mfu={"jagged": (1.5, "x")}), r"MFU must be in \(0, 1\], got 1.5"),
    (lambda: parse_mfu_assumption(["0"]), r"MFU must be in \(0, 1\], got 0.0"),
    (lambda: parse_mfu_assumption(["warp=0.3"]), "unknown rung 'warp'"),
    (lambda: parse_mfu_assumption(["fast"]), "expected VALUE or RUNG=VALUE"),
    (lambda: project(TINY, [8], options=Options(table_sync_every=0)), "table_sync_every must be >= 1"),
    (lambda: project(TINY, [8], options=Options(table_sync_every=10)),
     "table_sync_every=10 with table_optimizer='adamw': gemref sums AdamW tables' gradients every step"),
    (lambda: project(TINY, [8], options=Options(table_optimizer="sgd")), "table_optimizer='sgd'; valid: adamw"),
    (lambda: project(TINY, [8], options=Options(bandwidth_scale=0)), "bandwidth_scale must be > 0"),
    (lambda: measured_mfu({"ranks": 4, "rungs": [{"key": "baseline", "status": "ran", "mfu": 0.1}]}),
     "ran on 4 ranks and records no local MFU"),
    (lambda: load_waterfall("/nonexistent/waterfall.json"), "no such file"),
    (lambda: one_step(TINY.model, MeshShape(1, 8), FREE_HW, batch=1, tokens=1, model_flops=1.0, local_mfu=0.0),
     r"local_mfu must be in \(0, 1\]"),
    (lambda: project(TINY, [8], options=Options(collective_sms=133)), "collective_sms=133 exceeds the 132 SMs of H100"),
    (lambda: project(TINY, [8], options=Options(collective_sms=-1)), "collective_sms must be an integer >= 0, got -1"),
    (lambda: project(TINY, [8], options=Options(collective_sms=2.5)), "collective_sms must be an integer >= 0"),
    (lambda: project(TINY, [8], options=Options(transport="rccl")), "transport='rccl'; valid: nccl, ncclx_smfree"),
    (lambda: project(TINY, [8], options=Options(sm_share=1.5)), r"sm_share must be a number in \[0, 1\], got 1.5"),
    (lambda: predict_step(1.0, 1.0, [_overlapped(1, -0.1)]), r"all_gather sm_share must be a number in \[0, 1\]"),
    (lambda: sm_count(HardwareProfile("x", 8, FREE, FREE, "A100")), "no SM count for GPU 'A100'"),
    (lambda: with_sm_shares([_overlapped(1, 0)], FREE_HW, "nccl", 200), "collective_sms=200 exceeds the 132 SMs"),
])
def test_bad_inputs_raise_value_error(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_cli_prints_the_projection_and_writes_json(tmp_path, capsys):
    out = tmp_path / "sim.json"
    assert main(["simulate", "project", "--preset", "tiny", "--gpus", "8", "16", "--batches", "1", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "projected MFU" in text and "GEM's 20%-25% band" in text
    assert "(weak scaling; tables on AdamW, their summed gradient all-reduced every step)" in text
    record = json.loads(out.read_text())
    assert {r["gpus"] for r in record["rows"]} == {8, 16} and record["gem_band"]["gpus"] == 16


@pytest.mark.parametrize("optimizer, every, words", [
    ("adamw", 1, "tables on AdamW, their summed gradient all-reduced every step"),
    ("rowwise_adagrad", 1, "tables on row-wise Adagrad, replica weights and row state averaged every 1 step"),
    ("rowwise_adam", 100, "tables on row-wise Adam, replica weights and row state averaged every 100 steps"),
])
def test_every_projection_table_says_how_its_tables_train(capsys, optimizer, every, words):
    args = ["--table-optimizer", optimizer] + (["--table-sync-every", str(every)] if every > 1 else [])
    assert main(["simulate", "project", "--preset", "tiny", "--gpus", "8", "16", "--batches", "1", *args]) == 0
    text = capsys.readouterr().out
    assert f"(weak scaling; {words})" in text and f"(seconds per rank; {words})" in text
    assert f"the table replicas' all-reduce (here: {words})" in text


@pytest.mark.parametrize("args, message", [
    (["--mfu-assumption", "1.5"], "MFU must be in (0, 1]"),
    (["--gpus", "0"], "GPU counts must be integers >= 1"),
])
def test_cli_user_mistakes_exit_2(capsys, args, message):
    assert main(["simulate", "project", "--preset", "tiny", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_sm_contention_bench_prints_the_comparison(tmp_path, capsys):
    out = tmp_path / "sm.json"
    assert main(["bench", "sm_contention", "--preset", "tiny", "--gpus", "8", "16", "--rungs", "jagged", "fsdp_2d",
                 "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "QPS gain of NCCLX's SM-free transport" in text and "GEM reported ~5%" in text
    record = json.loads(out.read_text())
    assert record["sm_count"] == 132 and record["nccl_sms"] == 24
    assert [(r["gpus"], r["key"]) for r in record["rows"]] == [(8, "jagged"), (8, "fsdp_2d"), (16, "jagged"),
                                                               (16, "fsdp_2d")]


@pytest.mark.parametrize("args, message", [
    (["--nccl-sms", "200"], "--nccl-sms 200: SMs per collective must be in 0..132"),
    (["--smfree-sms", "-1"], "--smfree-sms -1: SMs per collective must be in 0..132"),
    (["--rungs", "warp"], "--rungs warp: unknown rung"),
])
def test_sm_contention_bench_mistakes_exit_2(capsys, args, message):
    assert main(["bench", "sm_contention", "--preset", "tiny", "--gpus", "8", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_validation_prediction_of_one_run_by_hand():
    """validate's comparison (`_compare`) on a made-up 2-rank run with free links (no comm):
    predicted step = (mean one-process seconds + host work) x time-sharing x imbalance.

    Every step's probe takes 0.5 CPU s, so a unit is 0.5 s. Warm-up = 3 steps, the late one
    (step 2) measures the host work: the ranks' thread CPU 0.6 s = 1.2 units, minus the 1.0
    unit the same parts took in one process = 0.2 units = 0.1 s. Timed steps 3, 4, 5, time-sharing 1.5:
      step 3: parts 1 and 3 units = 0.5 s, 1.5 s; mean 1.0, imbalance 1.5/1.0 = 1.5:
              (1.0 + 0.1) x 1.5 x 1.5 = 2.475 s (without host work 2.25)
      step 4: 1 and 1 units = 1.0 s each:  (1.0 + 0.1) x 1.5 = 1.65 s (1.5)
      step 5: 0.5 and 0.5 units = 0.5 s:   (0.5 + 0.1) x 1.5 = 0.9 s  (0.75)
    median predicted 1.65 s; measured steps 2.0, 1.5, 1.0 s, median 1.5 s: error 1.65/1.5 - 1 = +0.1;
    without the host work: median 1.5 s, error 0."""
    from gemref.simulate.validate import KINDS, _compare, validation_config

    train = validation_config(TINY, 2, steps=3, warmup=3, batch_size=4)
    lengths = np.array([5, 10, 20, 40])
    plan = [[[0, 1], [2, 3]]] * 6
    per_part = [[1.0, 1.0], [1.0, 3.0], [2.0, 2.0], [1.0, 1.0]]            # steps 2..5, in probe units
    steps = [{"step_s": s, "probe_cpu_s": 0.5, "stretch": 1.5, "cpu_s": 0.4, "process_cpu_s": 0.5}
             for s in (9.0, 9.0, 9.0, 2.0, 1.5, 1.0)]                      # warm-up step times are not used
    out = {"steps": steps, "rank_cpu_s": [[0.0, 0.0, 0.6, 0, 0, 0], [0.0, 0.0, 0.6, 0, 0, 0]]}
    row = _compare(TINY, train, plan, lengths, per_part, out, {k: FREE for k in KINDS}, range(2, 3),
                   {"probe_cpu_s": 0.5}, cores=2)
    assert row["host_work_s"] == pytest.approx(0.1)
    assert row["predicted_s"] == pytest.approx(1.65)
    assert row["measured_s"] == pytest.approx(1.5)
    assert row["error"] == pytest.approx(0.1)
    assert row["without_host_work_error"] == pytest.approx(0.0, abs=1e-12)
    assert row["comm_s"] == 0 and row["time_sharing"] == 1.5 and row["time_sharing_formula"] == 1.0
    assert row["imbalance"] == pytest.approx(1.0)                          # median of 1.5, 1, 1
    assert row["core_speed_run_vs_1proc"] == pytest.approx(1.0) and row["other_threads_cpu_s"] == pytest.approx(0.1)


@pytest.mark.multiproc
@pytest.mark.slow
def test_a_measured_validation_run_has_every_field_finite_and_positive(data_root):
    """One measured 2-rank run, checked for structure only: how close the prediction comes is a
    benchmark result (`gemref simulate validate`, benchmarks/), not something a test can judge
    on a shared machine."""
    from gemref.simulate.validate import validate

    (row,) = validate("tiny", (2,), steps=3, warmup=3, compute_reps=1, log=lambda s: None)
    assert row["ranks"] == 2 and row["calibration_ranks"] == 2 and row["cores"] >= 1
    for key in ("measured_s", "predicted_s", "compute_1proc_s", "time_sharing", "time_sharing_formula",
                "imbalance", "flop_imbalance", "core_speed_run_vs_1proc"):
        assert math.isfinite(row[key]) and row[key] > 0, (key, row[key])
    for key in ("host_work_s", "comm_s", "other_threads_cpu_s"):
        assert math.isfinite(row[key]) and row[key] >= 0, (key, row[key])
    assert math.isfinite(row["error"]) and row["error"] > -1 and math.isfinite(row["without_host_work_error"])
    assert row["error"] == pytest.approx(row["predicted_s"] / row["measured_s"] - 1)
    assert row["imbalance"] >= 1 and row["flop_imbalance"] >= 1
    assert row["tiers"] and all(t["alpha_us"] >= 0 and t["bandwidth_gb_s"] > 0 for t in row["tiers"].values())


# ----------------------------------------------------------------------------- the ladder's changes


def test_the_projections_per_rung_changes_are_the_ladder_tables():
    """Every rung of gemref/waterfall/ladder.py says what it changes in the projection (RungModel
    fields only), each projected rung is the one before with exactly those set, and no other
    module keeps a table of per-rung projection changes."""
    import ast
    from dataclasses import fields
    from pathlib import Path

    from gemref.simulate import projection
    from gemref.waterfall.ladder import KEYS, RUNGS

    names = {f.name for f in fields(projection.RungModel)} - {"key", "title"}
    assert all(isinstance(r.projection, dict) and set(r.projection) <= names for r in RUNGS)
    before = projection.RungModel("", "")
    for spec, model in zip(RUNGS, projection.LADDER, strict=True):
        changed = {n: getattr(model, n) for n in names if getattr(model, n) != getattr(before, n)}
        assert changed == {k: v for k, v in spec.projection.items() if getattr(before, k) != v}, spec.key
        before = model

    def field_table(node) -> bool:        # {"rung key": {RungModel field: ...} or dict(field=...), ...}
        if not isinstance(node, ast.Dict) or len({getattr(k, "value", None) for k in node.keys} & set(KEYS)) < 3:
            return False
        return any(isinstance(v, ast.Call) and getattr(v.func, "id", "") == "dict" and {k.arg for k in v.keywords} & names
                   or isinstance(v, ast.Dict) and {getattr(k, "value", None) for k in v.keys} & names
                   for v in node.values)

    package = Path(projection.__file__).parent.parent
    found = [str(p.relative_to(package)) for p in package.rglob("*.py")
             if any(field_table(n) for n in ast.walk(ast.parse(p.read_text())))]
    assert found == [] and not hasattr(projection, "CHANGES")



def test_the_tables_are_priced_as_their_optimizer_runs():
    """AdamW: the held rows' summed gradient every step; row-wise Adagrad: weights plus one state value
    per row (d + 1 per d), row-wise Adam: plus d + 1 (2d + 1 per d), 1/K of it per step
    (gemref/parallel/rowwise.py)."""
    from gemref.simulate.step_model import step_collectives

    cfg, mesh = get_preset("large").model, MeshShape(2, 8)
    adamw = {r["dim"]: r for r in step_collectives(cfg, mesh, 64, 64 * 100, True, 2, "row")}["tables"]
    rowwise = {r["dim"]: r for r in step_collectives(cfg, mesh, 64, 64 * 100, True, 2, "row",
                                                     table_optimizer="rowwise_adagrad")}["tables"]
    assert rowwise["bytes"] == pytest.approx(adamw["bytes"] * (cfg.d_model + 1) / cfg.d_model)
    adam = {r["dim"]: r for r in step_collectives(cfg, mesh, 64, 64 * 100, True, 2, "row",
                                                  table_optimizer="rowwise_adam")}["tables"]
    assert adam["bytes"] == pytest.approx(adamw["bytes"] * (2 * cfg.d_model + 1) / cfg.d_model)
    rows = project(get_preset("large"), [16], options=Options(table_optimizer="rowwise_adagrad", table_sync_every=10))
    assert {(r["table_optimizer"], r["table_sync_every"]) for r in rows} == {("rowwise_adagrad", 10)}


def test_the_memory_check_counts_the_tables_state_of_their_optimizer():
    """state_gb: the dense AdamW state as before, the tables' state by table_optimizer (adamw 2d values
    per row, rowwise_adagrad 1, rowwise_adam d + 1; parallel/memory.py), rows held by the fullest rank,
    and a table gradient (d values per row) only for AdamW: row-wise tables keep none."""
    from gemref.parallel.sparse import plan_tables
    from gemref.parallel.volume import table_shapes

    preset = get_preset("large")
    by = {t: {r["key"]: r for r in project(preset, [16], options=Options(table_optimizer=t))}
          for t in ("adamw", "rowwise_adagrad", "rowwise_adam")}
    d = preset.model.d_model
    for key in ("baseline", "fsdp_2d"):            # replicated (S = 1: every row) and row-sharded tables
        S = int(by["adamw"][key]["mesh"].split("x")[1])
        held = max(sum(p.row_range(s, S)[1] - p.row_range(s, S)[0]
                       for p in plan_tables(table_shapes(preset.model), S, "row").values()) for s in range(S))
        for optimizer, values in (("rowwise_adagrad", 1), ("rowwise_adam", d + 1)):
            saved = (by["adamw"][key]["state_gb"] - by[optimizer][key]["state_gb"]) * 1e9
            assert saved == pytest.approx(held * (2 * d + d - values) * 4, rel=1e-9), (key, optimizer)
