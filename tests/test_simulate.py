"""The scale projection: hand-computed cases, sanity, bad inputs, the CLI, and the check against measured runs."""
import json
import math
import warnings

import numpy as np
import pytest

from gemref.balance import SampleCost, rank_loads, round_robin
from gemref.cli import main
from gemref.config import get_preset
from gemref.mfu.flops import sample_cost_coefficients
from gemref.mfu.peak import gpu_peak
from gemref.simulate.cost_model import HardwareProfile, LinkTier, collective_time
from gemref.config import MeshShape
from gemref.simulate.projection import LADDER, Options, comm_rows, draw_batches, predict_step, project, split_loads
from gemref.simulate.summary import (findings, load_waterfall, measured_mfu, mfu_at, parse_mfu_assumption,
                                     required_mfu_1gpu, rung_deltas)
from gemref.simulate.validate import fit_tier

FREE = LinkTier("free", 0.0, math.inf, "no cost")
FREE_HW = HardwareProfile("free", 8, FREE, FREE, "H100")
TINY = get_preset("tiny")
EVERY_RUNG_40 = {r.key: (0.4, "test") for r in LADDER}


def test_one_gpu_step_is_its_compute_and_mfu_is_the_assumed_one():
    for row in project(TINY, [1], mfu=EVERY_RUNG_40, options=Options(batches=1)):
        assert row["comm_s"] == 0 and row["imbalance"] == 1.0
        assert row["step_s"] == pytest.approx(row["rank_flops"] / (gpu_peak("H100", "bf16").flops * 0.4), rel=1e-12)
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


def test_predict_step_by_hand():
    assert predict_step(2.0, 1.25, [])["step_s"] == 2.5
    rows = [{"kind": "all_gather", "dim": "shard", "seconds": 1.0, "overlappable_s": 0.8}]
    out = predict_step(0.5, 1.0, rows)                 # overlap hides at most the compute (0.5 of 0.8)
    assert out["exposed_s"] == pytest.approx(0.5) and out["step_s"] == pytest.approx(1.0)
    assert predict_step(2.0, 1.0, rows, sm_share=0.5)["step_s"] == pytest.approx(2.0 + 0.2 + 0.4)


def test_pure_comm_is_the_alpha_beta_sum():
    tier = LinkTier("t", 1e-5, 1e9, "test")
    hw = HardwareProfile("t", 8, tier, tier, "H100")
    rows = [{"kind": "all_gather", "dim": "shard", "group_size": 4, "count": 2, "bytes": 8e6, "overlappable_bytes": 8e6},
            {"kind": "all_reduce", "dim": "replicate", "group_size": 8, "count": 1, "bytes": 1e6},
            {"kind": "all_reduce", "dim": "tables", "group_size": 8, "count": 1, "bytes": 4e6}]
    gather = 2 * (3 * 1e-5 + 0.75 * 4e6 / 1e9)
    ring = 2 * 7 * 1e-5 + 2 * 7 / 8 * 1e6 / 1e9          # < tree: 2 * 3 * 1e-5 + 2 * 1e6 / 1e9
    tables = (2 * 7 * 1e-5 + 2 * 7 / 8 * 4e6 / 1e9) / 4  # synced every 4 steps
    priced = comm_rows(rows, MeshShape(2, 4), hw, table_sync_every=4)
    assert [r["seconds"] for r in priced] == pytest.approx([gather, ring, tables], rel=1e-12)
    assert predict_step(0.0, 1.0, priced)["step_s"] == pytest.approx(gather + ring + tables, rel=1e-12)


def test_more_bandwidth_is_never_slower():
    rows = {scale: project(TINY, [8, 64], options=Options(bandwidth_scale=scale, batches=1)) for scale in (0.5, 1, 2)}
    for slow, mid, fast in zip(rows[0.5], rows[1], rows[2]):
        assert slow["step_s"] >= mid["step_s"] >= fast["step_s"] and fast["mfu"] >= slow["mfu"]


def test_round_robin_loads_match_the_balancer():
    costs = np.random.default_rng(0).lognormal(size=37)
    assert split_loads(costs, 5, "round_robin") == pytest.approx(rank_loads(costs, round_robin(costs, 5)))


