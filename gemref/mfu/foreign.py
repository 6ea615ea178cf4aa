"""gemref's meter on a model it did not define: model FLOPs, peak, MFU and op classes of any
nn.Module's training step (chapter 13; the model need not be a GEMRef nor have a ModelConfig).

`measure(model, loss_fn, batches, optimizer, lengths_of=...)` runs one training step per batch
(`loss_fn(model, batch).backward()`, then `optimizer.step()` in an "optimizer" region) through
gemref's one step timer (timing.py `timed_step`) and returns a `ForeignRecord`:
  * model FLOPs per step = 3 x the forward's FLOPs as torch's FlopCounterMode counts them on the
    batch as it is (its REAL lengths; PaLM's backward = 2 x forward, docs/design.md), counted
    after the step, outside the clock, with every `gemref.attention.gdpa` call counted on its
    REAL lengths, whatever kernel ran: the meter opens `counting_attention()` around that
    forward, each gdpa call notes 4HD FLOPs per (query, key) pair its mask allows
    (gemref/attention/flops.py attention_model_flops) and runs its kernel in a region whose
    FlopCounterMode count (the kernel's executed ops: the padded rectangle of "reference", the
    padded buckets of "sdpa" on CPU, the tiles of cpu_jagged / cpu_fused) is set aside. So the
    padding of a gdpa kernel is never model work. Everything else counts as it ran: the user's
    own matmuls, an attention the user wrote without gdpa (its padding or full L^2 included:
    the meter cannot tell a pad row from a real one there), a batch the user padded.
  * executed FLOPs per step = FlopCounterMode over one forward + backward (the kernels' own
    formulas: padding, masked tiles, recompute included), also outside the clock; gradients it
    leaves are cleared. The record's `waste_flops_per_step` = executed - model.
  * the peak (peak.py `peak_flops`), and MFU, local MFU and scaling from meter.py `figures`:
    one process, so local MFU divides by the steps' own time and scaling = compute / wall.
  * seconds per op class (op_classes.py) of one more step run under the profiler; what no op
    accounts for (Python, gaps) goes to "other", so the classes sum to that profiled step.

gemref's switches on such a model (tests/test_foreign_model.py, chapter 13):
  * jagged attention: the model calls `gemref.attention.gdpa` on a KeyedJaggedTensor's
    JaggedTensor values/offsets (gemref/interop/example_model.py);
  * torch.compile of regions: gemref/compile/apply.py `compile_model(model, ["stack.*", "head"])`
    compiles the model's regions by name (module names, `module.method`, or a method of the model
    itself such as "mix"; patterns per segment; dim 0 dynamic: gemref/compile/regions.py). A region
    first called under FlopCounterMode is never compiled after it (torch 2.13: dynamo gives up on
    the frame), so `measure` counts a step's FLOPs after it ran; a compiled region that calls gdpa
    is counted the same as eager (tests/test_foreign_model.py).
  * AutoAC: gemref/autoac takes the module paths the caller names and a closure that returns
    the loss (`profile_blocks(model, ["head"], step)`, `solve`, `apply_plan`), so it applies to
    a foreign model's own modules.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Callable, Iterable

import torch
from torch import nn
from torch.autograd.profiler import record_function
from torch.utils.flop_counter import FlopCounterMode

from ..attention import counting_attention
from .flops import count_with_flop_counter
from .meter import Figures, figures
from .peak import Peak, peak_flops
from .timing import StepFlops, StepRecord, timed_step

@dataclass
class StepCount:
    """One training step's FLOPs on one batch (module doc): model = 3 x the forward's counted
    FLOPs with gdpa's attention on the real lengths; `attention_model` and `attention_set_aside`
    are the forward's gdpa share (model FLOPs noted, kernel ops set aside; x3 like the rest)."""

    model: int
    attention_model: int
    attention_set_aside: int
    gdpa_calls: int


def count_step(model: nn.Module, loss_fn: Callable, batch) -> StepCount:
    """Model FLOPs of one training step on `batch`, with what gdpa noted (module doc)."""
    with torch.no_grad(), counting_attention() as attention, FlopCounterMode(display=False) as counter:
        loss_fn(model, batch)
    forward = int(counter.get_total_flops()) - attention.set_aside_flops + attention.model_flops
    return StepCount(3 * forward, 3 * attention.model_flops, 3 * attention.set_aside_flops, attention.calls)


