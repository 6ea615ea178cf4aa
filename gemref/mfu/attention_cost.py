"""What attention costs, measured on one jagged batch: the kernels side by side, and full vs sliding-window causal attention as the history grows.

`compare_kernels(lengths, kernels, activation)`: for every kernel that can run the batch,
forward and forward+backward median wall seconds (warm-up, then repetitions, the kernels
round-robin through `interleaved` so load bursts on a shared machine hit all of them alike;
CUDA timed with events after a sync), achieved TFLOP/s on the REAL-length model FLOPs
(forward: attention_model_flops; forward+backward: 3x that, docs/design.md), the kernel's
executed/model FLOP ratio (padding, masked tiles), the peak memory of one forward+backward (a
separate, untimed pass, gemref/mfu/memory.py) and the speed-up over the reference kernel
measured in the same run on the same batch. The reference is skipped (with the reason) when
its padded score tensors would pass REFERENCE_BYTES_CAP bytes.

`window_sweep(lengths, window)`: for every history length L, a CPU batch of `batch` sequences
of exactly L events, causal self-attention through one gdpa kernel with no window ("full") and
with the window ("window"). Per variant: model FLOPs of forward+backward (3x the forward's
4*H*D per allowed pair, gemref/attention/flops.py: L(L+1)/2 pairs per sequence for full, sum
over rows i of min(i+1, W) for the window), the FLOPs the kernel executes (its own count:
padding, tiles), the peak memory of one untimed forward+backward (on CPU the live tensor
bytes, the kernel's workspace included), and the median wall and process-CPU seconds of
forward+backward, the variants interleaved (full, window, full, window, ...).
`cpu_over_wall` is process CPU / wall: about the thread count on an idle machine; far below
it the process waited for cores (contention) and its times are not final figures. `speedup`
is the median of the per-repetition full/window time ratios. `window_takeaway` reads a sweep
(and the window's quality cost, gemref/measure/quality.py `quality_cost`) in sentences.

On an oversubscribed CPU use fewer torch threads: the many-op kernels suffer most from OpenMP
threads waiting on descheduled peers (gemref/attention/cpu_jagged/op.py).
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from ..attention import KERNELS, attention_model_flops, gdpa
from ..data.jagged import lengths_to_offsets
from ..errors import UsageError
from .memory import PeakMemory, track_peak_memory
from .timing import interleaved

REFERENCE_BYTES_CAP = 3 << 30  # bytes: skip the reference when its padded score tensors would exceed this
WINDOW_VARIANTS = ("full", "window")


@dataclass
class AttentionBatch:
    """One jagged self-attention batch: q, k, v (T, H, D) that need gradients, the gradient of
    the output, and the sequences' lengths and offsets."""

    lengths: list[int]
    offsets: Tensor
    q: Tensor
    k: Tensor
    v: Tensor
    grad: Tensor

    @staticmethod
    def random(lengths: list[int], heads: int, head_dim: int, *, device: torch.device | str = "cpu",
               dtype: torch.dtype = torch.float32, seed: int = 0) -> "AttentionBatch":
        """Normal q, k, v and output gradient drawn on the CPU from `seed`, then moved to `device`."""
        gen = torch.Generator().manual_seed(seed)
        offsets = lengths_to_offsets(torch.tensor(lengths)).to(device)
        q, k, v, grad = (torch.randn(int(offsets[-1]), heads, head_dim, generator=gen).to(device, dtype)
                         for _ in range(4))
        for x in (q, k, v):
            x.requires_grad_(True)
        return AttentionBatch(lengths, offsets, q, k, v, grad)

    def forward(self, kernel: str, **opts) -> Tensor:
        return gdpa(self.q, self.k, self.v, self.offsets, kernel=kernel, max_len=max(self.lengths), **opts)

    def forward_backward(self, kernel: str, **opts) -> tuple[Tensor, ...]:
        return torch.autograd.grad(self.forward(kernel, **opts), (self.q, self.k, self.v), self.grad)

    def untimed_costs(self, kernel: str, activation: str, causal: bool, window: int | None) -> tuple[PeakMemory, int]:
        """(peak memory of one forward+backward, the FLOPs the kernel executes for one)."""
        with track_peak_memory(self.q.device) as peak:
            self.forward_backward(kernel, activation=activation, causal=causal, window=window)
        heads, head_dim = self.q.shape[1:]
        lengths = torch.tensor(self.lengths, device=self.q.device)
        return peak, sum(KERNELS[kernel].executed_flops(lengths, lengths, heads, head_dim, causal, window))