def test_ladder_at_scale_large_preset():
    rows = project(get_preset("large"), [8, 64], options=Options(batch_per_gpu=64, batches=1))
    assert len(rows) == 2 * len(LADDER)
    top = rows[len(LADDER):]
    assert top[-1]["mfu"] > 5 * top[0]["mfu"]                      # the ladder pays off at 64 GPUs
    assert not top[0]["fits"] and top[-1]["fits"]                   # replicated tables do not fit an H100
    deltas = rung_deltas(rows, 64)
    assert sum(d["delta"] for d in deltas) == pytest.approx(top[-1]["mfu"] - top[0]["mfu"])
    assert mfu_at(top[-1], top[-1]["mfu_1gpu"]) == pytest.approx(top[-1]["mfu"])
    target = top[-1]["mfu"] / 2
    assert mfu_at(top[-1], required_mfu_1gpu(top[-1], target)) == pytest.approx(target, rel=1e-6)
    assert required_mfu_1gpu(top[-1], 0.99) is None                # comm alone rules that out
    assert len(findings(rows)) == 5


def test_fit_tier_recovers_alpha_and_beta():
    tier = LinkTier("t", 2e-4, 5e8, "")
    samples = [(b, collective_time("reduce_scatter", b, 4, tier, "ring")) for b in (4e3, 6e4, 1e6)]
    fitted = fit_tier("reduce_scatter", samples, 4)
    assert fitted.alpha_s == pytest.approx(2e-4) and fitted.bandwidth_bytes_per_s == pytest.approx(5e8)


def test_measured_mfu_carries_rungs_that_did_not_run(tmp_path):
    rungs = [{"key": "baseline", "status": "ran", "mfu": 0.01}, {"key": "jagged", "status": "ran", "mfu": 0.03},
             {"key": "fused_attention", "status": "ran", "mfu": 0.05},
             {"key": "load_balance", "status": "n/a here: needs data-parallel ranks"}]
    path = tmp_path / "waterfall.json"
    path.write_text(json.dumps({"preset": "small", "device": "cpu", "ranks": 1, "rungs": rungs}))
    mfu = measured_mfu(load_waterfall(tmp_path))
    assert mfu["jagged"][0] == 0.03 and "measured" in mfu["jagged"][1]
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
    (lambda: project(TINY, [8], options=Options(bandwidth_scale=0)), "bandwidth_scale must be > 0"),
    (lambda: measured_mfu({"ranks": 4, "rungs": []}), "ran on 4 ranks"),
    (lambda: load_waterfall("/nonexistent/waterfall.json"), "no such file"),
])
def test_bad_inputs_raise_value_error(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_cli_prints_the_projection_and_writes_json(tmp_path, capsys):
    out = tmp_path / "sim.json"
    assert main(["simulate", "--preset", "tiny", "--gpus", "8", "16", "--batches", "1", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "projected MFU" in text and "GEM's 20%-25% band" in text
    record = json.loads(out.read_text())
    assert {r["gpus"] for r in record["rows"]} == {8, 16} and record["gem_band"]["gpus"] == 16


@pytest.mark.parametrize("args, message", [
    (["--mfu-assumption", "1.5"], "MFU must be in (0, 1]"),
    (["--gpus", "0"], "GPU counts must be integers >= 1"),
])
def test_cli_user_mistakes_exit_2(capsys, args, message):
    assert main(["simulate", "--preset", "tiny", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


@pytest.mark.multiproc
@pytest.mark.slow
@pytest.mark.solo
def test_prediction_of_measured_gloo_runs_within_20_percent(data_root):
    """tiny preset, jagged + fast kernel + kk balance + FSDP 1xR with row-sharded tables, 2 and 4 ranks.

    Marked solo: `make test` runs it alone. A rank count that misses anyway (a noisy
    neighbour on a shared machine) is measured once more, prediction and measurement anew."""
    from gemref.simulate.validate import validate

    rows = validate("tiny", (2, 4), log=lambda s: None)
    missed = [r["ranks"] for r in rows if abs(r["error"]) > 0.20]
    if missed:
        warnings.warn(f"simulator validation re-measured {missed} ranks after errors "
                      f"{[round(r['error'], 3) for r in rows if r['ranks'] in missed]}")
        rows = [r for r in rows if r["ranks"] not in missed] + validate("tiny", missed, log=lambda s: None)
    for r in rows:
        assert abs(r["error"]) <= 0.20, r
