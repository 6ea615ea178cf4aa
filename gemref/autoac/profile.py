"""Measure what checkpointing each block buys: the profiling pass behind AutoAC (the batch-size
search that turns freed memory into a larger batch is gemref/autoac/batch_search.py).

Every pass runs the training step's own forward and loss (gemref/step.py's `forward_loss`).
Activation bytes = the memory a training step's forward leaves alive for its backward:
  * CUDA: torch.cuda.memory_allocated after the forward minus before (everything).
  * CPU, eager: a TorchDispatchMode notes (weakly) every storage an op creates during the
    forward; the bytes of those still alive when it returns. Parameters and the batch,
    which existed before, are not counted.
  * CPU, compiled regions: inductor allocates without the dispatcher, so there the bytes are
    those of the tensors saved for backward (saved_tensors_hooks, storages deduplicated).
    That misses what a checkpoint keeps (its inputs), so it is used only where nothing is
    checkpointed (the PT2 budget); on an eager step the two methods agree (tests).

The profiling pass (`profile_blocks`), on one batch, never runs the un-checkpointed step
(so it fits wherever the fully checkpointed step fits, as the batch search needs):
  1. every block fully checkpointed: the reference bytes and backward FLOPs;
  2. per block, the same step with that one block left out of the checkpointing ("none")
     and with it at each other option: bytes freed by an option = bytes at "none" - bytes
     at it; recompute FLOPs = backward FLOPs at it - backward FLOPs at "none". In the "none"
     step the block's saved tensors (saved_tensors_hooks, storages deduplicated), forward
     FLOPs (FlopCounterMode) and, in a plain forward, its forward time are noted too.
A checkpoint keeps its inputs, which the block saves anyway, so it frees less than the block
saves; measuring with and without it gets that right. Blocks share only their inputs and
outputs, alive under any plan, so bytes add up: a plan's bytes = base - sum(freed), with
base (nothing checkpointed) = reference + sum over blocks of what "full" frees (tests
check both against measured steps).
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import fields
from typing import Callable, Iterator

import torch
from torch import Tensor, nn
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import FlopCounterMode

from .solver import ActivationProfile, BlockProfile, Plan, ac_blocks, applied_plan, apply_plan, remove_plan, solve
from ..compile import compile_stats
from ..data.jagged import JaggedBatch
from ..mfu.flops import model_flops
from ..step import forward_loss


def _storage_key(t: Tensor) -> tuple[StorageWeakRef, int]:
    storage = t.untyped_storage()
    return StorageWeakRef(storage), storage.nbytes()


def existing_storages(model: nn.Module, batch: JaggedBatch) -> set[int]:
    tensors = list(model.parameters()) + list(model.buffers()) + [getattr(batch, f.name) for f in fields(batch)]
    return {StorageWeakRef(t.untyped_storage()).cdata for t in tensors}


class StorageBirths(TorchDispatchMode):
    """Remembers, weakly, every storage an op returns that did not exist before."""

    def __init__(self, existing: set[int]):
        super().__init__()
        self.existing = existing
        self.born: dict[int, tuple[StorageWeakRef, int]] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, Tensor) and t.device.type == "cpu":
                ref, nbytes = _storage_key(t)
                known = self.born.get(ref.cdata)
                if ref.cdata not in self.existing and (known is None or known[0].expired()):
                    self.born[ref.cdata] = (ref, nbytes)
        return out

    def alive_bytes(self) -> int:
        return sum(n for ref, n in self.born.values() if not ref.expired())


class SavedTensors:
    """saved_tensors_hooks that note each saved storage once, with the block that saved it first."""

    def __init__(self, existing: set[int]):
        self.existing = existing
        self.saved: dict[int, tuple[StorageWeakRef, int, str]] = {}
        self.current = "outside"

    def _pack(self, t: Tensor) -> Tensor:
        ref, nbytes = _storage_key(t)
        if ref.cdata not in self.existing and ref.cdata not in self.saved:
            self.saved[ref.cdata] = (ref, nbytes, self.current)
        return t

    @contextmanager
    def active(self) -> Iterator["SavedTensors"]:
        with torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t):
            yield self

    def bytes_by_block(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for ref, nbytes, block in self.saved.values():
            out[block] = out.get(block, 0) + (0 if ref.expired() else nbytes)
        return out


def measure_method(model: nn.Module, device: torch.device) -> str:
    if device.type == "cuda":
        return "cuda_memory_allocated"
    return "cpu_saved_tensors" if compile_stats(model) is not None else "cpu_live_storages"


def forward_with_bytes(model: nn.Module, batch: JaggedBatch, autocast_dtype=None) -> tuple[Tensor, int]:
    """Run the forward; return the loss and the activation bytes it leaves for backward."""
    device = batch.values.device
    method = measure_method(model, device)
    if method == "cuda_memory_allocated":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        loss = forward_loss(model, batch, autocast_dtype)
        torch.cuda.synchronize(device)
        return loss, torch.cuda.memory_allocated(device) - before
    existing = existing_storages(model, batch)
    if method == "cpu_saved_tensors":
        if applied_plan(model):
            raise ValueError("cannot measure a checkpointed, compiled model on CPU: inductor's "
                             "buffers are invisible there; measure the eager model instead")
        saved = SavedTensors(existing)
        with saved.active():
            loss = forward_loss(model, batch, autocast_dtype)
        return loss, sum(saved.bytes_by_block().values())
    births = StorageBirths(existing)
    with births:
        loss = forward_loss(model, batch, autocast_dtype)
    return loss, births.alive_bytes()


def activation_bytes(model: nn.Module, batch: JaggedBatch, autocast_dtype=None) -> int:
    """Activation bytes of one training step's forward with the model as it is (plan applied)."""
    loss, nbytes = forward_with_bytes(model, batch, autocast_dtype)
    del loss
    return nbytes


