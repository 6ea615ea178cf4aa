"""Native vs TorchRec embedding tables: step time and table bytes per rank, interleaved on gloo ranks.

R one-thread gloo ranks (mesh Rx1: the dense layers replicated by DDP in both variants) build
the --preset model twice through `build_model`: `native` (nn.Embedding tables, replicated,
AdamW) and `torchrec` (EmbeddingCollection + EmbeddingBagCollection sharded by DMP with
--sharding, fused exact Adagrad: gemref/interop/). The variants run windows A B, B A, ...
(`mfu/timing.py` `interleaved`, one warm-up window): --steps-per-window training steps each on
the same per-rank batches, each step timed between barriers. Step time: per window the slowest
rank's median step, then the median over windows with its spread; `vs_native` is the median of
the paired per-window ratios (<1: TorchRec faster). Bytes per rank: the table weights and table
optimizer state this rank holds, and the payload bytes of the collectives of one step
(gemref/parallel/comm.py's recorder). The table optimizers differ (AdamW keeps 2 values per
weight, Adagrad 1), as in training.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist

from ..config import get_preset, override
from ..data.batches import representative_batch
from ..env import versions
from ..errors import UsageError
from ..files import write_json
from ..mfu.timing import interleaved
from ..options import output_file
from ..parallel.comm import CollectiveRecorder
from ..parallel.launch import cpu_ranks, launch, to_rank0
from ..parallel.mesh import group_dims
from ..parallel.parallelize import parallel_state
from ..report import format_table
from ..step import train_step
from ..train.compose import build_model, make_optimizer

VARIANTS = ("native", "torchrec")


def _local_bytes(value) -> int:
    """Bytes of this rank's part of a tensor, ShardedTensor or nested dict of them."""
    if isinstance(value, dict):
        return sum(_local_bytes(v) for v in value.values())
    if hasattr(value, "local_shards"):
        return sum(s.tensor.numel() * s.tensor.element_size() for s in value.local_shards())
    if isinstance(value, torch.Tensor) and value.numel() > 1:   # not Adam's step counters
        return value.numel() * value.element_size()
    return 0


def table_bytes(model, optimizer, engine: str) -> tuple[int, int]:
    """(table weight bytes, table optimizer-state bytes) held by this rank."""
    if engine == "native":
        params = list(model.tables.parameters())
        return (sum(p.numel() * p.element_size() for p in params),
                sum(_local_bytes(dict(optimizer.state.get(p, {}))) for p in params))
    tables = model.tables
    weights = sum(_local_bytes(v) for v in tables.state_dict().values())
    fused = getattr(tables, "fused_optimizer", None)
    return weights, _local_bytes(fused.state_dict()["state"]) if fused is not None else 0


def _rank(rank, world, preset_name, per_rank_batch, windows, steps, sharding, seed):
    preset = get_preset(preset_name)
    base = override(preset.train, mesh=f"{world}x1", jagged=True, kernel="auto", batch_size=per_rank_batch * world,
                    seed=seed)
    runs = {}
    for engine in VARIANTS:
        train = override(base, embeddings=engine, torchrec_sharding=sharding if engine == "torchrec" else "auto")
        parallel, device = parallel_state(train, torch.device("cpu"))
        model, _, _ = build_model(preset, train, device, parallel)
        runs[engine] = (model, make_optimizer(model, train), parallel)
    batches = {}

    def batch(k: int, i: int):
        if (k, i) not in batches:
            batches.clear() if len(batches) > 4 * steps else None
            batches[(k, i)] = representative_batch(preset, per_rank_batch, seed=seed + 7919 * (k * steps + i) + rank)
        return batches[(k, i)]

    def window(engine):
        model, optimizer, parallel = runs[engine]

        def run_window(k: int) -> float:
            times = []
            for i in range(steps):
                b = batch(k, i)
                dist.barrier()
                t0 = time.perf_counter()
                train_step(model, optimizer, b, normalizer=base.batch_size, finish_backward=parallel.finish_backward)
                times.append(time.perf_counter() - t0)
            return statistics.median(times)
        return run_window

    timed = interleaved({e: window(e) for e in VARIANTS}, windows, warmup=1, alternate=True)
    out = {"step_s": {e: timed[e] for e in VARIANTS}}
    for engine in VARIANTS:
        model, optimizer, parallel = runs[engine]
        recorder = CollectiveRecorder(group_dims(parallel.mesh))
        with recorder:
            train_step(model, optimizer, batch(0, 0), normalizer=base.batch_size,
                       finish_backward=parallel.finish_backward)
        weights, state = table_bytes(model, optimizer, engine)
        out[engine] = {"table_bytes": weights, "table_optimizer_bytes": state,
                       "comm_bytes_per_step": sum(r["bytes_per_step"] for r in recorder.summary()),
                       "plan": getattr(model, "torchrec_engine", {}).get("plan")}
    return to_rank0(out)


