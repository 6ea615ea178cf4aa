"""Sliding-window vs full causal history attention: FLOPs, peak memory, time as the history grows; the window's quality cost.

Attention (`window_sweep`): for every history length L of --lengths, a batch of --batch
sequences of exactly L events, --heads x --head-dim, causal self-attention through one gdpa
kernel (--kernel, default cpu_jagged) with no window ("full") and with --window W ("window").
Per variant: model FLOPs of forward+backward (3x the forward's 4*H*D per allowed pair,
gemref/attention/flops.py: L(L+1)/2 pairs per sequence for full, sum over rows i of
min(i+1, W) for the window), the FLOPs the kernel executes (its own count: padding, tiles),
the peak memory of one untimed forward+backward (gemref.mfu.memory: on CPU the live tensor
bytes, the kernel's workspace included), and the median wall and process-CPU seconds of
forward+backward over --reps repetitions after --warmup, the variants interleaved (full,
window, full, window, ...) so load on a shared machine hits both alike. `cpu_over_wall` is
process CPU / wall: about the thread count on an idle machine; far below it the process
waited for cores (contention) and its times are not final figures. `speedup` is the median
of the per-repetition full/window time ratios.

Quality (`quality_cost`, --quality-seeds N, 0 skips): for each seed 0..N-1, two short
training runs of --quality-preset (jagged, cpu_jagged, --quality-steps steps, same seed and
batches), without and with ModelConfig.window = --quality-window, then NE and AUC of both
tasks on the preset's eval batches. Reported: every run, the paired window - full
differences, and (N >= 2) the full runs' seed band (max - min over seeds), the spread a
difference must exceed to mean anything. With N = 1 there is no band: one seed per variant.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from dataclasses import replace
from typing import Callable

import torch

from ..attention import ACTIVATIONS, KERNELS, attention_model_flops, gdpa
from ..options import add_dataset_arg, int_at_least, nonnegative_int, output_file, positive_int
from ..config import PRESETS, Preset, get_preset, override
from ..data.folder import dataset_preset
from ..data.jagged import lengths_to_offsets
from ..env import versions
from ..errors import UsageError
from ..mfu.memory import track_peak_memory
from ..report import format_table
from ..runtime.files import write_json
from ..mfu.timing import interleaved

VARIANTS = ("full", "window")
METRICS = ("ne_click", "auc_click", "ne_conversion", "auc_conversion")
ATTENTION_COLUMNS = ("history_len", "variant", "model_gflop", "executed_gflop", "flops_vs_full", "peak_mib",
                     "wall_ms", "cpu_ms", "cpu_over_wall", "speedup")


def _wall_and_cpu(fn: Callable[[], object]) -> tuple[float, float]:
    """(wall seconds, process CPU seconds) of one call."""
    w0, c0 = time.perf_counter(), time.process_time()
    fn()
    cpu = time.process_time() - c0
    return time.perf_counter() - w0, cpu


def window_sweep(lengths: list[int], window: int, *, batch: int = 2, heads: int = 2, head_dim: int = 32,
                 activation: str = "silu", kernel: str = "cpu_jagged", warmup: int = 1, reps: int = 3,
                 seed: int = 0) -> list[dict]:
    """One row per (history length, variant) on CPU; see the module docstring for the columns."""
    rows = []
    for L in lengths:
        seq = [L] * batch
        offsets = lengths_to_offsets(torch.tensor(seq))
        gen = torch.Generator().manual_seed(seed)
        q, k, v, grad = (torch.randn(L * batch, heads, head_dim, generator=gen) for _ in range(4))
        for x in (q, k, v):
            x.requires_grad_(True)
        windows = {"full": None, "window": window}
        reason = next((r for w in windows.values() if (r := KERNELS[kernel].unavailable(q, activation, True, w))),
                      None)
        if reason:
            raise UsageError(f"--kernel {kernel} cannot run here: {reason}")

        def step(w):
            return lambda: torch.autograd.grad(gdpa(q, k, v, offsets, activation=activation, causal=True, window=w,
                                                    kernel=kernel, max_len=L), (q, k, v), grad)

        samples = interleaved({name: (lambda k, fn=step(w): _wall_and_cpu(fn)) for name, w in windows.items()}, reps,
                              warmup=warmup)
        times = {name: {"wall": [w for w, _ in t], "cpu": [c for _, c in t]} for name, t in samples.items()}
        full_model = 3 * attention_model_flops(seq, seq, heads, head_dim, True, None)
        lengths_t = torch.tensor(seq)
        for name, w in windows.items():
            with track_peak_memory("cpu") as peak:
                step(w)()
            model = 3 * attention_model_flops(seq, seq, heads, head_dim, True, w)
            executed = sum(KERNELS[kernel].executed_flops(lengths_t, lengths_t, heads, head_dim, True, w))
            wall, cpu = statistics.median(times[name]["wall"]), statistics.median(times[name]["cpu"])
            ratios = [f / x for f, x in zip(times["full"]["wall"], times[name]["wall"])]
            rows.append({"history_len": L, "variant": name, "window": w, "batch": batch,
                         "model_flops": model, "executed_flops": executed, "model_gflop": model / 1e9,
                         "executed_gflop": executed / 1e9, "flops_vs_full": model / full_model,
                         "peak_mib": peak.bytes / 2 ** 20, "memory_method": peak.method,
                         "wall_ms": wall * 1e3, "cpu_ms": cpu * 1e3, "cpu_over_wall": cpu / wall,
                         "speedup": statistics.median(ratios)})
    return rows


def train_and_evaluate(preset_name: str | Preset, window: int | None, seed: int, steps: int, data_root=None) -> dict:
    """Eval NE/AUC (both tasks) after `steps` training steps (jagged, cpu_jagged) of the preset
    (a name, or a Preset: e.g. one on a dataset folder), its model's window set to `window`."""
    from ..data.loader import make_loader
    from ..data.sampler import StepBatches
    from ..train import evaluate, setup

    preset = get_preset(preset_name) if isinstance(preset_name, str) else preset_name
    preset = replace(preset, model=override(preset.model, window=window))
    train = override(preset.train, steps=steps, seed=seed, jagged=True, kernel="cpu_jagged")
    s = setup(preset, train, device="cpu", data_root=data_root, progress=False)
    batches = iter(make_loader(s.train_set, batch_sampler=StepBatches(s.sampler, 0), device=s.device))
    for _ in range(steps):
        s.step(next(batches))
    result = evaluate(s, train.eval_batches, steps)
    return {m: float(result[m]) for m in METRICS}


