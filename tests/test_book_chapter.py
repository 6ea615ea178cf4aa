"""Chapter 10's op-class section (gemref/walkthrough/best_rung.py): which rung it profiles, the bars of its
figure worked out by hand, and one real rung profiled end to end."""
from __future__ import annotations

import json
from dataclasses import asdict

import pytest

from gemref.walkthrough.best_rung import best_rung, limit_stacks, profile_rung
from gemref.report.figures import step_limits_figure


def _row(key, mfu, status="ran"):
    return {"key": key, "rung": key, "status": status, "mfu": mfu}


def test_best_rung_is_the_highest_mfu_else_the_last_that_ran():
    rows = [_row("baseline", 0.02), _row("jagged", 0.05), _row("fused_attention", 0.04), _row("fp8", None, "n/a here")]
    row, why = best_rung(rows)
    assert row["key"] == "jagged" and "5.00%" in why
    row, why = best_rung([_row("baseline", None), _row("jagged", None), _row("fp8", None, "n/a here")])
    assert row["key"] == "jagged" and "contended" in why
    with pytest.raises(ValueError, match="no rung of this waterfall ran"):
        best_rung([_row("fp8", None, "n/a here")])


def test_limit_stacks_by_hand():
    # profiled: 20 ms (GEMM 10, attention 5, other 5); unprofiled step 10 ms, so every class x 0.5
    record = {"profiled_step_s": 0.020,
              "classes": [{"class": "gemm", "ms_per_step": 10.0}, {"class": "attention", "ms_per_step": 5.0},
                          {"class": "communication", "ms_per_step": 0.0}, {"class": "other", "ms_per_step": 5.0}],
              "limits": [{"case": "step", "step_ms": 10.0}, {"case": "gemm_at_best_rate", "step_ms": 8.0},
                         {"case": "gemm_at_peak", "step_ms": 6.0}]}
    stacks = limit_stacks(record)
    assert stacks["step"] == pytest.approx({"gemm": 5.0, "attention": 2.5, "other": 2.5})
    # the non-GEMM 5 ms stay; the GEMMs get what is left of each limit: 8 - 5 and 6 - 5
    assert stacks["gemm_at_best_rate"] == pytest.approx({"gemm": 3.0, "attention": 2.5, "other": 2.5})
    assert stacks["gemm_at_peak"] == pytest.approx({"gemm": 1.0, "attention": 2.5, "other": 2.5})
    fig = step_limits_figure(stacks, {"step": 0.05, "gemm_at_best_rate": None, "gemm_at_peak": 0.08})
    assert [t.name for t in fig.data] == ["gemm", "attention", "other"]
    assert list(fig.data[0].y) == ["step (MFU 5.0%)", "gemm_at_best_rate", "gemm_at_peak (MFU 8.0%)"]
    assert list(fig.data[0].x) == pytest.approx([5.0, 3.0, 1.0]) and fig.layout.barmode == "stack"


def test_profile_rung_runs_one_ranks_step_of_the_rung(data_root):
    from gemref.train.presets import get_preset
    from gemref.train.override import override

    preset = get_preset("tiny")
    train = override(preset.train, jagged=True, kernel="auto", mesh="1x2", balance="kk")
    row = {"key": "fused_attention", "rung": "2 + flash/GDPA", "batch_size": 32,
           "config": json.loads(json.dumps({"model": asdict(preset.model), "train": asdict(train)}))}
    prof = profile_rung(preset, row, ranks=2, warmup=1, timed_steps=1, profile_steps=1, probe_reps=1)
    assert prof["batch_size"] == 16 and prof["rung"] == "fused_attention"
    shares = {r["class"]: r["share"] for r in prof["classes"]}
    assert shares["gemm"] > 0 and shares["attention"] > 0 and sum(shares.values()) == pytest.approx(1, abs=0.05)
    for case, stack in prof["stacks"].items():       # each bar adds up to its case's step
        assert sum(stack.values()) == pytest.approx(next(r["step_ms"] for r in prof["limits"] if r["case"] == case))