def summarize(per_rank: list[dict]) -> list[dict]:
    """One row per variant from every rank's results (module doc says how)."""
    slowest = {e: [max(r["step_s"][e][k] for r in per_rank) for k in range(len(per_rank[0]["step_s"][e]))]
               for e in VARIANTS}
    rows = []
    for e in VARIANTS:
        ratios = [t / n for t, n in zip(slowest[e], slowest["native"])]
        rows.append({"variant": e, "windows": len(slowest[e]), "step_ms": 1e3 * statistics.median(slowest[e]),
                     "spread_ms": f"{1e3 * min(slowest[e]):.1f}..{1e3 * max(slowest[e]):.1f}",
                     "vs_native": statistics.median(ratios),
                     "table_bytes_per_rank": [r[e]["table_bytes"] for r in per_rank],
                     "table_opt_bytes_per_rank": [r[e]["table_optimizer_bytes"] for r in per_rank],
                     "comm_bytes_per_rank": [int(r[e]["comm_bytes_per_step"]) for r in per_rank]})
    return rows


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="tiny")
    p.add_argument("--ranks", type=int, default=2, help="gloo ranks (one thread each)")
    p.add_argument("--per-rank-batch", type=int, default=32, help="samples per rank per step")
    p.add_argument("--windows", type=int, default=5, help="timed windows per variant (after one warm-up window)")
    p.add_argument("--steps-per-window", type=int, default=4)
    p.add_argument("--sharding", default="auto", help="TorchRec sharding: auto (the planner) or one type")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", metavar="PATH", type=output_file, help="write the record here")


def run(args: argparse.Namespace) -> int:
    from ..config import TORCHREC_SHARDINGS
    from ..interop.lib import torchrec

    for name in ("ranks", "per_rank_batch", "windows", "steps_per_window"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.sharding not in TORCHREC_SHARDINGS:
        raise UsageError(f"--sharding {args.sharding!r}; valid: {', '.join(TORCHREC_SHARDINGS)}")
    get_preset(args.preset)
    torchrec()                   # a missing TorchRec is one line here, before any rank starts
    load = os.getloadavg()[0]
    per_rank = launch(_rank, (args.preset, args.per_rank_batch, args.windows, args.steps_per_window, args.sharding,
                              args.seed), cpu_ranks(args.ranks), timeout_s=580)
    rows = summarize(per_rank)
    print(format_table(rows, title=f"native vs TorchRec tables: {args.preset}, {args.ranks} gloo ranks, "
                                   f"{args.per_rank_batch} samples per rank, medians of {args.windows} windows x "
                                   f"{args.steps_per_window} steps (A B / B A)"))
    plan = per_rank[0]["torchrec"]["plan"]
    print(format_table([{"table": t, **v} for t, v in plan.items()], title=f"TorchRec plan ({args.sharding})"))
    if args.ranks + load > (os.cpu_count() or 1):
        print(f"note: {args.ranks} ranks + load average {load:.1f} on {os.cpu_count()} cores: times include sharing")
    if args.json:
        write_json(args.json, {"bench": "embeddings", "config": {k: v for k, v in vars(args).items() if k != "func"},
                               "rows": rows, "plan": plan, "load_avg_1min": load, "cpu_count": os.cpu_count(),
                               "versions": versions()})
    return 0
