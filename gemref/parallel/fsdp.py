"""Dense parallelism: FSDP2 (`fully_shard`) per GEMLayer and on the root, on the 2D mesh.

Each GEMLayer is one FSDP unit, the root unit holds what is left (dense input projection,
final norms, heads, and the embedding tables unless parallel/sparse.py shards them, in
which case they are `ignored_params`). A unit's parameters are stored as 1/S shards (dim 0,
padded to a multiple of S); around its forward and backward the unit all-gathers them,
after backward it reduce-scatters the gradients over "shard" and, on an RxS mesh with
R > 1 (HSDP), all-reduces the gradient shards over "replicate".

  * mixed precision: on CUDA parameters are all-gathered and computed in bf16, gradients
    reduced in fp32 (MixedPrecisionPolicy); on CPU everything stays fp32;
  * reshard_after_forward=True frees the gathered parameters after forward and gathers
    them again for backward (ZeRO-3: least memory, one more all-gather per unit);
    False keeps them until backward (ZeRO-2-like: less traffic, more memory). The root
    unit is never resharded after forward (its parameters are needed first in backward);
  * explicit prefetch: layer i's forward starts layer i+1's all-gather, layer i's
    backward starts layer i-1's, so the gathers overlap compute;
  * gradients are SUMMED over ranks (no division), so each rank's loss must be divided by
    the GLOBAL batch size (ranking_loss(..., normalizer=global batch)): then the gradient
    is the single-process gradient of the global batch, whatever the per-rank sample
    counts (load balancing gives ranks different counts). SUM-only reductions are also
    what NCCL's zero-copy path and gloo support.
The model code never sees any of this.
"""
from __future__ import annotations

import logging
from typing import Iterable

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

log = logging.getLogger(__name__)


def mixed_precision_policy(device: torch.device) -> MixedPrecisionPolicy:
    """bf16 parameters with fp32 gradient reduction on CUDA; plain fp32 on CPU."""
    if torch.device(device).type == "cuda":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


def dense_mesh(mesh: DeviceMesh) -> DeviceMesh:
    """The mesh FSDP gets: 1D "shard" when R = 1 (plain FSDP), the 2D mesh otherwise (HSDP)."""
    return mesh["shard"] if mesh.size(0) == 1 else mesh


def apply_fsdp(model: nn.Module, mesh: DeviceMesh, device: torch.device, *, reshard_after_forward: bool = True,
               ignored_params: Iterable[nn.Parameter] = (), prefetch: bool = True) -> list[FSDPModule]:
    """Shard `model.layers[i]` and then the root with fully_shard; return the FSDP units (root last)."""
    m = dense_mesh(mesh)
    policy = mixed_precision_policy(device)
    layers = list(model.layers)
    for layer in layers:
        fully_shard(layer, mesh=m, reshard_after_forward=reshard_after_forward, mp_policy=policy)
    # The root keeps fully_shard's default, which never reshards the root after forward
    # (torch 2.11-2.13); passing True would make it gather its parameters twice per step.
    root_kwargs = {} if reshard_after_forward else {"reshard_after_forward": False}
    fully_shard(model, mesh=m, mp_policy=policy, ignored_params=set(ignored_params), **root_kwargs)
    units: list[FSDPModule] = [*layers, model]
    for unit in units:
        unit.set_force_sum_reduction_for_comms(True)
        unit.set_gradient_divide_factor(1.0)
    if prefetch and torch.device(device).type == "cpu":
        _async_unshard(units)
    if prefetch:
        for i, layer in enumerate(layers):
            if i + 1 < len(layers):
                layer.set_modules_to_forward_prefetch([layers[i + 1]])
            if i > 0:
                layer.set_modules_to_backward_prefetch([layers[i - 1]])
    return units


def _async_unshard(units: list[FSDPModule]) -> None:
    """On CPU there are no streams: FSDP2 waits for every all-gather right after issuing it,
    so a prefetch overlaps nothing. Issuing unshards asynchronously (FSDP2's own
    `unshard_async_op` switch, which has no public setter in torch 2.11-2.13) lets the
    gloo thread gather layer i+1 while this thread computes layer i. Skipped, with a log
    line, if this torch has no such attribute."""
    for unit in units:
        groups = getattr(unit._get_fsdp_state(), "_fsdp_param_groups", None)
        if groups is None or not all(hasattr(g, "unshard_async_op") for g in groups):
            log.info("FSDP2 of torch %s has no unshard_async_op: CPU prefetch will not overlap", torch.__version__)
            return
        for group in groups:
            group.unshard_async_op = True


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
