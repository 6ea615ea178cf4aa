"""Dense parallelism (chapter 07_fsdp_2d): FSDP2 `fully_shard` per named layer and on the root.

`apply_fsdp(model, mesh, layers, device)` works on any model: each module named in `layers` is an
FSDP unit, the root unit holds the rest; ShardedEmbeddings (sparse.py) keep their own sharding.
A unit's parameters live as 1/S shards (dim 0 padded to a multiple of S), all-gathered around its
forward and backward; its gradients are reduce-scattered over "shard" and, with R > 1 (HSDP),
all-reduced over "replicate". Gradients are SUMMED, not averaged: each rank divides its summed loss
by the GLOBAL batch size, so the step is the one-process step on the global batch, whatever the
per-rank sample counts (and SUM is what gloo supports). Parameters a rank leaves unused join the
reduce-scatter with zero gradients, so every rank reduces the same buffers. Prefetch: layer i's
forward starts layer i+1's all-gather, its backward layer i-1's; on CPU (no streams) through hooks
calling `unshard(async_op=True)`, so gloo's thread gathers while this one computes (chapter
08_communication measures the overlap). The model code never sees any of this.
"""
from __future__ import annotations

from typing import Iterable, Sequence

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

from .sparse import ShardedEmbedding, find_modules


def mixed_precision_policy(param_dtype: torch.dtype | None = None) -> MixedPrecisionPolicy:
    """FSDP2's policy for GEMMs in `param_dtype`: None or fp32, no mixed precision; bf16 or fp16,
    parameters gathered in it and gradients reduced in fp32. Shards and optimizer stay fp32."""
    if param_dtype is None or param_dtype == torch.float32:
        return MixedPrecisionPolicy()
    if not isinstance(param_dtype, torch.dtype) or not param_dtype.is_floating_point:
        raise ValueError(f"param_dtype must be a floating-point torch.dtype (the GEMMs' dtype), got {param_dtype!r}")
    return MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)


def apply_fsdp(model: nn.Module, mesh: DeviceMesh, layers: Sequence[str], device: torch.device, *,
               reshard_after_forward: bool = True, ignored_params: Iterable[nn.Parameter] = (),
               prefetch: bool = True, param_dtype: torch.dtype | None = None) -> list[FSDPModule]:
    """fully_shard each module named in `layers` (fully qualified, forward order, each run once per
    forward), then the root; return the units (root last). ShardedEmbeddings and `ignored_params`
    (tables another library shards) stay out. reshard_after_forward: free gathered parameters after
    forward, gather again in backward (ZeRO-3; False: keep them). `param_dtype`: the GEMMs' dtype."""
    units = list(find_modules(model, layers, "layers").values())
    m = mesh["shard"] if mesh.size(0) == 1 else mesh     # R = 1: plain FSDP; else HSDP on the 2D mesh
    policy = mixed_precision_policy(param_dtype)
    ignored = set(ignored_params) | {p for t in model.modules() if isinstance(t, ShardedEmbedding)
                                     for p in t.parameters()}
    for layer in units:
        fully_shard(layer, mesh=m, reshard_after_forward=reshard_after_forward, mp_policy=policy,
                    ignored_params=ignored & set(layer.parameters()))
    # The root keeps fully_shard's default, which never reshards the root after forward
    # (torch 2.11-2.13); passing True would make it gather its parameters twice per step.
    root_kwargs = {} if reshard_after_forward else {"reshard_after_forward": False}
    fully_shard(model, mesh=m, mp_policy=policy, ignored_params=ignored, **root_kwargs)
    for unit in [*units, model]:
        unit.set_force_sum_reduction_for_comms(True)
        unit.set_gradient_divide_factor(1.0)
        if hasattr(unit, "set_reduce_scatter_unused_params"):   # unused parameters: zero gradients (torch 2.13)
            unit.set_reduce_scatter_unused_params(True, recurse=False)
    if prefetch and torch.device(device).type == "cpu":
        _async_prefetch(model, units)
    elif prefetch:                                       # FSDP2's own, on its all-gather stream
        for prev, nxt in zip(units, units[1:]):
            prev.set_modules_to_forward_prefetch([nxt])
            nxt.set_modules_to_backward_prefetch([prev])
    return [*units, model]


def _async_prefetch(root: nn.Module, layers: list[FSDPModule]) -> None:
    """CPU prefetch: hooks start a unit's all-gather with `unshard(async_op=True)` (FSDP2 waits for it
    when the unit runs), only inside the root's forward: a checkpoint's recomputation in backward
    must not start a gather that the next step would consume after the optimizer changed the shards."""
    in_forward = [False]
    root.register_forward_pre_hook(lambda *_: in_forward.__setitem__(0, True))
    root.register_forward_hook(lambda *_: in_forward.__setitem__(0, False), always_call=True)

    def gather_next(nxt: FSDPModule):
        def hook(*_) -> None:          # returns None: a pre-hook's result would replace the inputs
            if in_forward[0]:
                nxt.unshard(async_op=True)
        return hook

    def gather_previous_in_backward(prev: FSDPModule):
        def hook(_module, _args, out) -> None:
            values = out.values() if isinstance(out, dict) else out if isinstance(out, (tuple, list)) else [out]
            needs_grad = [t for t in values if isinstance(t, torch.Tensor) and t.requires_grad]
            if in_forward[0] and torch.is_grad_enabled() and needs_grad:   # backward reaches this layer
                needs_grad[0].register_hook(lambda grad: (prev.unshard(async_op=True), grad)[1])
        return hook

    for prev, nxt in zip(layers, layers[1:]):
        prev.register_forward_pre_hook(gather_next(nxt))
        nxt.register_forward_hook(gather_previous_in_backward(prev))
