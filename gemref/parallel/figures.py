"""Plotly figures for the parallelism chapters (notebooks 07 and 08). Functions take rows, return figures."""
from __future__ import annotations

import plotly.graph_objects as go

TEMPLATE = "plotly_white"
MB = 2 ** 20


def rank_bytes_figure(rows: list[dict], title: str = "bytes held per rank") -> go.Figure:
    """Stacked bars (MB) of params / grads / optimizer state per layout; rows: {layout, params, grads, optimizer}."""
    layouts = [r["layout"] for r in rows]
    fig = go.Figure([go.Bar(name=k, x=layouts, y=[r[k] / MB for r in rows]) for k in ("params", "grads", "optimizer")])
    fig.update_layout(barmode="stack", title=title, yaxis_title="MB per rank", template=TEMPLATE)
    return fig


def loss_parity_figure(curves: dict[str, list[float]], reference: list[float],
                       title: str = "loss per step: every layout vs one process") -> go.Figure:
    steps = list(range(1, len(reference) + 1))
    fig = go.Figure([go.Scatter(x=steps, y=reference, name="one process", mode="lines", line={"width": 6})])
    for name, losses in curves.items():
        fig.add_trace(go.Scatter(x=steps, y=losses, name=name, mode="lines+markers"))
    fig.update_layout(title=title, xaxis_title="step", yaxis_title="training loss", template=TEMPLATE)
    return fig


def grouped_bars_figure(categories: list[str], series: dict[str, list[float]], title: str, yaxis: str,
                        log_y: bool = False, hline: tuple[float, str] | None = None) -> go.Figure:
    """One bar group per category, one bar per series (e.g. recorded vs analytic bytes per collective)."""
    fig = go.Figure([go.Bar(name=name, x=categories, y=values) for name, values in series.items()])
    fig.update_layout(barmode="group", title=title, yaxis_title=yaxis, template=TEMPLATE)
    if log_y:
        fig.update_yaxes(type="log")
    if hline:
        fig.add_hline(y=hline[0], line_dash="dash", annotation_text=hline[1])
    return fig


def lines_figure(x: list, series: dict[str, list[float]], title: str, xaxis: str, yaxis: str,
                 log_x: bool = True) -> go.Figure:
    fig = go.Figure([go.Scatter(x=x, y=y, name=name, mode="lines+markers") for name, y in series.items()])
    fig.update_layout(title=title, xaxis_title=xaxis, yaxis_title=yaxis, template=TEMPLATE)
    if log_x:
        fig.update_xaxes(type="log")
    return fig
