"""Tensor memory of a block of code, in bytes, on CUDA and on CPU: the one storage tracker.

CUDA: the caching allocator's `max_memory_allocated`, reset at entry (tensors alive before
entry count, as on the device they occupy memory).

CPU has no allocator statistics, so `LiveStorages` counts it itself: a TorchDispatchMode that
sees every tensor an aten op returns and notes, by a weak reference and its bytes, each storage
the op CREATED: one that is neither an input's storage (a view, an in-place or `out=` result)
nor one that existed before (`existing`: parameters, buffers, the batch; a view of a parameter,
the weight.t() a Linear takes, is therefore never counted). `alive_bytes()` sums the noted
storages still alive: after a forward, the activations it leaves for backward (AutoAC's
profiler, gemref/autoac/profile.py). With `peak=True` it also sums them after every op and keeps
the largest (`track_peak_memory`: activations, saved tensors, workspaces, gradients), and the
opaque CPU attention ops run their bodies inside the mode, so what they allocate internally
counts too (gemref/attention/jagged_op.py OPAQUE_BODIES). Without `peak` such an op is one op
(its outputs count): its body's caches (cpu_jagged's plans and tile biases, lru_cache'd on the
first call) are no activations, and counted they would land in whichever pass ran first, the
profiler's fully checkpointed reference, shrinking every block's "full" freed bytes by them.
A storage resized in place (`untyped_storage().resize_`, as FSDP2 does with its unsharded
parameters) changes size without the dispatcher and is not seen; FSDP2's all-gather buffers
are. Exact and repeatable, and slow (a Python hook per op): use it in a separate measuring
pass, never while timing. `SavedTensors` counts instead what autograd saves for backward.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterable, Iterator

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


@dataclass
class PeakMemory:
    bytes: int = 0          # peak bytes (see module docstring for what counts)
    method: str = ""        # "cuda_allocator" or "cpu_tensor_tracking"


def storage_key(t: torch.Tensor) -> int | None:
    """The identity of t's storage while it lives (its StorageImpl's address); None for a
    tensor without one of its own (a subclass such as DTensor: the mode sees its local parts)."""
    try:
        return StorageWeakRef(t.untyped_storage()).cdata
    except (RuntimeError, NotImplementedError, TypeError):
        return None


_let_in: set = set()     # the opaque ops whose bodies the tracker already runs inside its mode


class SavedTensors:
    """What autograd saves for backward, by saved_tensors_hooks: each saved storage once (not one of
    `existing`'s keys), with the block (`current`, set by the caller) that saved it first. AutoAC's
    profiler attributes a block's saved bytes with it (gemref/autoac/profile.py)."""

    def __init__(self, existing: set[int]):
        self.existing, self.current = existing, "outside"
        self.saved: dict[int, tuple[StorageWeakRef, int, str]] = {}

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        ref = StorageWeakRef(t.untyped_storage())
        if ref.cdata not in self.existing and ref.cdata not in self.saved:
            self.saved[ref.cdata] = (ref, t.untyped_storage().nbytes(), self.current)
        return t

    @contextmanager
    def active(self) -> Iterator["SavedTensors"]:
        with torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t):
            yield self

    def bytes_by_block(self) -> dict[str, int]:
        """{block: bytes of its saved storages still alive}."""
        out: dict[str, int] = {}
        for ref, nbytes, block in self.saved.values():
            out[block] = out.get(block, 0) + (0 if ref.expired() else nbytes)
        return out


def _let_opaque_ops_in() -> None:
    """Run the body of every opaque CPU attention op inside the tracker's mode, so the tensors
    the op allocates internally count too (gemref/attention/jagged_op.py OPAQUE_BODIES)."""
    from ..attention import KERNELS  # noqa: F401  (reading a name of the package registers every kernel's ops)
    from ..attention.jagged_op import OPAQUE_BODIES

    for op, body in OPAQUE_BODIES.items():
        if op not in _let_in:
            def traced(mode, func, types, args, kwargs, body=body):
                if not mode.track_peak:          # activation bytes: the op is one op (see above)
                    return mode.note(args, kwargs, func(*args, **(kwargs or {})))
                with mode:
                    return body(*args, **(kwargs or {}))
            torch.library.register_torch_dispatch(op, LiveStorages, traced)
            _let_in.add(op)


class LiveStorages(TorchDispatchMode):
    """The CPU storage tracker (module docstring). `existing`: tensors whose storages never count."""

    def __init__(self, existing: Iterable[torch.Tensor] = (), peak: bool = False) -> None:
        super().__init__()
        _let_opaque_ops_in()
        self.existing = {storage_key(t) for t in existing}
        self.born: dict[int, tuple[StorageWeakRef, int]] = {}    # key -> (weak ref, bytes at birth)
        self.track_peak, self.peak = peak, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return self.note(args, kwargs, func(*args, **(kwargs or {})))

    def note(self, args, kwargs, out):
        """Note the storages `out` holds that the op created; `out`."""
        inputs = {storage_key(t) for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.device.type == "cpu" and (key := storage_key(t)) is not None:
                known = self.born.get(key)
                if key not in self.existing and key not in inputs and (known is None or known[0].expired()):
                    self.born[key] = (StorageWeakRef(t.untyped_storage()), t.untyped_storage().nbytes())
        if self.track_peak:
            self.born = {k: v for k, v in self.born.items() if not v[0].expired()}
            self.peak = max(self.peak, self.alive_bytes())
        return out

    def alive_bytes(self) -> int:
        return sum(n for ref, n in self.born.values() if not ref.expired())


@contextmanager
def track_peak_memory(device: torch.device | str) -> Iterator[PeakMemory]:
    """`with track_peak_memory(dev) as peak: ...` then read `peak.bytes`."""
    device = torch.device(device)
    result = PeakMemory()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        result.method = "cuda_allocator"
        try:
            yield result
        finally:
            torch.cuda.synchronize(device)
            result.bytes = int(torch.cuda.max_memory_allocated(device))
        return
    result.method = "cpu_tensor_tracking"
    with LiveStorages(peak=True) as mode:
        try:
            yield result
        finally:
            result.bytes = mode.peak
