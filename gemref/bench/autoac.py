"""AutoAC against the alternatives under activation-memory budgets: bytes, recompute, step time, MFU.

For each budget (a fraction of the activation bytes of a step with nothing checkpointed),
four strategies side by side on the same batches (jagged histories, the auto attention kernel):
  none  nothing checkpointed: the reference (the same row at every budget)
  full  every block fully checkpointed: the classic recipe (the same row at every budget)
  auto  AutoAC: the least-recompute plan that fits the budget (gemref/autoac/solver.py)
  pt2   torch.compile with torch._functorch.config.activation_memory_budget = the budget
Columns: activation bytes on the first batch (gemref/autoac/profile.py; with --compile on CPU the
checkpointed strategies are measured on their eager twin), their share of the eager no-AC
bytes, whether they fit the budget, recompute FLOPs (FlopCounterMode: backward FLOPs minus
the eager no-AC backward's) in % of the step's model FLOPs, the median of --steps timed
training steps after --warmup, its ratio to none's, MFU, and HFU (= MFU x executed/model
FLOPs of the first batch, recompute counted as executed).

--find-batch: the largest batch that fits a memory budget without and with AutoAC (default:
the memory the no-AC step needs at --batch-size; CPU: activation bytes, CUDA: peak device
memory), then both are timed side by side: what the freed memory bought.

Timings on a shared machine are noisy: compare ratios within one run and read medians.
"""
from __future__ import annotations

import argparse
import platform
import statistics
from dataclasses import asdict, dataclass

import numpy as np
import torch

from ..autoac.profile import backward_flops, find_batch_size, forward_with_bytes, profile_blocks, step_bytes
from ..autoac.solver import Plan, applied_plan, solve
from ..config import PRESETS, Preset, TrainConfig, get_preset, override
from ..data.folder import dataset_preset
from ..data.loader import EventDataset, make_loader
from ..env import versions
from ..errors import UsageError
from ..runtime.files import write_json
from ..mfu.flops import executed_flops, model_flops, step_flops
from ..mfu.meter import mfu, run_peak
from ..mfu.timing import StepRecord, interleaved, timed_step
from ..options import add_dataset_arg, add_device_arg, nonnegative_int, output_file, positive_int
from ..report import format_table
from ..train import Setup, build_model, forward_loss, make_optimizer, setup, train_step

DEFAULT_BUDGETS = (1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1)
SWEEP_COLUMNS = ("budget", "strategy", "act_mb", "act_pct", "fits", "recompute_pct", "step_s", "vs_none",
                 "mfu", "hfu", "plan")
GAIN_COLUMNS = ("strategy", "batch_size", "memory_mb", "recompute_pct", "step_s", "samples_per_s", "mfu", "hfu",
                "plan")


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
    if strategy == "pt2":
        return override(b.train, compile=True, ac="pt2", ac_budget=budget, ac_compress="none")
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


def measure(b: Bench, model, reference: Trainer, *, bytes_model=None, base_backward: int = 0) -> dict:
    """Activation bytes and backward FLOPs on the first batch, then the timed steps, each
    paired with a step of `reference` (vs_reference: the median ratio)."""
    batch = b.batches[0]
    loss, nbytes = forward_with_bytes(bytes_model or model, batch, b.autocast)
    del loss
    bwd = backward_flops(forward_loss(model, batch, b.autocast), model)
    timed, ref_timed = paired_steps(b, Trainer(b, model), b.batches, reference)
    seconds, ref_seconds = [r.step_s for r in timed], [r.step_s for r in ref_timed]
    cfg, model_f = b.preset.model, model_flops(b.preset.model, batch.lengths).total
    recompute = bwd - base_backward if base_backward else 0
    step_mfu = run_mfu(b, timed)
    executed = executed_flops(cfg, batch.lengths, jagged=True, kernel=b.s.kernel).total + recompute
    return {"act_bytes": nbytes, "backward_flops": bwd, "recompute_flops": recompute,
            "recompute_pct": 100 * recompute / model_f, "step_s": statistics.median(seconds), "steps_s": seconds,
            "vs_reference": statistics.median(t / r for t, r in zip(seconds, ref_seconds)),
            "mfu": step_mfu, "hfu": step_mfu * executed / model_f if step_mfu is not None else None}


