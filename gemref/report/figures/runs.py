"""Figures of runs and kernels: FLOPs, loss curves, step times, compile, precision, attention windows."""
from __future__ import annotations

from typing import TYPE_CHECKING

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .base import COLORS, TEMPLATE, log_ticks

if TYPE_CHECKING:
    from ..records import RunRecord


def flop_breakdown_figure(rows: list[dict], title: str = "FLOPs per training step, by component") -> go.Figure:
    """Grouped bars of model vs executed FLOPs per component (rows from `gemref flops`)."""
    rows = [r for r in rows if r["component"] != "total"]
    names = [r["component"] for r in rows]
    fig = go.Figure([
        go.Bar(name="model FLOPs (real lengths)", x=names, y=[r["model_train"] for r in rows]),
        go.Bar(name="executed FLOPs (what ran)", x=names, y=[r["executed_train"] for r in rows]),
    ])
    fig.update_layout(barmode="group", title=title, yaxis_title="FLOPs per step", template=TEMPLATE)
    return fig


def run_figure(record: RunRecord, window: int = 20) -> go.Figure:
    """A run at a glance: training loss per step with its running mean over `window` steps
    and the eval losses (left); the last eval's NE and AUC per task (right); throughput and
    MFU in the title."""
    fig = make_subplots(rows=1, cols=2, column_widths=[0.65, 0.35],
                        subplot_titles=("loss", "last eval (NE < 1 beats the base rate)"))
    losses = record["loss_curve"]
    steps = list(range(1, len(losses) + 1))
    running = [sum(losses[max(0, i - window + 1):i + 1]) / (i + 1 - max(0, i - window + 1)) for i in range(len(losses))]
    fig.add_trace(go.Scatter(x=steps, y=losses, mode="lines", name="train loss", opacity=0.35), row=1, col=1)
    fig.add_trace(go.Scatter(x=steps, y=running, mode="lines", name=f"train, mean of {window}"), row=1, col=1)
    evals = record.get("eval_history") or []
    fig.add_trace(go.Scatter(x=[e["step"] for e in evals], y=[e["eval_loss"] for e in evals], mode="markers",
                             name="eval loss", marker=dict(size=10, symbol="diamond")), row=1, col=1)
    last = record.get("eval") or {}
    for metric in ("ne", "auc"):
        tasks = [t for t in ("click", "conversion") if last.get(f"{metric}_{t}") is not None]
        values = [last[f"{metric}_{t}"] for t in tasks]
        fig.add_trace(go.Bar(x=tasks, y=values, name=metric.upper(), text=[f"{metric.upper()} {v:.3f}" for v in values]),
                      row=1, col=2)
    fig.update_xaxes(title_text="step", row=1, col=1)
    mfu = record.get("mfu")
    fig.update_layout(template=TEMPLATE, barmode="group",
                      title=f"{record['preset']} on {record['device']['name']}: {record['tokens_per_s']:.3g} tokens/s, "
                            f"{record['model_tflops_per_s']:.3g} model TFLOP/s, "
                            + (f"MFU {mfu:.1%}" if mfu is not None else "MFU N/A (no known peak)"))
    return fig


def time_breakdown_figure(rows: list[dict], title: str = "where a training step's time goes") -> go.Figure:
    """Horizontal bars of seconds per region (rows: {"region", "seconds"})."""
    rows = sorted(rows, key=lambda r: r["seconds"])
    fig = go.Figure(go.Bar(x=[r["seconds"] * 1e3 for r in rows], y=[r["region"] for r in rows],
                           orientation="h"))
    fig.update_layout(title=title, xaxis_title="milliseconds per step", template=TEMPLATE)
    return fig


def mx_blocks_figure(exponent, sqnr_db, title: str = "MXFP8: one scale per 32 values") -> go.Figure:
    """Heatmaps of a tensor's per-block scale exponents and per-block SQNR (rows x blocks)."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("block scale exponent (2^e)", "block SQNR (dB)"))
    fig.add_trace(go.Heatmap(z=exponent, colorscale="Viridis", colorbar=dict(x=0.45)), row=1, col=1)
    fig.add_trace(go.Heatmap(z=sqnr_db, colorscale="RdBu", colorbar=dict(x=1.0)), row=1, col=2)
    for col in (1, 2):
        fig.update_xaxes(title_text="block", row=1, col=col)
        fig.update_yaxes(title_text="row", row=1, col=col)
    fig.update_layout(title=title, template=TEMPLATE)
    return fig


def compile_steps_figure(steps: dict, title: str = "eager vs compiled: step time and compile time") -> go.Figure:
    """Per-step times of every variant (left) and each compiled variant's compile time against
    the median steps (right); `steps` from gemref.measure.compile_steps.compare_steps."""
    fig = make_subplots(rows=1, cols=2, column_widths=[0.6, 0.4],
                        subplot_titles=("timed training steps", "one-off compile vs one step"))
    for row in steps["rows"]:
        fig.add_trace(go.Scatter(y=row["steps_s"], mode="lines+markers", name=row["variant"]), row=1, col=1)
    labels = [f"compile {r['variant']} (once)" for r in steps["rows"] if "compile_s" in r] \
        + [f"{r['variant']} step" for r in steps["rows"]]
    values = [r["compile_s"] for r in steps["rows"] if "compile_s" in r] + [r["median_step_s"] for r in steps["rows"]]
    fig.add_trace(go.Bar(x=labels, y=values, text=[f"{v:.3g} s" for v in values], showlegend=False), row=1, col=2)
    fig.update_xaxes(title_text="timed step", row=1, col=1)
    fig.update_yaxes(title_text="seconds", row=1, col=1)
    fig.update_yaxes(title_text="seconds", row=1, col=2, **log_ticks(values))
    fig.update_layout(title=title, template=TEMPLATE)
    return fig


def sqnr_figure(per_precision: dict[str, list], title: str = "SQNR per layer vs the fp32 twin") -> go.Figure:
    """Grouped bars: for each precision, each layer's output / input-grad / weight-grad SQNR."""
    fig = make_subplots(rows=3, cols=1, shared_xaxes=True,
                        subplot_titles=("output", "input grad", "weight grad"))
    for name, layers in per_precision.items():
        x = [layer.fqn for layer in layers]
        for row, field in enumerate(("output_db", "input_grad_db", "weight_grad_db"), start=1):
            fig.add_trace(go.Bar(name=name, x=x, y=[getattr(layer, field) for layer in layers],
                                 legendgroup=name, showlegend=row == 1), row=row, col=1)
    fig.update_yaxes(title_text="dB")
    fig.update_layout(barmode="group", title=title, template=TEMPLATE, height=750)
    return fig


