"""Applying parallelism to a built model.

`parallel_state` builds the 2D mesh over the running process group; `parallelize` shards the
tables and applies FSDP2 to the layers and tables the caller names (the last thing applied to
the model, after precision, AC and compile: docs/design.md) and keeps the sharded tables in the
ParallelState, whose `finish_backward` syncs their replicas (what the ranks did is measured by
the lab: gemref/measure/comm.py `rank_times`, `measure_comm`).
gemref/train/compose.py calls these; gemref/parallel/launch.py starts the ranks.

Batches: `TrainConfig.batch_size` is the GLOBAL batch. Every rank draws the same global
batches (seed, epoch) and takes its part (gemref/data/sampler.py). Gradients are summed over
ranks and each rank's loss is divided by the global batch size, so the step is the
single-process step on the global batch, whatever the per-rank counts
(tests/test_parallel_train.py checks it).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.device_mesh import DeviceMesh

from ..train.config import TrainConfig
from ..errors import UsageError
from .backend import ncclx_mesh_built
from .config import MeshShape

if TYPE_CHECKING:
    from .sparse import ShardedEmbedding


@dataclass
class ParallelState:
    mesh: DeviceMesh
    shape: MeshShape
    rank: int
    world: int
    backend: str
    train: TrainConfig
    tables: dict[str, ShardedEmbedding] = field(default_factory=dict)   # what `parallelize` sharded
    fsdp_param_dtype: torch.dtype | None = None   # the dtype FSDP gathers parameters in; None: FSDP not applied

    def finish_backward(self, model: nn.Module) -> None:
        """Gradient syncs FSDP does not do itself: the replicas of the (AdamW) tables `parallelize` sharded."""
        if self.train.parallelism.sparse_sharding != "none" and self.train.parallelism.table_optimizer == "adamw":
            from .sparse import sync_replica_grads   # sharded tables: loaded only by a run that has them
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
    if not dist.is_initialized() and ncclx_mesh_built() is None:
        layout = train.parallelism
        if layout.mesh != "1x1" or layout.sparse_sharding != "none":
            shape = layout.shape
            raise UsageError(f"mesh={layout.mesh} / sparse_sharding={layout.sparse_sharding} need a process group: "
                             f"pass --ranks {shape.world} or launch with torchrun --nproc-per-node {shape.world}")
        return None, device
    from .mesh import build_mesh, local_device   # the mesh: loaded only with a process group
    shape = train.parallelism.shape
    mesh = build_mesh(shape, device.type)
    backend = "ncclx" if ncclx_mesh_built() is not None else dist.get_backend()
    state = ParallelState(mesh, shape, dist.get_rank(), dist.get_world_size(), backend, train)
    return state, local_device(device.type)


def parallelize(model: nn.Module, train: TrainConfig, state: ParallelState, device: torch.device, *,
                layers: Sequence[str], tables: Sequence[str] = (), ignored: nn.Module | None = None,
                features: Callable[..., Mapping[str, Sequence[Tensor]]] | None = None,
                param_dtype: torch.dtype | None = None) -> None:
    """The last thing applied to the model. `layers`: fully qualified names of the modules FSDP
    shards as units (forward order); `tables`: those of the nn.Embedding / nn.EmbeddingBag
    modules sparse_sharding shards. Replicated (mesh Rx1, tables not sharded): DDP's bucketed
    all-reduce overlapped with the backward (replicate.py). Otherwise sparse tables first (FSDP
    must ignore them; kept in `state.tables` for finish_backward), then FSDP. `ignored`: a
    module sharded and updated by someone else (TorchRec's tables), left out of DDP and FSDP.
    `features(*forward args)` -> {table name: [ids of each call]}: all the tables' lookups of a
    forward in one exchange (sparse.py `fuse_lookups`); None: one exchange per lookup.
    `param_dtype`: the dtype the run's GEMMs compute in, which FSDP gathers parameters in
    (fsdp.py `mixed_precision_policy`; None: fp32), kept in `state.fsdp_param_dtype`."""
    # DDP, FSDP and the sharded tables: loaded only by a run with a process group, when it applies them
    from .fsdp import apply_fsdp
    from .replicate import apply_replicate
    from .sparse import fuse_lookups, shard_tables
    if state.shape.shard == 1 and train.parallelism.sparse_sharding == "none":
        apply_replicate(model, state.mesh, ignored_modules=[ignored] if ignored is not None else ())
        return
    state.tables = shard_tables(model, state.mesh, tables, train.parallelism.sparse_sharding)
    if state.tables and features is not None:
        fuse_lookups(model, state.tables, features)
    apply_fsdp(model, state.mesh, layers, device, reshard_after_forward=train.parallelism.reshard_after_forward,
               ignored_params=ignored.parameters() if ignored is not None else (), param_dtype=param_dtype)
    state.fsdp_param_dtype = param_dtype or torch.float32
