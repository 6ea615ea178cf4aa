"""Local rebalancing (policy "local") against the global policies: simulated at scale, measured on gloo ranks.

Policy "none" of `gemref train --balance` is round_robin here (equal counts, the order of
DistributedSampler). Simulated (every --ranks entry): an epoch of --steps global batches of --per-rank-batch x R
history lengths drawn from the preset's skewed profile, priced in model FLOPs
(gemref/mfu/flops.py), split by each policy (gemref/balance/compare.py states every column):
imbalance, share of the optimum's throughput (against a lower bound on the best split, and
against kk where kk runs: --kk-max-ranks, since kk costs ~20 s per step at 1024 ranks),
bytes each rank receives per step to balance, how far samples move from their home step,
whether every sample was used once, and the heaviest rank-step's history events and
activation bytes (a per-sample bytes model fitted to activation bytes measured on the
preset's model, gemref/autoac/profile.py, unless --no-act-model).

--measure-ranks (default 2,4; 0 skips): R gloo ranks on CPU (gemref.parallel.launch.spawn),
each building the --measure-preset GEMRef (jagged) and the real BalancedDistributedBatchSampler
for every policy over one epoch; at every step each policy in turn (interleaved) runs forward +
backward on the rank's batch and all-reduces the gradients. Per policy: step time (median over
steps of the slowest rank's compute + all-reduce), imbalance of compute wall and thread-CPU
time, the largest activation bytes any rank's batch needed (measured in a separate untimed
forward), and whether the ranks' batches covered the epoch exactly once. With more ranks than
free cores wall times include time-sharing: read cpu_imbalance.
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np
import torch
import torch.distributed as dist

from ..autoac.profile import activation_bytes
from ..balance import SAMPLER_POLICIES, SampleCost, calibrate
from ..balance.compare import compare_over_steps, exchange_bytes
from ..errors import UsageError
from ..options import output_file
from ..config import get_preset
from ..data.batches import batch_with_lengths
from ..data.sampler import BalancedDistributedBatchSampler
from ..data.synthetic import draw_lengths
from ..env import versions
from ..mfu.flops import sample_cost_coefficients
from ..parallel.launch import cpu_ranks, launch, to_rank0
from ..report import format_table
from ..runtime.files import write_json
from .balance import gem_model

SIM_COLUMNS = ("ranks", "policy", "imbalance", "imbalance_worst", "of_optimum", "of_kk", "gap_closed",
               "exchange_bytes", "plan_ms", "displacement_mean", "displacement_max", "once", "peak_tokens",
               "peak_act_mb")


def _lengths(preset, n: int, seed) -> np.ndarray:
    data, cfg = preset.data, preset.model
    return draw_lengths(data.length_profile, n, cfg.max_len, min(data.median_len, cfg.max_len), data.len_sigma, seed)


def activation_model(preset_name: str, batches: int = 8, seed: int = 0) -> SampleCost:
    """Activation bytes per sample (c0 + c1*L + c2*L^2), fitted to bytes measured on the preset's model."""
    preset = get_preset(preset_name)
    model, _ = gem_model(preset_name, preset.model.max_len)
    rng = np.random.default_rng([seed, 77])
    pool = _lengths(preset, 4096, rng)
    lengths_list = [rng.choice(pool, size=int(rng.integers(2, 33))) for _ in range(batches)]
    measured = [activation_bytes(model, batch_with_lengths(model.cfg, L, seed=i)) for i, L in enumerate(lengths_list)]
    return calibrate(lengths_list, measured, per_step=False).cost


