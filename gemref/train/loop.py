"""The training loop, top to bottom: set up (compose.py applies the rungs), resume, step, evaluate,
report tokens/s and MFU. Nothing here measures for a report: the run record, the communication
and memory measurements and the profilers attach from the lab through `LoopHooks`
(gemref/measure/run.py's `run` is the loop plus its record).

    s = setup("small", train)             # model with every rung applied, AdamW, data, sampler
    result = train(s)                     # steps, evaluations, every rank's step records, MFU

Each step is launched (`launch_step`: the step clock, gemref/mfu/timing.py `timed_step`, on CUDA
two timing events; then the on-device (loss, non-finite flag)) and read back (`finish_step`: one
read of the pair, the step's end event). Nothing inside a step waits for the device: on CUDA the
loop reads step k after launching k + 1 (`overlap`), and tests/test_host_syncs.py counts the
step's syncs. A NaN/inf loss or gradient stops the run (`NonFiniteError`, naming the step and the
newest checkpoint of a good state; a bad state is never saved).

Several ranks (gemref/parallel/parallelize.py): batch_size is the global batch, each rank takes its
part, losses are divided by the global batch size and gradients summed, so a step equals the
single-process step on the global batch; the ranks all-reduce (loss, flag) every step, so all
stop at the same step. After the loop every rank's step records reach every rank, and the
summary is gemref/mfu/meter.py's: E2E MFU = local MFU x scaling ratio.
"""
from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from typing import Iterator, Sequence

import torch
import torch.distributed as dist
from torch import Tensor
from tqdm import tqdm

from ..data.jagged import JaggedBatch
from ..data.loader import make_loader
from ..data.sampler import StepBatches
from ..errors import UsageError
from ..mfu.meter import MeterSummary, run_peak, summary
from ..mfu.peak import Peak
from ..mfu.timing import PendingStep, StepRecord
from ..model.gem import TASKS, ranking_loss
from ..step import NonFiniteError, nonfinite
from .compose import Setup
from .config import TrainConfig, switch_values
from .metrics import EvalResult, normalized_entropy, roc_auc
from .presets import Preset

log = logging.getLogger(__name__)


@dataclass
class StepResult:
    """One training step as the loop sees it (this rank's view; loss and flag are global)."""

    step: int                 # steps completed with this one (1-based, as checkpoints count)
    loss: float               # the global batch's loss
    nonfinite: bool           # the loss or a gradient held a NaN/inf, on some rank
    work: StepRecord          # this rank's seconds, data wait, CPU, samples, tokens, FLOPs


@dataclass
class TrainResult:
    """What `train` returns: every step, every evaluation, and the MFU summary over the timed steps."""

    start_step: int                       # > 0 when resumed from a checkpoint
    warmup_steps: int                     # leading steps left out of the summary
    steps: list[StepResult]               # this rank's, from start_step + 1
    evals: list[EvalResult]               # the last one after the final step
    ranks: list[list[StepRecord]]         # every rank's step records (one list in one process)
    peak: Peak                            # the peak the MFU divides by (the GEMMs' dtype)
    summary: MeterSummary                 # tokens/s, E2E and local MFU, scaling ratio (gemref/mfu/meter.py)


class LoopHooks:
    """Where the lab attaches to the loop (records, profilers, comm measurement); no-ops here."""

    def on_start(self, s: Setup, start_step: int) -> None:
        """Before the first step (after resuming)."""

    def on_step(self, s: Setup, result: StepResult) -> None:
        """After each finite step."""

    def on_end(self, s: Setup, result: TrainResult) -> None:
        """After the final evaluation; the model is still as trained."""


@torch.no_grad()
def evaluate(s: Setup, batches: int, step: int) -> EvalResult:
    """NE and AUC per task on the first `batches` eval batches (deterministic order), after `step` steps."""
    s.model.eval()
    loader = make_loader(s.eval_set, s.train.batch_size, shuffle=False, drop_last=False)
    logits, labels = [], []
    for i, batch in enumerate(loader):
        if i == batches:
            break
        batch = batch.to(s.device)
        with s.precision.autocast():
            logits.append(s.model(batch).float().cpu())
        labels.append(batch.labels.cpu())
    s.model.train()
    logits_t, labels_t = torch.cat(logits), torch.cat(labels)
    out = {"step": step, "eval_samples": labels_t.shape[0], "eval_loss": float(ranking_loss(logits_t, labels_t))}
    for t, task in enumerate(TASKS):
        out[f"ne_{task}"] = normalized_entropy(logits_t[:, t], labels_t[:, t])
        out[f"auc_{task}"] = roc_auc(logits_t[:, t], labels_t[:, t])
    return out


