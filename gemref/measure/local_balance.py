"""Local rebalancing (policy "local") against the global policies: simulated at scale, measured on gloo ranks.

Policy "none" of `gemref train --balance` is round_robin here (equal counts, the order of
DistributedSampler). Exchange is counted for ranks that each read only their own data (lpt and
kk then all-gather the lengths; gemref's sampler, which gives every rank every length, needs none). `simulate`: for every rank count, an epoch of global batches of
per_rank_batch x R history lengths drawn from the preset's skewed profile, priced in model
FLOPs (gemref/mfu/flops.py), split by each policy (gemref/measure/balance_compare.py `compare` states every
column): imbalance, share of the optimum's throughput (against a lower bound on the best
split, and against kk where kk runs: up to kk_max_ranks, since kk costs ~20 s per step at 1024
ranks), bytes each rank receives per step to balance, how far samples move from their home
step, whether every sample was used once, and the heaviest rank-step's history events and
activation bytes (a per-sample bytes model fitted to activation bytes measured on the preset's
model, `activation_model`, gemref/autoac/profile.py).

`measure`: R gloo ranks on CPU (gemref.parallel.launch), each building the preset's GEMRef
(jagged) and the real BalancedDistributedBatchSampler for every policy over one epoch; at
every step each policy in turn (interleaved) runs training's step on the rank's batch with the
gradient all-reduce timed apart (gemref/measure/balance_policies.py `timed_step`). Per policy:
step time (median over steps of the slowest rank's compute + all-reduce), imbalance of compute
wall and thread-CPU time, the largest activation bytes any rank's batch needed (measured in a
separate untimed forward), and whether the ranks' batches covered the epoch exactly once. With
more ranks than free cores wall times include time-sharing: read cpu_imbalance.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

from .batch_search import gemref_activation_bytes as activation_bytes
from ..balance import SAMPLER_POLICIES, SampleCost, calibrate
from ..balance import loss_divisor
from .balance_compare import compare, exchange_bytes
from ..train.presets import get_preset
from ..data.batches import batch_with_lengths
from ..data.sampler import BalancedDistributedBatchSampler
from ..data.synthetic import draw_lengths
from ..mfu.flops import sample_cost_coefficients
from ..parallel.launch import cpu_ranks, launch, to_rank0
from .balance_policies import gem_model, timed_step

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


def simulate(preset_name: str, ranks: list[int], policies: list[str], cost: SampleCost, memory: SampleCost | None, *,
             per_rank_batch: int, steps: int, pool_steps: int, kk_max_ranks: int, seed: int = 0) -> list[dict]:
    """One row per (rank count, policy) over a simulated epoch of `steps` steps (module doc;
    SIM_COLUMNS); peak_act_mb in MiB from the `memory` model, None without one."""
    preset = get_preset(preset_name)
    target = float(cost.cost(_lengths(preset, 1 << 18, np.random.default_rng([seed, 99]))).mean())
    rows = []
    for r in ranks:
        epoch = np.stack([_lengths(preset, r * per_rank_batch, np.random.default_rng([seed, s]))
                          for s in range(steps)])
        chosen = [p for p in policies if p != "kk" or r <= kk_max_ranks]
        for row in compare(epoch, cost, r, chosen, pool_steps=pool_steps,
                                      target_per_sample=target, memory=memory):
            act = row.pop("peak_act_bytes")
            rows.append({**{k: v for k, v in row.items() if k != "loads"},
                         "peak_act_mb": act / 2**20 if act is not None else None})
    return rows


def _measure_rank(rank, world, preset_name, lengths, global_batch, policies, pool_steps, warmup, seed):
    """One gloo rank: per policy and step, [compute wall s, compute CPU s, all-reduce s, samples, act bytes]."""
    preset = get_preset(preset_name)
    model, optimizer = gem_model(preset_name, preset.model.max_len)
    cost = SampleCost(*sample_cost_coefficients(model.cfg))
    plans = {p: list(BalancedDistributedBatchSampler(lengths, global_batch, cost, rank=rank, world_size=world,
                                                     seed=seed, policy=p, drop_last=True, pool_steps=pool_steps))
             for p in policies}
    out = {p: [] for p in policies}
    for step in range(len(plans[policies[0]])):
        for policy in policies:
            ids = plans[policy][step]
            batch = batch_with_lengths(model.cfg, lengths[ids], seed=step * world + rank)
            dist.barrier()
            times = timed_step(model, optimizer, batch, loss_divisor(global_batch))
            nbytes = activation_bytes(model, batch)            # untimed, separate forward
            if step >= warmup:
                out[policy].append([*times, len(ids), nbytes])
    return to_rank0({"times": {p: torch.tensor(v, dtype=torch.float64) for p, v in out.items()},
                     "ids": {p: torch.tensor([i for b in plans[p] for i in b], dtype=torch.int64) for p in policies}})


def measure(preset_name: str, ranks: int, policies: list[str], *, per_rank_batch: int, steps: int, warmup: int,
            pool_steps: int, seed: int = 0, timeout_s: float = 540) -> list[dict]:
    """One row per sampler policy (module doc): step_ms, imbalance, cpu_imbalance, exchange_bytes,
    peak_act_mb (MiB), once, speedup_vs_rr; policies a sampler cannot take are left out."""
    preset = get_preset(preset_name)
    global_batch = ranks * per_rank_batch
    n = global_batch * (warmup + steps)
    lengths = _lengths(preset, n, np.random.default_rng([seed, 5]))
    policies = [p for p in policies if p in SAMPLER_POLICIES]
    results = launch(_measure_rank, (preset_name, lengths, global_batch, policies, pool_steps, warmup, seed),
                     cpu_ranks(ranks), timeout_s=timeout_s)
    rows = []
    for policy in policies:
        t = torch.stack([res["times"][policy] for res in results])         # (R, steps, 5)
        compute, cpu, wall = t[:, :, 0], t[:, :, 1], t[:, :, 0] + t[:, :, 2]
        ids = torch.sort(torch.cat([res["ids"][policy] for res in results])).values
        rows.append({"ranks": ranks, "policy": policy, "step_ms": float(wall.max(0).values.median()) * 1e3,
                     "imbalance": float((compute.max(0).values / compute.mean(0)).median()),
                     "cpu_imbalance": float((cpu.max(0).values / cpu.mean(0)).median()),
                     "exchange_bytes": exchange_bytes(policy, ranks, per_rank_batch),
                     "peak_act_mb": float(t[:, :, 4].max()) / 2**20,
                     "once": bool(torch.equal(ids, torch.arange(n)))})
    base = next((r["step_ms"] for r in rows if r["policy"] == "round_robin"), None)
    for row in rows:
        row["speedup_vs_rr"] = base / row["step_ms"] if base else None
    return rows
