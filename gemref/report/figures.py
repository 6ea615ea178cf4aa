"""Plotly figures shared by the notebooks and the CLI. Functions take records, return figures."""
from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..files import atomic_write_bytes, atomic_write_text

if TYPE_CHECKING:
    from .records import RunRecord

log = logging.getLogger(__name__)
TEMPLATE = "plotly_white"
COLORS = ("#636efa", "#ef553b", "#00cc96")   # plotly's first three: one per variant, the same in every panel
MB = 2 ** 20
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "chrome")


def find_chromium() -> str | None:
    """Path of a Chromium/Chrome on PATH (kaleido's static export drives it), or None."""
    return next((p for p in map(shutil.which, CHROMIUM_NAMES) if p), None)


def save_figure(fig: go.Figure, stem: str | Path, *, png: bool = True) -> list[Path]:
    """Write stem.html (plotly.js inlined, opens offline) and, when a Chromium is available
    for kaleido, stem.png. Returns the paths written; a missing Chromium is logged, not fatal."""
    stem = Path(stem)
    written = [atomic_write_text(stem.with_suffix(".html"), fig.to_html(include_plotlyjs=True))]
    if png:
        if find_chromium() is None:
            log.warning("no Chromium on PATH: skipped %s.png (apt-get install -y chromium)", stem)
        else:
            written.append(atomic_write_bytes(stem.with_suffix(".png"),
                                              fig.to_image(format="png", width=1100, height=600, scale=1)))
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
    """Per-step times of both variants (left) and compile time against the median step (right);
    `steps` from gemref.bench.compile.compare_steps."""
    fig = make_subplots(rows=1, cols=2, column_widths=[0.6, 0.4],
                        subplot_titles=("timed training steps", "one-off compile vs one step"))
    for row in steps["rows"]:
        fig.add_trace(go.Scatter(y=row["steps_s"], mode="lines+markers", name=row["variant"]), row=1, col=1)
    compiled = steps["rows"][1]
    labels = ["compile (once)", "eager step", "compiled step"]
    values = [compiled["compile_s"], steps["rows"][0]["median_step_s"], compiled["median_step_s"]]
    fig.add_trace(go.Bar(x=labels, y=values, text=[f"{v:.3g} s" for v in values], showlegend=False), row=1, col=2)
    fig.update_xaxes(title_text="timed step", row=1, col=1)
    fig.update_yaxes(title_text="seconds", row=1, col=1)
    fig.update_yaxes(title_text="seconds", type="log", row=1, col=2)
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


def waterfall_figure(rows: list[dict], title: str = "MFU waterfall: what each technique adds") -> go.Figure:
    """Top: a plotly waterfall of E2E MFU (%) rung by rung. Bottom: local MFU and E2E MFU (%)
    per rung, with the scaling ratio (E2E / local: what survives communication, waiting and
    data loading) printed on each pair. Rungs that did not apply show as 'n/a here', rungs
    with no uncontended window as 'contended'. Without a known peak: tokens/s, top panel only.
    Rows from gemref.waterfall.run_waterfall."""
    measured = [r for r in rows if r.get("status") == "ran" and r.get("tokens_per_s") is not None]
    use_mfu = bool(measured) and all(r.get("mfu") is not None for r in measured)
    value = (lambda r: 100 * r["mfu"]) if use_mfu else (lambda r: r["tokens_per_s"])
    x, y, measure, text, previous = [], [], [], [], None
    for r in rows:
        x.append(r["rung"])
        if r.get("status") != "ran" or r.get("tokens_per_s") is None:
            y.append(0.0)
            measure.append("relative")
            text.append("n/a here" if r.get("status") != "ran" else "contended")
            continue
        v = value(r)
        y.append(v if previous is None else v - previous)
        measure.append("absolute" if previous is None else "relative")
        text.append(f"{v:.3g}" + ("%" if use_mfu else ""))
        previous = v
    fig = make_subplots(rows=2 if use_mfu else 1, cols=1, shared_xaxes=True,
                        row_heights=[0.6, 0.4] if use_mfu else [1.0], vertical_spacing=0.08)
    fig.add_trace(go.Waterfall(x=x, y=y, measure=measure, text=text, textposition="outside", showlegend=False,
                               connector={"line": {"color": "rgb(150,150,150)"}}), row=1, col=1)
    fig.update_yaxes(title_text="E2E MFU (%)" if use_mfu else "tokens/s (no peak known: MFU N/A)", row=1, col=1)
    if use_mfu:
        names = [r["rung"] for r in measured]
        local = [100 * r["local_mfu"] if r.get("local_mfu") is not None else None for r in measured]
        fig.add_trace(go.Bar(name="local MFU", x=names, y=local), row=2, col=1)
        fig.add_trace(go.Bar(name="E2E MFU", x=names, y=[100 * r["mfu"] for r in measured], textposition="outside",
                             text=[f"x{r['scaling_ratio']:.2f}" if r.get("scaling_ratio") is not None else ""
                                   for r in measured]), row=2, col=1)
        fig.update_yaxes(title_text="MFU (%): local, E2E", row=2, col=1)
    fig.update_layout(title=title, template=TEMPLATE, barmode="group")
    return fig