# TrainConfig fields that change the trajectory; steps, evaluation, timing and the switches that
# change how (not what) the model computes are not part of a run's identity.
# table_lr counts only for row-wise tables (adamw tables train at lr), so an adamw run's identity
# is what it was before table_lr existed.
TRAJECTORY_FIELDS = ("batch_size", "lr", "weight_decay", "seed", "precision", "precision_min_dim", "table_optimizer",
                     "table_sync_interval", "table_lr")


def run_description(preset: Preset, train: TrainConfig) -> dict:
    """The loop's part of a run's identity in its checkpoints (gemref/checkpoint/dcp.py `run`):
    preset name, model and data configs, trajectory fields, as JSON values."""
    desc = {"preset": preset.name, "model": asdict(preset.model), "data": asdict(preset.data),
            "train": {name: switch_values(train)[name] for name in TRAJECTORY_FIELDS
                      if name != "table_lr" or train.parallelism.table_optimizer != "adamw"}}
    return json.loads(json.dumps(desc))


def resume_step(s: Setup) -> int:
    """The step to start from: when resuming, that of the newest complete checkpoint (verified
    against this run before anything is unpickled); else 0, after claiming the checkpoint
    folder for this run (a folder another run owns is refused before any training)."""
    tc = s.train
    if not (tc.checkpoint.every or tc.checkpoint.resume):
        return 0
    from ..checkpoint import start_from_checkpoint   # checkpoints: loaded only by a run that keeps them
    step = start_from_checkpoint(tc.checkpoint.folder, s.model, s.optimizer, global_batch=tc.batch_size,
                                 seed=tc.seed, resume=tc.checkpoint.resume, run=run_description(s.preset, tc),
                                 overwrite=tc.checkpoint.overwrite)
    if step >= tc.steps:
        raise UsageError(f"{tc.checkpoint.folder} is at step {step}, which is not below steps={tc.steps}: "
                         "nothing to train")
    return step


@dataclass
class LaunchedStep:
    """A step whose work is queued on the device, not read back yet (`finish_step` reads it)."""

    step: int
    work: PendingStep
    health: Tensor            # on the device: (loss, non-finite flag), all-reduced over the ranks


def launch_step(s: Setup, batches: Iterator[JaggedBatch], step: int, after: LaunchedStep | None = None) -> LaunchedStep:
    """Training step `step` (1-based) on the next batch, queued under the step clock (Setup.timed_step,
    deferred): nothing here waits for the device. `after`: the step launched before it."""
    work, loss, _ = s.timed_step(lambda: next(batches), defer=True, after=after.work if after else None)
    health = torch.stack([loss.float(), nonfinite(loss, s.model)])
    if s.parallel:
        dist.all_reduce(health)           # the global loss (parts divided by the global batch); flagged ranks
    return LaunchedStep(step, work, health)


def finish_step(launched: LaunchedStep) -> StepResult:
    """Read a launched step back: its time (waits for its end event only) and its (loss, flag)."""
    loss_value, flagged = launched.health.tolist()
    return StepResult(launched.step, loss_value, flagged > 0, launched.work.resolve())


def measure_step(s: Setup, batches: Iterator[JaggedBatch], step: int) -> StepResult:
    """Training step `step` (1-based) on the next batch, timed (Setup.timed_step), then checked.

    Not timed as the step: the FLOP count, the non-finite check and, with several ranks, the
    all-reduce of (loss, flag)."""
    return finish_step(launch_step(s, batches, step))


def every_rank(s: Setup, records: list[StepRecord]) -> list[list[StepRecord]]:
    """Every rank's step records (one all-gather after the loop; [records] in one process)."""
    if s.parallel is None:
        return [records]
    return [[StepRecord(**r) for r in rank] for rank in s.parallel.gather([asdict(r) for r in records])]


