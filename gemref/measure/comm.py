"""What a step's collectives moved and how much of their time was exposed (the lab's comm measurement).

1. `CollectiveRecorder` is a TorchDispatchMode that sees every c10d collective that runs
   inside it (FSDP's all-gathers and reduce-scatters, the HSDP all-reduce, the sparse
   all-to-alls): kind, mesh dim, group size and payload bytes. Payload = the whole tensor
   of the collective: all-gather output, reduce-scatter input, all-reduce tensor,
   all-to-all input (what this rank sends, its own part included). A collective over a
   one-rank group moves nothing and is not recorded. It intercepts every op, so use it on
   measuring steps, not while timing.
2. `comm_overlap(profile)` reads a torch.profiler trace: the execution intervals of the
   collectives (gloo worker threads on CPU, NCCL kernels on GPU) against the compute
   intervals (aten ops on the main thread, other kernels on GPU). total = the union of the
   comm intervals; exposed = the part of it during which no compute ran, i.e. the time a
   rank only waited on the network. `attach_times` gives each recorded collective the
   execution time of its matching profiler event.
3. `measure_comm` runs one profiled forward+backward of a run under the recorder and sets the
   recorded bytes beside the analytic ones (gemref/parallel/volume.py); `rank_times` gathers each
   rank's step, compute and waiting times (gemref/measure/run.py puts both in the run record).

The alpha-beta time model is in gemref/simulate/collectives.py (priced per step by cost_model.py); the backend choice in
gemref/parallel/backend.py.
"""
from __future__ import annotations

import statistics
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from ..train.presets import Preset
from ..mfu.profile import quiet_profile
from ..parallel.mesh import group_dims
from ..parallel.parallelize import ParallelState
from ..parallel.volume import step_volume, total_bytes


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


# ----------------------------------------------------------------------------- a run's comm record
def reshard_all(model: nn.Module) -> None:
    """Free every FSDP-gathered parameter, as after a training step's backward: a no-grad forward
    (evaluation) leaves the root unit gathered, and a step measured after it would miss its all-gather."""
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


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


def measure_comm(state: ParallelState, preset: Preset, model: nn.Module, batch, fwd_bwd: Callable[[], None], *,
                 jagged: bool) -> dict:
    """One profiled forward+backward under the CollectiveRecorder: recorded vs analytic bytes, exposed comm.

    `jagged`: the run's attention layout (the analytic volume's shapes). Returns (on every rank)
    world totals per (kind, dim), the ratio recorded / analytic, and each rank's overlap figures.
    """
    cuda = state.mesh.device_type == "cuda"
    reshard_all(model)      # start from the sharded state a training step starts from
    recorder = CollectiveRecorder(group_dims(state.mesh))
    dist.barrier()
    with quiet_profile(state.mesh.device_type) as prof:
        with recorder:
            fwd_bwd()
        if cuda:
            torch.cuda.synchronize()
    attach_times(recorder.collectives, prof)
    layout = state.layout
    analytic = step_volume(preset.model, state.shape, rank=state.rank, batch=batch.batch_size,
                           tokens=batch.num_tokens, jagged=jagged, param_bytes=2 if cuda else 4,
                           reduce_bytes=4, reshard_after_forward=layout.reshard_after_forward,
                           sparse_sharding=layout.sparse_sharding, table_optimizer=layout.table_optimizer,
                           table_sync_interval=layout.table_sync_interval)
    per_rank = state.gather({"recorded": recorder.summary(), "analytic": analytic,
                             "overlap": comm_overlap(prof)})
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
