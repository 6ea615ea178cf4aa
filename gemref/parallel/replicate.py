"""Replicated data parallelism (mesh Rx1, tables not sharded): DDP's bucketed gradient all-reduce,
overlapped with the backward.

Every rank holds the whole model; after backward each gradient must be summed over the R
ranks. FSDP2 on an Rx1 mesh would do it unit by unit, and on CPU (no streams) each unit's
all-reduce blocks the backward until it is done. DDP's reducer instead packs gradients into
buckets of about BUCKET_MB in reverse order of registration (the order backward produces
them) and starts each bucket's all-reduce as soon as its last gradient is ready, without
waiting (gloo runs it on its own threads): the collective of layer L's bucket travels while
layer L-1's backward computes, and the step waits only for what is still in flight at the end
(`torch.distributed._composable.replicate`: DDP applied in place, so parameter names, the
model's attributes and its state_dict stay as they are).

Gradients are SUMMED (a comm hook replaces DDP's average), as everywhere in gemref: each
rank's loss is divided by the global batch size, so the summed gradient is the
single-process gradient of the global batch (docs/design.md; gemref/parallel/fsdp.py says the
same of FSDP). The embedding tables' gradients are produced last (their lookup is the first op
of the forward), so their bucket cannot overlap the backward: it is most of what stays exposed.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

BUCKET_MB = 4        # DDP's default is 25: smaller buckets start sooner on a small model


def _sum_hook(group, bucket):   # no annotations: DDP checks them literally (not as postponed strings)
    """All-reduce (SUM) one dist.GradBucket, asynchronously; DDP waits for the future at the end."""
    work = dist.all_reduce(bucket.buffer(), group=group, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


def apply_replicate(model: nn.Module, mesh: DeviceMesh, bucket_mb: float = BUCKET_MB,
                    ignored_modules=()) -> None:
    """DDP in place over the mesh's "replicate" dim, gradients summed (module doc); `ignored_modules`
    keep their parameters out of it."""
    from torch.distributed._composable.replicate import replicate

    group = mesh.get_group("replicate")
    replicate(model, ignored_modules=list(ignored_modules) or None, process_group=group, bucket_cap_mb=bucket_mb,
              gradient_as_bucket_view=True)
    model.register_comm_hook(group, _sum_hook)


def all_reduce_grads(model: nn.Module) -> None:
    """Sum the gradients over the ranks in one flat buffer (replicated data parallelism, as DDP
    without buckets, nothing overlapped), written back so every rank steps the same model."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    flat = torch.cat([g.flatten() for g in grads])
    dist.all_reduce(flat)
    torch._foreach_copy_(grads, [g.view_as(p) for g, p in zip(flat.split([g.numel() for g in grads]), grads)])