def loss_curves_figure(records: dict[str, dict], title: str = "training loss") -> go.Figure:
    """One line per run (records keyed by label), smoothed over 10 steps."""
    fig = go.Figure()
    for label, record in records.items():
        losses = record["loss_curve"]
        smooth = [sum(losses[max(0, i - 9):i + 1]) / len(losses[max(0, i - 9):i + 1]) for i in range(len(losses))]
        fig.add_trace(go.Scatter(x=list(range(1, len(losses) + 1)), y=smooth, mode="lines", name=label))
    fig.update_layout(title=title, xaxis_title="step", yaxis_title="loss (10-step mean)", template=TEMPLATE)
    return fig


def bars_figure(labels: list[str], values: list[float], title: str, yaxis: str) -> go.Figure:
    """A plain bar chart with values printed on the bars."""
    fig = go.Figure(go.Bar(x=labels, y=values, text=[f"{v:.3g}" for v in values]))
    fig.update_layout(title=title, yaxis_title=yaxis, template=TEMPLATE)
    return fig


def lines_figure(x: list, series: dict[str, list], title: str, xaxis: str, yaxis: str,
                 log_x: bool = False) -> go.Figure:
    """One line (with markers) per named series over a shared x."""
    dashes, symbols = ("solid", "dash", "dot", "dashdot"), ("circle", "square", "diamond", "triangle-up")
    fig = go.Figure([go.Scatter(x=x, y=y, mode="lines+markers", name=name, line=dict(dash=dashes[k % 4], width=2),
                                marker=dict(symbol=symbols[k % 4], size=8 + 2 * (k == 0)))     # overlapping lines stay visible
                     for k, (name, y) in enumerate(series.items())])
    fig.update_layout(title=title, xaxis_title=xaxis, yaxis_title=yaxis, template=TEMPLATE)
    if log_x:
        fig.update_xaxes(**log_ticks(x))
    return fig


def grouped_bars_figure(categories: list[str], series: dict[str, list[float]], title: str, yaxis: str,
                        log_y: bool = False, hline: tuple[float, str] | None = None) -> go.Figure:
    """One bar group per category, one bar per series (e.g. recorded vs analytic bytes per collective)."""
    fig = go.Figure([go.Bar(name=name, x=categories, y=values) for name, values in series.items()])
    fig.update_layout(barmode="group", title=title, yaxis_title=yaxis, template=TEMPLATE)
    if log_y:
        fig.update_yaxes(**log_ticks([v for values in series.values() for v in values]))
    if hline:
        fig.add_hline(y=hline[0], line_dash="dash", annotation_text=hline[1])
    return fig


def window_figure(rows: list[dict], title: str = "full causal vs sliding-window attention, forward+backward") -> go.Figure:
    """Model GFLOP, median wall ms and peak MiB against history length, one line per variant;
    `rows` from gemref.mfu.attention_cost.window_sweep (log-log axes)."""
    panels = (("model_gflop", "model GFLOP"), ("wall_ms", "wall time (ms, median)"), ("peak_mib", "peak memory (MiB)"))
    fig = make_subplots(rows=1, cols=3, subplot_titles=[t for _, t in panels])
    for i, variant in enumerate(dict.fromkeys(r["variant"] for r in rows)):
        mine = [r for r in rows if r["variant"] == variant]
        for col, (key, _) in enumerate(panels, start=1):
            fig.add_trace(go.Scatter(x=[r["history_len"] for r in mine], y=[r[key] for r in mine], mode="lines+markers",
                                     name=variant, legendgroup=variant, showlegend=col == 1,
                                     marker_color=COLORS[i % len(COLORS)]), row=1, col=col)
    fig.update_xaxes(title_text="history length (events)", **log_ticks([r["history_len"] for r in rows]))
    for col, (key, label) in enumerate(panels, start=1):
        fig.update_yaxes(title_text=label, row=1, col=col, **log_ticks([r[key] for r in rows]))
    fig.update_layout(title=title, template=TEMPLATE)
    return fig
def loss_parity_figure(curves: dict[str, list[float]], reference: list[float],
                       title: str = "loss per step: every layout vs one process") -> go.Figure:
    steps = list(range(1, len(reference) + 1))
    fig = go.Figure([go.Scatter(x=steps, y=reference, name="one process", mode="lines", line={"width": 6})])
    for name, losses in curves.items():
        fig.add_trace(go.Scatter(x=steps, y=losses, name=name, mode="lines+markers"))
    fig.update_layout(title=title, xaxis_title="step", yaxis_title="training loss", template=TEMPLATE)
    return fig


