"""One training step, in pieces: the loss of a batch, its gradients, one optimiser update.

The training loop (gemref/train/, which re-exports these names), the activation profiler
behind AutoAC (gemref/autoac/profile.py) and the benches (gemref/bench/, gemref/measure/)
all step a model with these functions, so a bench times the step that training runs. They
take the pieces of a step (model, optimizer, batch, autocast dtype, hooks) rather than a
run's `train.Setup`, so a bench can step models that `train.setup` did not build. The module sits below both
train/ and autoac/ (train/ imports the profiler, so the step cannot live in train/).

No host sync anywhere: the loss comes back detached, on the device, and `nonfinite` returns
an on-device flag that the caller reads where it synchronises anyway; a loop that finds it
set raises `NonFiniteError`.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Callable

import torch
from torch import Tensor, nn
from torch.profiler import record_function

from .compile import loss_function
from .data.jagged import JaggedBatch

Hook = Callable[[nn.Module], None]


def forward_loss(model: nn.Module, batch: JaggedBatch, autocast_dtype: torch.dtype | None = None,
                 normalizer: int | None = None) -> Tensor:
    """The training forward: logits under autocast (if `autocast_dtype`), then the loss in fp32
    (the compiled loss region when the model is compiled). `normalizer` divides the summed
    loss: `gemref.balance.loss_divisor` of the global batch when ranks hold parts of it (None:
    this batch's size)."""
    device_type = batch.values.device.type
    with torch.autocast(device_type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
        logits = model(batch)
    with record_function("loss"):
        return loss_function(model)(logits, batch.labels, normalizer)


def backward(model: nn.Module, loss: Tensor, finish_backward: Hook | None = None) -> None:
    """loss.backward(), then `finish_backward(model)`: the gradient syncs the model's wrappers do
    not do themselves (e.g. sharded tables' replicas, gemref/parallel/parallelize.py)."""
    with record_function("backward"):
        loss.backward()
    if finish_backward is not None:
        finish_backward(model)


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, batch: JaggedBatch, *,
               autocast_dtype: torch.dtype | None = None, normalizer: int | None = None,
               finish_backward: Hook | None = None, after_optimizer_step: Hook | None = None) -> Tensor:
    """One optimisation step: zero the gradients, forward, backward, optimizer step, then
    `after_optimizer_step(model)` (e.g. float8 weight-scale precompute). Returns the detached
    loss, on the device. The gradients stay in place until the next step zeroes them."""
    optimizer.zero_grad(set_to_none=True)
    loss = forward_loss(model, batch, autocast_dtype, normalizer)
    backward(model, loss, finish_backward)
    with record_function("optimizer"):
        optimizer.step()
        if after_optimizer_step is not None:
            after_optimizer_step(model)
    return loss.detach()


def nonfinite(loss: Tensor, model: nn.Module) -> Tensor:
    """On-device 0-d float: 1.0 when `loss` or any gradient this process holds (its local shard
    under FSDP) contains a NaN or an infinity, else 0.0. Gradients are read through their
    max-abs norm, which cannot overflow, so a large finite gradient is not flagged."""
    local = [p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
             for p in model.parameters() if p.grad is not None]
    grads = [g for g in local if g.numel()]          # an FSDP rank may hold an empty shard
    worst = torch.stack([n.float() for n in torch._foreach_norm(grads, float("inf"))]) if grads \
        else loss.new_zeros(1, dtype=torch.float32)
    finite = torch.isfinite(loss.float()).all() & torch.isfinite(worst).all()
    return (~finite).float()


class NonFiniteError(ValueError):
    """A training step produced a NaN/inf loss or gradient. `step`: that step (1-based, as
    checkpoints count); `checkpoint`: the newest checkpoint of a good state, or None."""

    def __init__(self, step: int, loss: float, checkpoint: Path | None, checkpointing: bool):
        self.step, self.loss, self.checkpoint = step, loss, checkpoint
        what = "gradient" if math.isfinite(loss) else "loss"
        if checkpoint is not None:
            last = f"the last good state is checkpoint {checkpoint}"
        else:
            last = "no checkpoint of a good state exists" + (
                "" if checkpointing else " (checkpointing is off: set checkpoint_dir and checkpoint_every)")
        super().__init__(f"training step {step} produced a non-finite {what} (loss {loss:g}); "
                         f"stopped without saving it: {last}")
