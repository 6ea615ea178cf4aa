"""The distributed part of training: launching ranks, sharding the model, each rank's batches,
and what a multi-rank run adds to its record. gemref/train.py composes it with the other switches.

    gemref train --ranks 4 --mesh 2x2 --sparse-sharding row --balance kk   (local gloo ranks)
    torchrun --nproc-per-node 8 -m gemref train --preset base --device cuda --jagged --kernel auto \
        --mesh 1x8 --sparse-sharding row --balance kk                      (one node of 8 GPUs)
    torchrun --nnodes 4 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \
        -m gemref train --preset large --device cuda --jagged --kernel auto \
        --mesh 4x8 --sparse-sharding row --balance kk                      (HSDP: 4 nodes x 8 GPUs)
    add --backend ncclx to run the collectives on NCCLX (needs torchcomms)

Batches: `TrainConfig.batch_size` is the GLOBAL batch. Every rank draws the same global
batches (seed, epoch) and takes its part: equal counts by position (balance "none" /
"round_robin", what DistributedSampler does) or a cost-balanced split ("lpt", "kk": per-
sample model FLOPs from gemref/mfu/flops.py). Gradients are summed over ranks and each
rank's loss is divided by the global batch size, so the step is the single-process step on
the global batch, whatever the per-rank counts (tests/test_parallel_train.py checks it).
"""
from __future__ import annotations

import itertools
import json
import os
import statistics
from dataclasses import dataclass
from typing import Callable, Iterator

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from .balance import SampleCost
from .config import Preset, TrainConfig
from .mfu.flops import sample_cost_coefficients
from .parallel import comm, launch
from .parallel.fsdp import apply_fsdp, reshard_all
from .parallel.mesh import MeshShape, build_mesh, check_world, group_dims, local_device, parse_mesh
from .parallel.sparse import shard_tables, sync_replica_grads
from .parallel.volume import step_volume, total_bytes
from .report import to_jsonable
from .sampler import BalancedDistributedBatchSampler


@dataclass
class ParallelState:
    mesh: DeviceMesh
    shape: MeshShape
    rank: int
    world: int
    backend: str
    train: TrainConfig

    def finish_backward(self, model: nn.Module) -> None:
        """Gradient syncs FSDP does not do itself: the sharded tables' replicas."""
        if self.train.sparse_sharding != "none":
            sync_replica_grads(model, self.mesh)

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
    if not dist.is_initialized() and launch.ncclx_mesh_built() is None:
        if train.mesh != "1x1" or train.sparse_sharding != "none":
            shape = parse_mesh(train.mesh)
            raise ValueError(f"mesh={train.mesh} / sparse_sharding={train.sparse_sharding} need a process group: "
                             f"pass --ranks {shape.world} or launch with torchrun --nproc-per-node {shape.world}")
        return None, device
    shape = parse_mesh(train.mesh)
    mesh = build_mesh(shape, device.type)
    backend = "ncclx" if launch.ncclx_mesh_built() is not None else dist.get_backend()
    state = ParallelState(mesh, shape, dist.get_rank(), dist.get_world_size(), backend, train)
    return state, local_device(device.type)


def parallelize(model: nn.Module, train: TrainConfig, state: ParallelState, device: torch.device) -> None:
    """Sparse tables first (FSDP must ignore them), then FSDP: the last thing applied to the model."""
    ignored = shard_tables(model, state.mesh, train.sparse_sharding)
    apply_fsdp(model, state.mesh, device, reshard_after_forward=train.reshard_after_forward,
               ignored_params=ignored)


# ----------------------------------------------------------------------------- batches


def batch_sampler(lengths, preset: Preset, train: TrainConfig, rank: int, world: int) -> BalancedDistributedBatchSampler:
    """This rank's part of every global batch (drop_last: every step has the full global batch)."""
    policy = "round_robin" if train.balance == "none" else train.balance
    cost = SampleCost(*sample_cost_coefficients(preset.model))
    return BalancedDistributedBatchSampler(lengths, train.batch_size, cost, rank=rank, world_size=world,
                                           seed=train.seed, policy=policy, drop_last=True)


