"""Diagrams that explain an idea, drawn by code from the run's own numbers (plotly shapes and bars).

Each chapter of the walkthrough opens its idea with one of these, so the picture shows this
run's data, not a generic cartoon:

    mfu_diagram(model, executed, step_s, peak)  ch00  a step's seconds: useful FLOPs at peak, padding, the rest
    jagged_diagram(lengths, max_len)      ch01  values + offsets against the padded layout
    tiling_diagram(L, block, window)      ch02  which (query, key) tiles a causal flash kernel visits
    activations_diagram()                 ch03  softmax's row normalisation vs pointwise activations
    regions_diagram()                     ch04  which parts of a block torch.compile compiles
    knapsack_diagram(blocks, plan, ...)   ch05  bytes each block frees per option, the plan, the budget
    partition_diagram(costs, parts)       ch06  samples packed into ranks: round robin vs balanced
    mesh_diagram(R, S)                    ch07  the 2D mesh: shard groups and replicate groups
    overlap_diagram(compute, comm)        ch08  a step's compute and communication lanes
    formats_diagram()                     ch09  the bits of fp32, bf16 and E4M3; MX's shared block scale
    ladder_diagram(rungs)                 ch10  the ladder as a staircase, one switch per rung
    cluster_diagram(nodes, gpus_per_node) ch11  nodes of GPUs: shard groups inside a node, replicas across
    split_diagram(splits, max_history)    ch12  the chronological split of a real dataset, rows per split
    wrap_diagram(stages)                  ch13  what gemref does around a model it did not define
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go

TEMPLATE = "plotly_white"
PALETTE = ("#4C78A8", "#F58518", "#54A24B", "#E45756", "#72B7B2", "#B279A2", "#FF9DA6", "#9D755D")


def _canvas(title: str, width: float, height: float) -> go.Figure:
    fig = go.Figure()
    fig.update_layout(title=title, template=TEMPLATE, showlegend=False, plot_bgcolor="white",
                      xaxis=dict(visible=False, range=[-0.5, width + 0.5]),
                      yaxis=dict(visible=False, range=[-0.5, height + 0.5], scaleanchor="x"))
    return fig


def _box(fig: go.Figure, x: float, y: float, w: float, h: float, color: str, text: str = "", **line) -> None:
    fig.add_shape(type="rect", x0=x, y0=y, x1=x + w, y1=y + h, fillcolor=color, line=dict(color="white", width=1,
                                                                                           **line))
    if text:
        fig.add_annotation(x=x + w / 2, y=y + h / 2, text=text, showarrow=False, font=dict(size=11))


def mfu_split(model_flops: float, executed_flops: float, step_seconds: float, peak_flops: float) -> dict[str, float]:
    """A step's seconds as shares (summing to 1): the model's FLOPs at peak (= MFU), the extra
    FLOPs it executed (padding, masked scores) at peak, and the time not spent at peak."""
    if not (0 < model_flops <= executed_flops) or step_seconds <= 0 or peak_flops <= 0:
        raise ValueError(f"need 0 < model ({model_flops}) <= executed ({executed_flops}) FLOPs and a positive "
                         f"step ({step_seconds} s) and peak ({peak_flops} FLOP/s)")
    at_peak = step_seconds * peak_flops                                  # FLOPs the step could have done
    useful, extra = model_flops / at_peak, (executed_flops - model_flops) / at_peak
    if useful + extra > 1:
        raise ValueError(f"the step executed {executed_flops:.3g} FLOPs in {step_seconds:.3g} s: above the peak "
                         f"{peak_flops:.3g} FLOP/s")
    return {"model FLOPs at peak (MFU)": useful, "extra executed FLOPs at peak": extra,
            "below peak (memory, overhead, idle)": 1 - useful - extra}


def mfu_diagram(model_flops: float, executed_flops: float, step_seconds: float, peak_flops: float,
                title: str = "what MFU counts: one step's seconds") -> go.Figure:
    """One bar of a step's time split as `mfu_split` says: only the first segment is MFU."""
    split = mfu_split(model_flops, executed_flops, step_seconds, peak_flops)
    fig = go.Figure([go.Bar(y=["step"], x=[100 * v], name=k, orientation="h", marker_color=c,
                            text=f"{100 * v:.1f}%", textposition="inside")
                     for (k, v), c in zip(split.items(), (PALETTE[0], PALETTE[1], "#DDDDDD"))])
    fig.update_layout(barmode="stack", title=title, template=TEMPLATE, height=260, xaxis_title="% of the step's seconds",
                      legend=dict(orientation="h", y=-0.5))
    return fig


