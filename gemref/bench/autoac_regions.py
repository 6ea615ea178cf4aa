"""Per-region AutoAC with compressed saved activations: fronts, memory, batch, step time, loss parity.

1. fronts: the --preset model is profiled on one batch (gemref/autoac/regions.py: every block's
   selective / full / compressed options, bytes measured as in gemref/autoac/profile.py). At
   every budget (a fraction of the no-AC activation bytes) three strategies:
     uniform   one fraction for every region (PyTorch 2's activation_memory_budget style)
     joint     per-region budgets solved together (AutoAC, gemref/autoac/solver.py)
     joint+C   the same with "compressed" as a fourth option per region
   with predicted activation bytes and recompute FLOPs in % of the step's model FLOPs; the
   record holds each strategy's whole Pareto front (bytes, FLOPs, plan).
2. memory: per format, activation bytes of a step with every block compressed (measured)
   against none, and the hooks' own count (bytes of compressed tensors, bytes stored).
3. batch: the largest batch whose activations fit the no-AC bytes of --batch-size, without
   and with compression (`autoac.profile.find_batch_size` called on the plain model and on
   the model under `autoac.compress.compressing`, which compresses the whole forward,
   attention's saved tensors included: right for the pointwise attention of every preset).
4. step time: training steps of the plain model and of every-block-compressed models,
   interleaved on the same batches (gemref/bench/autoac.py paired_steps), medians and ratios.
5. parity: --parity-seeds real training runs of --parity-steps steps (the preset's data,
   jagged, kernel auto) with and without compression; eval loss per seed, the paired
   difference, and the uncompressed runs' seed-to-seed range (the band it should stay in).
CPU timings on a shared machine are noisy: read ratios within one run.
"""
from __future__ import annotations

import argparse
import statistics
from dataclasses import asdict

import numpy as np
import torch

from ..autoac.compress import FORMATS, CompressionSpec, compressing
from ..autoac.profile import find_batch_size, forward_with_bytes
from ..autoac.regions import pareto_front, profile_regions, uniform_front, uniform_plan, without_option
from ..autoac.solver import saved_compression, solve
from ..errors import UsageError
from ..options import add_dataset_arg, output_file
from ..config import Preset, override
from ..data.folder import dataset_preset
from ..data.loader import make_loader
from ..data.sampler import StepBatches
from ..env import versions
from ..report import format_table
from ..runtime.files import write_json
from ..train import evaluate, setup
from .autoac import Trainer, make_bench, paired_steps, strategy_model

DEFAULT_BUDGETS = (1.0, 0.8, 0.6, 0.5, 0.4, 0.3, 0.2)


def fronts(b, spec: CompressionSpec, budgets) -> dict:
    model = strategy_model(b, "none", compiled=False)
    profile = profile_regions(model, b.batches[0], spec, autocast_dtype=b.autocast)
    plain = without_option(profile, "compressed")
    base, flops = profile.base_bytes, profile.model_flops
    rows = []
    for f in budgets:
        for strategy, make in (("uniform", lambda: uniform_plan(plain, f)), ("joint", lambda: solve(plain, int(f * base))),
                               ("joint+C", lambda: solve(profile, int(f * base)))):
            try:
                plan = make()
            except ValueError:       # below what the strategy can reach
                rows.append({"budget": f, "strategy": strategy, "plan": "impossible"})
                continue
            rows.append({"budget": f, "strategy": strategy, "act_mb": plan.predicted_bytes / 2**20,
                         "act_pct": 100 * plan.predicted_bytes / base, "fits": plan.predicted_bytes <= f * base,
                         "recompute_pct": 100 * plan.recompute_flops / flops, "plan": plan.summary()})
    curve = {name: [(p.predicted_bytes, p.recompute_flops, p.summary()) for p in front]
             for name, front in (("uniform", uniform_front(plain)), ("joint", pareto_front(plain)),
                                 ("joint+C", pareto_front(profile)))}
    dominated = sum(solve(plain, nbytes).recompute_flops <= fl for nbytes, fl, _ in curve["uniform"])
    return {"base_bytes": base, "model_flops": flops, "rows": rows, "fronts": curve,
            "joint_no_worse_at": f"{dominated}/{len(curve['uniform'])} uniform points"}


