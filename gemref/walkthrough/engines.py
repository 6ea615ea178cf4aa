"""Chapter 07's two embedding engines side by side: the rows, the plan and the figure it shows
of `gemref.measure.table_engines.compare_sharded`'s result (gemref's sharded tables vs TorchRec's).
"""
from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..parallel.sparse import plan_tables
from ..report.figures import TEMPLATE

KB = 1024


def engine_rows(result: dict) -> list[dict]:
    """One row per variant: step time (ms, slowest rank, median of windows), TorchRec's time over
    its native pair's, and this variant's table bytes on each rank (weights, optimizer state),
    in KiB, plus the payload bytes of one step's collectives (KiB, rank 0); time_over_native < 1: TorchRec faster."""
    return [{"variant": r["variant"], "sharding": r["sharding"], "step_ms": r["step_ms"], "spread_ms": r["spread_ms"],
             "time_over_native": None if r["engine"] == "native" else r["vs_native"], "timed_against": r["baseline"],
             "weights_KiB_per_rank": [round(b / KB, 1) for b in r["table_bytes_per_rank"]],
             "optimizer_KiB_per_rank": [round(b / KB, 1) for b in r["table_opt_bytes_per_rank"]],
             "collectives_KiB_rank0": round(r["comm_bytes_per_rank"][0] / KB, 1)} for r in result["rows"]]


def plan_rows(plan: dict, shapes: dict[str, tuple[int, int]], ranks: int) -> list[dict]:
    """TorchRec's planner, table by table (plan: {"ec.item": {"sharding", "kernel", "ranks"}}), beside
    what gemref's table-wise plan (largest first onto the least-loaded rank) does with the same tables."""
    native = plan_tables(shapes, ranks, "table")
    rows = []
    for key, entry in plan.items():
        name = key.split(".", 1)[1]
        rows_, dim = shapes[name]
        rows.append({"table": key, "rows x dim": f"{rows_} x {dim}", "KiB": round(rows_ * dim * 4 / KB, 1),
                     "TorchRec planner": entry["sharding"], "on ranks": entry["ranks"],
                     "gemref table-wise": f"rank {native[name].owner}"})
    return rows


def engines_figure(result: dict, title: str = "gemref's sharded tables vs TorchRec's") -> go.Figure:
    """Left: each variant's table bytes (weights + optimizer state) per rank; right: its step time
    (slowest rank, median over windows, bars from the fastest to the slowest window)."""
    rows = result["rows"]
    names = [r["variant"] for r in rows]
    fig = make_subplots(rows=1, cols=2, subplot_titles=("table weights + optimizer state per rank",
                                                        "training step (slowest rank)"))
    for k in range(len(rows[0]["table_bytes_per_rank"])):
        fig.add_trace(go.Bar(name=f"rank {k}", x=names, legendgroup="ranks",
                             y=[(r["table_bytes_per_rank"][k] + r["table_opt_bytes_per_rank"][k]) / KB for r in rows]),
                      row=1, col=1)
    colours = ["#4C78A8" if r["engine"] == "native" else "#F58518" for r in rows]
    fig.add_trace(go.Bar(x=names, y=[r["step_ms"] for r in rows], marker_color=colours, showlegend=False,
                         text=[f"{r['step_ms']:.0f} ms" for r in rows],
                         error_y=dict(type="data", symmetric=False,
                                      array=[r["step_ms_max"] - r["step_ms"] for r in rows],
                                      arrayminus=[r["step_ms"] - r["step_ms_min"] for r in rows])),
                  row=1, col=2)
    fig.update_yaxes(title_text="KiB", row=1, col=1)
    fig.update_yaxes(title_text="ms (blue: gemref, orange: TorchRec)", row=1, col=2)
    fig.update_layout(barmode="group", title=title, template=TEMPLATE)
    return fig