def budget_sweep(b: Bench, budgets=DEFAULT_BUDGETS, *, pt2: bool = True, log=print) -> dict:
    """Every strategy at every budget; returns {"profile", "rows", "done_when"}."""
    for f in budgets:
        if not 0.0 < f <= 1.0:
            raise ValueError(f"budgets are fractions in (0, 1], got {f}")
    eager_twin = b.device.type == "cpu" and b.train.compilation.enabled   # CPU can't see compiled + checkpointed bytes
    log("profiling every block (eager) ...")
    eager = strategy_model(b, "none", compiled=False)
    profile = profile_blocks(eager, b.batches[0], options=("full",) if b.train.compilation.enabled else ("selective", "full"),
                             autocast_dtype=b.autocast)
    base = profile.base_bytes
    reference_backward = backward_flops(forward_loss(eager, b.batches[0], b.autocast), eager)
    reference = Trainer(b, strategy_model(b, "none"))     # every strategy's steps pair with its steps

    def run(label, strategy, plan=None, budget=1.0):
        log(f"timing {label} ...")
        if strategy == "pt2":
            # Each budget is a new inductor backend, so a new graph for every region; dynamo
            # keeps at most recompile_limit (8) per function, then runs it eagerly. Start clean.
            torch._dynamo.reset()
        twin = strategy_model(b, strategy, plan, compiled=False) if eager_twin and strategy in ("full", "auto") \
            else None
        return measure(b, strategy_model(b, strategy, plan, budget=budget), reference, bytes_model=twin,
                       base_backward=reference_backward)

    none, full = run("none", "none"), run("full", "full")
    plans, auto_runs, rows = {}, {}, []
    for f in budgets:
        try:
            plans[f] = solve(profile, int(f * base))
        except ValueError:
            plans[f] = None
    for plan in {p.summary(): p for p in plans.values() if p is not None}.values():
        auto_runs[plan.summary()] = run(f"auto {plan.summary()}", "auto", plan)
    for f in budgets:
        target = f * base
        entries = [("none", none, ""), ("full", full, "every block")]
        if plans[f] is None:
            entries.append(("auto", None, f"impossible: min {100 * profile.min_bytes / base:.0f}%"))
        else:
            entries.append(("auto", {**auto_runs[plans[f].summary()], "predicted_bytes": plans[f].predicted_bytes},
                            plans[f].summary()))
        if pt2:
            entries.append(("pt2", run(f"pt2 budget {f}", "pt2", budget=f), f"activation_memory_budget={f}"))
        for strategy, m, note in entries:
            row = {"budget": f, "strategy": strategy, "plan": note}
            if m is not None:
                row.update(act_mb=m["act_bytes"] / 2**20, act_pct=100 * m["act_bytes"] / base,
                           fits=m["act_bytes"] <= target, recompute_pct=m["recompute_pct"], step_s=m["step_s"],
                           vs_none=m["vs_reference"], mfu=m["mfu"], hfu=m["hfu"],
                           act_bytes=m["act_bytes"], recompute_flops=m["recompute_flops"], steps_s=m["steps_s"],
                           predicted_bytes=m.get("predicted_bytes"))
            rows.append(row)
    half = plans.get(0.5)
    done = None
    if half is not None:
        auto_pct, full_pct = auto_runs[half.summary()]["recompute_pct"], full["recompute_pct"]
        done = {"budget": 0.5, "auto_recompute_pct": auto_pct, "full_recompute_pct": full_pct,
                "auto_over_full": auto_pct / full_pct if full_pct else None,
                "met": auto_pct <= 0.5 * full_pct}
    return {"profile": {"base_bytes": base, "min_bytes": profile.min_bytes, "method": profile.method,
                        "model_flops": profile.model_flops, "blocks": [asdict(x) for x in profile.blocks]},
            "rows": rows, "done_when": done}


