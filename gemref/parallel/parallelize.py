"""GEMRef's path through rung 6 (gemref/train/compose.py calls it; launch.py starts the ranks).

`parallel_state(layout, device)`: the 2D mesh of the run's ParallelConfig over the process group.
`parallelize`: the tables then the layers sharded, the last thing applied to the model (after
precision, AC and compile: docs/design.md); `ParallelState.finish_backward` syncs table replicas.
Each rank takes its part of the GLOBAL batch and divides its loss by the global batch size, so
the summed gradients make the one-process step (tests/test_parallel_train.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.device_mesh import DeviceMesh

from ..errors import UsageError
from .backend import ncclx_mesh_built
from .config import MeshShape, ParallelConfig

if TYPE_CHECKING:
    from .sparse import ShardedEmbedding


@dataclass
class ParallelState:
    mesh: DeviceMesh
    shape: MeshShape
    rank: int
    world: int
    backend: str
    layout: ParallelConfig
    tables: dict[str, ShardedEmbedding] = field(default_factory=dict)   # what `parallelize` sharded
    fsdp_param_dtype: torch.dtype | None = None   # the dtype FSDP gathers parameters in; None: FSDP not applied

    def finish_backward(self, model: nn.Module) -> None:
        """The syncs FSDP does not do: the replicas of the AdamW tables (a row-wise optimizer syncs its own)."""
        if self.layout.sparse_sharding != "none" and self.layout.table_optimizer == "adamw":
            from .sparse import sync_replica_grads   # loaded only by a run with sharded tables
            sync_replica_grads(self.tables, self.mesh)

    def gather(self, obj) -> list:
        """Every rank's `obj`, in rank order."""
        out = [None] * self.world
        dist.all_gather_object(out, obj)
        return out


def parallel_state(layout: ParallelConfig, device: torch.device) -> tuple[ParallelState | None, torch.device]:
    """The mesh over the running process group and this rank's device; (None, device) in one plain process."""
    if not dist.is_initialized() and ncclx_mesh_built() is None:
        if layout.mesh != "1x1" or layout.sparse_sharding != "none":
            world = layout.shape.world
            raise UsageError(f"mesh={layout.mesh} / sparse_sharding={layout.sparse_sharding} need a process group: "
                             f"pass --ranks {world} or launch with torchrun --nproc-per-node {world}")
        return None, device
    from .mesh import build_mesh, local_device   # loaded only with a process group
    backend = "ncclx" if ncclx_mesh_built() is not None else dist.get_backend()
    state = ParallelState(build_mesh(layout.shape, device.type), layout.shape, dist.get_rank(), dist.get_world_size(),
                          backend, layout)
    return state, local_device(device.type)


def parallelize(model: nn.Module, state: ParallelState, device: torch.device, *, layers: Sequence[str],
                tables: Sequence[str] = (), ignored: nn.Module | None = None,
                features: Callable[..., Mapping[str, Sequence[Tensor]]] | None = None,
                param_dtype: torch.dtype | None = None) -> None:
    """Shard `model` as `state.layout` says: `tables` (module names) sharded, then FSDP units `layers`
    (forward order); mesh Rx1 with no sharded tables: DDP (replicate.py). `ignored`: a module someone
    else shards (TorchRec's tables); `features`: for sparse.py `fuse_lookups` (None: an exchange per
    lookup); `param_dtype`: the GEMMs' dtype, FSDP's gather dtype (None: fp32)."""
    from .fsdp import apply_fsdp                 # loaded only by a run with a process group
    from .replicate import apply_replicate
    from .sparse import fuse_lookups, shard_tables
    layout = state.layout
    if state.shape.shard == 1 and layout.sparse_sharding == "none":
        apply_replicate(model, state.mesh, ignored_modules=[ignored] if ignored is not None else ())
        return
    state.tables = shard_tables(model, state.mesh, tables, layout.sparse_sharding)
    if state.tables and features is not None:
        fuse_lookups(model, state.tables, features)
    apply_fsdp(model, state.mesh, layers, device, reshard_after_forward=layout.reshard_after_forward,
               ignored_params=ignored.parameters() if ignored is not None else (), param_dtype=param_dtype)
    state.fsdp_param_dtype = param_dtype or torch.float32
