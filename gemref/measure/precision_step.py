"""Whole training steps in two precisions, interleaved: the step speed-up and the loss it costs.

`compare_step_precisions(preset, train, ("fp32", "bf16"), seeds=..., steps=..., warmup=...)`
builds one run per (seed, precision) with `train.setup` (so every switch composes as training
composes it; same seed, same initial weights and the same batches for both precisions), then
steps them round-robin (gemref/mfu/timing.py `interleaved`, the order reversed every other
round), each round on the same batch for every precision. Per precision it reports the median
step time and tokens/s over every timed step of every seed; the speed-up of each non-reference
precision is the median over paired steps (same seed, same batch) of t_reference / t, with its
p10..p90 across those pairs, and the median of process CPU / wall per step (about the thread
count on an idle machine; well below it, the run waited for cores). After the steps each run is evaluated on the same eval batches,
and the eval losses (nats per sample, one per seed) go through gemref/report/seed_band.py: a
precision keeps the reference's quality when its mean lies within k standard errors of the
reference's seed-to-seed spread.

`preset_at_width(preset, width)` is the preset's architecture at another d_model (its heads
kept): what bf16 gives on a CPU's matrix engine depends on how wide the GEMMs are.

`train_per_precision(preset, precisions, steps=...)` is the plainer comparison `gemref bench
precision --preset` prints: one training run per precision through the training loop, one
after the other (not interleaved, one seed), with the median step, MFU against the peak of the
dtype its GEMMs ran in (gemref/mfu/meter.py `gemm_dtype`) and the eval loss.

Seconds are wall-clock seconds of the step alone (forward, backward, optimizer; not the data
fetch). Nothing here bounds a time: the numbers are what this machine did in this run.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, replace

from ..train.presets import Preset
from ..train.config import TrainConfig
from ..train.override import override
from ..data.loader import make_loader
from ..errors import UsageError
from ..mfu.meter import percentile
from ..mfu.timing import interleaved
from ..report.seed_band import K_SE, seed_band_rows
from .run import run as train_run
from ..train import setup
from ..train.loop import evaluate


@dataclass
class StepComparison:
    """What `compare_step_precisions` measured (see the module doc)."""

    rows: list[dict]           # one per precision: median step s, tokens/s, speed-up and its p10..p90, loss band
    steps_s: dict[str, list[float]]   # every timed step's seconds, per precision (seeds in order)
    eval_loss: dict[str, list[float]]  # one eval loss per seed, per precision
    reference: str
    seeds: list[int]

    def as_record(self) -> dict:
        return {"rows": self.rows, "steps_s": self.steps_s, "eval_loss": self.eval_loss,
                "reference": self.reference, "seeds": self.seeds}


def preset_at_width(preset: Preset, width: int) -> Preset:
    """The preset's architecture at d_model = width, heads kept (head dim = width / heads); a
    width its heads do not divide is a UsageError naming both."""
    return preset if width == preset.model.d_model else replace(preset, model=override(preset.model, d_model=width))


def speedup(reference_s: list[float], variant_s: list[float]) -> tuple[float, float, float]:
    """(median, p10, p90) of t_reference / t_variant over paired steps (same seed, same batch)."""
    if len(reference_s) != len(variant_s) or not reference_s:
        raise ValueError(f"need as many paired steps of each, got {len(reference_s)} and {len(variant_s)}")
    ratios = [r / v for r, v in zip(reference_s, variant_s)]
    return statistics.median(ratios), percentile(ratios, 0.1), percentile(ratios, 0.9)


def compare_step_precisions(preset: Preset, train: TrainConfig, precisions: tuple[str, ...], *,
                            seeds: list[int], steps: int, warmup: int, eval_batches: int,
                            device: str = "cpu", k: float = K_SE) -> StepComparison:
    """Interleaved steps of `train` in each precision (the first is the reference), per seed."""
    if len(precisions) < 2 or len(set(precisions)) != len(precisions):
        raise UsageError(f"need at least two different precisions, got {list(precisions)}")
    if len(seeds) < 2 or len(set(seeds)) != len(seeds):
        raise UsageError(f"the loss band needs at least two different seeds, got {seeds}")
    if steps < 1 or warmup < 0 or eval_batches < 1:
        raise UsageError(f"need steps >= 1, warmup >= 0, eval_batches >= 1; got {steps}, {warmup}, {eval_batches}")
    steps_s: dict[str, list[float]] = {p: [] for p in precisions}
    tokens: dict[str, int] = {p: 0 for p in precisions}
    busy: dict[str, list[float]] = {p: [] for p in precisions}   # process CPU / wall, per step
    eval_loss: dict[str, list[float]] = {p: [] for p in precisions}
    for seed in seeds:
        runs = {p: setup(preset, override(train, precision=p, seed=seed), device=device) for p in precisions}
        first = runs[precisions[0]]
        loader = iter(make_loader(first.train_set, first.train.batch_size, seed=seed))
        batches = [next(loader) for _ in range(warmup + steps)]
        records = interleaved({p: (lambda i, s=s: s.timed_step(lambda: batches[i])[0]) for p, s in runs.items()},
                              steps, warmup=warmup, alternate=True)
        for p, rs in records.items():
            steps_s[p] += [r.step_s for r in rs]
            tokens[p] += sum(r.tokens for r in rs)
            busy[p] += [r.process_cpu_s / r.step_s for r in rs if r.step_s > 0]
            eval_loss[p].append(float(evaluate(runs[p], eval_batches, warmup + steps)["eval_loss"]))
        del runs
    bands = {row["label"]: row for row in seed_band_rows(eval_loss, precisions[0], k)}
    rows = []
    for p in precisions:
        ratio = (1.0, 1.0, 1.0) if p == precisions[0] else speedup(steps_s[precisions[0]], steps_s[p])
        band = bands[p]
        rows.append({"precision": p, "median_step_s": statistics.median(steps_s[p]),
                     "tokens_per_s": tokens[p] / sum(steps_s[p]), "speedup": ratio[0],
                     "speedup_p10": ratio[1], "speedup_p90": ratio[2],
                     "eval_loss_mean": band["mean"], "eval_loss_sd": band["sd"],
                     "loss_difference": band["difference"], "loss_tolerance": band["tolerance"],
                     "within_band": band["within"], "cpu_over_wall": statistics.median(busy[p])})
    return StepComparison(rows, steps_s, eval_loss, precisions[0], list(seeds))


def speedup_text(row: dict) -> str:
    """'2.05x (1.90..2.20)': a row's median speed-up over the reference, with its p10..p90."""
    return f"{row['speedup']:.2f}x ({row['speedup_p10']:.2f}..{row['speedup_p90']:.2f})"