def batch_gain(b: Bench, memory_budget: int | None = None, max_batch: int | None = None, log=print) -> dict:
    """Largest batch without and with AutoAC under one memory budget, then both timed."""
    order = np.random.default_rng(b.train.seed).permutation(len(b.dataset))

    def batch_of(n):
        return b.dataset.__getitems__(order[:n].tolist()).to(b.device)

    eager = strategy_model(b, "none", compiled=False)
    if memory_budget is None:
        memory_budget = step_bytes(eager, batch_of(b.train.batch_size), b.autocast)
    log(f"searching batch sizes under {memory_budget / 2**20:.1f} MiB ...")
    found = find_batch_size(eager, batch_of, memory_budget, autocast_dtype=b.autocast,
                            max_batch=min(len(b.dataset), max_batch or 16 * b.train.batch_size),
                            options=("full",) if b.train.compilation.enabled else ("selective", "full"))
    log(f"timing batch {found.no_ac_batch} without AC against batch {found.autoac_batch} with AutoAC ...")
    cfg, count = b.preset.model, len(b.batches)
    batches = {"none": timed_batches(b, found.no_ac_batch, count), "auto": timed_batches(b, found.autoac_batch, count)}
    auto_r, none_r = paired_steps(b, Trainer(b, strategy_model(b, "auto", found.plan)), batches["auto"],
                                  Trainer(b, strategy_model(b, "none")), batches["none"])
    auto_s, none_s = [r.step_s for r in auto_r], [r.step_s for r in none_r]
    rows = []
    for strategy, plan, used, timed in (("none", None, found.no_ac_bytes, none_r),
                                        ("auto", found.plan, found.autoac_bytes, auto_r)):
        first, n = batches[strategy][0], batches[strategy][0].batch_size
        seconds = [r.step_s for r in timed]
        flops = step_flops(cfg, first.lengths, jagged=True, kernel=b.s.kernel, ac_choices=plan.choices if plan else {})
        rows.append({"strategy": strategy, "batch_size": n, "memory_mb": used / 2**20,
                     "recompute_pct": 100 * flops.recompute / flops.model, "step_s": statistics.median(seconds),
                     "samples_per_s": statistics.median(n / s for s in seconds), "mfu": run_mfu(b, timed),
                     "hfu": mfu(sum(r.executed_flops for r in timed), sum(seconds), b.peak),
                     "plan": plan.summary() if plan else ""})
    none, auto = rows
    return {"memory_budget_bytes": memory_budget, "measure": found.measure, "rows": rows,
            "search_cap": found.max_batch, "capped": found.autoac_batch == found.max_batch,
            "batch_ratio": auto["batch_size"] / max(none["batch_size"], 1),
            "samples_per_s_ratio": statistics.median((auto["batch_size"] / a) / (none["batch_size"] / n)
                                                     for a, n in zip(auto_s, none_s)),
            "mfu_gain": (auto["mfu"] - none["mfu"]) if none["mfu"] is not None else None}