BREAKDOWN_PARTS = (("gemm_s", "GEMMs"), ("attention_s", "attention"), ("elementwise_s", "element-wise"),
                   ("optimizer_s", "optimizer"), ("other_s", "other compute"), ("compute_s", "compute"),
                   ("exposed_comm_s", "exposed communication"), ("waiting_s", "waiting at the collective"),
                   ("queued_s", "queued for a core"), ("data_s", "data"))


def waterfall_breakdown_figure(rows: list[dict], title: str = "where each rung's step goes") -> go.Figure:
    """Stacked bars (ms per step) of each measured rung's step-time breakdown (gemref/waterfall/stats.py)."""
    measured = [r for r in rows if r.get("breakdown")]
    names = [r["rung"] for r in measured]
    fig = go.Figure([go.Bar(name=label, x=names, y=[1e3 * r["breakdown"].get(key, 0.0) for r in measured])
                     for key, label in BREAKDOWN_PARTS if any(key in r["breakdown"] for r in measured)])
    fig.update_layout(barmode="stack", title=title, yaxis_title="ms per step (mean over ranks)", template=TEMPLATE)
    return fig


def step_limits_figure(stacks: dict[str, dict[str, float]], mfu: dict[str, float | None],
                       title: str = "one step by op class, and its limits") -> go.Figure:
    """Stacked horizontal bars, one per case (the measured step, its limits), of ms per step by
    op class; each case's MFU beside its name. stacks: {case: {class: ms}}, mfu: {case: MFU}."""
    cases = list(stacks)
    labels = [f"{c} (MFU {mfu[c]:.1%})" if mfu.get(c) is not None else c for c in cases]
    classes = list(dict.fromkeys(k for c in cases for k in stacks[c]))
    fig = go.Figure([go.Bar(name=k, y=labels, x=[stacks[c].get(k, 0.0) for c in cases], orientation="h")
                     for k in classes])
    fig.update_layout(barmode="stack", title=title, xaxis_title="ms per step", template=TEMPLATE,
                      yaxis={"autorange": "reversed"})
    return fig


def length_histogram_figure(lengths, title: str = "history lengths") -> go.Figure:
    fig = go.Figure(go.Histogram(x=list(lengths), nbinsx=60))
    fig.update_layout(title=title, xaxis_title="events per history", yaxis_title="samples",
                      template=TEMPLATE, bargap=0.05)
    return fig


def rank_loads_figure(rows: list[dict], title: str = "cost per rank, one global batch") -> go.Figure:
    """Grouped bars of per-rank cost for each policy (rows from gemref.balance.compare_policies)."""
    fig = go.Figure([go.Bar(name=r["policy"], x=[f"rank {i}" for i in range(len(r["loads"]))], y=r["loads"])
                     for r in rows])
    fig.update_layout(barmode="group", title=title, yaxis_title="model FLOPs", template=TEMPLATE)
    return fig


def lines_figure(x: list, series: dict[str, list], title: str, xaxis: str, yaxis: str,
                 log_x: bool = False) -> go.Figure:
    """One line (with markers) per named series over a shared x."""
    fig = go.Figure([go.Scatter(x=x, y=y, mode="lines+markers", name=name) for name, y in series.items()])
    fig.update_layout(title=title, xaxis_title=xaxis, yaxis_title=yaxis, template=TEMPLATE)
    if log_x:
        fig.update_xaxes(type="log")
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
    fig.update_layout(barmode="group", title=title, template=TEMPLATE)
    return fig


