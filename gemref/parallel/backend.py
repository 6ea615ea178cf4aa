"""Which backend a run's collectives use: gloo (CPU), nccl (CUDA), or ncclx (Meta's NCCLX, reached
through torchcomms when importable), checked BEFORE any process group exists; and the NCCLX job's
mesh. What the collectives moved and how much of it compute hid is the lab's (gemref/measure/comm.py).
"""
from __future__ import annotations

import importlib.util

import torch
import torch.distributed as dist

from .config import BACKENDS

NCCLX_INSTALL = ("pip install --pre torchcomms --index-url https://download.pytorch.org/whl/nightly/cu128 "
                 "(see https://github.com/meta-pytorch/torchcomms; needs CUDA GPUs)")


def resolve_backend(name: str, device: torch.device | str) -> str:
    """The concrete backend for `device`; a ValueError saying why when it cannot run here."""
    device = torch.device(device)
    if name not in BACKENDS:
        raise ValueError(f"backend={name!r}; valid: {', '.join(BACKENDS)}")
    if name == "auto":
        return "nccl" if device.type == "cuda" else "gloo"
    if name == "gloo" and device.type == "cuda":
        raise ValueError("backend 'gloo' runs CPU tensors here (no reduce-scatter on CUDA tensors); "
                         "use --backend nccl (or ncclx) with --device cuda")
    if name in ("nccl", "ncclx") and device.type != "cuda":
        raise ValueError(f"backend {name!r} needs --device cuda; on CPU use gloo")
    if name in ("nccl", "ncclx") and not torch.cuda.is_available():
        raise ValueError(f"backend {name!r} needs CUDA GPUs, but torch.cuda.is_available() is False")
    if name == "nccl" and not dist.is_nccl_available():
        raise ValueError(f"backend 'nccl': this torch build ({torch.__version__}) has no NCCL")
    if name == "ncclx" and importlib.util.find_spec("torchcomms") is None:
        raise ValueError(f"backend 'ncclx' needs the torchcomms package, which is not importable here: {NCCLX_INSTALL}")
    return name


_ncclx: dict = {}   # {"mesh": DeviceMesh, "comms": [...]} of the NCCLX job this process joined


def ncclx_mesh_built():
    """The DeviceMesh `init_ncclx` built (None when this process runs no NCCLX job)."""
    return _ncclx.get("mesh")


def init_ncclx(replicate: int, shard: int, device: torch.device) -> None:
    """Join the NCCLX job: build its mesh (ncclx_mesh) and keep it for build_mesh and shutdown."""
    mesh, comms = ncclx_mesh(replicate, shard, device)
    _ncclx.update(mesh=mesh, comms=comms)


def finalize_ncclx() -> None:
    """Release the NCCLX communicators (sub-communicators first)."""
    for comm in _ncclx.pop("comms", []):
        comm.finalize()
    _ncclx.clear()


def ncclx_mesh(replicate: int, shard: int, device: torch.device):
    """A ("replicate", "shard") DeviceMesh whose groups are NCCLX communicators (torchcomms).

    One world communicator, split into one communicator per mesh dim, wrapped as process
    groups by `torchcomms.device_mesh.init_device_mesh`; FSDP and DTensor then run on NCCLX
    unchanged. Returns (mesh, communicators); call `.finalize()` on each (sub-communicators
    first) before exit. Not run in gemref's CI (needs GPUs and torchcomms).
    """
    import torchcomms
    from torchcomms.device_mesh import init_device_mesh

    world = torchcomms.new_comm("ncclx", device, name="gemref_world")
    rank = world.get_rank()
    grid = torch.arange(replicate * shard).view(replicate, shard)
    r, s = divmod(rank, shard)
    dims = {"replicate": world.split(grid[:, s].tolist(), "replicate"),
            "shard": world.split(grid[r, :].tolist(), "shard")}
    mesh = init_device_mesh(mesh_dim_comms=(dims["replicate"], dims["shard"]),
                            mesh_dim_names=("replicate", "shard"), _global_comm=world)
    return mesh, [dims["replicate"], dims["shard"], world]
