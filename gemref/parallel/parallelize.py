"""Applying parallelism to a built model, and what a multi-rank run adds to its record.

`parallel_state` builds the 2D mesh over the running process group; `parallelize` shards the
tables and applies FSDP2 to the layers and tables the caller names (the last thing applied to
the model, after precision, AC and compile: docs/design.md) and keeps the sharded tables in the
ParallelState, whose `finish_backward` syncs their replicas; `rank_times` and `measure_comm`
measure what the ranks did.
gemref/train/compose.py and loop.py call these; gemref/parallel/launch.py starts the ranks.

Batches: `TrainConfig.batch_size` is the GLOBAL batch. Every rank draws the same global
batches (seed, epoch) and takes its part (gemref/data/sampler.py). Gradients are summed over
ranks and each rank's loss is divided by the global batch size, so the step is the
single-process step on the global batch, whatever the per-rank counts
(tests/test_parallel_train.py checks it).
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.device_mesh import DeviceMesh

from ..config import MeshShape, Preset, TrainConfig
from ..errors import UsageError
from ..mfu.profile import quiet_profile
from . import comm
from .fsdp import apply_fsdp, reshard_all
from .mesh import build_mesh, group_dims, local_device
from .replicate import apply_replicate
from .sparse import ShardedEmbedding, fuse_lookups, shard_tables, sync_replica_grads
from .volume import step_volume, total_bytes


@dataclass
class ParallelState:
    mesh: DeviceMesh
    shape: MeshShape
    rank: int
    world: int
    backend: str
    train: TrainConfig
    tables: dict[str, ShardedEmbedding] = field(default_factory=dict)   # what `parallelize` sharded

    def finish_backward(self, model: nn.Module) -> None:
        """Gradient syncs FSDP does not do itself: the replicas of the (AdamW) tables `parallelize` sharded."""
        if self.train.parallelism.sparse_sharding != "none" and self.train.parallelism.table_optimizer == "adamw":
            sync_replica_grads(self.tables, self.mesh)   # row-wise tables: synced by their RowWiseAdagrad

    def sum(self, values: list[float]) -> list[float]:
        """All-reduce (SUM) a few host numbers, in float64."""
        t = torch.tensor(values, dtype=torch.float64, device=self.mesh.device_type)
        dist.all_reduce(t)
        return t.tolist()

    def gather(self, obj) -> list:
        out = [None] * self.world
        dist.all_gather_object(out, obj)
        return out


def parallel_state(train: TrainConfig, device: torch.device) -> tuple[ParallelState | None, torch.device]:
    """The mesh over the running process group (and this rank's device); (None, device) in one plain process."""
    if not dist.is_initialized() and comm.ncclx_mesh_built() is None:
        layout = train.parallelism
        if layout.mesh != "1x1" or layout.sparse_sharding != "none":
            shape = layout.shape
            raise UsageError(f"mesh={layout.mesh} / sparse_sharding={layout.sparse_sharding} need a process group: "
                             f"pass --ranks {shape.world} or launch with torchrun --nproc-per-node {shape.world}")
        return None, device
    shape = train.parallelism.shape
    mesh = build_mesh(shape, device.type)
    backend = "ncclx" if comm.ncclx_mesh_built() is not None else dist.get_backend()
    state = ParallelState(mesh, shape, dist.get_rank(), dist.get_world_size(), backend, train)
    return state, local_device(device.type)


def parallelize(model: nn.Module, train: TrainConfig, state: ParallelState, device: torch.device, *,
                layers: Sequence[str], tables: Sequence[str] = (), ignored: nn.Module | None = None,
                features: Callable[..., Mapping[str, Sequence[Tensor]]] | None = None) -> None:
    """The last thing applied to the model. `layers`: fully qualified names of the modules FSDP
    shards as units (forward order); `tables`: those of the nn.Embedding / nn.EmbeddingBag
    modules sparse_sharding shards. Replicated (mesh Rx1, tables not sharded): DDP's bucketed
    all-reduce overlapped with the backward (replicate.py). Otherwise sparse tables first (FSDP
    must ignore them; kept in `state.tables` for finish_backward), then FSDP. `ignored`: a
    module sharded and updated by someone else (TorchRec's tables), left out of DDP and FSDP.
    `features(*forward args)` -> {table name: [ids of each call]}: all the tables' lookups of a
    forward in one exchange (sparse.py `fuse_lookups`); None: one exchange per lookup."""
    if state.shape.shard == 1 and train.parallelism.sparse_sharding == "none":
        apply_replicate(model, state.mesh, ignored_modules=[ignored] if ignored is not None else ())
        return
    state.tables = shard_tables(model, state.mesh, tables, train.parallelism.sparse_sharding)
    if state.tables and features is not None:
        fuse_lookups(model, state.tables, features)
    apply_fsdp(model, state.mesh, layers, device, reshard_after_forward=train.parallelism.reshard_after_forward,
               ignored_params=ignored.parameters() if ignored is not None else ())


# ----------------------------------------------------------------------------- record extras


def rank_times(state: ParallelState, step_s: list[float], cpu_s: list[float], samples: list[int]) -> list[dict]:
    """Per rank (medians over timed steps): step wall time, its compute, and the rest: waiting.

    Compute is this thread's CPU time, which on CPU ranks (one thread each) is the work
    itself, blind to time-sharing of the cores. On GPUs the host thread only launches
    kernels: there, read the profiler's exposed communication (measure_comm) instead.
    """
    mine = {"rank": state.rank, "samples": statistics.median(samples), "step_s": statistics.median(step_s),
            "compute_cpu_s": statistics.median(cpu_s),
            "wait_s": statistics.median(max(0.0, w - c) for w, c in zip(step_s, cpu_s))}
    return state.gather(mine)


def measure_comm(state: ParallelState, preset: Preset, model: nn.Module, batch, fwd_bwd: Callable[[], None]) -> dict:
    """One profiled forward+backward under the CollectiveRecorder: recorded vs analytic bytes, exposed comm.

    Returns (on every rank) world totals per (kind, dim), the ratio recorded / analytic, and
    each rank's overlap figures.
    """
    cuda = state.mesh.device_type == "cuda"
    reshard_all(model)      # start from the sharded state a training step starts from
    recorder = comm.CollectiveRecorder(group_dims(state.mesh))
    dist.barrier()
    with quiet_profile(state.mesh.device_type) as prof:
        with recorder:
            fwd_bwd()
        if cuda:
            torch.cuda.synchronize()
    comm.attach_times(recorder.collectives, prof)
    tc = state.train
    analytic = step_volume(preset.model, state.shape, rank=state.rank, batch=batch.batch_size,
                           tokens=batch.num_tokens, jagged=tc.attention.jagged, param_bytes=2 if cuda else 4,
                           reduce_bytes=4, reshard_after_forward=tc.parallelism.reshard_after_forward,
                           sparse_sharding=tc.parallelism.sparse_sharding,
                           table_optimizer=tc.parallelism.table_optimizer,
                           table_sync_interval=tc.parallelism.table_sync_interval)
    per_rank = state.gather({"recorded": recorder.summary(), "analytic": analytic,
                             "overlap": comm.comm_overlap(prof)})
    rows: dict[tuple[str, str], dict] = {}
    for r in per_rank:
        for kind in ("recorded", "analytic"):
            for row in r[kind]:
                entry = rows.setdefault((row["kind"], row["dim"]), {"kind": row["kind"], "dim": row["dim"],
                                        "recorded_bytes": 0.0, "analytic_bytes": 0.0, "recorded_count": 0.0,
                                        "seconds": 0.0})
                if kind == "recorded":
                    entry["recorded_bytes"] += row["bytes_per_step"]
                    entry["recorded_count"] += row["count_per_step"]
                    entry["seconds"] += row["seconds_per_step"]
                else:
                    entry["analytic_bytes"] += row["bytes"]
    table = sorted(rows.values(), key=lambda e: (e["dim"], e["kind"]))
    for e in table:
        e["ratio"] = e["recorded_bytes"] / e["analytic_bytes"] if e["analytic_bytes"] else None
    recorded, expected = sum(e["recorded_bytes"] for e in table), sum(e["analytic_bytes"] for e in table)
    return {"by_kind": table, "recorded_bytes": recorded, "analytic_bytes": expected,
            "ratio": recorded / expected if expected else None,
            "analytic_bytes_rank0": total_bytes(per_rank[0]["analytic"]),
            "overlap_per_rank": [dict(rank=i, **r["overlap"]) for i, r in enumerate(per_rank)]}