class StepBatches:
    """An endless batch_sampler that starts at global step `start` (epochs roll over; resumable).

    Resuming at step k re-plans (but does not load) the k % len(sampler) batches skipped in
    the current epoch, so the run continues with exactly the batches it would have drawn.
    """

    def __init__(self, sampler: BalancedDistributedBatchSampler, start: int = 0):
        self.sampler, self.start = sampler, start

    def __iter__(self) -> Iterator[list[int]]:
        epoch, skip = divmod(self.start, len(self.sampler))
        while True:
            self.sampler.set_epoch(epoch)
            yield from itertools.islice(iter(self.sampler), skip, None)
            epoch, skip = epoch + 1, 0


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
    from .mfu.profile import quiet_profile

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
                           tokens=batch.num_tokens, jagged=tc.jagged, param_bytes=2 if cuda else 4,
                           reduce_bytes=4, reshard_after_forward=tc.reshard_after_forward,
                           sparse_sharding=tc.sparse_sharding)
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


# ----------------------------------------------------------------------------- launching


def _train_ranks(rank: int, world: int, preset: Preset, trains: list[TrainConfig], kwargs: dict):
    from .train import run

    records = [run(preset, train, **kwargs) for train in trains]
    return [json.loads(json.dumps(to_jsonable(r))) for r in records] if rank == 0 else None


def launch_runs(preset: Preset, trains: list[TrainConfig], *, ranks: int | None = None, device: str = "auto",
                timeout_s: float = launch.DEFAULT_TIMEOUT_S, **run_kwargs) -> list[dict] | None:
    """Run `train.run` for each config in turn on the same ranks; return rank 0's records
    (None on torchrun ranks other than 0). One launch for several configs saves the start-up.

    Under torchrun (its variables set) this process is one rank; otherwise `ranks` local
    processes are spawned (default R*S of the first mesh). Meshes, world size and backend are
    all checked before any process group exists, so a bad input fails fast instead of hanging.
    """
    from .train import resolve_device, run

    if not trains:
        raise ValueError("launch_runs needs at least one TrainConfig")
    dev = resolve_device(device)
    backends = {comm.resolve_backend(t.backend, dev) for t in trains}
    if len(backends) > 1:
        raise ValueError(f"one launch runs one backend; these configs ask for {sorted(backends)}")
    backend = backends.pop()
    shapes = [parse_mesh(t.mesh) for t in trains]
    world = launch.torchrun_world()
    if world is not None:
        for shape in shapes:
            check_world(shape, world)
        launch.init_from_env(backend, local_device(dev.type), shapes[0], timeout_s)
        try:
            records = [run(preset, t, device=dev.type, **run_kwargs) for t in trains]
        finally:
            launch.shutdown()
        return records if int(os.environ["RANK"]) == 0 else None
    ranks = shapes[0].world if ranks is None else ranks
    for shape in shapes:
        check_world(shape, ranks)
    if dev.type == "cuda" and ranks > torch.cuda.device_count():
        raise ValueError(f"--ranks {ranks} needs {ranks} GPUs, this host has {torch.cuda.device_count()}")
    if backend == "ncclx":
        raise ValueError("backend 'ncclx' is launched with torchrun (torchcomms bootstraps from its variables)")
    kwargs = {"device": dev.type, **run_kwargs}
    return launch.spawn(_train_ranks, ranks, (preset, list(trains), kwargs), backend=backend, timeout_s=timeout_s)[0]


def launch_train(preset: Preset, train: TrainConfig, **kwargs) -> dict | None:
    """`launch_runs` for one config: rank 0's record (None on other torchrun ranks)."""
    records = launch_runs(preset, [train], **kwargs)
    return records[0] if records is not None else None