def simulate(args, cost: SampleCost, memory: SampleCost | None) -> list[dict]:
    preset = get_preset(args.preset)
    target = float(cost.cost(_lengths(preset, 1 << 18, np.random.default_rng([args.seed, 99]))).mean())
    rows = []
    for ranks in args.ranks:
        steps = np.stack([_lengths(preset, ranks * args.per_rank_batch, np.random.default_rng([args.seed, s]))
                          for s in range(args.simulated_steps)])
        policies = [p for p in args.policies if p != "kk" or ranks <= args.kk_max_ranks]
        for row in compare_over_steps(steps, cost, ranks, policies, pool_steps=args.pool_steps,
                                      target_per_sample=target, memory=memory):
            act = row.pop("peak_act_bytes")
            rows.append({**row, "peak_act_mb": act / 2**20 if act is not None else None})
    return rows


def _measure_rank(rank, world, preset_name, lengths, global_batch, policies, pool_steps, warmup, seed):
    """One gloo rank: per policy and step, [compute wall s, compute CPU s, all-reduce s, samples, act bytes].

    Each step is training's step (gemref/step.py) with the gradient all-reduce of replicated
    data parallelism (bench balance's) timed apart from the forward+backward before it."""
    from ..step import train_step
    from .balance import _all_reduce_grads

    preset = get_preset(preset_name)
    model, optimizer = gem_model(preset_name, preset.model.max_len)
    cost = SampleCost(*sample_cost_coefficients(model.cfg))
    plans = {p: list(BalancedDistributedBatchSampler(lengths, global_batch, cost, rank=rank, world_size=world,
                                                     seed=seed, policy=p, drop_last=True, pool_steps=pool_steps))
             for p in policies}
    out = {p: [] for p in policies}
    marks: list[float] = []

    def timed_all_reduce(m) -> None:
        marks.extend((time.perf_counter(), time.thread_time()))
        _all_reduce_grads(m)
        marks.append(time.perf_counter())

    for step in range(len(plans[policies[0]])):
        for policy in policies:
            ids = plans[policy][step]
            batch = batch_with_lengths(model.cfg, lengths[ids], seed=step * world + rank)
            dist.barrier()
            marks.clear()
            t0, c0 = time.perf_counter(), time.thread_time()
            train_step(model, optimizer, batch, normalizer=global_batch, finish_backward=timed_all_reduce)
            t1, c1, t2 = marks
            nbytes = activation_bytes(model, batch)            # untimed, separate forward
            if step >= warmup:
                out[policy].append([t1 - t0, c1 - c0, t2 - t1, len(ids), nbytes])
    return to_rank0({"times": {p: torch.tensor(v, dtype=torch.float64) for p, v in out.items()},
                     "ids": {p: torch.tensor([i for b in plans[p] for i in b], dtype=torch.int64) for p in policies}})


def measure(args, ranks: int) -> list[dict]:
    preset = get_preset(args.measure_preset)
    global_batch = ranks * args.measure_per_rank_batch
    n = global_batch * (args.measure_warmup + args.measure_steps)
    lengths = _lengths(preset, n, np.random.default_rng([args.seed, 5]))
    policies = [p for p in args.policies if p in SAMPLER_POLICIES]
    results = launch(_measure_rank, (args.measure_preset, lengths, global_batch, policies, args.pool_steps,
                                     args.measure_warmup, args.seed), cpu_ranks(ranks), timeout_s=540)
    rows = []
    for policy in policies:
        t = torch.stack([res["times"][policy] for res in results])         # (R, steps, 5)
        compute, cpu, wall = t[:, :, 0], t[:, :, 1], t[:, :, 0] + t[:, :, 2]
        ids = torch.sort(torch.cat([res["ids"][policy] for res in results])).values
        rows.append({"ranks": ranks, "policy": policy, "step_ms": float(wall.max(0).values.median()) * 1e3,
                     "imbalance": float((compute.max(0).values / compute.mean(0)).median()),
                     "cpu_imbalance": float((cpu.max(0).values / cpu.mean(0)).median()),
                     "exchange_bytes": exchange_bytes(policy, ranks, args.measure_per_rank_batch),
                     "peak_act_mb": float(t[:, :, 4].max()) / 2**20,
                     "once": bool(torch.equal(ids, torch.arange(n)))})
    base = next((r["step_ms"] for r in rows if r["policy"] == "round_robin"), None)
    for row in rows:
        row["speedup_vs_rr"] = base / row["step_ms"] if base else None
    return rows