def jagged_diagram(lengths: Sequence[int], max_len: int, title: str = "one batch: jagged vs padded") -> go.Figure:
    """Top: the padded layout, one row of max_len slots per sample (grey: padding). Bottom:
    the jagged layout, every event once in `values`, and `offsets` marking where each sample starts."""
    lengths = [int(n) for n in lengths]
    B, T = len(lengths), sum(lengths)
    scale = max(max_len, T) / 40 or 1
    fig = _canvas(title, max(max_len, T) / scale, B + 4)
    for b, n in enumerate(lengths):
        y = B + 3 - b
        _box(fig, 0, y, n / scale, 0.8, PALETTE[b % len(PALETTE)])
        _box(fig, n / scale, y, (max_len - n) / scale, 0.8, "#DDDDDD")
    start = 0
    for b, n in enumerate(lengths):
        _box(fig, start / scale, 0.6, n / scale, 0.8, PALETTE[b % len(PALETTE)])
        fig.add_annotation(x=start / scale, y=0.1, text=str(start), showarrow=False, font=dict(size=10))
        start += n
    fig.add_annotation(x=T / scale, y=0.1, text=str(T), showarrow=False, font=dict(size=10))
    fig.add_annotation(x=0, y=B + 4.2, xanchor="left", showarrow=False,
                       text=f"padded: {B} x {max_len} = {B * max_len:,} slots, {T:,} real ({T / (B * max_len):.0%})")
    fig.add_annotation(x=0, y=1.8, xanchor="left", showarrow=False,
                       text=f"jagged: values ({T:,} events) + offsets {[0, *np.cumsum(lengths).tolist()]}")
    return fig


