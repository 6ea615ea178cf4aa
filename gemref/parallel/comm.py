"""Communication: which backend, what every collective moved, and how much of it was exposed.

1. `resolve_backend(name, device)` checks a backend BEFORE any process group exists: gloo
   (CPU), nccl (CUDA), ncclx (Meta's NCCLX, reached through torchcomms when importable).
2. `CollectiveRecorder` is a TorchDispatchMode that sees every c10d collective that runs
   inside it (FSDP's all-gathers and reduce-scatters, the HSDP all-reduce, the sparse
   all-to-alls): kind, mesh dim, group size and payload bytes. Payload = the whole tensor
   of the collective: all-gather output, reduce-scatter input, all-reduce tensor,
   all-to-all input (what this rank sends, its own part included). A collective over a
   one-rank group moves nothing and is not recorded. It intercepts every op, so use it on
   measuring steps, not while timing.
3. `comm_overlap(profile)` reads a torch.profiler trace: the execution intervals of the
   collectives (gloo worker threads on CPU, NCCL kernels on GPU) against the compute
   intervals (aten ops on the main thread, other kernels on GPU). total = the union of the
   comm intervals; exposed = the part of it during which no compute ran, i.e. the time a
   rank only waited on the network. `attach_times` gives each recorded collective the
   execution time of its matching profiler event.

The analytic bytes per step are in volume.py, the alpha-beta time model in gemref/simulate/cost_model.py.
"""
from __future__ import annotations

import importlib.util
import time
from collections import defaultdict
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from ..config import BACKENDS

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


# ----------------------------------------------------------------------------- recording

# c10d op -> (kind, the schema argument whose tensors make the payload)
_C10D_OPS = {
    "_allgather_base_": ("all_gather", "output_tensor"), "allgather_": ("all_gather", "output_tensors"),
    "allgather_into_tensor_coalesced_": ("all_gather", "outputs"),
    "allgather_coalesced_": ("all_gather", "output_lists"),
    "_reduce_scatter_base_": ("reduce_scatter", "input_tensor"), "reduce_scatter_": ("reduce_scatter", "input_tensors"),
    "reduce_scatter_tensor_coalesced_": ("reduce_scatter", "inputs"),
    "allreduce_": ("all_reduce", "tensors"), "allreduce_coalesced_": ("all_reduce", "tensors"),
    "alltoall_base_": ("all_to_all", "input"), "alltoall_": ("all_to_all", "input_tensors"),
    "broadcast_": ("broadcast", "tensors"),
}
# the input tensor of the collective, as a profiler trace shows its size (to match events)
_INPUT_ARG = {"all_gather": ("input_tensor", "input_tensors", "inputs", "input_list"),
              "reduce_scatter": ("input_tensor", "input_tensors", "inputs"),
              "all_reduce": ("tensors",), "all_to_all": ("input", "input_tensors"), "broadcast": ("tensors",)}


@dataclass
class Collective:
    kind: str             # all_gather | reduce_scatter | all_reduce | all_to_all | broadcast | other c10d op
    dim: str              # replicate | shard | world | group:<name>
    group_size: int
    bytes: int            # payload bytes (see module docstring)
    input_numel: int      # elements of the input tensor (matches profiler events)
    issued_s: float       # seconds since the recorder started
    seconds: float | None = None   # execution time from the profiler (attach_times)


def _bytes(x) -> int:
    return sum(t.numel() * t.element_size() for t in tree_leaves(x) if isinstance(t, torch.Tensor))


def _numel(x) -> int:
    return sum(t.numel() for t in tree_leaves(x) if isinstance(t, torch.Tensor))