def _ints(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"expected comma-separated integers, got {text!r}") from None
    return values


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ranks", default="8,64,256,1024", help="simulated rank counts (comma separated)")
    p.add_argument("--per-rank-batch", type=int, default=32, help="samples per rank per step")
    p.add_argument("--simulated-steps", type=int, default=64, help="steps in the simulated epoch")
    p.add_argument("--pool-steps", type=int, default=8, help='"local": steps a sample may move (its pool, k)')
    p.add_argument("--policies", default="round_robin,lpt,kk,local,shared", help="policies (comma separated)")
    p.add_argument("--kk-max-ranks", type=int, default=256, help="run kk only up to this many simulated ranks")
    p.add_argument("--preset", default="small", help="lengths and per-sample FLOPs of this preset")
    p.add_argument("--no-act-model", action="store_true", help="skip the activation-bytes model (peak_act_mb)")
    p.add_argument("--measure-ranks", default="2,4", help="gloo rank counts to measure (0 skips)")
    p.add_argument("--measure-preset", default="tiny")
    p.add_argument("--measure-per-rank-batch", type=int, default=16)
    p.add_argument("--measure-steps", type=int, default=12, help="timed steps per policy")
    p.add_argument("--measure-warmup", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", metavar="PATH", type=output_file, help="write the record here")


def run(args: argparse.Namespace) -> int:
    args.ranks, measure_ranks = _ints(args.ranks), [r for r in _ints(args.measure_ranks) if r]
    args.policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    bad = [p for p in args.policies if p not in SAMPLER_POLICIES]
    if bad or not args.policies:
        raise UsageError(f"--policies {bad or args.policies}: valid: {', '.join(SAMPLER_POLICIES)}")
    for name in ("per_rank_batch", "simulated_steps", "pool_steps", "measure_per_rank_batch", "measure_steps"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if not args.ranks or min(args.ranks + measure_ranks + [1]) < 1:
        raise UsageError("--ranks and --measure-ranks take integers >= 1 (--measure-ranks 0 skips)")
    cost = SampleCost(*sample_cost_coefficients(get_preset(args.preset).model))
    memory = None if args.no_act_model else activation_model(args.preset, seed=args.seed)
    sim = simulate(args, cost, memory)
    show = [{k: f"{v:.4f}" if isinstance(v, float) and k.startswith(("imb", "of_", "gap")) else v
             for k, v in row.items()} for row in sim]
    print(format_table(show, SIM_COLUMNS, title=f"simulated: {args.preset} lengths and FLOPs, {args.simulated_steps} steps of "
                                                f"{args.per_rank_batch} samples per rank, local pool {args.pool_steps} steps"))
    record = {"bench": "local_balance", "config": {k: v for k, v in vars(args).items() if k != "func"},
              "simulated": sim, "activation_model": None if memory is None else
              [memory.per_sample, memory.per_token, memory.per_token_sq], "cpu_count": os.cpu_count(),
              "versions": versions()}
    measured = []
    for ranks in measure_ranks:
        load = os.getloadavg()[0]
        rows = measure(args, ranks)
        for row in rows:
            row["load_avg_1min"] = load
        measured += rows
        if ranks + load > (os.cpu_count() or 1):
            print(f"note: {ranks} ranks + load average {load:.1f} on {os.cpu_count()} cores: read cpu_imbalance")
    if measured:
        print(format_table(measured, title=f"measured on gloo ranks: {args.measure_preset} GEM step, "
                                           f"{args.measure_per_rank_batch} samples per rank, medians over "
                                           f"{args.measure_steps} steps"))
    record["measured"] = measured
    if args.json:
        write_json(args.json, record)
    return 0
