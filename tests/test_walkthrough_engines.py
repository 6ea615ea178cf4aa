"""gemref/walkthrough/engines.py: chapter 07's rows, plan and figure of gemref's vs TorchRec's tables."""
from __future__ import annotations

import pytest

from gemref.walkthrough.engines import engine_rows, engines_figure, plan_rows


def _result():
    def row(variant, engine, sharding, baseline, weights, step, lo, hi):
        return {"variant": variant, "engine": engine, "sharding": sharding, "baseline": baseline, "step_ms": step,
                "step_ms_min": lo, "step_ms_max": hi, "spread_ms": f"{lo:.1f}..{hi:.1f}", "vs_native": step / 40,
                "table_bytes_per_rank": weights, "table_opt_bytes_per_rank": [2 * w for w in weights],
                "comm_bytes_per_rank": [3072, 1024]}
    return {"rows": [row("native row", "native", "row", "native row", [2048, 1024], 40.0, 35.0, 50.0),
                     row("TorchRec row_wise", "torchrec", "row_wise", "native row", [1024, 512], 30.0, 28.0, 31.0)]}


def test_engine_rows_give_kib_per_rank_and_leave_native_unpaired():
    native, trec = engine_rows(_result())
    assert native["weights_KiB_per_rank"] == [2.0, 1.0] and native["optimizer_KiB_per_rank"] == [4.0, 2.0]
    assert native["collectives_KiB_rank0"] == 3.0 and native["time_over_native"] is None
    assert trec["time_over_native"] == pytest.approx(0.75) and trec["timed_against"] == "native row"


def test_plan_rows_put_gemrefs_table_wise_owner_beside_the_planner():
    shapes = {"item": (100, 4), "sparse_0": (60, 4), "sparse_1": (50, 4)}
    plan = {"ec.item": {"sharding": "row_wise", "kernel": "fused", "ranks": [0, 1]},
            "ebc.sparse_0": {"sharding": "table_wise", "kernel": "fused", "ranks": [0]},
            "ebc.sparse_1": {"sharding": "table_wise", "kernel": "fused", "ranks": [1]}}
    rows = {r["table"]: r for r in plan_rows(plan, shapes, 2)}
    # largest first onto the least loaded: item (400 values) -> rank 0, sparse_0 (240) -> 1, sparse_1 (200) -> 1
    assert [rows[t]["gemref table-wise"] for t in ("ec.item", "ebc.sparse_0", "ebc.sparse_1")] == \
        ["rank 0", "rank 1", "rank 1"]
    assert rows["ec.item"]["KiB"] == pytest.approx(1.6) and rows["ec.item"]["rows x dim"] == "100 x 4"   # 1600 B
    assert rows["ebc.sparse_0"]["TorchRec planner"] == "table_wise" and rows["ebc.sparse_0"]["on ranks"] == [0]


def test_engines_figure_draws_bytes_per_rank_and_the_window_spread():
    fig = engines_figure(_result())
    rank0, rank1, steps = fig.data
    assert list(rank0.y) == [6.0, 3.0] and list(rank1.y) == [3.0, 1.5]     # (weights + 2 x weights) / 1024
    assert list(steps.y) == [40.0, 30.0]
    assert list(steps.error_y.array) == [10.0, 1.0] and list(steps.error_y.arrayminus) == [5.0, 2.0]