# ----------------------------------------------------------------------------- command


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="small", choices=list(PRESETS), help="model/data preset")
    add_dataset_arg(p)
    p.add_argument("--batch-size", type=positive_int, help="samples per step (default: the preset's)")
    p.add_argument("--budgets", default=",".join(str(x) for x in DEFAULT_BUDGETS),
                   help="activation budgets, fractions of the no-AC bytes (comma separated)")
    p.add_argument("--steps-per-strategy", type=positive_int, default=3,
                   help="timed steps per strategy and budget (median reported)")
    p.add_argument("--warmup", type=nonnegative_int, default=1, help="untimed steps before them")
    add_device_arg(p)
    p.add_argument("--compile", action="store_true", help="compile none/full/auto too (AutoAC: none|full)")
    p.add_argument("--no-pt2", action="store_true", help="skip the PyTorch 2 memory-budget strategy")
    p.add_argument("--find-batch", action="store_true", help="also: largest batch per strategy under a budget")
    p.add_argument("--memory-budget-mb", type=float, help="--find-batch budget (default: the no-AC step's)")
    p.add_argument("--max-batch", type=positive_int, help="--find-batch search cap (default: 16 x the batch size)")
    p.add_argument("--threads", type=positive_int, help="torch CPU threads (default: torch's)")
    p.add_argument("--json", metavar="PATH", type=output_file, help="write the record here")


def run(args) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        budgets = tuple(float(x) for x in args.budgets.split(","))
    except ValueError:
        raise UsageError(f"--budgets takes comma-separated fractions, got {args.budgets!r}") from None
    if not all(0.0 < f <= 1.0 for f in budgets):
        raise UsageError(f"--budgets are fractions in (0, 1], got {args.budgets}")
    if args.memory_budget_mb is not None and not args.memory_budget_mb > 0:
        raise UsageError(f"--memory-budget-mb must be > 0, got {args.memory_budget_mb}")
    b = make_bench(dataset_preset(args.preset, args.dataset), batch_size=args.batch_size,
                   steps=args.steps_per_strategy, warmup=args.warmup, device=args.device, compile=args.compile)
    log = lambda s: print(s, flush=True)   # noqa: E731
    sweep = budget_sweep(b, budgets, pt2=not args.no_pt2, log=log)
    title = (f"AutoAC bench: {b.preset.name}, batch {b.train.batch_size}, kernel {b.s.kernel}, "
             f"compile={b.train.compilation.enabled}, {b.device.type} ({torch.get_num_threads()} threads), "
             f"no-AC activations {sweep['profile']['base_bytes'] / 2**20:.1f} MiB ({sweep['profile']['method']})")
    print(format_table(sweep["rows"], SWEEP_COLUMNS, title=title))
    if sweep["done_when"]:
        d = sweep["done_when"]
        print(f"at a 50% budget AutoAC recomputes {d['auto_recompute_pct']:.2f}% of model FLOPs, full AC "
              f"{d['full_recompute_pct']:.2f}% (ratio {d['auto_over_full']:.3f}; target <= 0.5: "
              f"{'met' if d['met'] else 'NOT met'})")
    record = {"kind": "bench_autoac", "preset": b.preset.name, "data": asdict(b.preset.data),
              "batch_size": b.train.batch_size,
              "kernel": b.s.kernel, "compile": b.train.compilation.enabled, "steps": args.steps_per_strategy, "warmup": args.warmup,
              "device": {"type": b.device.type, "threads": torch.get_num_threads(), "machine": platform.machine()},
              "versions": versions(),
              "peak_flops": b.peak, **sweep}
    if args.find_batch:
        budget = int(args.memory_budget_mb * 2**20) if args.memory_budget_mb else None
        gain = batch_gain(b, budget, args.max_batch, log=log)
        print(format_table(gain["rows"], GAIN_COLUMNS,
                           title=f"largest batch under {gain['memory_budget_bytes'] / 2**20:.1f} MiB "
                                 f"({gain['measure']})"))
        print(f"AutoAC fits {gain['batch_ratio']:.2f}x the batch"
              + (f" (the search cap, {gain['search_cap']}: more may fit)" if gain["capped"] else "")
              + f": {gain['samples_per_s_ratio']:.2f}x samples/s"
              + (f", MFU {100 * gain['mfu_gain']:+.2f} points" if gain["mfu_gain"] is not None else ""))
        record["find_batch"] = gain
    if args.json:
        write_json(args.json, record)
        print(f"wrote {args.json}")
    return 0