def quality_cost(preset: str | Preset, window: int, seeds: int, steps: int, data_root=None, log=print) -> dict:
    """Paired full/window training runs per seed (see the module docstring)."""
    runs, diffs = [], []
    for seed in range(seeds):
        log(f"training {getattr(preset, 'name', preset)} seed {seed}: full, then window {window} ...")
        pair = {name: train_and_evaluate(preset, w, seed, steps, data_root)
                for name, w in (("full", None), ("window", window))}
        runs += [{"seed": seed, "variant": name, **m} for name, m in pair.items()]
        diffs.append({"seed": seed, **{m: pair["window"][m] - pair["full"][m] for m in METRICS}})
    summary = []
    for m in METRICS:
        full = [r[m] for r in runs if r["variant"] == "full"]
        band = max(full) - min(full) if seeds >= 2 else None
        mean_diff = statistics.mean(d[m] for d in diffs)
        summary.append({"metric": m, "full_mean": statistics.mean(full),
                        "window_mean": statistics.mean(r[m] for r in runs if r["variant"] == "window"),
                        "mean_difference": mean_diff, "full_seed_band": band,
                        "within_band": None if band is None else abs(mean_diff) <= band})
    return {"preset": getattr(preset, "name", preset), "window": window, "steps": steps, "seeds": seeds, "runs": runs,
            "differences": diffs, "summary": summary}


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
        grow = {v: by[(top, v)]["model_flops"] / by[(low, v)]["model_flops"] for v in VARIANTS}
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


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--lengths", nargs="+", type=positive_int, default=None,
                   help="history lengths (default 512 1024 2048 4096; 256 512 1024 with --quick)")
    p.add_argument("--window", type=positive_int, default=256, help="sliding window W (events per query)")
    p.add_argument("--batch", type=positive_int, default=2, help="sequences per batch, each of the history length")
    p.add_argument("--heads", type=positive_int, default=2)
    p.add_argument("--head-dim", type=positive_int, default=32)
    p.add_argument("--activation", default="silu", choices=ACTIVATIONS)
    p.add_argument("--kernel", default="cpu_jagged", help="gdpa kernel (CPU)")
    p.add_argument("--warmup", type=nonnegative_int, default=1)
    p.add_argument("--reps", type=positive_int, default=None, help="timed repetitions per variant (default 5; 2 with --quick)")
    p.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--seed", type=nonnegative_int, default=0)
    p.add_argument("--quality-seeds", type=nonnegative_int, default=3,
                   help="training runs per variant for eval NE/AUC (0 skips; 1: no seed band)")
    p.add_argument("--quality-preset", default="tiny", choices=list(PRESETS))
    add_dataset_arg(p)
    p.add_argument("--quality-window", type=positive_int, default=8, help="the model's window in the quality runs")
    p.add_argument("--quality-steps", type=int_at_least(1), default=150)
    p.add_argument("--quick", action="store_true", help="CI-sized: lengths 256 512 1024, 2 reps, 1 quality seed of 40 steps")
    p.add_argument("--json", metavar="PATH", type=output_file, default=None, help="write the record here")


