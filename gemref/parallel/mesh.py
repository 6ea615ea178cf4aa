"""The 2D device mesh ("replicate", "shard") that both dense FSDP and the sparse tables use.

A mesh `RxS` arranges R*S ranks as R groups of S: parameters are sharded S ways inside a
group (the "shard" dim: FSDP's reduce-scatter/all-gather, the embedding rows) and
replicated R ways across groups (the "replicate" dim: an all-reduce of gradient shards).
Rank r sits at (r // S, r % S), so a shard group is S consecutive ranks: put it inside a
node, where the links are fast, and let only the replicate all-reduce cross nodes.

    1xW   FSDP 1D (everything sharded W ways)
    Wx1   replicated data parallelism (DDP-like: full copies, gradients all-reduced)
    RxS   HSDP / 2D: sharded within groups of S, replicated across R groups

Meshes are built once per process group and cached here; `release_meshes()` forgets them (and
DTensor's sharding-propagation cache, which holds their specs) when the group is destroyed, so
a later group never gets a mesh over a destroyed one.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from .backend import ncclx_mesh_built
from .config import MeshShape

MESH_DIMS = ("replicate", "shard")
_meshes: dict[tuple, DeviceMesh] = {}


def release_meshes() -> None:
    """Forget every cached mesh, and DTensor's sharding-propagation cache (its specs hold meshes).
    Called when the process group is destroyed (gemref/parallel/launch.py `shutdown`). Other
    private DTensor caches (redistribute planners, strategy caches) still hold meshes, hence their
    groups and gloo threads, until the process ends: launch.py's module doc says why a rank then
    ends with os._exit."""
    _meshes.clear()
    try:
        from torch.distributed.tensor.debug import _clear_sharding_prop_cache
    except ImportError:          # a torch without that cache
        return
    _clear_sharding_prop_cache()


def check_world(shape: MeshShape, world_size: int) -> None:
    """R*S must equal the number of ranks; checked before any process group exists."""
    if shape.world != world_size:
        raise ValueError(f"mesh={shape} needs R*S = {shape.world} ranks, but the world size is {world_size}: "
                         f"launch {shape.world} ranks (--ranks {shape.world}, or torchrun --nproc-per-node "
                         f"{shape.world}) or choose a mesh with R*S = {world_size}")


def build_mesh(shape: MeshShape, device_type: str) -> DeviceMesh:
    """The 2D DeviceMesh over the initialised process group (or the NCCLX one torchcomms built)."""
    built = ncclx_mesh_built()
    if built is not None:
        check_world(shape, built.size())
        return built
    assert dist.is_initialized(), "init the process group first (gemref.parallel.launch)"
    check_world(shape, dist.get_world_size())
    # Creating process groups is a rendezvous of every rank: build each mesh once per group.
    key = (shape, device_type, dist.distributed_c10d._get_default_group().group_name)
    if key not in _meshes:
        _meshes[key] = init_device_mesh(device_type, (shape.replicate, shape.shard), mesh_dim_names=MESH_DIMS)
    return _meshes[key]


def group_dims(mesh: DeviceMesh) -> dict[str, str]:
    """Process-group name -> mesh dim ("replicate", "shard"), plus the world group ("world").

    The collective recorder (gemref/measure/comm.py) uses it to say along which dim each collective ran.
    """
    names = {dist.distributed_c10d._get_default_group().group_name: "world"}
    for dim in MESH_DIMS:
        names[mesh.get_group(dim).group_name] = dim
    return names


def local_device(device_type: str) -> torch.device:
    """This rank's device: cuda:LOCAL_RANK on GPUs, cpu otherwise."""
    if device_type == "cuda":
        import os
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")
