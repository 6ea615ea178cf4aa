"""Replicated data parallelism (mesh Rx1, tables not sharded): DDP's bucketed all-reduce, overlapped.

Every rank holds the whole model. DDP's reducer packs gradients into buckets of about BUCKET_MB in
the order backward produces them and starts each bucket's all-reduce as soon as it is full (gloo on
its own threads), so layer L's bucket travels while layer L-1's backward computes; FSDP2 on an Rx1
mesh would instead block the CPU backward unit by unit. `torch.distributed._composable.replicate`
applies DDP in place (parameter names and state_dict unchanged). Gradients are SUMMED (a comm
hook), as everywhere in gemref: the loss is divided by the global batch size (fsdp.py). The tables'
bucket comes last (their lookup is the forward's first op): most of what stays exposed.
"""
from __future__ import annotations

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
    """DDP in place over the mesh's "replicate" dim, gradients summed; `ignored_modules` stay out of it."""
    from torch.distributed._composable.replicate import replicate

    group = mesh.get_group("replicate")
    replicate(model, ignored_modules=list(ignored_modules) or None, process_group=group, bucket_cap_mb=bucket_mb,
              gradient_as_bucket_view=True)
    model.register_comm_hook(group, _sum_hook)
