"""AutoAC's profiler (chapter 05; the idea: gemref/autoac/__init__.py): what each option of each
named block frees and costs, measured on one step (`step`: the forward, returning the loss) of
the caller's model. Activation bytes = what a forward leaves alive for backward: on CUDA the
growth of memory_allocated, on CPU the bytes of the storages it created still alive
(gemref/mfu/memory.py LiveStorages). The un-checkpointed step never runs: with every other block
"full", a block's bytes freed = bytes at "none" - at the option, recompute FLOPs = backward FLOPs
at the option - at "none", recompute seconds = its time in the step (forward and rerun) minus
its forward at "none" (median of `repeats` rounds, floored at 0; "compressed": the compression).
Blocks share only their inputs and outputs, so bytes add: a plan's bytes = base - sum(freed)."""
from __future__ import annotations

import statistics
import time
from typing import TYPE_CHECKING, Callable, Sequence

import torch
from torch import Tensor, nn
from torch.utils.flop_counter import FlopCounterMode

from ..compile import compile_stats
from ..mfu.memory import LiveStorages, SavedTensors, storage_key
from .plan import APPROXIMATE_OPTIONS, OPTIONS, ActivationProfile, BlockProfile, Plan, applied_plan, apply_plan, \
    find_blocks, remove_plan, solve

if TYPE_CHECKING:
    from ..activation_compression import CompressionSpec


def _device(model: nn.Module) -> torch.device:
    return next(iter(model.parameters()), torch.empty(0)).device


def _existing(model: nn.Module, inputs: Sequence[Tensor]) -> list[Tensor]:
    return [*model.parameters(), *model.buffers(), *inputs]


def forward_with_bytes(model: nn.Module, step: Callable[[], Tensor],
                       inputs: Sequence[Tensor] = ()) -> tuple[Tensor, int]:
    """Run `step`; return the loss and the activation bytes it leaves for backward. `inputs`:
    tensors that existed before (the batch), never counted."""
    device = _device(model)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        loss = step()
        torch.cuda.synchronize(device)
        return loss, torch.cuda.memory_allocated(device) - before
    if compile_stats(model) is not None:
        raise ValueError("a compiled model allocates on CPU without the dispatcher, so its bytes are "
                         "invisible here: measure the eager model")
    with LiveStorages(_existing(model, inputs)) as live:
        loss = step()
    return loss, live.alive_bytes()


def activation_bytes(model: nn.Module, step: Callable[[], Tensor], inputs: Sequence[Tensor] = ()) -> int:
    """Activation bytes of one forward (`step`) with the model as it is (plan applied)."""
    return forward_with_bytes(model, step, inputs)[1]


def backward_flops(loss: Tensor, model: nn.Module) -> int:
    """FLOPs of loss.backward() (recomputation included); leaves no gradients behind."""
    with FlopCounterMode(display=False) as counter:
        loss.backward()
    model.zero_grad(set_to_none=True)
    return int(counter.get_total_flops())


