"""Peak memory of a block of code, in bytes, on CUDA and on CPU.

CUDA: the caching allocator's `max_memory_allocated`, reset at entry (tensors alive before
entry count, as on the device they occupy memory).

CPU has no allocator statistics, so `track_peak_memory` counts it itself: a
TorchDispatchMode sees every tensor an aten op returns, remembers each new storage by a
weak reference, and after every op sums the storages still alive. The result is the peak of
*tensor* bytes created inside the block (activations, saved tensors, workspaces, grads),
not counting tensors that existed before (parameters, inputs). It is exact and repeatable,
and slow (a Python hook per op): use it in a separate measuring pass, never while timing.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


@dataclass
class PeakMemory:
    bytes: int = 0          # peak bytes (see module docstring for what counts)
    method: str = ""        # "cuda_allocator" or "cpu_tensor_tracking"


_let_in: set = set()     # the opaque ops whose bodies the tracker already runs inside its mode


def _let_opaque_ops_in() -> None:
    """Run the body of every opaque CPU attention op inside the tracker's mode, so the tensors
    the op allocates internally count too (gemref/attention/jagged_op.py OPAQUE_BODIES)."""
    from ..attention import KERNELS  # noqa: F401  (reading a name of the package registers every kernel's ops)
    from ..attention.jagged_op import OPAQUE_BODIES

    for op, body in OPAQUE_BODIES.items():
        if op not in _let_in:
            def traced(mode, func, types, args, kwargs, body=body):
                with mode:
                    return body(*args, **(kwargs or {}))
            torch.library.register_torch_dispatch(op, LiveTensorBytes, traced)
            _let_in.add(op)


class LiveTensorBytes(TorchDispatchMode):
    """The CPU tracker's dispatch mode; the opaque attention ops run their bodies inside it."""

    def __init__(self) -> None:
        super().__init__()
        _let_opaque_ops_in()
        self.live: dict[int, tuple[StorageWeakRef, int]] = {}
        self.current = 0
        self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                storage = t.untyped_storage()
                try:
                    key = storage.data_ptr()
                except RuntimeError:  # a storage resized to 0 (FSDP frees gathered params so)
                    continue
                known = self.live.get(key)
                if key and (known is None or known[0].expired()):
                    nbytes = storage.nbytes()
                    self.live[key] = (StorageWeakRef(storage), nbytes)
        self._refresh()
        return out

    def _refresh(self) -> None:
        dead = [k for k, (ref, _) in self.live.items() if ref.expired()]
        for k in dead:
            del self.live[k]
        self.current = sum(n for _, n in self.live.values())
        self.peak = max(self.peak, self.current)


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
    mode = LiveTensorBytes()
    result.method = "cpu_tensor_tracking"
    with mode:
        try:
            yield result
        finally:
            result.bytes = mode.peak
