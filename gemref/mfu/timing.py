"""The one timed training step, and the one interleaving loop (docs/design.md, Measuring honestly).

`timed_step(fetch, run, device, count)` is how gemref times a training step, everywhere
(`gemref train`, the waterfall's windows, every bench that steps a model, the chapters):

    fetch()   the next batch (timed apart: the data wait)
    run(b)    the step (forward, backward, optimizer), under the step clock (`StepClock`): on
              CUDA two timing events on the stream, so the time is the device's and nothing
              waits for the device until the record is read (`defer`: later, by the caller)
    count(l)  the step's FLOPs from the batch's lengths (gemref.mfu.flops.step_flops),
              counted after the clock stopped

and returns a `StepRecord` (this rank's view of the step, base units), the step's result
(the detached loss) and the batch. With `op_classes=True` the step runs under the profiler
and the record carries its seconds per op class (gemref/mfu/op_classes.py, as recorded); a
profiled step's time includes the profiler's overhead, so it is never a timed step of a window
(gemref/mfu/op_profile.py pairs profiled steps with unprofiled ones to take that overhead out).

`interleaved(fns, rounds)` runs variants round-robin (round k of every variant before any
variant's round k+1; optionally alternating the order), so a slow phase of a shared machine
hits every variant alike. The benches compare kernels and models with it; the waterfall
runs its windows with it, re-running a round that a rank spent without its core.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator, Mapping, TypeVar

import torch

T = TypeVar("T")


@contextmanager
def stopwatch(device: torch.device | str) -> Iterator[list[float]]:
    """`with stopwatch(dev) as t: ...` then t[0] is the elapsed seconds (CUDA-synchronised)."""
    cuda = torch.device(device).type == "cuda"
    out: list[float] = []
    if cuda:
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    try:
        yield out
    finally:
        if cuda:
            torch.cuda.synchronize(device)
        out.append(time.perf_counter() - start)


@dataclass
class StepFlops:
    """FLOPs of one training step (gemref/mfu/flops.py `step_flops`)."""

    model: int          # the MFU numerator: 3 x forward matmul FLOPs over the real lengths
    executed: int       # what the kernels ran: padding, masked tiles and recompute included
    recompute: int      # of `executed`, what activation checkpointing reran


@dataclass
class StepRecord:
    """One rank's view of one training step (seconds, counts and FLOPs of this rank's part)."""

    wall_s: float              # fetching the batch + the step: this rank's share of the job's clock
    data_s: float              # of which blocked fetching the batch
    cpu_s: float               # the main thread's CPU seconds inside the step
    process_cpu_s: float       # every thread of the process, inside the step
    samples: int
    tokens: int                # real history events
    model_flops: int
    executed_flops: int
    recompute_flops: int
    op_seconds: dict[str, float] | None = None   # seconds by op class, when profiled

    @property
    def step_s(self) -> float:
        """The step alone (forward, backward, optimizer)."""
        return self.wall_s - self.data_s


def compute_seconds(r: StepRecord, world: int, device_type: str, threads: int) -> float | None:
    """This rank's compute in a step: on one rank the step's own time (nothing in it but
    compute); on one-thread CPU ranks the main thread's CPU time (a rank waiting for a peer
    sleeps); on GPU ranks the profiled compute kernels, so None here (gemref/mfu/meter.py)."""
    if world == 1:
        return r.step_s
    return r.cpu_s if device_type == "cpu" and threads == 1 else None


class StepClock:
    """A step's seconds. On CUDA two timing events on the current stream: recording them waits for
    nothing, and `seconds()` waits for the end event only (no device-wide synchronize), so the
    host can run ahead into the next step. Elsewhere the host's perf_counter around the step.
    `after`: the previous step's clock; on CUDA the device's idle gap between its end and this
    start (the data wait and host lag as the device saw them) is then `gap_s()`."""

    def __init__(self, device: torch.device | str, after: "StepClock | None" = None):
        self.cuda = torch.device(device).type == "cuda"
        self.after = after if after is not None and after.cuda == self.cuda else None
        self.elapsed: float | None = None

    def __enter__(self) -> "StepClock":
        if self.cuda:
            self.start, self.end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self.start.record()
        else:
            self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        if self.cuda:
            self.end.record()
        else:
            self.elapsed = time.perf_counter() - self.t0

    def seconds(self) -> float:
        if self.elapsed is None:
            self.end.synchronize()
            self.elapsed = self.start.elapsed_time(self.end) / 1e3
        return self.elapsed

    def gap_s(self) -> float | None:
        """Seconds the device idled between the previous step's end and this start (CUDA with
        `after`), else None."""
        if not self.cuda or self.after is None:
            return None
        self.end.synchronize()
        return self.after.end.elapsed_time(self.start) / 1e3


@dataclass
class PendingStep:
    """A timed step whose device time is not read yet (`resolve()` waits for its end event only)."""

    clock: StepClock
    data_s: float                 # host seconds blocked fetching the batch
    cpu_s: float
    process_cpu_s: float
    samples: int
    tokens: int
    flops: StepFlops
    op_seconds: dict[str, float] | None

    def resolve(self) -> StepRecord:
        step_s = self.clock.seconds()
        gap = self.clock.gap_s()
        data_s = self.data_s if gap is None else gap   # overlapped on a GPU: what the device waited
        return StepRecord(data_s + step_s, data_s, self.cpu_s, self.process_cpu_s, self.samples, self.tokens,
                          self.flops.model, self.flops.executed, self.flops.recompute, self.op_seconds)


def timed_step(fetch: Callable[[], object], run: Callable[[object], T], device: torch.device | str,
               count: Callable[[torch.Tensor], StepFlops], *, op_classes: bool = False, defer: bool = False,
               after: PendingStep | None = None) -> tuple[StepRecord | PendingStep, T, object]:
    """Fetch a batch, run the step on it under the step clock, count its FLOPs (module doc).
    Returns (record, run's result, batch). `defer`: the record is a PendingStep, read later, so
    nothing here waits for the device (the training loop reads step k after launching k + 1);
    `after`: the previous step's PendingStep, whose end this step's data wait is measured from
    on CUDA."""
    device = torch.device(device)
    t0 = time.perf_counter()
    batch = fetch()
    data_s = time.perf_counter() - t0
    profiler = None
    if op_classes:
        from .profile import quiet_profile
        profiler = quiet_profile(device.type)
        profiler.__enter__()
    try:
        cpu0, proc0 = time.thread_time(), time.process_time()
        with StepClock(device, after.clock if after is not None else None) as clock:
            out = run(batch)
        cpu_s, proc_s = time.thread_time() - cpu0, time.process_time() - proc0
    finally:
        if profiler is not None:
            profiler.__exit__(None, None, None)
    seconds = None
    if profiler is not None:
        from .op_classes import classify_cpu, classify_cuda
        events = profiler.events()
        seconds = classify_cuda(events) if device.type == "cuda" else classify_cpu(events).seconds
    pending = PendingStep(clock, data_s, cpu_s, proc_s, batch.batch_size, batch.num_tokens, count(batch.lengths),
                          seconds)
    return (pending if defer else pending.resolve()), out, batch


def interleaved(fns: Mapping[str, Callable[[int], T]], rounds: int, *, warmup: int = 0, alternate: bool = False,
                redo: Callable[[int, int, dict[str, T]], bool] | None = None) -> dict[str, list[T]]:
    """{variant: [fn(k) for each timed round k]}, the variants run round-robin.

    The first `warmup` rounds run the same way and are dropped (so round k of every variant
    always sees the same inputs). `alternate` reverses the order every other round (A B, B A:
    neither variant always runs right after the other). After each round, `redo(k, attempt,
    results)` may ask for it to run again (results of a redone round are dropped)."""
    if rounds < 0 or warmup < 0:
        raise ValueError(f"need rounds, warmup >= 0, got {rounds}, {warmup}")
    names = list(fns)
    out: dict[str, list[T]] = {name: [] for name in names}
    for k in range(warmup + rounds):
        attempt = 0
        while True:
            order = names[::-1] if alternate and k % 2 else names
            results = {name: fns[name](k) for name in order}
            if k < warmup or redo is None or not redo(k - warmup, attempt, results):
                break
            attempt += 1
        if k >= warmup:
            for name in names:
                out[name].append(results[name])
    return out
