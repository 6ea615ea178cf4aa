"""Native vs TorchRec embedding tables on one-thread gloo ranks: step time and table bytes per rank, interleaved.

R ranks build the preset's model once per variant through `build_model`: native tables
(nn.Embedding, AdamW; replicated, or sharded by gemref row- or table-wise) or TorchRec's
(EmbeddingCollection + EmbeddingBagCollection sharded by DMP with one sharding type or the
planner's choice, fused exact Adagrad: gemref/interop/). The variants run windows A B, B A, ...
(`mfu/timing.py` `interleaved`, one warm-up window): `steps_per_window` training steps each on
the same per-rank batches, each step timed between barriers. Step time: per window the slowest
rank's median step, then the median over windows with its spread; `vs_native` is the median of
the paired per-window ratios against the variant's baseline (<1: faster). Bytes per rank: the
table weights and table optimizer state this rank holds (gemref/parallel/memory.py
`table_bytes`), and the payload bytes of the collectives of one step (gemref/measure/comm.py's
recorder). The table optimizers differ (AdamW keeps 2 values per weight, Adagrad 1), as in
training.

`compare_engines` (`gemref bench embeddings`): mesh Rx1, the dense layers replicated by DDP in
both variants, native tables replicated against TorchRec's sharded over every rank.
`compare_sharded` (chapter 07): mesh 1xR, the dense layers FSDP-sharded in every variant,
gemref's row- and table-wise `ShardedEmbedding`s against TorchRec's row_wise, table_wise and its
planner's own choice (`SHARDED_VARIANTS`), each TorchRec variant paired with a native one.
"""
from __future__ import annotations

import os
import statistics
import time

import torch
import torch.distributed as dist

from ..train.presets import get_preset
from ..train.override import override
from ..data.batches import representative_batch
from ..errors import UsageError
from ..interop.lib import quiet_torchrec
from ..interop.sharders import dmp_collection_refusal
from ..mfu.timing import interleaved
from .comm import CollectiveRecorder
from ..parallel.launch import cpu_ranks, launch, to_rank0
from ..parallel.memory import table_bytes
from ..parallel.mesh import group_dims
from ..parallel.parallelize import parallel_state
from ..step import train_step
from ..train.compose import build_model, make_optimizer

VARIANTS = ("native", "torchrec")
# chapter 07: (label, engine, sharding, the native label it is timed against); tables sharded over every rank
SHARDED_VARIANTS = (("native row", "native", "row", "native row"),
                    ("TorchRec row_wise", "torchrec", "row_wise", "native row"),
                    ("native table", "native", "table", "native table"),
                    ("TorchRec table_wise", "torchrec", "table_wise", "native table"),
                    ("TorchRec planner", "torchrec", "auto", "native row"))


def _variant_config(base, engine: str, sharding: str):
    """The TrainConfig of one variant: native tables with `sharding` none/row/table, or TorchRec's
    with one of TORCHREC_SHARDINGS."""
    if engine == "native":
        return override(base, embeddings="native", sparse_sharding=sharding)
    return override(base, embeddings="torchrec", torchrec_sharding=sharding)


def _rank(rank, world, preset_name, per_rank_batch, windows, steps, variants, mesh, seed):
    """variants: (label, engine, sharding) each; every rank's results to rank 0."""
    with quiet_torchrec():
        return _measure(rank, world, preset_name, per_rank_batch, windows, steps, variants, mesh, seed)


def _measure(rank, world, preset_name, per_rank_batch, windows, steps, variants, mesh, seed):
    preset = get_preset(preset_name)
    base = override(preset.train, mesh=mesh, jagged=True, kernel="auto", batch_size=per_rank_batch * world,
                    seed=seed)
    runs = {}
    for label, engine, sharding in variants:
        train = _variant_config(base, engine, sharding)
        parallel, device = parallel_state(train.parallelism, torch.device("cpu"))
        model, _, _ = build_model(preset, train, device, parallel)
        runs[label] = (model, make_optimizer(model, train), parallel, engine)
    batches = {}

    def batch(k: int, i: int):
        if (k, i) not in batches:
            batches.clear() if len(batches) > 4 * steps else None
            batches[(k, i)] = representative_batch(preset.model, preset.data, per_rank_batch,
                                                   seed=seed + 7919 * (k * steps + i) + rank)
        return batches[(k, i)]

    def window(label):
        model, optimizer, parallel, _ = runs[label]

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

    timed = interleaved({label: window(label) for label in runs}, windows, warmup=1, alternate=True)
    out = {"step_s": timed}
    for label, (model, optimizer, parallel, engine) in runs.items():
        recorder = CollectiveRecorder(group_dims(parallel.mesh))
        with recorder:
            train_step(model, optimizer, batch(0, 0), normalizer=base.batch_size,
                       finish_backward=parallel.finish_backward)
        weights, state = table_bytes(model, optimizer, engine)
        out[label] = {"table_bytes": weights, "table_optimizer_bytes": state,
                       "comm_bytes_per_step": sum(r["bytes_per_step"] for r in recorder.summary()),
                       "plan": getattr(model, "torchrec_engine", {}).get("plan")}
    if rank == 0 and any(engine == "torchrec" for *_, engine in runs.values()):
        out["dmp_collection_cpu"] = dmp_collection_refusal()
    return to_rank0(out)


