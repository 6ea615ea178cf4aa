"""A bench: what every variant of a benchmark shares, and training steps timed in pairs.

`make_bench` sets up one preset as training does (gemref.train.setup: data, device, precision,
the resolved kernel; jagged histories, kernel auto) and draws the batches to time; a variant
is a strategy (`strategy_config`: training's AC and compile switches), built by
gemref.train.build_model as training builds it (`strategy_model`). `Trainer` runs training's
step under the one step timer (gemref/mfu/timing.py); `paired_steps` interleaves two
trainers step by step, so a shared machine's changing load hits both alike. Seconds are
wall-clock seconds of one training step; MFU is gemref/mfu/meter.py's.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..autoac import Plan, applied_plan
from ..train.presets import Preset, get_preset
from ..train.config import TrainConfig
from ..train.override import override
from ..data.loader import EventDataset, make_loader
from ..mfu.flops import step_flops
from ..mfu.meter import mfu, run_peak
from ..mfu.timing import StepRecord, interleaved, timed_step
from ..train import Setup, build_model, make_optimizer, setup, train_step


@dataclass
class Bench:
    """What every strategy shares: the eager no-AC run's Setup (gemref.train.setup: preset,
    data, device, precision, the resolved kernel), the bench's switches (`train`: jagged,
    kernel auto, --compile), the timed batches, the untimed warm-up steps and one device's
    peak FLOP/s."""

    s: Setup
    train: TrainConfig
    batches: list
    warmup: int
    peak: float | None

    @property
    def preset(self) -> Preset:
        return self.s.preset

    @property
    def device(self) -> torch.device:
        return self.s.device

    @property
    def autocast(self) -> torch.dtype | None:
        return self.s.precision.autocast_dtype

    @property
    def dataset(self) -> EventDataset:
        return self.s.train_set


def make_bench(preset: str | Preset, *, batch_size: int | None = None, steps: int = 3, warmup: int = 1,
               device: str = "auto", compile: bool = False, data_root=None, seed: int = 0) -> Bench:
    preset = get_preset(preset) if isinstance(preset, str) else preset
    if steps < 1 or warmup < 0:
        raise ValueError(f"need steps >= 1 and warmup >= 0, got steps={steps}, warmup={warmup}")
    train = override(preset.train, jagged=True, kernel="auto", batch_size=batch_size or preset.train.batch_size,
                     seed=seed, compile=compile, eval_every=0)
    s = setup(preset, override(train, compile=False, compile_regions="all"), device=device, data_root=data_root)
    b = Bench(s, train, [], warmup, run_peak(s.device, s.precision.precision, emulated=s.precision.is_emulated).flops)
    b.batches = timed_batches(b, train.batch_size, warmup + steps)
    return b


def timed_batches(b: Bench, batch_size: int, count: int) -> list:
    loader = iter(make_loader(b.dataset, batch_size, seed=b.train.seed))
    return [next(loader).to(b.device) for _ in range(count)]


def strategy_config(b: Bench, strategy: str, plan: Plan | None = None, *, budget: float = 1.0,
                    compiled: bool | None = None, compress: str = "none") -> TrainConfig:
    """The TrainConfig of a strategy (training's switches, so train.build_model applies it: AC
    before compile, as in training). `plan`: AutoAC's solved plan for "auto"."""
    compiled = b.train.compilation.enabled if compiled is None else compiled
    if strategy == "memory_budget":
        return override(b.train, compile=True, ac="memory_budget", ac_budget=budget, ac_compress="none")
    if strategy == "auto":
        return override(b.train, compile=compiled, ac="auto", ac_plan=plan.summary(), ac_compress=compress)
    return override(b.train, compile=compiled, ac=strategy, ac_budget=1.0, ac_plan="", ac_compress=compress)


def strategy_model(b: Bench, strategy: str, plan: Plan | None = None, *, budget: float = 1.0,
                   compiled: bool | None = None, compress: str = "none") -> torch.nn.Module:
    """A fresh model (same seed) with a strategy applied, built as training builds it."""
    return build_model(b.preset, strategy_config(b, strategy, plan, budget=budget, compiled=compiled,
                                                 compress=compress), b.device)[0]


class Trainer:
    """A model and training's optimizer (`train.make_optimizer`); `step(batch)` runs training's
    step (`train.train_step`) under the one step timer and returns its StepRecord."""

    def __init__(self, b: Bench, model):
        self.b, self.model = b, model
        self.optimizer = make_optimizer(model, b.train)

    def step(self, batch) -> StepRecord:
        cfg, kernel = self.b.preset.model, self.b.s.kernel
        count = lambda lengths: step_flops(cfg, lengths, jagged=True, kernel=kernel,  # noqa: E731
                                           ac_choices=applied_plan(self.model), device=self.b.device)
        run = lambda x: train_step(self.model, self.optimizer, x, autocast_dtype=self.b.autocast)  # noqa: E731
        return timed_step(lambda: batch, run, self.b.device, count)[0]


def paired_steps(b: Bench, trainer: Trainer, batches: list, reference: Trainer,
                 reference_batches: list | None = None) -> tuple[list[StepRecord], list[StepRecord]]:
    """`trainer`'s steps after the warm-up, each paired with a step of `reference` (on the same
    batch unless `reference_batches` are given), interleaved in alternating order
    (gemref/mfu/timing.py), so that a shared machine's changing load hits both alike.
    Returns the trainer's records and the reference's."""
    reference_batches = reference_batches or batches
    out = interleaved({"trainer": lambda k: trainer.step(batches[k]),
                       "reference": lambda k: reference.step(reference_batches[k])},
                      len(batches) - b.warmup, warmup=b.warmup, alternate=True)
    return out["trainer"], out["reference"]


def run_mfu(b: Bench, records: list[StepRecord]) -> float | None:
    """MFU of a strategy's timed steps on one device (gemref/mfu/meter.py: the one definition)."""
    return mfu(sum(r.model_flops for r in records), sum(r.step_s for r in records), b.peak)
