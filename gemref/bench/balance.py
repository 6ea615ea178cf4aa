"""Load balancing across data-parallel ranks: imbalance and straggler wait per partition policy.

Projected (default): draw global batches of history lengths from a length profile, price
each sample with a SampleCost (model FLOPs of one training sample of the --preset model,
from gemref/mfu/flops.py, unless --cost gives coefficients), partition every
batch with each policy and report, per policy, the medians over batches of
  imbalance = max / mean per-rank cost   (1.0 = perfect)
  idle      = sum_r (max - cost_r) / (R * max), the share of rank-time spent waiting for
              the straggler at the gradient all-reduce
  part_ms   = time of the partitioner itself (it runs on every rank, every step)
  lower_bound = max(dearest sample, mean) / mean: no partition of that batch can do better.

--measure: spawn R gloo ranks on CPU (one thread each, gemref.parallel.launch) that run the
real GEM training step: every rank builds the --preset GEMRef and its optimizer as training
does (jagged, max_len = --max-len, same seed), and on each global batch (synthetic ids,
lengths from the profile) takes its samples split by round_robin and by kk in turn and runs
training's step (`train.train_step`) with the loss divided by the global batch size; between
backward and the optimizer update the gradients are all-reduced (replicated data
parallelism, as DDP without buckets). The split prices samples with the same cost as the
training switch (model FLOPs, gemref/mfu/flops.py), or with seconds fitted to this
machine's measured step times (--calibrate, `gemref.balance.calibrate`).
Per rank: compute time, and wait (+comm) time in the all-reduce; per step: step time (max
over ranks), imbalance of compute wall time and of compute CPU time, idle share. With more
ranks than CPU cores, or other jobs on the machine, ranks time-share cores and wall times
stretch: then cpu_imbalance (thread CPU time, blind to time-sharing) is the figure to read.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from dataclasses import replace

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from ..data.batches import batch_with_lengths
from ..balance import POLICIES, SampleCost, calibrate, compare_policies, partition
from ..options import check_local_ranks, nonnegative_int, output_file, positive_float, positive_int
from ..config import LENGTH_PROFILES, PRESETS, get_preset, override
from ..data.synthetic import draw_lengths
from ..mfu.flops import sample_cost_coefficients
from ..errors import UsageError
from ..parallel.launch import cpu_ranks, launch, to_rank0
from ..report import format_table
from ..runtime.files import write_json
from ..env import versions


# ----------------------------------------------------------------------------- the GEM step on gloo ranks


def gem_model(preset: str, max_len: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    """The preset's GEMRef (built by training's `build_model`: jagged, the best attention kernel
    here, fp32, seed 0) with max_len widened to the profile's, and training's optimizer."""
    from ..train import build_model, make_optimizer

    p = get_preset(preset)
    train = override(p.train, jagged=True, kernel="auto", precision="fp32", seed=0)
    model = build_model(replace(p, model=replace(p.model, max_len=max_len)), train, torch.device("cpu"))[0]
    return model, make_optimizer(model, train)


def _all_reduce_grads(model: nn.Module) -> None:
    """Sum the gradients over the ranks in one flat buffer (replicated data parallelism, as DDP
    without buckets), written back so every rank steps the same model."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    flat = torch.cat([g.flatten() for g in grads])
    dist.all_reduce(flat)
    torch._foreach_copy_(grads, [g.view_as(p) for g, p in zip(flat.split([g.numel() for g in grads]), grads)])


def _measure_rank(rank, world, preset, max_len, lengths_per_step, cost_coeffs, policies, warmup):
    """One rank of --measure: per step and policy, (compute wall s, compute CPU s, all-reduce wall s, n).

    Each step is training's step (`train.train_step`); its gradient all-reduce is timed apart
    from the forward+backward before it (the optimizer update after it is in neither)."""
    from ..train import train_step

    model, optimizer = gem_model(preset, max_len)
    cost = SampleCost(*cost_coeffs)
    out = {p: [] for p in policies}
    marks: list[float] = []

    def timed_all_reduce(m: nn.Module) -> None:
        marks.extend((time.perf_counter(), time.thread_time()))
        _all_reduce_grads(m)
        marks.append(time.perf_counter())

    for step, lengths in enumerate(lengths_per_step):
        batch = batch_with_lengths(model.cfg, lengths, seed=step)
        for policy in policies:
            mine = batch.select(partition(cost.cost(lengths), world, policy, min_per_rank=1)[rank])
            dist.barrier()
            marks.clear()
            t0, c0 = time.perf_counter(), time.thread_time()
            train_step(model, optimizer, mine, normalizer=len(lengths), finish_backward=timed_all_reduce)
            t1, c1, t2 = marks
            if step >= warmup:
                out[policy].append([t1 - t0, c1 - c0, t2 - t1, mine.batch_size])
    return to_rank0({p: torch.tensor(v, dtype=torch.float64) for p, v in out.items()})


