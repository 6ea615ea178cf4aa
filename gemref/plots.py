"""Plotly figures shared by the notebooks and the CLI. Functions take records, return figures."""
from __future__ import annotations

import logging
import shutil
from pathlib import Path

import plotly.graph_objects as go
from plotly.subplots import make_subplots

log = logging.getLogger(__name__)
TEMPLATE = "plotly_white"
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "chrome")


def find_chromium() -> str | None:
    """Path of a Chromium/Chrome on PATH (kaleido's static export drives it), or None."""
    return next((p for p in map(shutil.which, CHROMIUM_NAMES) if p), None)


def save_figure(fig: go.Figure, stem: str | Path, *, png: bool = True) -> list[Path]:
    """Write stem.html (plotly.js inlined, opens offline) and, when a Chromium is available
    for kaleido, stem.png. Returns the paths written; a missing Chromium is logged, not fatal."""
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    written = [stem.with_suffix(".html")]
    fig.write_html(written[0], include_plotlyjs=True)
    if png:
        if find_chromium() is None:
            log.warning("no Chromium on PATH: skipped %s.png (apt-get install -y chromium)", stem)
        else:
            fig.write_image(stem.with_suffix(".png"), width=1100, height=600, scale=1)
            written.append(stem.with_suffix(".png"))
    return written


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


def run_figure(record: dict) -> go.Figure:
    """A run at a glance: training loss per step, and its throughput/MFU figures."""
    fig = make_subplots(rows=1, cols=2, column_widths=[0.65, 0.35],
                        subplot_titles=("training loss", "throughput"))
    losses = record["loss_curve"]
    fig.add_trace(go.Scatter(x=list(range(1, len(losses) + 1)), y=losses, mode="lines", name="loss"),
                  row=1, col=1)
    mfu = record.get("mfu")
    labels = ["model TFLOP/s", "MFU %" if mfu is not None else "MFU (N/A)"]
    values = [record["model_tflops_per_s"], 100 * mfu if mfu is not None else 0.0]
    fig.add_trace(go.Bar(x=labels, y=values, name="throughput", text=[f"{v:.3g}" for v in values]),
                  row=1, col=2)
    fig.update_xaxes(title_text="step", row=1, col=1)
    fig.update_layout(template=TEMPLATE, showlegend=False,
                      title=f"{record['preset']} on {record['device']['name']}: "
                            f"{record['tokens_per_s']:.3g} tokens/s, NE(click) {record['eval']['ne_click']:.3f}")
    return fig


def time_breakdown_figure(rows: list[dict], title: str = "where a training step's time goes") -> go.Figure:
    """Horizontal bars of seconds per region (rows: {"region", "seconds"})."""
    rows = sorted(rows, key=lambda r: r["seconds"])
    fig = go.Figure(go.Bar(x=[r["seconds"] * 1e3 for r in rows], y=[r["region"] for r in rows],
                           orientation="h"))
    fig.update_layout(title=title, xaxis_title="milliseconds per step", template=TEMPLATE)
    return fig