class CollectiveRecorder(TorchDispatchMode):
    """`with CollectiveRecorder(group_dims) as rec: step()` then `rec.collectives`, `rec.summary()`.

    `group_dims` maps process-group names to mesh dims (gemref.parallel.mesh.group_dims).
    """

    def __init__(self, group_dims: dict[str, str] | None = None):
        super().__init__()
        self.group_dims = group_dims or {}
        self.collectives: list[Collective] = []
        self.t0 = time.perf_counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.namespace == "c10d" and func._opname in _C10D_OPS:
            self._record(func, args, kwargs)
        return func(*args, **kwargs)

    def _record(self, func, args, kwargs) -> None:
        from torch._C._distributed_c10d import ProcessGroup

        kind, payload = _C10D_OPS[func._opname]
        named = {a.name: v for a, v in zip(func._schema.arguments, args)} | kwargs
        group = ProcessGroup.unbox(named["process_group"])
        if group.size() == 1:
            return
        inputs = next((named[n] for n in _INPUT_ARG[kind] if n in named), named[payload])
        self.collectives.append(Collective(
            kind, self.group_dims.get(group.group_name, f"group:{group.group_name}"), group.size(),
            _bytes(named[payload]), _numel(inputs), time.perf_counter() - self.t0))

    def summary(self, steps: int = 1) -> list[dict]:
        """Per (kind, dim): collectives and payload bytes per step (totals / `steps`, the steps recorded)."""
        rows: dict[tuple, dict] = defaultdict(lambda: {"count": 0, "bytes": 0, "seconds": 0.0})
        for c in self.collectives:
            row = rows[(c.kind, c.dim, c.group_size)]
            row["count"] += 1
            row["bytes"] += c.bytes
            row["seconds"] += c.seconds or 0.0
        return [{"kind": k, "dim": d, "group_size": g, "count_per_step": v["count"] / steps,
                 "bytes_per_step": v["bytes"] / steps, "seconds_per_step": v["seconds"] / steps}
                for (k, d, g), v in sorted(rows.items())]


# ----------------------------------------------------------------------------- overlap


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _length(intervals) -> float:
    return sum(b - a for a, b in intervals)


def _intersection(xs, ys) -> float:
    """Total length of the overlap of two sorted, disjoint interval lists."""
    i = j = 0
    total = 0.0
    while i < len(xs) and j < len(ys):
        lo, hi = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
        total += max(0.0, hi - lo)
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return total


def _is_comm_kernel(name: str) -> bool:
    return "nccl" in name.lower()


def comm_events(prof) -> list:
    """The profiler events that are collectives executing (gloo threads, NCCL kernels), by start time."""
    from torch.autograd import DeviceType

    events = [e for e in prof.events()
              if e.name.startswith("gloo:") or (e.device_type == DeviceType.CUDA and _is_comm_kernel(e.name))]
    return sorted(events, key=lambda e: e.time_range.start)


def comm_overlap(prof) -> dict:
    """Seconds of comm (union of collective intervals), of it exposed (no compute running), and the overlap share."""
    from torch.autograd import DeviceType

    events = prof.events()
    comm = comm_events(prof)
    gpu = any(e.device_type == DeviceType.CUDA for e in comm)
    comm_threads = {e.thread for e in comm if e.device_type == DeviceType.CPU}
    if gpu:
        compute = [e for e in events if e.device_type == DeviceType.CUDA and not _is_comm_kernel(e.name)]
    else:
        compute = [e for e in events if e.device_type == DeviceType.CPU and e.name.startswith("aten::")
                   and e.thread not in comm_threads]
    comm_iv = _union([(e.time_range.start, e.time_range.end) for e in comm])
    compute_iv = _union([(e.time_range.start, e.time_range.end) for e in compute])
    total = _length(comm_iv) / 1e6
    exposed = total - _intersection(comm_iv, compute_iv) / 1e6
    return {"comm_s": total, "exposed_comm_s": exposed, "compute_s": _length(compute_iv) / 1e6,
            "overlapped_share": 1 - exposed / total if total > 0 else None, "timeline": "gpu" if gpu else "cpu"}


def _event_kind(name: str) -> set[str]:
    n = name.lower().replace("_", "")
    if "allgather" in n:
        return {"all_gather"}
    if "reducescatter" in n:
        return {"reduce_scatter"}
    if "allreduce" in n:                  # gloo runs a reduce-scatter as an all-reduce
        return {"all_reduce", "reduce_scatter"}
    if "alltoall" in n or "sendrecv" in n:
        return {"all_to_all"}
    if "broadcast" in n:
        return {"broadcast"}
    return set()


def attach_times(collectives: list[Collective], prof) -> int:
    """Give each recorded collective the duration of its profiler event; returns how many matched.

    Events are matched first-in first-out by kind and, where the trace records shapes
    (gloo), by input size, which identifies a collective among the concurrent groups.
    """
    pending = list(comm_events(prof))
    matched = 0
    for c in collectives:
        for i, e in enumerate(pending):
            shapes = [s for s in (e.input_shapes or []) if s]
            numel_ok = not shapes or int(torch.Size(shapes[0]).numel()) == c.input_numel
            if c.kind in _event_kind(e.name) and numel_ok:
                c.seconds = (e.time_range.end - e.time_range.start) / 1e6
                pending.pop(i)
                matched += 1
                break
    return matched