def _seconds(fn: Callable[[], object], device: torch.device) -> float:
    """Wall seconds of one call (CUDA: between two events after a sync)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _wall_and_cpu(fn: Callable[[], object]) -> tuple[float, float]:
    """(wall seconds, process CPU seconds) of one call."""
    w0, c0 = time.perf_counter(), time.process_time()
    fn()
    cpu = time.process_time() - c0
    return time.perf_counter() - w0, cpu


def compare_kernels(lengths: list[int], kernels: list[str], activation: str, *, heads: int = 2,
                    head_dim: int = 32, causal: bool = False, window: int | None = None,
                    device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                    warmup: int = 1, reps: int = 3, seed: int = 0) -> tuple[list[dict], list[tuple]]:
    """Time every kernel that can run this jagged batch (interleaved), then one untimed memory
    pass each. Returns (one row per kernel, [(kernel, reason)] for those that cannot run here).
    Times in ms, memory in MiB; speed-ups are over "reference" when it is first in `kernels`
    and runs."""
    device = torch.device(device)
    batch = AttentionBatch.random(lengths, heads, head_dim, device=device, dtype=dtype, seed=seed)
    runnable, skipped = [], []
    for kernel in kernels:
        reason = KERNELS[kernel].unavailable(batch.q, activation, causal, window)
        ref_bytes = 4 * len(lengths) * heads * max(lengths) ** 2 * batch.q.element_size()
        if kernel == "reference" and ref_bytes > REFERENCE_BYTES_CAP:
            reason = f"at L={max(lengths)} its padded scores would take ~{ref_bytes / 2 ** 30:.1f} GiB"
        (runnable.append(kernel) if reason is None else skipped.append((kernel, reason)))
    opts = dict(activation=activation, causal=causal, window=window)
    fns = {(kernel, "fwd"): (lambda kernel=kernel: batch.forward(kernel, **opts)) for kernel in runnable}
    fns.update({(kernel, "fwdbwd"): (lambda kernel=kernel: batch.forward_backward(kernel, **opts))
                for kernel in runnable})
    seconds = {name: statistics.median(t) for name, t in
               interleaved({name: (lambda k, fn=fn: _seconds(fn, device)) for name, fn in fns.items()}, reps,
                           warmup=warmup).items()}
    model = attention_model_flops(lengths, lengths, heads, head_dim, causal, window)
    rows = []
    for kernel in runnable:
        peak, executed = batch.untimed_costs(kernel, activation, causal, window)
        fwd_s, fwdbwd_s = seconds[(kernel, "fwd")], seconds[(kernel, "fwdbwd")]
        rows.append({"kernel": kernel, "fwd_ms": fwd_s * 1e3, "fwdbwd_ms": fwdbwd_s * 1e3,
                     "fwd_tflops": model / fwd_s / 1e12, "fwdbwd_tflops": 3 * model / fwdbwd_s / 1e12,
                     "exec_over_model": executed / (3 * model) if model else None,
                     "peak_mib": peak.bytes / 2 ** 20, "memory_method": peak.method})
    if runnable and runnable[0] == "reference":
        for row in rows:
            row["speedup_fwd"] = rows[0]["fwd_ms"] / row["fwd_ms"]
            row["speedup_fwdbwd"] = rows[0]["fwdbwd_ms"] / row["fwdbwd_ms"]
    return rows, skipped


def window_sweep(lengths: list[int], window: int, *, batch: int = 2, heads: int = 2, head_dim: int = 32,
                 activation: str = "silu", kernel: str = "cpu_jagged", warmup: int = 1, reps: int = 3,
                 seed: int = 0) -> list[dict]:
    """One row per (history length, variant) on CPU (module doc): FLOPs, GFLOP, MiB, ms. A
    kernel that cannot run a variant here is a UsageError carrying its reason."""
    rows = []
    for L in lengths:
        seq = [L] * batch
        inputs = AttentionBatch.random(seq, heads, head_dim, seed=seed)
        windows = {"full": None, "window": window}
        reason = next((r for w in windows.values()
                       if (r := KERNELS[kernel].unavailable(inputs.q, activation, True, w))), None)
        if reason:
            raise UsageError(f"--kernel {kernel} cannot run here: {reason}")

        def step(w):
            return lambda: inputs.forward_backward(kernel, activation=activation, causal=True, window=w)

        samples = interleaved({name: (lambda k, fn=step(w): _wall_and_cpu(fn)) for name, w in windows.items()}, reps,
                              warmup=warmup)
        times = {name: {"wall": [w for w, _ in t], "cpu": [c for _, c in t]} for name, t in samples.items()}
        full_model = 3 * attention_model_flops(seq, seq, heads, head_dim, True, None)
        for name, w in windows.items():
            peak, executed = inputs.untimed_costs(kernel, activation, True, w)
            model = 3 * attention_model_flops(seq, seq, heads, head_dim, True, w)
            wall, cpu = statistics.median(times[name]["wall"]), statistics.median(times[name]["cpu"])
            ratios = [f / x for f, x in zip(times["full"]["wall"], times[name]["wall"])]
            rows.append({"history_len": L, "variant": name, "window": w, "batch": batch,
                         "model_flops": model, "executed_flops": executed, "model_gflop": model / 1e9,
                         "executed_gflop": executed / 1e9, "flops_vs_full": model / full_model,
                         "peak_mib": peak.bytes / 2 ** 20, "memory_method": peak.method,
                         "wall_ms": wall * 1e3, "cpu_ms": cpu * 1e3, "cpu_over_wall": cpu / wall,
                         "speedup": statistics.median(ratios)})
    return rows


def window_takeaway(rows: list[dict], quality: dict | None = None) -> list[str]:
    """Sentences that read a `window_sweep` (and `quality_cost`) result: what the window saved at
    the longest history, how the costs grew, and the quality difference against the seed band."""
    by = {(r["history_len"], r["variant"]): r for r in rows}
    lengths = sorted({r["history_len"] for r in rows})
    top, low = lengths[-1], lengths[0]
    full, win = by[(top, "full")], by[(top, "window")]
    W = win["window"]
    lines = [f"At L = {top} events a window of {W} computes {win['flops_vs_full']:.1%} of full causal attention's "
             f"model FLOPs, and the kernel executes {win['executed_flops'] / full['executed_flops']:.1%} of its "
             f"full-attention FLOPs; forward+backward ran {win['speedup']:.2f}x faster ({full['wall_ms']:.1f} -> "
             f"{win['wall_ms']:.1f} ms; process CPU / wall {full['cpu_over_wall']:.2f} and "
             f"{win['cpu_over_wall']:.2f}), peak memory {full['peak_mib']:.1f} -> {win['peak_mib']:.1f} MiB."]
    if top > low:
        grow = {v: by[(top, v)]["model_flops"] / by[(low, v)]["model_flops"] for v in WINDOW_VARIANTS}
        lines.append(f"From L = {low} to {top} ({top / low:.0f}x longer) full attention's FLOPs grew "
                     f"{grow['full']:.1f}x, the window's {grow['window']:.1f}x.")
    more = [L for L in lengths if by[(L, "window")]["executed_flops"] > by[(L, "full")]["executed_flops"]]
    if more:
        lines.append(f"At L = {', '.join(map(str, more))} the windowed kernel executed MORE FLOPs than full attention: "
                     "with a history a few windows long its band tiles cover more than the full causal triangle "
                     "(which it splits into blocks), so the window pays off only on longer histories.")
    short = [L for L in lengths if L <= W]
    if short:
        lines.append(f"Histories of at most {W} events (here L = {', '.join(map(str, short))}) fit in the window: "
                     "it changes nothing there.")
    for s in (quality or {}).get("summary", []):
        if s["metric"] not in ("ne_click", "auc_click"):
            continue
        head = (f"Eval {s['metric']}: {s['full_mean']:.4f} full vs {s['window_mean']:.4f} with window "
                f"{quality['window']} ({s['mean_difference']:+.4f})")
        if s["full_seed_band"] is None:
            lines.append(head + "; one seed per variant, so no seed band: this difference cannot be told from "
                                "seed noise.")
        else:
            where = "inside" if s["within_band"] else "outside"
            lines.append(head + f", {where} the full runs' seed band {s['full_seed_band']:.4f} over "
                                f"{quality['seeds']} seeds.")
    return lines