def memory(b, formats) -> list[dict]:
    plain = strategy_model(b, "none", compiled=False)
    _, base = forward_with_bytes(plain, b.batches[0], b.autocast)
    rows = [{"format": "none", "act_mb": base / 2**20, "vs_none": 1.0}]
    for fmt in formats:
        model = strategy_model(b, "none", compiled=False, compress=fmt)      # every block compressed
        _, nbytes = forward_with_bytes(model, b.batches[0], b.autocast)
        stats = saved_compression(model).stats
        rows.append({"format": fmt, "act_mb": nbytes / 2**20, "vs_none": nbytes / base,
                     "compressed_mb": stats["compressed_bytes"] / 2**20, "stored_mb": stats["stored_bytes"] / 2**20,
                     "tensors_compressed": stats["compressed"], "tensors_kept": stats["tensors"] - stats["compressed"]})
    return rows


def batch_search(b, spec: CompressionSpec, max_batch: int) -> dict:
    order = np.random.default_rng(b.train.seed).permutation(len(b.dataset))

    def batch_of(n):
        return b.dataset.__getitems__(order[:n].tolist()).to(b.device)

    plain = strategy_model(b, "none", compiled=False)
    _, budget = forward_with_bytes(plain, batch_of(b.train.batch_size), b.autocast)
    found = {"none": find_batch_size(plain, batch_of, budget, max_batch=max_batch, autocast_dtype=b.autocast)}
    model = strategy_model(b, "none", compiled=False)
    with compressing(model, spec):
        found[spec.format] = find_batch_size(model, batch_of, budget, max_batch=max_batch, autocast_dtype=b.autocast)
    return {"budget_bytes": budget, "max_batch": max_batch,
            "rows": [{"compression": k, "no_ac_batch": v.no_ac_batch, "full_ac_batch": v.autoac_batch,
                      "autoac_plan": v.plan.summary()} for k, v in found.items()]}


def step_times(b, formats) -> list[dict]:
    reference = Trainer(b, strategy_model(b, "none"))
    rows = []
    for fmt in formats:
        trainer = Trainer(b, strategy_model(b, "none", compiled=False, compress=fmt))
        timed, ref_timed = paired_steps(b, trainer, b.batches, reference)
        seconds, ref = [r.step_s for r in timed], [r.step_s for r in ref_timed]
        rows.append({"format": fmt, "step_s": statistics.median(seconds), "none_step_s": statistics.median(ref),
                     "vs_none": statistics.median(t / r for t, r in zip(seconds, ref))})
    return rows


def train_eval_loss(preset: str | Preset, seed: int, steps: int, spec: CompressionSpec | None, data_root=None) -> float:
    """Eval loss after a real training run (jagged, kernel auto), every block compressed if `spec`."""
    from ..config import get_preset

    p = get_preset(preset) if isinstance(preset, str) else preset
    s = setup(p, override(p.train, steps=steps, seed=seed, jagged=True, kernel="auto",
                          ac_compress=spec.format if spec else "none"), device="cpu", data_root=data_root, progress=False)
    batches = iter(make_loader(s.train_set, batch_sampler=StepBatches(s.sampler, 0), device=s.device))
    for _ in range(steps):
        s.step(next(batches))
    return float(evaluate(s, s.train.eval_batches, steps)["eval_loss"])