def profile_blocks(model: nn.Module, blocks: Sequence[str], step: Callable[[], Tensor], *,
                   options: Sequence[str] = ("save_matmuls", "full"), repeats: int = 3,
                   compression: CompressionSpec | None = None, inputs: Sequence[Tensor] = ()) -> ActivationProfile:
    """Measure every block (module paths) at "full" and any of "save_matmuls", "compressed" (in
    `compression`'s format) on the eager, unwrapped model: about len(blocks) * (len(options) + 1)
    * (repeats + 2) steps, none bigger than the fully checkpointed step plus one block's."""
    valid = OPTIONS[1:] + APPROXIMATE_OPTIONS
    if "full" not in options or set(options) - set(valid) or len(set(options)) != len(options):
        raise ValueError(f"options {tuple(options)!r}: give 'full' (the reference every block is "
                         f"measured against) and any of {', '.join(o for o in valid if o != 'full')}")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    if applied_plan(model) or compile_stats(model) is not None:
        raise ValueError("profile the eager model before checkpointing or compiling it")
    if not (names := list(blocks)) or len(find_blocks(model, names)) != len(names):     # none, or one twice
        raise ValueError(f"blocks must be distinct module paths, at least one; got {names}")
    device = _device(model)
    all_full = {name: "full" for name in names}

    def run(choices: dict[str, str], watch: str | None = None):
        """(bytes, forward FLOPs, backward FLOPs, the watched block's saved bytes and forward FLOPs)."""
        apply_plan(model, choices, compression=compression)
        saved = SavedTensors({storage_key(t) for t in _existing(model, inputs)})
        counter, at, hooks = FlopCounterMode(display=False), [0, 0], []
        if watch is not None:
            def mark(i: int, current: str):
                def hook(*_):
                    saved.current, at[i] = current, counter.get_total_flops()
                return hook
            block = model.get_submodule(watch)
            hooks = [block.register_forward_pre_hook(mark(0, watch)), block.register_forward_hook(mark(1, "outside"))]
        try:
            with counter, saved.active():
                loss, nbytes = forward_with_bytes(model, step, inputs)
            forward, saved_bytes = int(counter.get_total_flops()), saved.bytes_by_block().get(watch, 0)
            return nbytes, forward, backward_flops(loss, model), saved_bytes, at[1] - at[0]
        finally:
            for h in hooks:
                h.remove()
            remove_plan(model)

    def seconds(name: str, option: str) -> float:
        """Seconds the block's runs take in one step at `option`, every other block "full": its
        forward hooks fire on the rerun too (always_call: also when the rerun stops early)."""
        block, clock = model.get_submodule(name), []

        def tick(*_):
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            clock.append(time.perf_counter())
        hooks = [block.register_forward_pre_hook(tick), block.register_forward_hook(tick, always_call=True)]
        apply_plan(model, {**all_full, name: option}, compression=compression)
        try:
            step().backward()
            model.zero_grad(set_to_none=True)
            return sum(clock[i + 1] - clock[i] for i in range(0, len(clock) - 1, 2))
        finally:
            for h in hooks:
                h.remove()
            remove_plan(model)

    reference_bytes, reference_forward, reference_backward, _, _ = run(all_full)
    profiled = []
    for name in names:
        none_bytes, _, none_backward, saved_bytes, flops = run({**all_full, name: "none"}, watch=name)
        at = {o: run({**all_full, name: o})[::2] for o in options if o != "full"}
        at["full"] = (reference_bytes, reference_backward)
        rounds = [{o: seconds(name, o) for o in ("none", *options)} for _ in range(repeats + 1)][1:]  # warm-up
        median = {o: max(0.0, statistics.median(r[o] - r["none"] for r in rounds)) for o in options}
        profiled.append(BlockProfile(name, saved_bytes, int(flops), {o: none_bytes - at[o][0] for o in options},
                                     {o: at[o][1] - none_backward for o in options}, median))
    base_bytes = reference_bytes + sum(b.freed_bytes["full"] for b in profiled)
    step_flops = reference_forward + reference_backward - sum(b.recompute_flops["full"] for b in profiled)
    method = "cuda_memory_allocated" if device.type == "cuda" else "cpu_live_storages"
    return ActivationProfile(base_bytes, tuple(profiled), tuple(options), method, step_flops)


def auto_checkpoint(model: nn.Module, blocks: Sequence[str], step: Callable[[], Tensor], budget_fraction: float, *,
                    objective: str = "time", options: Sequence[str] = ("save_matmuls", "full"), repeats: int = 3,
                    compression: CompressionSpec | None = None,
                    inputs: Sequence[Tensor] = ()) -> tuple[Plan, ActivationProfile]:
    """Profile, solve for `budget_fraction` of the no-checkpoint activation bytes, apply."""
    if not 0.0 < budget_fraction <= 1.0:
        raise ValueError(f"budget_fraction must be in (0, 1], got {budget_fraction}")
    profile = profile_blocks(model, blocks, step, options=options, repeats=repeats, compression=compression,
                             inputs=inputs)
    plan = solve(profile, int(budget_fraction * profile.base_bytes), objective)
    apply_plan(model, plan, compression=compression)
    return plan, profile