def calibrate_gem(preset: str, max_len: int, pool: np.ndarray, n_batches: int = 16, reps: int = 2, seed: int = 0):
    """Time the GEM training step (`train.train_step`) on batches of varied size and length mix
    from `pool`; fit a SampleCost in seconds.

    Times are this thread's CPU time with one torch thread (as on every rank), so other
    processes sharing the cores do not distort the fit.
    """
    from ..train import train_step

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    model, optimizer = gem_model(preset, max_len)
    rng = np.random.default_rng(seed)
    lengths_list, times = [], []
    for k in range(n_batches):
        lengths = rng.choice(pool, size=int(rng.integers(2, 33)))
        batch = batch_with_lengths(model.cfg, lengths, seed=k)
        samples = []
        for _ in range(reps + 1):   # first run is warm-up
            t0 = time.thread_time()
            train_step(model, optimizer, batch)
            samples.append(time.thread_time() - t0)
        lengths_list.append(lengths)
        times.append(statistics.median(samples[1:]))
    torch.set_num_threads(threads)
    return calibrate(lengths_list, times)


# ----------------------------------------------------------------------------- command


def configure_parser(p: argparse.ArgumentParser) -> None:
    small = get_preset("small")
    p.add_argument("--ranks", type=positive_int, default=8,
                   help="data-parallel ranks R (with --measure: gloo processes; at most 4 per core unless "
                        "GEMREF_MAX_RANKS=N)")
    p.add_argument("--batch", type=positive_int, default=512, help="global batch size (samples)")
    p.add_argument("--profile", choices=LENGTH_PROFILES, default="skewed")
    p.add_argument("--max-len", type=positive_int, default=small.model.max_len)
    p.add_argument("--median", type=positive_int, default=small.data.median_len,
                   help="median (skewed) / every (fixed) length")
    p.add_argument("--sigma", type=positive_float, default=small.data.len_sigma,
                   help="log-normal sigma of the skewed profile")
    p.add_argument("--batches", type=positive_int, default=20, help="global batches to evaluate (medians over them)")
    p.add_argument("--preset", default="small", choices=list(PRESETS),
                   help="model whose per-sample FLOPs price the samples")
    p.add_argument("--cost", type=float, nargs=3, metavar=("C0", "C1", "C2"),
                   help="override: cost per sample, per event, per event^2 (default: the preset's FLOPs)")
    p.add_argument("--seed", type=nonnegative_int, default=0)
    p.add_argument("--measure", action="store_true",
                   help="also run R gloo ranks on CPU: the --preset GEM training step, round_robin vs kk")
    p.add_argument("--steps-per-policy", type=positive_int, default=10,
                   help="--measure: measured steps per policy (after 2 warm-up)")
    p.add_argument("--calibrate", action="store_true",
                   help="--measure: split by seconds fitted to this machine's GEM step times, not by FLOPs")
    p.add_argument("--json", metavar="PATH", type=output_file, help="write the record here")


def _projected(args, cost: SampleCost) -> list[dict]:
    batches = [draw_lengths(args.profile, args.batch, args.max_len, args.median, args.sigma, args.seed + b)
               for b in range(args.batches)]
    return [{k: v for k, v in row.items() if k != "loads"}
            for row in compare_policies(batches, cost, args.ranks, tuple(POLICIES))]


def _show(rows: list[dict]) -> list[dict]:
    """Ratios near 1 need 4 decimals to be told apart (format_table keeps 3 significant digits)."""
    keys = ("imbalance", "imbalance_worst", "idle", "speedup", "lower_bound", "cpu_imbalance")
    return [{k: f"{v:.4f}" if k in keys else v for k, v in row.items()} for row in rows]


