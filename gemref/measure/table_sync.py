"""The sharded tables' optimizer and replica sync: communication per step and quality over seeds.

On R x S one-thread gloo ranks (default mesh 2x2, tables row-sharded over S, dense layers HSDP),
gemref's own path (`train/compose.py` setup: build_model, make_optimizer) trains the preset once
per variant and seed:

    adamw (summed)            table_optimizer=adamw: the tables step with AdamW at the dense lr (two
                              moments per element, every row), their R replicas' FULL local gradients
                              all-reduced every step
    rowwise_adagrad every N   table_optimizer=rowwise_adagrad, table_sync_interval=N, at table_lr:
                              row-wise Adagrad on the touched rows inside backward, each replica group
                              on its own part of the batch, weights and row state (1 value per row)
                              averaged over "replicate" every N steps (DMPCollection)
    rowwise_adam every N      the same with fbgemm's partial row-wise Adam (row state d + 1 values)

The last `window` steps of each run (a multiple of every N) run under the collective recorder
and the profiler (in sessions of PROFILE_CHUNK steps): payload bytes per step per (kind, dim)
on rank 0 (comm.py's recorder), the tables' replicate bytes per step (rowwise: what the row-wise optimizer
all-reduced; adamw: the table
gradient rows this rank holds, every step), and rank 0's exposed communication per step (comm
not overlapped by compute, gemref/measure/comm.py `comm_overlap`; on time-shared CPU cores it includes waiting).
Then every rank evaluates `eval_batches` eval batches (replica 0's tables, rank 0's numbers;
the last step is a sync step of every N, so the replicas agree): eval loss (nats per sample)
and NE per task. Quality is the seed band (report/seed_band.py) against the first row-wise variant
(by default "rowwise_adagrad every 1"; "adamw (summed)" when only adamw runs).
"""
from __future__ import annotations

import os
import statistics
import sys
import time

import torch.distributed as dist

from ..train.presets import get_preset
from ..train.override import override
from ..data.loader import make_loader
from ..data.sampler import StepBatches
from ..errors import UsageError
from ..mfu.profile import quiet_profile
from . import comm
from ..parallel.launch import launch, preflight, to_rank0
from ..parallel.mesh import group_dims
from ..parallel.config import TABLE_LR, TABLE_OPTIMIZERS
from ..parallel.rowwise import RowWiseOptimizer
from ..report.seed_band import seed_band_rows
from ..train.compose import setup
from ..train.loop import evaluate
from ..parallel.config import parse_mesh

PROFILE_CHUNK = 5       # steps per profiler session (100 steps at once held ~5 GB per rank on tiny)


def variants(intervals, optimizers=TABLE_OPTIMIZERS) -> list[tuple[str, str, int]]:
    """(label, table_optimizer, table_sync_interval): adamw (if listed) first, then each listed
    row-wise optimizer at every interval, in TABLE_OPTIMIZERS' order; a name not in it is a UsageError."""
    if not optimizers or any(o not in TABLE_OPTIMIZERS for o in optimizers):
        raise UsageError(f"table optimizers {list(optimizers)}: pick one or more of {', '.join(TABLE_OPTIMIZERS)}")
    return ([("adamw (summed)", "adamw", 1)] if "adamw" in optimizers else []) + \
        [(f"{o} every {n}", o, n) for o in TABLE_OPTIMIZERS[1:] if o in optimizers for n in intervals]


def reference(runs) -> str:
    """The variant the seed bands compare with: the first row-wise one, else the first."""
    return next((label for label, optimizer, _ in runs if optimizer != "adamw"), runs[0][0])


def _row_optimizer(model) -> RowWiseOptimizer | None:
    return next((m.row_optimizer for m in model.modules() if getattr(m, "row_optimizer", None) is not None), None)


def _rank(rank, world, preset_name, mesh, runs, seeds, steps, window, eval_batches, table_lr, attention, data_root):
    preset = get_preset(preset_name)
    out, start = [], time.monotonic()
    for label, optimizer, interval in runs:
        for seed in seeds:
            rate = {} if optimizer == "adamw" else {"table_lr": table_lr}     # adamw tables: the dense lr
            train = override(preset.train, mesh=mesh, sparse_sharding="row", table_optimizer=optimizer,
                             table_sync_interval=interval, seed=seed, steps=steps, eval_batches=eval_batches, **rate,
                             **attention)
            s = setup(preset, train, device="cpu", data_root=data_root)
            batches = iter(make_loader(s.train_set, batch_sampler=StepBatches(s.sampler, 0), device=s.device))
            for _ in range(steps - window):
                s.step(next(batches))
            rows_opt = _row_optimizer(s.model)
            synced0 = rows_opt.synced_bytes if rows_opt else 0
            recorder = comm.CollectiveRecorder(group_dims(s.parallel.mesh))
            exposed = total = 0.0
            dist.barrier()
            with recorder:
                for done in range(0, window, PROFILE_CHUNK):   # profiled in chunks: the profiler's memory stays bounded
                    with quiet_profile("cpu") as prof:
                        for _ in range(min(PROFILE_CHUNK, window - done)):
                            s.step(next(batches))
                    overlap = comm.comm_overlap(prof)
                    exposed, total = exposed + overlap["exposed_comm_s"], total + overlap["comm_s"]
            if rows_opt is not None:
                table_sync = (rows_opt.synced_bytes - synced0) / window
            else:
                table_sync = sum(t.local_weight().numel() * t.local_weight().element_size()
                                 for t in s.parallel.tables.values() if t.local_weight() is not None) \
                    if s.parallel.shape.replicate > 1 else 0
            result = evaluate(s, eval_batches, steps)
            out.append({"label": label, "seed": seed, "kernel": s.kernel, "jagged": s.train.attention.jagged,
                        "by_kind": recorder.summary(window),
                        "table_sync_bytes": table_sync, "exposed_s": exposed / window,
                        "comm_s": total / window, **{k: result[k] for k in
                                                                 ("eval_loss", "ne_click", "ne_conversion")}})
            if rank == 0:      # progress: a long bench says where it is (a rank's stderr reaches the caller's)
                print(f"run {len(out)}/{len(runs) * len(seeds)}: {label}, seed {seed}: eval loss "
                      f"{result['eval_loss']:.4f} ({time.monotonic() - start:.0f} s)", file=sys.stderr, flush=True)
    return to_rank0(out)