def run(args: argparse.Namespace) -> int:
    if args.kernel not in KERNELS:
        raise UsageError(f"--kernel {args.kernel!r}: valid: {', '.join(KERNELS)}")
    quality_preset = dataset_preset(args.quality_preset, args.dataset)
    max_len = quality_preset.model.max_len
    if args.quality_seeds and args.quality_window >= max_len:
        raise UsageError(f"--quality-window {args.quality_window} >= the {args.quality_preset} preset's max_len "
                         f"{max_len}" + (f" on dataset {args.dataset}" if args.dataset else "")
                         + ": that window is full attention")
    if args.quick:
        args.lengths = args.lengths or [256, 512, 1024]
        args.reps = args.reps or 2
        args.quality_seeds, args.quality_steps = min(args.quality_seeds, 1), min(args.quality_steps, 40)
    args.lengths, args.reps = args.lengths or [512, 1024, 2048, 4096], args.reps or 5
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    load = os.getloadavg()[0]
    rows = window_sweep(args.lengths, args.window, batch=args.batch, heads=args.heads, head_dim=args.head_dim,
                        activation=args.activation, kernel=args.kernel, warmup=args.warmup, reps=args.reps,
                        seed=args.seed)
    threads = torch.get_num_threads()
    print(format_table(rows, list(ATTENTION_COLUMNS),
                       title=f"causal {args.activation} attention, full vs window {args.window} ({args.kernel}, "
                             f"{args.batch} x L events, H={args.heads} D={args.head_dim}, {threads} threads): "
                             f"forward+backward, medians of {args.reps}; speedup = full / window time"))
    if load + threads > (os.cpu_count() or 1):
        print(f"note: load average {load:.1f} + {threads} threads on {os.cpu_count()} cores: "
              "times include waiting for cores (read cpu_over_wall)")
    record = {"bench": "window", "config": {k: v for k, v in vars(args).items() if k != "func"},
              "threads": threads, "cpu_count": os.cpu_count(), "load_avg_1min": load, "versions": versions(),
              "attention": rows, "quality": None}
    if args.quality_seeds:
        quality = quality_cost(quality_preset, args.quality_window, args.quality_seeds, args.quality_steps)
        record["quality"] = quality
        band = "seed band of the full runs" if args.quality_seeds >= 2 else "one seed per variant: no seed band"
        print(format_table(quality["summary"], title=f"quality: {args.quality_preset}, {args.quality_steps} steps, "
                                                     f"window {args.quality_window} vs full, {args.quality_seeds} "
                                                     f"seed(s); {band}"))
    print("\n".join(window_takeaway(rows, record["quality"])))
    if args.json:
        write_json(args.json, record)
    return 0
