"""Dense parallelism (chapter 07_fsdp_2d): FSDP2 `fully_shard` per named layer and on the root.

`apply_fsdp(model, mesh, layers, device)` works on any module tree: each module named in
`layers` (fully qualified names, forward order; GEMRef passes "layers.0", "layers.1", ...) is
one FSDP unit, the root unit holds the rest; every ShardedEmbedding in the model keeps its own
sharding (parallel/sparse.py) and stays out of FSDP. A unit's parameters are stored as 1/S
shards (dim 0 padded to a multiple of S), all-gathered around its forward and backward; its
gradients are reduce-scattered over "shard" and, with R > 1 (HSDP), all-reduced over "replicate".

  * mixed precision follows the run (`param_dtype`, the dtype its GEMMs compute in): None or
    fp32 gathers and computes fp32 parameters; bf16 gathers them in bf16 and reduces gradients
    in fp32 (MixedPrecisionPolicy); the sharded parameters and the optimizer stay fp32 either way;
  * reshard_after_forward=True frees gathered parameters after forward and gathers them
    again for backward (ZeRO-3: least memory, one more all-gather per unit); False keeps
    them (ZeRO-2-like). The root unit is never resharded after forward;
  * prefetch: layer i's forward starts layer i+1's all-gather, layer i's backward starts
    layer i-1's. On CUDA FSDP2's `set_modules_to_forward_prefetch` / `..._backward_prefetch`
    (its all-gather stream overlaps compute). On CPU, with no streams, FSDP2 would wait for a
    prefetched gather right after issuing it, so hooks issue it with the public
    `FSDPModule.unshard(async_op=True)`: gloo's thread gathers layer i+1 while this thread
    computes layer i, FSDP2 waits for it at layer i+1 (chapter 08_communication measures the
    overlap). Only inside the root's forward: a checkpoint's recomputation in backward must
    not start a gather that the next step would consume after the optimizer changed the shards;
  * parameters a rank leaves unused (data-dependent control flow, a rank with no samples)
    join the reduce-scatter with zero gradients (`set_reduce_scatter_unused_params`), so every
    rank reduces the same buffers (without it: a collective size mismatch);
  * gradients are SUMMED over ranks (no division): each rank divides its summed loss by the
    GLOBAL batch size, so the gradient is the one-process gradient of the global batch,
    whatever the per-rank sample counts. SUM-only reductions are also what gloo supports.
Sizes are in elements (padded_numel). The model code never sees any of this.
"""
from __future__ import annotations

from typing import Iterable, Sequence

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

from .sparse import ShardedEmbedding


def mixed_precision_policy(param_dtype: torch.dtype | None = None) -> MixedPrecisionPolicy:
    """FSDP2's policy for a run whose GEMMs compute in `param_dtype`: None or fp32, parameters
    gathered in fp32 (no mixed precision); bf16 or fp16, gathered in it and gradients reduced in
    fp32 (ValueError for a dtype that is not floating point)."""
    if param_dtype is None or param_dtype == torch.float32:
        return MixedPrecisionPolicy()
    if not isinstance(param_dtype, torch.dtype) or not param_dtype.is_floating_point:
        raise ValueError(f"param_dtype must be a floating-point torch.dtype (the GEMMs' dtype), got {param_dtype!r}")
    return MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)


def dense_mesh(mesh: DeviceMesh) -> DeviceMesh:
    """The mesh FSDP gets: 1D "shard" when R = 1 (plain FSDP), the 2D mesh otherwise (HSDP)."""
    return mesh["shard"] if mesh.size(0) == 1 else mesh


def find_layers(model: nn.Module, layers: Sequence[str]) -> list[nn.Module]:
    """The modules named in `layers`; ValueError naming any that is missing, the root, or repeated."""
    if not layers:
        raise ValueError(f"apply_fsdp needs the names of the layers of {type(model).__name__} to shard as units "
                         f"(got none)")
    if len(set(layers)) != len(layers) or "" in layers:
        raise ValueError(f"layers {list(layers)}: each must name a submodule once (the root is always a unit)")
    found = []
    for name in layers:
        try:
            found.append(model.get_submodule(name))
        except AttributeError:
            raise ValueError(f"layer {name!r}: no such module in {type(model).__name__}") from None
    return found


def apply_fsdp(model: nn.Module, mesh: DeviceMesh, layers: Sequence[str], device: torch.device, *,
               reshard_after_forward: bool = True, ignored_params: Iterable[nn.Parameter] = (),
               prefetch: bool = True, param_dtype: torch.dtype | None = None) -> list[FSDPModule]:
    """fully_shard each module named in `layers`, then the root; return the FSDP units (root last).
    `layers`: fully qualified names, in forward order, each run once per forward (prefetch
    gathers the next one early). The parameters of every ShardedEmbedding in the model, and
    `ignored_params` (e.g. tables another library shards), stay out of FSDP. `param_dtype`: the
    dtype the run's GEMMs compute in (`mixed_precision_policy`; None: fp32)."""
    units = find_layers(model, layers)
    m = dense_mesh(mesh)
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
        if hasattr(unit, "set_reduce_scatter_unused_params"):   # torch 2.13 has it (module doc)
            unit.set_reduce_scatter_unused_params(True, recurse=False)
    if prefetch and torch.device(device).type == "cpu":
        _async_prefetch(model, units)
    elif prefetch:
        for i, layer in enumerate(units):
            if i + 1 < len(units):
                layer.set_modules_to_forward_prefetch([units[i + 1]])
            if i > 0:
                layer.set_modules_to_backward_prefetch([units[i - 1]])
    return [*units, model]


def _async_prefetch(root: nn.Module, layers: list[FSDPModule]) -> None:
    """CPU prefetch through public APIs (module doc): hooks that start a unit's all-gather with
    `unshard(async_op=True)` (FSDP2 waits for it when the unit runs), only inside the root's forward."""
    in_forward = [False]
    root.register_forward_pre_hook(lambda *_: in_forward.__setitem__(0, True))
    root.register_forward_hook(lambda *_: in_forward.__setitem__(0, False), always_call=True)

    def forward_prefetch(nxt: FSDPModule):
        def hook(*_) -> None:          # returns None: a pre-hook's result would replace the inputs
            if in_forward[0]:
                nxt.unshard(async_op=True)
        return hook

    def backward_prefetch(prev: FSDPModule):
        def hook(_module, _args, out) -> None:
            values = out.values() if isinstance(out, dict) else out if isinstance(out, (tuple, list)) else [out]
            needs_grad = [t for t in values if isinstance(t, torch.Tensor) and t.requires_grad]
            if in_forward[0] and torch.is_grad_enabled() and needs_grad:   # backward reaches this layer
                needs_grad[0].register_hook(lambda grad: (prev.unshard(async_op=True), grad)[1])
        return hook

    for i, layer in enumerate(layers):
        if i + 1 < len(layers):
            layer.register_forward_pre_hook(forward_prefetch(layers[i + 1]))
        if i > 0:
            layer.register_forward_hook(backward_prefetch(layers[i - 1]))


def padded_numel(shape: torch.Size | tuple[int, ...], shards: int) -> int:
    """Elements of a parameter once FSDP pads its dim 0 to a multiple of `shards`."""
    if not shape:
        return shards
    rest = 1
    for n in shape[1:]:
        rest *= n
    return -(-shape[0] // shards) * shards * rest


def reshard_all(model: nn.Module) -> None:
    """Free every gathered parameter (as after a training step's backward).

    A no-grad forward (evaluation) leaves the root unit gathered; measuring a step after
    it would miss the root's all-gather.
    """
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()