def compare_table_sync(preset: str = "tiny", mesh: str = "2x2", intervals=(1, 10, 100), *, seeds: int = 3,
                       steps: int = 100, window: int = 100, eval_batches: int = 8, optimizers=TABLE_OPTIMIZERS,
                       table_lr: float = TABLE_LR, attention: dict | None = None, data_root=None,
                       timeout_s: float = 3600) -> dict:
    """Run every variant (`optimizers` x `intervals`, module doc) x seed on R*S gloo ranks, the
    row-wise tables at `table_lr`, attention switched by `attention` (TrainConfig's flat names,
    e.g. {"jagged": True, "kernel": "cpu_fused"}; default: the preset's); {"rows": one per
    variant, "runs": every run, "reference": the seed bands' variant, rank 0's figures}."""
    shape = parse_mesh(mesh)
    if shape.replicate < 2:
        raise UsageError(f"mesh={mesh}: the replica sync needs R >= 2 replica groups (e.g. 2x2, 2x1)")
    if seeds < 2 or any(n < 1 for n in intervals) or window < 1 or steps < window:
        raise UsageError(f"need seeds >= 2 (a seed band), intervals >= 1 and 1 <= window <= steps; got seeds={seeds}, "
                         f"intervals={list(intervals)}, window={window}, steps={steps}")
    if any(window % n or steps % n for n in intervals):
        raise UsageError(f"window={window} and steps={steps} must be multiples of every interval {list(intervals)}: "
                         f"each sync is counted whole, and the evaluated replicas have just synced")
    if table_lr <= 0:
        raise UsageError(f"table_lr must be > 0, got {table_lr}")
    attention = dict(attention or {})
    override(get_preset(preset).train, **attention)       # a bad switch is a UsageError here, not in a rank
    runs = variants(intervals, optimizers)
    plan = preflight("cpu", ["gloo"], [shape], shape.world, group=True)
    per_rank = launch(_rank, (preset, mesh, runs, list(range(seeds)), steps, window, eval_batches, table_lr,
                              attention, data_root), plan, timeout_s=timeout_s)
    results = per_rank[0]
    by_label = {label: [r for r in results if r["label"] == label] for label, _, _ in runs}
    bands = {row["label"]: row for row in seed_band_rows(
        {label: [r["eval_loss"] for r in rs] for label, rs in by_label.items()}, reference(runs))}
    rows = []
    for label, rs in by_label.items():
        def per_step(kind, dim):
            return statistics.mean(sum(k["bytes_per_step"] for k in r["by_kind"]
                                       if (k["kind"], k["dim"]) == (kind, dim)) for r in rs)
        a2a_count = statistics.mean(sum(k["count_per_step"] for k in r["by_kind"] if k["kind"] == "all_to_all")
                                    for r in rs)
        band = bands[label]
        rows.append({"variant": label, "all_to_all_bytes": per_step("all_to_all", "shard"),
                     "all_to_alls": a2a_count, "replicate_bytes": per_step("all_reduce", "replicate"),
                     "table_sync_bytes": statistics.mean(r["table_sync_bytes"] for r in rs),
                     "exposed_ms": 1e3 * statistics.median(r["exposed_s"] for r in rs),
                     "comm_ms": 1e3 * statistics.median(r["comm_s"] for r in rs),
                     "eval_loss": band["mean"], "loss_sd": band["sd"],
                     "ne_click": statistics.mean(r["ne_click"] for r in rs),
                     "ne_conversion": statistics.mean(r["ne_conversion"] for r in rs),
                     "vs_ref": band["difference"], "tolerance": band["tolerance"], "in_band": band["within"]})
    return {"rows": rows, "runs": results, "reference": reference(runs), "load_avg_1min": os.getloadavg()[0], "cpu_count": os.cpu_count()}