def train_per_precision(preset: Preset, precisions: list[str], *, steps: int, kernel: str, min_dim: int, seed: int,
                        device: str) -> list[dict]:
    """Train `preset` for `steps` steps in each precision (module doc); one row per precision:
    path (the kernel that ran), converted layers, median_step_s (seconds), mfu, mfu_basis,
    eval_loss and speedup (vs bf16, else fp32; "emulated" rows make no speed claim)."""
    rows = []
    for precision in precisions:
        train = override(preset.train, steps=steps, precision=precision, precision_kernel=kernel,
                         precision_min_dim=min_dim, seed=seed)
        r = train_run(preset, train, device=device, progress=False, measure_memory=False)
        rows.append({"precision": precision, "path": r["precision"]["kernel"],
                     "converted": len(r["precision"]["converted"]), "median_step_s": r["median_step_s"],
                     "mfu": r["mfu"], "mfu_basis": r["mfu_basis"], "eval_loss": r["eval"]["eval_loss"]})
    t_ref = {r["precision"]: r["median_step_s"] for r in rows}
    for r in rows:
        ref = t_ref.get("bf16", t_ref.get("fp32"))
        r["speedup"] = "emulated" if r["path"] == "emulated" else (ref / r["median_step_s"] if ref else None)
    return rows