def tiling_diagram(L: int, block: int, window: int | None = None,
                   title: str = "causal attention: the tiles a flash kernel visits") -> go.Figure:
    """An L x L score matrix in block x block tiles: full tiles (computed without a mask),
    diagonal or window-edge tiles (masked), and the tiles it never visits."""
    n = -(-L // block)
    fig = _canvas(title, n, n)
    counts = {"full": 0, "masked": 0, "skipped": 0}
    for i in range(n):              # query tile (rows, top to bottom)
        for j in range(n):          # key tile
            q0, q1, k0, k1 = i * block, min(L, (i + 1) * block) - 1, j * block, min(L, (j + 1) * block) - 1
            allowed_any = k0 <= q1 and (window is None or k1 > q0 - window)
            allowed_all = k1 <= q0 and (window is None or k0 > q1 - window)
            kind = "full" if allowed_all else "masked" if allowed_any else "skipped"
            counts[kind] += 1
            _box(fig, j, n - 1 - i, 1, 1, {"full": PALETTE[0], "masked": PALETTE[1], "skipped": "#EEEEEE"}[kind])
    fig.add_annotation(x=n / 2, y=n + 0.3, showarrow=False,
                       text=f"L = {L}, tiles of {block}: {counts['full']} full, {counts['masked']} masked, "
                            f"{counts['skipped']} never visited (of {n * n})")
    return fig


def activations_diagram(title: str = "GDPA: act(q.k) per key, or softmax across keys") -> go.Figure:
    """The pointwise activations GDPA offers against softmax: softmax's weights depend on every
    key's score (row-normalised), a pointwise weight only on its own."""
    import torch
    import torch.nn.functional as F

    s = torch.linspace(-4, 4, 161)
    curves = {"silu": F.silu(s), "gelu": F.gelu(s), "relu": F.relu(s), "relu2": F.relu(s) ** 2 / 4,
              "softmax (over these 161 scores)": torch.softmax(s, 0) * 161 / 8}
    fig = go.Figure([go.Scatter(x=s.tolist(), y=v.tolist(), name=k, mode="lines") for k, v in curves.items()])
    fig.update_layout(title=title, template=TEMPLATE, xaxis_title="score q.k (scaled)",
                      yaxis_title="weight of that key's value", yaxis_range=[-0.5, 4.2])
    return fig


def regions_diagram(title: str = "one GEM layer: what torch.compile compiles (blue) and what stays eager") -> go.Figure:
    """The blocks of a layer in order, each split into its compiled regions and the eager attention."""
    parts = [("sequence block", [("project: norm, QKV", True), ("attention kernel", False),
                                 ("mix: out proj, FFN", True)]),
             ("interaction block", [("DCN-style mixing", True)]),
             ("cross block", [("project", True), ("attention kernel", False), ("mix", True)])]
    fig = _canvas(title, 12, 3)
    x = 0.0
    for block, regions in parts:
        w = 4 / len(regions) * (1 if len(regions) > 1 else 0.6)
        fig.add_annotation(x=x + w * len(regions) / 2, y=2.6, text=f"<b>{block}</b>", showarrow=False)
        for name, compiled in regions:
            _box(fig, x, 1, w - 0.1, 1.2, PALETTE[0] if compiled else PALETTE[1], name.replace(": ", ":<br>"))
            x += w
        x += 0.3
    fig.add_annotation(x=6, y=0.3, showarrow=False,
                       text="a compiled region is one graph per kind (every layer reuses it), dim 0 dynamic")
    return fig


def knapsack_diagram(blocks: Sequence[Mapping], plan: Mapping[str, str], base_bytes: int, budget_bytes: int,
                     title: str = "AutoAC's knapsack: bytes each block frees, and the plan") -> go.Figure:
    """Per block, the bytes "save_matmuls" and "full" would free (bars) and the option the plan
    took (marked); the line is how many bytes the budget requires to be freed."""
    names = [b["name"] for b in blocks]
    fig = go.Figure()
    for k, option in enumerate(("save_matmuls", "full")):
        fig.add_trace(go.Bar(name=f"{option} frees", x=names, y=[b["freed_bytes"].get(option, 0) / 2**20 for b in blocks],
                             marker=dict(color=PALETTE[k], opacity=[1.0 if plan.get(n) == option else 0.35 for n in names])))
    need = max(0, base_bytes - budget_bytes) / 2**20
    fig.add_annotation(x=0, y=1.08, xref="paper", yref="paper", showarrow=False, xanchor="left",
                       text=f"the budget keeps {budget_bytes / 2**20:.2f} of {base_bytes / 2**20:.2f} MiB: "
                            f"the plan must free {need:.2f} MiB (solid bars: what it chose)")
    fig.update_layout(barmode="group", title=title, template=TEMPLATE, yaxis_title="MiB freed", xaxis_title="block")
    return fig


def partition_diagram(costs: Sequence[float], parts: Mapping[str, Sequence[Sequence[int]]],
                      title: str = "one global batch, packed into ranks") -> go.Figure:
    """For each policy, every rank's samples stacked (one segment per sample, by cost): the
    tallest column is the straggler every rank waits for."""
    costs = np.asarray(costs, dtype=float)
    fig = go.Figure()
    for p, (policy, ranks) in enumerate(parts.items()):
        for r, idx in enumerate(ranks):
            base = 0.0
            for i in sorted(idx, key=lambda i: -costs[i]):
                fig.add_trace(go.Bar(x=[f"{policy}<br>rank {r}"], y=[costs[i]], base=base, marker_color=PALETTE[p % 8],
                                     marker_line=dict(color="white", width=0.5), showlegend=False,
                                     hovertext=f"sample {i}: cost {costs[i]:.3g}"))
                base += costs[i]
    fig.update_layout(barmode="overlay", title=title, template=TEMPLATE, yaxis_title="cost (model FLOPs)")
    return fig


def mesh_diagram(replicate: int, shard: int, title: str | None = None) -> go.Figure:
    """R x S ranks as a grid: a row is a shard group (parameters split S ways, reduce-scatter and
    all-gather), a column a replicate group (the same shard on R ranks, all-reduce)."""
    fig = _canvas(title or f"the {replicate}x{shard} mesh: rank r at (r // {shard}, r % {shard})", shard * 1.2, replicate * 1.2)
    for r in range(replicate):
        for s in range(shard):
            _box(fig, s * 1.2, (replicate - 1 - r) * 1.2, 1, 1, PALETTE[s % 8], f"rank {r * shard + s}<br>shard {s}")
        fig.add_annotation(x=-0.2, y=(replicate - 1 - r) * 1.2 + 0.5, text=f"group {r}", showarrow=False,
                           xanchor="right")
    fig.add_annotation(x=shard * 0.6, y=replicate * 1.2 + 0.1, showarrow=False,
                       text="rows: shard groups (FSDP's all-gather / reduce-scatter) · "
                            "columns: replicate groups (all-reduce of gradient shards)")
    return fig


def overlap_diagram(compute: Sequence[tuple[str, float, float]], comm: Sequence[tuple[str, float, float]],
                    title: str = "one step: compute and communication lanes") -> go.Figure:
    """Two lanes of (name, start s, end s): communication under compute is hidden; the rest is exposed."""
    fig = go.Figure()
    for lane, items in (("compute", compute), ("communication", comm)):
        for k, (name, start, end) in enumerate(items):
            fig.add_trace(go.Bar(y=[lane], x=[end - start], base=start, orientation="h", name=name,
                                 marker_color=PALETTE[k % 8], hovertext=name, showlegend=False))
    fig.update_layout(barmode="overlay", title=title, template=TEMPLATE, xaxis_title="seconds into the step")
    return fig


FORMATS = {"fp32": (1, 8, 23), "bf16": (1, 8, 7), "fp8 E4M3": (1, 4, 3)}   # sign, exponent, mantissa bits


def formats_diagram(formats: Mapping[str, tuple[int, int, int]] = FORMATS, block: int = 32,
                    title: str = "what a value keeps: sign, exponent, mantissa bits") -> go.Figure:
    """One row of bit boxes per format (sign, exponent, mantissa), and MX's cost per value: `block`
    E4M3 elements share one 8-bit power-of-two (E8M0) scale."""
    fig = _canvas(title, 33, 2 * len(formats) + 1)
    for row, (name, (sign, exponent, mantissa)) in enumerate(formats.items()):
        y = 2 * (len(formats) - row)
        x = 0.0
        for bits, color, part in ((sign, PALETTE[3], "s"), (exponent, PALETTE[0], "exp"), (mantissa, PALETTE[2], "man")):
            _box(fig, x, y, bits, 1, color, f"{part} {bits}" if bits > 2 else "")
            x += bits
        fig.add_annotation(x=x + 0.3, y=y + 0.5, xanchor="left", showarrow=False,
                           text=f"<b>{name}</b>: {sign + exponent + mantissa} bits")
    fig.add_annotation(x=0, y=0.5, xanchor="left", showarrow=False,
                       text=f"MXFP8: {block} E4M3 values share one 8-bit E8M0 scale: {(block * 8 + 8) / block:g} bits "
                            "per value; bf16 keeps fp32's exponent range with 7 mantissa bits")
    return fig


def ladder_diagram(rungs: Sequence[tuple[int, str, str]], title: str = "the ladder: one more technique per rung") -> go.Figure:
    """A staircase of (number, title, switch): rung k stands on rung k-1, labelled with its switch."""
    if not rungs:
        raise ValueError("the ladder needs at least one rung")
    fig = _canvas(title, 2.2 * len(rungs), len(rungs) + 1)
    for i, (number, name, switch) in enumerate(rungs):
        _box(fig, 2.2 * i, 0, 2.1, i + 1, PALETTE[i % len(PALETTE)])
        fig.add_annotation(x=2.2 * i + 1.05, y=i + 1.35, showarrow=False, font=dict(size=10),
                           text=f"<b>{name}</b><br>{switch}")
    return fig


def cluster_diagram(nodes: int, gpus_per_node: int, title: str | None = None) -> go.Figure:
    """`nodes` boxes of `gpus_per_node` GPUs: a node's GPUs form a shard group on fast links
    (NVLink), the same position across nodes a replicate group over the network."""
    if nodes < 1 or gpus_per_node < 1:
        raise ValueError(f"need nodes >= 1 and gpus_per_node >= 1, got {nodes}, {gpus_per_node}")
    fig = _canvas(title or f"{nodes} nodes x {gpus_per_node} GPUs = {nodes * gpus_per_node} ranks",
                  (gpus_per_node + 1) * nodes, 4)
    for n in range(nodes):
        x0 = n * (gpus_per_node + 1)
        fig.add_shape(type="rect", x0=x0 - 0.2, y0=0.8, x1=x0 + gpus_per_node - 0.3, y1=3.1,
                      line=dict(color=PALETTE[0], width=2))
        fig.add_annotation(x=x0 + (gpus_per_node - 0.5) / 2, y=3.4, showarrow=False, text=f"node {n}")
        for g in range(gpus_per_node):
            _box(fig, x0 + g, 1.5, 0.8, 0.8, PALETTE[2], str(n * gpus_per_node + g))
    fig.add_annotation(x=0, y=0.2, xanchor="left", showarrow=False,
                       text="a node = one shard group (FSDP gathers on fast links); across nodes, replicate groups")
    return fig


def split_diagram(splits: Sequence[Mapping], max_history: int, title: str = "a real dataset, split by time") -> go.Figure:
    """One bar per split sized by its rows ({"split", "rows"}: gemref data check's summary): every
    row predicts one rating from its user's latest `max_history` earlier ones."""
    total = sum(int(r["rows"]) for r in splits)
    if total <= 0:
        raise ValueError("the splits hold no rows")
    fig = _canvas(title, 20, 3)
    x = 0.0
    for i, r in enumerate(splits):
        w = 20 * int(r["rows"]) / total
        _box(fig, x, 1, w, 1, PALETTE[i % len(PALETTE)], f"{r['split']}: {int(r['rows']):,} rows ({r['rows'] / total:.0%})")
        x += w
    fig.add_annotation(x=10, y=0.4, showarrow=False,
                       text=f"earlier ratings train, later ones evaluate; a row's history: its user's latest "
                            f"{max_history} earlier ratings")
    return fig


def wrap_diagram(stages: Sequence[str], title: str = "what gemref does around a model it did not define") -> go.Figure:
    """Boxes left to right joined by arrows: the model, then each thing gemref does with it."""
    if len(stages) < 2:
        raise ValueError("a flow needs at least two stages")
    fig = _canvas(title, 3 * len(stages), 2)
    for i, stage in enumerate(stages):
        _box(fig, 3 * i, 0.5, 2.4, 1, PALETTE[0] if i == 0 else PALETTE[4], stage)
        if i:
            fig.add_annotation(x=3 * i, y=1, ax=3 * i - 0.6, ay=1, xref="x", yref="y", axref="x", ayref="y",
                               showarrow=True, arrowhead=2, text="")
    return fig