def backward_flops(loss: Tensor, model: nn.Module) -> int:
    """FLOPs of loss.backward() (recomputation included); leaves no gradients behind."""
    with FlopCounterMode(display=False) as counter:
        loss.backward()
    model.zero_grad(set_to_none=True)
    return int(counter.get_total_flops())


@contextmanager
def _watched(block: nn.Module, enter: Callable[[], None], leave: Callable[[], None]):
    """Call enter() and leave() around every forward of one (not checkpointed) block."""
    forward = block.forward

    def run(*args, **kwargs):
        enter()
        try:
            return forward(*args, **kwargs)
        finally:
            leave()
    block.forward = run
    try:
        yield
    finally:
        del block.forward


def profile_blocks(model: nn.Module, batch: JaggedBatch, *, options: tuple[str, ...] = ("selective", "full"),
                   autocast_dtype: torch.dtype | None = None) -> ActivationProfile:
    """Measure every block with every option on `batch` (see module docstring).

    The model must be eager and not checkpointed (profile first, then apply, then compile).
    Costs 1 + 3 * n_layers * len(options) forward+backward passes and 3 * n_layers forwards;
    the most memory any of them needs is the fully checkpointed step plus one block's
    activations. Leaves no gradients.
    """
    if set(options) - {"selective", "full"} or "full" not in options:
        raise ValueError(f"options {options!r}: give ('full',) or ('selective', 'full') (full checkpointing "
                         f"is the reference every block is measured against)")
    if applied_plan(model) or compile_stats(model) is not None:
        raise ValueError("profile the eager model before checkpointing or compiling it")
    device = batch.values.device
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    names = list(ac_blocks(model))
    all_full = {name: "full" for name in names}

    def step(choices: dict[str, str], watch: str | None = None):
        """Bytes and backward FLOPs of one step under `choices`; the watched block's saved
        bytes and forward FLOPs, if any."""
        apply_plan(model, choices)
        try:
            if watch is None:
                loss, nbytes = forward_with_bytes(model, batch, autocast_dtype)
                return nbytes, backward_flops(loss, model), 0, 0
            saved, counter, at = SavedTensors(existing_storages(model, batch)), FlopCounterMode(display=False), []

            def enter():
                saved.current = watch
                at.append(counter.get_total_flops())

            def leave():
                saved.current = "outside"
                at.append(counter.get_total_flops())
            with _watched(ac_blocks(model)[watch], enter, leave), counter, saved.active():
                loss, nbytes = forward_with_bytes(model, batch, autocast_dtype)
            saved_bytes = saved.bytes_by_block().get(watch, 0)
            return nbytes, backward_flops(loss, model), saved_bytes, at[1] - at[0]
        finally:
            remove_plan(model)

    def forward_seconds(name: str) -> float:
        clock: list[float] = []

        def tick():
            sync()
            clock.append(time.perf_counter())
        apply_plan(model, {**all_full, name: "none"})
        try:
            with _watched(ac_blocks(model)[name], tick, tick):
                forward_loss(model, batch, autocast_dtype)
        finally:
            remove_plan(model)
        return clock[1] - clock[0]

    reference_bytes, reference_backward, _, _ = step(all_full)
    blocks = []
    for name in names:
        none_bytes, none_backward, saved_bytes, flops = step({**all_full, name: "none"}, watch=name)
        at = {o: step({**all_full, name: o})[:2] for o in options if o != "full"}
        at["full"] = (reference_bytes, reference_backward)
        blocks.append(BlockProfile(name, saved_bytes, int(flops), forward_seconds(name),
                                   {o: none_bytes - at[o][0] for o in options},
                                   {o: at[o][1] - none_backward for o in options}))
    base_bytes = reference_bytes + sum(b.freed_bytes["full"] for b in blocks)
    return ActivationProfile(base_bytes, tuple(blocks), tuple(options), measure_method(model, device),
                             model_flops(model.cfg, batch.lengths).total)


def auto_checkpoint(model: nn.Module, batch: JaggedBatch, budget_fraction: float, *,
                    options: tuple[str, ...] = ("selective", "full"),
                    autocast_dtype: torch.dtype | None = None) -> tuple[Plan, ActivationProfile]:
    """Profile, solve for `budget_fraction` of the no-checkpoint activation bytes, apply."""
    if not 0.0 < budget_fraction <= 1.0:
        raise ValueError(f"budget_fraction must be in (0, 1], got {budget_fraction}")
    profile = profile_blocks(model, batch, options=options, autocast_dtype=autocast_dtype)
    plan = solve(profile, int(budget_fraction * profile.base_bytes))
    apply_plan(model, plan)
    return plan, profile
