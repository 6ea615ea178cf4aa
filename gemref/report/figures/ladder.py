"""Figures of the ladder: the waterfall, where each rung's step goes, a step's limits, scale projections."""
from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .base import TEMPLATE


def waterfall_figure(rows: list[dict], title: str = "MFU waterfall: what each technique adds") -> go.Figure:
    """Top: a plotly waterfall of E2E MFU (%) rung by rung. Bottom: local MFU and E2E MFU (%)
    per rung, with the scaling ratio (E2E / local: what survives communication, waiting and
    data loading) printed on each pair. Rungs that did not apply show as 'n/a here', rungs
    with no uncontended window as 'contended'. Without a known peak: tokens/s, top panel only.
    Each MFU divides by the peak of its rung's GEMM dtype (the row's "mfu_basis"): a rung on
    another basis than the rung before it starts a new bar from zero, never a step from the
    previous one (bf16's MFU against the bf16 peak is no loss against fp32's), and every bar
    on another basis than the first rung's names its basis. Rows from
    gemref.waterfall.run_waterfall."""
    measured = [r for r in rows if r.get("status") == "ran" and r.get("tokens_per_s") is not None]
    use_mfu = bool(measured) and all(r.get("mfu") is not None for r in measured)
    value = (lambda r: 100 * r["mfu"]) if use_mfu else (lambda r: r["tokens_per_s"])
    bases = list(dict.fromkeys(r.get("mfu_basis") for r in measured)) if use_mfu else []
    mixed = len(bases) > 1
    x, y, measure, text, previous, previous_basis = [], [], [], [], None, None
    for r in rows:
        x.append(r["rung"])
        if r.get("status") != "ran" or r.get("tokens_per_s") is None:
            y.append(0.0)
            measure.append("relative")
            text.append("n/a here" if r.get("status") != "ran" else "contended")
            continue
        v, basis = value(r), r.get("mfu_basis") if use_mfu else None
        restart = previous is None or basis != previous_basis
        y.append(v if restart else v - previous)
        measure.append("absolute" if restart else "relative")
        named = f"<br>of the {basis}" if mixed and basis != bases[0] else ""
        text.append(f"{v:.3g}" + ("%" if use_mfu else "") + named)
        previous, previous_basis = v, basis
    fig = make_subplots(rows=2 if use_mfu else 1, cols=1, shared_xaxes=True,
                        row_heights=[0.6, 0.4] if use_mfu else [1.0], vertical_spacing=0.08)
    fig.add_trace(go.Waterfall(x=x, y=y, measure=measure, text=text, textposition="outside", showlegend=False,
                               connector={"line": {"color": "rgb(150,150,150)"}}), row=1, col=1)
    fig.update_yaxes(title_text=("E2E MFU (%), each of its rung's peak" if mixed else "E2E MFU (%)") if use_mfu
                     else "tokens/s (no peak known: MFU N/A)", row=1, col=1)
    if use_mfu:
        names = [r["rung"] for r in measured]
        local = [100 * r["local_mfu"] if r.get("local_mfu") is not None else None for r in measured]
        fig.add_trace(go.Bar(name="local MFU", x=names, y=local), row=2, col=1)
        fig.add_trace(go.Bar(name="E2E MFU", x=names, y=[100 * r["mfu"] for r in measured], textposition="outside",
                             text=[f"x{r['scaling_ratio']:.2f}" if r.get("scaling_ratio") is not None else ""
                                   for r in measured]), row=2, col=1)
        fig.update_yaxes(title_text="MFU (%): local, E2E", row=2, col=1)
    if mixed:
        title += f" (MFU bases: {', '.join(str(b) for b in bases)}; a new basis starts a new bar)"
    fig.update_layout(title=title, template=TEMPLATE, barmode="group")
    return fig


BREAKDOWN_PARTS = (("gemm_s", "GEMMs"), ("attention_s", "attention"), ("elementwise_s", "element-wise"),
                   ("optimizer_s", "optimizer"), ("other_s", "other compute"), ("compute_s", "compute"),
                   ("exposed_comm_s", "exposed communication"), ("waiting_s", "waiting at the collective"),
                   ("queued_s", "queued for a core"), ("data_s", "data"))


def waterfall_breakdown_figure(rows: list[dict], title: str = "where each rung's step goes", ranks: int = 1) -> go.Figure:
    """Stacked bars of each measured rung's step-time breakdown (gemref/waterfall/stats.py), in
    microseconds per sample a rank trains (rungs differ in batch: AutoAC's is larger, so per-step
    times would compare different work)."""
    measured = [r for r in rows if r.get("breakdown")]
    names = [f"{r['rung']}<br>({r['batch_size'] // ranks} samples/rank)" for r in measured]
    per_sample = [1e6 * ranks / r["batch_size"] for r in measured]
    fig = go.Figure([go.Bar(name=label, x=names, y=[k * r["breakdown"].get(key, 0.0) for r, k in zip(measured, per_sample)])
                     for key, label in BREAKDOWN_PARTS if any(key in r["breakdown"] for r in measured)])
    fig.update_layout(barmode="stack", title=title, template=TEMPLATE,
                      yaxis_title="µs per sample (a rank's step / its samples; mean over ranks)")
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



