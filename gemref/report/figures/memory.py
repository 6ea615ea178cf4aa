"""Figures of memory and balance: activation checkpointing, bytes per rank, lengths and rank loads."""
from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .base import DEFAULT_COLORS, MB, TEMPLATE


def length_histogram_figure(lengths, title: str = "history lengths") -> go.Figure:
    fig = go.Figure(go.Histogram(x=list(lengths), nbinsx=60))
    fig.update_layout(title=title, xaxis_title="events per history", yaxis_title="samples",
                      template=TEMPLATE, bargap=0.05)
    return fig


def rank_loads_figure(rows: list[dict], title: str = "cost per rank, one global batch") -> go.Figure:
    """Grouped bars of per-rank cost for each policy (rows from gemref.measure.balance_compare: `loads`, the first step's)."""
    fig = go.Figure([go.Bar(name=r["policy"], x=[f"rank {i}" for i in range(len(r["loads"]))], y=r["loads"])
                     for r in rows])
    fig.update_layout(barmode="group", title=title, yaxis_title="model FLOPs", template=TEMPLATE)
    return fig


def activation_profile_figure(blocks: list[dict], title: str = "what checkpointing each block frees") -> go.Figure:
    """Per block: bytes saved for backward and freed by each checkpoint option (left), FLOPs
    a full checkpoint recomputes (right); `blocks` from an ActivationProfile (as dicts)."""
    names = [b["name"].replace("layers.", "L") for b in blocks]
    fig = make_subplots(rows=1, cols=2, column_widths=[0.65, 0.35],
                        subplot_titles=("activation bytes", "recomputed FLOPs (full)"))
    fig.add_trace(go.Bar(name="saved for backward", x=names, y=[b["saved_bytes"] for b in blocks]), row=1, col=1)
    for option in blocks[0]["freed_bytes"]:
        fig.add_trace(go.Bar(name=f"freed by {option}", x=names, y=[b["freed_bytes"][option] for b in blocks]),
                      row=1, col=1)
    fig.add_trace(go.Bar(name="recompute (full)", x=names, y=[b["recompute_flops"].get("full", 0) for b in blocks],
                         showlegend=False), row=1, col=2)
    fig.update_yaxes(title_text="bytes", row=1, col=1)
    fig.update_yaxes(title_text="FLOPs recomputed per step", row=1, col=2)
    fig.update_xaxes(title_text="block (layer.kind)")
    fig.update_layout(barmode="group", title=title, template=TEMPLATE)
    return fig


def ac_pareto_figure(rows: list[dict], title: str = "activation memory vs recompute, per strategy") -> go.Figure:
    """Recompute (% of model FLOPs) and step time against activation bytes (% of no AC), one
    trace per strategy, points labelled by budget; rows from gemref.measure.autoac_sweep.budget_sweep."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("recompute FLOPs", "step time"))
    for i, strategy in enumerate(dict.fromkeys(r["strategy"] for r in rows)):
        points = {}
        for r in rows:
            if r["strategy"] == strategy and r.get("act_pct") is not None:
                points.setdefault((r["act_pct"], r["recompute_pct"], r["step_s"]), []).append(r["budget"])
        xs = [p[0] for p in points]
        text = ["budget " + ", ".join(f"{b:.0%}" for b in budgets) for budgets in points.values()]
        for col, ys in ((1, [p[1] for p in points]), (2, [p[2] for p in points])):
            fig.add_trace(go.Scatter(x=xs, y=ys, mode="markers", name=strategy, text=text, legendgroup=strategy,
                                     showlegend=col == 1, marker=dict(size=10, color=DEFAULT_COLORS[i])),
                          row=1, col=col)
    fig.update_xaxes(title_text="activation bytes, % of no checkpointing")
    fig.update_yaxes(title_text="% of model FLOPs", row=1, col=1)
    fig.update_yaxes(title_text="seconds per step", row=1, col=2)
    fig.update_layout(title=title, template=TEMPLATE)
    return fig


def ac_fronts_figure(fronts: dict[str, list], base_bytes: int, model_flops: int,
                     title: str = "activation memory vs recompute: the Pareto front of each strategy") -> go.Figure:
    """One step line per strategy through its Pareto front: activation bytes (% of no checkpointing)
    against recompute FLOPs (% of the step's model FLOPs), hover = the plan; `fronts` maps a
    strategy to [(bytes, recompute FLOPs, plan summary)] (gemref.measure.autoac_regions.fronts)."""
    fig = go.Figure()
    for name, points in fronts.items():
        points = sorted(points)
        fig.add_trace(go.Scatter(x=[100 * b / base_bytes for b, _, _ in points],
                                 y=[100 * f / model_flops for _, f, _ in points], text=[p for _, _, p in points],
                                 mode="lines+markers", line_shape="hv", name=name))
    fig.update_layout(title=title, xaxis_title="activation bytes, % of no checkpointing",
                      yaxis_title="recompute, % of model FLOPs", template=TEMPLATE)
    return fig


def batch_gain_figure(gain: dict, title: str = "what the freed memory buys") -> go.Figure:
    """Batch size, samples/s and MFU without and with AutoAC under one memory budget."""
    rows = gain["rows"]
    fig = make_subplots(rows=1, cols=3, subplot_titles=("largest batch", "samples/s", "MFU %"))
    names = ["no AC" if r["strategy"] == "none" else "AutoAC" for r in rows]
    for col, key, scale in ((1, "batch_size", 1), (2, "samples_per_s", 1), (3, "mfu", 100)):
        values = [(r[key] or 0) * scale for r in rows]
        fig.add_trace(go.Bar(x=names, y=values, text=[f"{v:.3g}" for v in values], showlegend=False),
                      row=1, col=col)
    fig.update_layout(title=title, template=TEMPLATE)
    return fig


def rank_bytes_figure(rows: list[dict], title: str = "bytes held per rank") -> go.Figure:
    """Stacked bars (MB) of params / grads / optimizer state per layout; rows: {layout, params, grads, optimizer}."""
    layouts = [r["layout"] for r in rows]
    fig = go.Figure([go.Bar(name=k, x=layouts, y=[r[k] / MB for r in rows]) for k in ("params", "grads", "optimizer")])
    fig.update_layout(barmode="stack", title=title, yaxis_title="MB per rank", template=TEMPLATE)
    return fig