def count_model_flops(model: nn.Module, loss_fn: Callable, batch) -> int:
    """Model FLOPs of one training step on `batch`: 3 x the forward's (module doc)."""
    return count_step(model, loss_fn, batch).model


def count_executed_flops(model: nn.Module, loss_fn: Callable, batch) -> int:
    """FLOPs the kernels ran in one forward + backward on `batch` (their own formulas)."""
    executed = count_with_flop_counter(lambda: loss_fn(model, batch).backward())
    model.zero_grad(set_to_none=True)
    return executed


@dataclass
class _Batch:
    """What timed_step reads of a batch: the user's batch, its lengths, samples and tokens."""

    inputs: object
    lengths: torch.Tensor

    @property
    def batch_size(self) -> int:
        return self.lengths.numel()

    @property
    def num_tokens(self) -> int:
        return int(self.lengths.sum())


@dataclass
class ForeignRecord:
    """What `measure` found (seconds, FLOPs, FLOP/s; one process)."""

    steps: list[StepRecord]            # the timed steps (warm-up excluded), in order
    figures: Figures                   # meter.py: mfu (E2E), local_mfu, scaling_ratio, hfu, ...
    peak: Peak                         # one device's peak FLOP/s and where it comes from
    model_flops_per_step: float        # median over the timed steps
    executed_flops_per_step: float
    op_seconds: dict[str, float]       # the profiled step by op class; sums to profiled_step_s
    profiled_step_s: float             # that step's time (profiler overhead included)
    losses: list[float]

    @property
    def mfu(self) -> float | None:
        return self.figures["mfu"]

    @property
    def waste_flops_per_step(self) -> float:
        """Executed minus model FLOPs (median step): padding, masked tiles, recompute."""
        return self.executed_flops_per_step - self.model_flops_per_step


def measure(model: nn.Module, loss_fn: Callable[[nn.Module, object], torch.Tensor], batches: Iterable,
            optimizer: torch.optim.Optimizer, *, lengths_of: Callable[[object], torch.Tensor],
            device: torch.device | str = "cpu", dtype: str = "fp32", warmup: int = 1,
            peak: Peak | None = None) -> ForeignRecord:
    """Train `model` one step per batch and meter it (module doc). `lengths_of(batch)`: (B,) real
    history lengths (the record's samples and tokens). The first `warmup` steps are left out of
    the figures; the last batch trains once more, under the profiler. `dtype`: the peak's
    ("fp32" or "bf16"); `peak` overrides the lookup (FLOP/s)."""
    device = torch.device(device)
    peak = peak if peak is not None else peak_flops(device, dtype)

    def run(b: _Batch) -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model, b.inputs)
        loss.backward()
        with record_function("optimizer"):
            optimizer.step()
        return loss.detach()

    steps, losses, last = [], [], None
    for batch in batches:
        last = _Batch(batch, torch.as_tensor(lengths_of(batch), dtype=torch.int64).cpu())
        record, loss, _ = timed_step(lambda: last, run, device, lambda _: StepFlops(
            count_model_flops(model, loss_fn, batch), count_executed_flops(model, loss_fn, batch), 0))
        steps.append(record)
        losses.append(float(loss))
    if len(steps) <= warmup:
        raise ValueError(f"{len(steps)} batch(es) for warmup={warmup}: give at least {warmup + 1}")
    profiled, _, _ = timed_step(lambda: last, run, device, lambda _: StepFlops(0, 0, 0), op_classes=True)
    ops = dict(profiled.op_seconds)
    ops["other"] += max(0.0, profiled.step_s - sum(ops.values()))
    timed = steps[warmup:]
    return ForeignRecord(timed, figures([timed], peak.flops, device_type=device.type,
                                        threads=torch.get_num_threads()), peak,
                         statistics.median(s.model_flops for s in timed),
                         statistics.median(s.executed_flops for s in timed), ops, profiled.step_s, losses)