def train(s: Setup, *, hooks: Sequence[LoopHooks] = (), progress: bool = True,
          overlap: bool | None = None) -> TrainResult:
    """Train `s` from its newest checkpoint (or step 0) to `s.train.steps`, evaluating every
    `eval_every` steps and after the last; return the steps and the MFU summary (warm-up excluded).
    Raises NonFiniteError at the first step whose loss or gradient is NaN/inf.

    `overlap` (default: on CUDA): step k is read back (its time, loss and flag; the hooks'
    on_step) after step k + 1 is launched, so the host fetches and launches while the device
    computes. A step that is checkpointed or evaluated, and the last, are read back before the
    next starts, so no state past a bad step is ever saved or evaluated."""
    tc = s.train
    start = resume_step(s)
    warmup = max(0, min(tc.warmup_steps, tc.steps - start - 1))   # at least one timed step
    if warmup < tc.warmup_steps and s.rank == 0:
        log.warning("timing after %d warm-up step(s), not warmup_steps=%d: this run has %d step(s) to time",
                    warmup, tc.warmup_steps, tc.steps - start)
    peak = run_peak(s.device, s.precision.precision, s.rank, s.precision.is_emulated)
    batches = iter(make_loader(s.train_set, batch_sampler=StepBatches(s.sampler, start),
                               num_workers=tc.num_workers, device=s.device))
    if tc.checkpoint.every or start:   # checkpoints: loaded only by a run that keeps them
        from ..checkpoint import checkpoint_path, save_checkpoint
    good = checkpoint_path(tc.checkpoint.folder, start) if start else None   # newest checkpoint of a good state
    for hook in hooks:
        hook.on_start(s, start)
    steps: list[StepResult] = []
    evals: list[EvalResult] = []
    bar = tqdm(range(start + 1, tc.steps + 1), desc=f"train {s.preset.name}", unit="step",
               disable=not progress or s.rank != 0)

    def finish(launched: LaunchedStep) -> None:
        nonlocal good
        result = finish_step(launched)
        if result.nonfinite:
            raise NonFiniteError(result.step, result.loss, good, bool(tc.checkpoint.folder and tc.checkpoint.every))
        steps.append(result)
        for hook in hooks:
            hook.on_step(s, result)
        bar.set_postfix(loss=f"{result.loss:.4f}", tokens_per_s=f"{result.work.tokens / result.work.step_s:,.0f}")
        if tc.checkpoint.every and result.step % tc.checkpoint.every == 0:
            good = save_checkpoint(tc.checkpoint.folder, result.step, s.model, s.optimizer, global_batch=tc.batch_size,
                                   seed=tc.seed, run=run_description(s.preset, tc))
        if tc.eval_every and result.step % tc.eval_every == 0 and result.step < tc.steps:
            evals.append(evaluate(s, tc.eval_batches, result.step))

    overlap = s.device.type == "cuda" if overlap is None else overlap
    queued: LaunchedStep | None = None     # launched, not read back: the device runs it while the host goes on
    for step in bar:
        launched = launch_step(s, batches, step, after=queued)
        if queued is not None:
            finish(queued)
        # a step whose state is saved or evaluated, and the last, are read back before the next changes the model
        must_read = not overlap or step == tc.steps or bool(tc.checkpoint.every and step % tc.checkpoint.every == 0) \
            or bool(tc.eval_every and step % tc.eval_every == 0)
        queued = None if must_read else launched
        if must_read:
            finish(launched)
    evals.append(evaluate(s, tc.eval_batches, tc.steps))
    ranks = every_rank(s, [r.work for r in steps])
    meter = summary(ranks, peak, warmup, device_type=s.device.type, threads=torch.get_num_threads())
    result = TrainResult(start, warmup, steps, evals, ranks, peak, meter)
    if s.rank == 0:
        mfu = meter["mfu"]
        log.info("%s: %.0f tokens/s, MFU %s (%s peak)", s.preset.name, meter["tokens_per_s"],
                 "N/A" if mfu is None else f"{100 * mfu:.1f}%", peak.dtype)
    for hook in hooks:
        hook.on_end(s, result)
    return result