def summarize(per_rank: list[dict], labels=VARIANTS, baselines: dict | None = None) -> list[dict]:
    """One row per variant from every rank's results (module doc says how); `baselines` names the
    variant each is timed against (default: "native"). vs_min/vs_max: the range of the paired
    per-window ratios."""
    slowest = {e: [max(r["step_s"][e][k] for r in per_rank) for k in range(len(per_rank[0]["step_s"][e]))]
               for e in labels}
    rows = []
    for e in labels:
        base = (baselines or {}).get(e, "native")
        ratios = [t / n for t, n in zip(slowest[e], slowest[base])]
        rows.append({"variant": e, "windows": len(slowest[e]), "step_ms": 1e3 * statistics.median(slowest[e]),
                     "spread_ms": f"{1e3 * min(slowest[e]):.1f}..{1e3 * max(slowest[e]):.1f}",
                     "step_ms_min": 1e3 * min(slowest[e]), "step_ms_max": 1e3 * max(slowest[e]),
                     "vs_native": statistics.median(ratios), "vs_min": min(ratios), "vs_max": max(ratios),
                     "table_bytes_per_rank": [r[e]["table_bytes"] for r in per_rank],
                     "table_opt_bytes_per_rank": [r[e]["table_optimizer_bytes"] for r in per_rank],
                     "comm_bytes_per_rank": [int(r[e]["comm_bytes_per_step"]) for r in per_rank]})
    return rows


def compare_sharded(preset: str = "tiny", ranks: int = 2, *, per_rank_batch: int = 8, windows: int = 2,
                    steps_per_window: int = 1, seed: int = 0, timeout_s: float = 580) -> dict:
    """Chapter 07: gemref's sharded tables against TorchRec's on `ranks` one-thread gloo ranks
    (module doc; SHARDED_VARIANTS). Returns {"rows": one per variant (summarize's, plus engine,
    sharding, baseline; step_ms in milliseconds, bytes in bytes, per rank), "plan": TorchRec's
    per-table plan for the planner variant, "dmp_collection_cpu": dmp_collection_refusal() on rank 0,
    "load_avg_1min", "cpu_count"}."""
    import importlib.util

    from ..interop.lib import INSTALL_HINT

    if ranks < 2 or windows < 1 or steps_per_window < 1 or per_rank_batch < 1:
        raise UsageError(f"compare_sharded needs ranks >= 2 and windows, steps_per_window, per_rank_batch >= 1; got "
                         f"{ranks}, {windows}, {steps_per_window}, {per_rank_batch}")
    get_preset(preset)
    if importlib.util.find_spec("torchrec") is None:   # found, not imported: the ranks import it (~3 s of CPU)
        raise UsageError(f"TorchRec is not installed; {INSTALL_HINT}")
    load = os.getloadavg()[0]
    variants = tuple((label, engine, sharding) for label, engine, sharding, _ in SHARDED_VARIANTS)
    per_rank = launch(_rank, (preset, per_rank_batch, windows, steps_per_window, variants, f"1x{ranks}", seed),
                      cpu_ranks(ranks), timeout_s=timeout_s)
    labels = [v[0] for v in SHARDED_VARIANTS]
    rows = summarize(per_rank, labels, {v[0]: v[3] for v in SHARDED_VARIANTS})
    for row, (_, engine, sharding, baseline) in zip(rows, SHARDED_VARIANTS):
        row.update(engine=engine, sharding=sharding, baseline=baseline)
    planner = next(v[0] for v in SHARDED_VARIANTS if v[2] == "auto")
    return {"rows": rows, "plan": per_rank[0][planner]["plan"], "dmp_collection_cpu": per_rank[0]["dmp_collection_cpu"],
            "load_avg_1min": load, "cpu_count": os.cpu_count()}


def compare_engines(preset: str, ranks: int, sharding: str, *, per_rank_batch: int, windows: int,
                    steps_per_window: int, seed: int = 0, timeout_s: float = 580) -> dict:
    """`gemref bench embeddings`: native tables replicated against TorchRec's sharded by `sharding`
    (one of TORCHREC_SHARDINGS) on `ranks` one-thread gloo ranks, mesh Rx1 (module doc). Returns
    {"rows": summarize's, one per VARIANTS entry, "plan": TorchRec's per-table plan}."""
    variants = (("native", "native", "none"), ("torchrec", "torchrec", sharding))
    per_rank = launch(_rank, (preset, per_rank_batch, windows, steps_per_window, variants, f"{ranks}x1", seed),
                      cpu_ranks(ranks), timeout_s=timeout_s)
    return {"rows": summarize(per_rank), "plan": per_rank[0]["torchrec"]["plan"]}