def parity(preset: str | Preset, spec: CompressionSpec, seeds: int, steps: int, data_root=None, log=print) -> dict:
    rows = []
    for seed in range(seeds):
        log(f"training seed {seed} without and with {spec.format} ...")
        plain = train_eval_loss(preset, seed, steps, None, data_root)
        comp = train_eval_loss(preset, seed, steps, spec, data_root)
        rows.append({"seed": seed, "eval_loss": plain, "eval_loss_compressed": comp, "difference": comp - plain})
    plain = [r["eval_loss"] for r in rows]
    diff = statistics.mean(r["difference"] for r in rows)
    band = max(plain) - min(plain)
    return {"format": spec.format, "steps": steps, "rows": rows, "mean_difference": diff, "seed_band": band,
            "within_band": abs(diff) <= band}


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="tiny")
    add_dataset_arg(p)
    p.add_argument("--batch-size", type=int, help="samples per step (default: the preset's)")
    p.add_argument("--format", default="mxfp8", choices=FORMATS, help="compression of the fronts, batch, parity")
    p.add_argument("--formats", default=",".join(FORMATS), help="formats of the memory and step-time tables")
    p.add_argument("--budgets", default=",".join(str(x) for x in DEFAULT_BUDGETS))
    p.add_argument("--steps-per-variant", type=int, default=6, help="timed steps per variant")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--max-batch", type=int, help="batch search cap (default: 8 x the batch size)")
    p.add_argument("--no-batch-search", action="store_true")
    p.add_argument("--parity-seeds", type=int, default=3, help="training runs per variant (0 skips)")
    p.add_argument("--parity-steps", type=int, default=150)
    p.add_argument("--json", metavar="PATH", type=output_file, help="write the record here")


def run(args) -> int:
    formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    if not formats or set(formats) - set(FORMATS):
        raise UsageError(f"--formats {args.formats!r}: valid: {', '.join(FORMATS)}")
    try:
        budgets = tuple(float(x) for x in args.budgets.split(","))
    except ValueError:
        raise UsageError(f"--budgets takes comma-separated fractions, got {args.budgets!r}") from None
    if not budgets or not all(0.0 < f <= 1.0 for f in budgets):
        raise UsageError(f"--budgets are fractions in (0, 1], got {args.budgets}")
    if (args.steps_per_variant < 1 or args.warmup < 0 or args.parity_seeds < 0 or args.parity_steps < 1
            or args.parity_seeds == 1):
        raise UsageError("need --steps-per-variant >= 1, --warmup >= 0, --parity-seeds 0 (skip) or >= 2 (a seed band), "
                         "--parity-steps >= 1")
    log = lambda s: print(s, flush=True)   # noqa: E731
    spec = CompressionSpec(args.format)
    b = make_bench(dataset_preset(args.preset, args.dataset), batch_size=args.batch_size, steps=args.steps_per_variant,
                   warmup=args.warmup, device="cpu")
    log("profiling every region (selective, full, compressed) ...")
    front = fronts(b, spec, budgets)
    print(format_table(front["rows"], title=f"fronts: {b.preset.name}, batch {b.train.batch_size}, {args.format}, "
                                            f"no-AC activations {front['base_bytes'] / 2**20:.2f} MiB; joint no worse "
                                            f"than uniform at {front['joint_no_worse_at']}"))
    record = {"kind": "bench_autoac_regions", "preset": b.preset.name, "data": asdict(b.preset.data),
              "batch_size": b.train.batch_size,
              "format": args.format, "threads": torch.get_num_threads(), "versions": versions(), "fronts": front}
    record["memory"] = memory(b, formats)
    print(format_table(record["memory"], ("format", "act_mb", "vs_none", "compressed_mb", "stored_mb",
                                          "tensors_compressed", "tensors_kept"),
                       title="activation bytes, every block compressed (measured; the hooks' own count)"))
    if not args.no_batch_search:
        log("searching batch sizes ...")
        record["batch"] = batch_search(b, spec, args.max_batch or 8 * b.train.batch_size)
        print(format_table(record["batch"]["rows"], title=f"largest batch under "
                                                          f"{record['batch']['budget_bytes'] / 2**20:.2f} MiB"))
    record["step_time"] = step_times(b, formats)
    print(format_table(record["step_time"], title=f"step time, interleaved with the plain model "
                                                  f"({args.steps_per_variant} steps after {args.warmup} warm-up)"))
    if args.parity_seeds:
        record["parity"] = parity(b.preset, spec, args.parity_seeds, args.parity_steps, log=log)
        par = record["parity"]
        print(format_table(par["rows"], title=f"eval loss after {args.parity_steps} steps"))
        print(f"mean difference {par['mean_difference']:+.4f}, uncompressed seed band {par['seed_band']:.4f}: "
              f"{'within' if par['within_band'] else 'OUTSIDE'} the band")
    if args.json:
        write_json(args.json, record)
    return 0