def _measure(args, cost: SampleCost) -> tuple[dict | None, list[dict], list[dict]]:
    warmup = 2
    fit = None
    if args.calibrate:
        pool = draw_lengths(args.profile, 4096, args.max_len, args.median, args.sigma, args.seed + 10_000)
        fit = calibrate_gem(args.preset, args.max_len, pool, seed=args.seed)
        cost = fit.cost
    steps = [draw_lengths(args.profile, args.batch, args.max_len, args.median, args.sigma, args.seed + s)
             for s in range(warmup + args.steps_per_policy)]
    policies = ["round_robin", "kk"]
    results = launch(_measure_rank, (args.preset, args.max_len, steps,
                                     (cost.per_sample, cost.per_token, cost.per_token_sq), policies, warmup),
                     cpu_ranks(args.ranks), timeout_s=540)
    per_rank, summary = [], []
    for policy in policies:
        per_step = torch.stack([res[policy] for res in results])    # (R, steps, 4)
        wall = per_step[:, :, 0] + per_step[:, :, 2]                  # compute + all-reduce
        for r in range(args.ranks):
            med = per_step[r].median(dim=0).values.tolist()
            per_rank.append({"policy": policy, "rank": r, "samples": int(med[3]), "compute_ms": med[0] * 1e3,
                             "compute_cpu_ms": med[1] * 1e3, "allreduce_wait_ms": med[2] * 1e3})
        compute, cpu = per_step[:, :, 0], per_step[:, :, 1]
        summary.append({"policy": policy, "step_ms": float(wall.max(0).values.median()) * 1e3,
                        "imbalance": float((compute.max(0).values / compute.mean(0)).median()),
                        "cpu_imbalance": float((cpu.max(0).values / cpu.mean(0)).median()),
                        "idle": float((per_step[:, :, 2].sum(0) / wall.sum(0)).median())})
    base = summary[0]["step_ms"]
    for row in summary:
        row["speedup"] = base / row["step_ms"]
    fit_info = None if fit is None else {
        "per_sample_s": fit.cost.per_sample, "per_token_s": fit.cost.per_token,
        "per_token_sq_s": fit.cost.per_token_sq, "per_step_s": fit.per_step, "rel_rms_error": fit.rel_rms_error}
    return fit_info, per_rank, summary


def run(args: argparse.Namespace) -> int:
    if args.batch < args.ranks:
        raise UsageError(f"--batch {args.batch} is smaller than --ranks {args.ranks}: every rank needs a sample")
    if args.median > args.max_len:
        raise UsageError(f"--median {args.median} exceeds --max-len {args.max_len}")
    if args.measure:
        check_local_ranks(args.ranks, "cpu")
    coefficients = args.cost or sample_cost_coefficients(get_preset(args.preset).model)
    cost = SampleCost(*coefficients)
    rows = _projected(args, cost)
    print(format_table(_show(rows), title=f"projected: {args.ranks} ranks, global batch {args.batch}, {args.profile} "
                                   f"lengths (median {args.median}, max {args.max_len}), {args.batches} batches"))
    record = {"bench": "balance", "config": {k: v for k, v in vars(args).items() if k != "func"},
              "cost_coefficients": list(coefficients), "projected": rows, "cpu_count": os.cpu_count(),
              "platform": platform.platform(), "versions": versions()}
    if args.measure:
        load_1min = os.getloadavg()[0]
        fit, per_rank, summary = _measure(args, cost)
        if fit:
            print(f"\ncalibrated GEM step cost (s): per_sample {fit['per_sample_s']:.3g}, per_token "
                  f"{fit['per_token_s']:.3g}, per_token^2 {fit['per_token_sq_s']:.3g}, per_step {fit['per_step_s']:.3g} "
                  f"(rel RMS error {fit['rel_rms_error']:.1%})")
        else:
            print(f"\nsplit by model FLOPs per sample of the {args.preset} preset (as `gemref train --balance kk`)")
        if args.ranks + load_1min > (os.cpu_count() or 1):
            print(f"note: {args.ranks} ranks + load average {load_1min:.1f} on {os.cpu_count()} CPU cores: "
                  "wall times include time-sharing; read cpu_imbalance")
        print(format_table(per_rank, title=f"measured per rank: {args.preset} GEM step, max_len {args.max_len} "
                                           "(medians over steps)"))
        print(format_table(_show(summary), title="measured per step (medians over steps)"))
        record.update(calibration=fit, measured_per_rank=per_rank, measured=summary, load_avg_1min=load_1min)
    if args.json:
        write_json(args.json, record)
    return 0