def ac_pareto_figure(rows: list[dict], title: str = "activation memory vs recompute, per strategy") -> go.Figure:
    """Recompute (% of model FLOPs) and step time against activation bytes (% of no AC), one
    trace per strategy, points labelled by budget; rows from gemref.bench.autoac.budget_sweep."""
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
    strategy to [(bytes, recompute FLOPs, plan summary)] (gemref.bench.autoac_regions.fronts)."""
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


DEFAULT_COLORS = ("#636efa", "#ef553b", "#00cc96", "#ab63fa", "#ffa15a", "#19d3f3")


def scale_mfu_figure(rows: list[dict], band: tuple[float, float] | None = None,
                     title: str = "projected MFU vs GPUs (weak scaling)") -> go.Figure:
    """E2E MFU (%) against GPU count, one line per rung (rows from gemref.simulate.projection.project);
    hovering a point shows its local MFU x scaling ratio; `band` (fractions) is shaded, e.g. GEM's
    public 20-25%."""
    gpus = sorted({r["gpus"] for r in rows})
    fig = go.Figure()
    for rung in dict.fromkeys(r["rung"] for r in rows):
        mine = {r["gpus"]: r for r in rows if r["rung"] == rung}
        fig.add_trace(go.Scatter(x=gpus, y=[100 * mine[g]["mfu"] for g in gpus], mode="lines+markers", name=rung,
                                 text=[f"local {mine[g]['local_mfu']:.1%} x scaling {mine[g]['scaling_ratio']:.2f}"
                                       for g in gpus]))
    if band:
        fig.add_hrect(y0=100 * band[0], y1=100 * band[1], fillcolor="green", opacity=0.12, line_width=0,
                      annotation_text=f"GEM: {band[0]:.0%}-{band[1]:.0%}", annotation_position="top left")
    fig.update_xaxes(type="log", tickvals=gpus, ticktext=[str(g) for g in gpus], title_text="GPUs")
    fig.update_layout(title=title, yaxis_title="E2E MFU (%)", template=TEMPLATE)
    return fig


def step_breakdown_figure(rows: list[dict], title: str = "one step, per rank") -> go.Figure:
    """Stacked bars per rung: compute, load-imbalance bubble, exposed comm by collective kind (seconds)."""
    names = [r["rung"] for r in rows]
    kinds = list(dict.fromkeys(k for r in rows for k in r["exposed_by_kind"]))
    fig = go.Figure([go.Bar(name="compute", x=names, y=[r["compute_s"] for r in rows]),
                     go.Bar(name="imbalance bubble", x=names, y=[r["bubble_s"] for r in rows])]
                    + [go.Bar(name=f"exposed {k}", x=names, y=[r["exposed_by_kind"].get(k, 0.0) for r in rows])
                       for k in kinds]
                    + [go.Bar(name="SM slowdown of overlapped compute", x=names,
                              y=[r.get("sm_slowdown_s", 0.0) for r in rows])])
    fig.update_layout(barmode="stack", title=title, yaxis_title="seconds", template=TEMPLATE)
    return fig



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


def window_figure(rows: list[dict], title: str = "full causal vs sliding-window attention, forward+backward") -> go.Figure:
    """Model GFLOP, median wall ms and peak MiB against history length, one line per variant;
    `rows` from gemref.bench.window.window_sweep (log-log axes)."""
    panels = (("model_gflop", "model GFLOP"), ("wall_ms", "wall ms (median)"), ("peak_mib", "peak MiB"))
    fig = make_subplots(rows=1, cols=3, subplot_titles=[t for _, t in panels])
    for i, variant in enumerate(dict.fromkeys(r["variant"] for r in rows)):
        mine = [r for r in rows if r["variant"] == variant]
        for col, (key, _) in enumerate(panels, start=1):
            fig.add_trace(go.Scatter(x=[r["history_len"] for r in mine], y=[r[key] for r in mine], mode="lines+markers",
                                     name=variant, legendgroup=variant, showlegend=col == 1,
                                     marker_color=COLORS[i % len(COLORS)]), row=1, col=col)
    fig.update_xaxes(type="log", title_text="history length (events)")
    fig.update_yaxes(type="log")
    fig.update_layout(title=title, template=TEMPLATE)
    return fig
