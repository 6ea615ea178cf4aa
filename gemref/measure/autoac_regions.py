"""Per-region AutoAC with compressed saved activations: fronts, memory, step time, loss parity.

  fronts      the bench's model profiled on one batch (gemref/autoac/regions.py: every block's
              selective / full / compressed options). At every budget (a fraction of the no-AC
              activation bytes) three strategies: uniform (one fraction for every region,
              PyTorch 2's activation_memory_budget style), joint (per-region budgets solved
              together: AutoAC, gemref/autoac/solver.py) and joint+C (the same with
              "compressed" as a fourth option per region), with predicted activation bytes and
              recompute FLOPs in % of the step's model FLOPs, and each strategy's whole
              Pareto front (bytes, FLOPs, plan).
  memory      per format, activation bytes of a step with every block compressed (measured)
              against none, and the hooks' own count (bytes of compressed tensors, bytes stored).
  step_times  training steps of the plain model and of every-block-compressed models,
              interleaved on the same batches (gemref/measure/bench.py paired_steps), medians
              and ratios.
  parity      real training runs (the preset's data, jagged, kernel auto) with and without
              compression; eval loss per seed, the paired difference, and the uncompressed
              runs' seed-to-seed range (the band it should stay in).
"""
from __future__ import annotations

import statistics

from ..autoac.compress import CompressionSpec
from ..autoac.profile import forward_with_bytes
from ..autoac.regions import pareto_front, profile_regions, uniform_front, uniform_plan, without_option
from ..autoac.solver import saved_compression, solve
from ..config import Preset, get_preset, override
from ..data.loader import make_loader
from ..data.sampler import StepBatches
from ..train import evaluate, setup
from .bench import Bench, Trainer, paired_steps, strategy_model


def fronts(b: Bench, spec: CompressionSpec, budgets) -> dict:
    """uniform, joint and joint+C at every budget, and their Pareto fronts (module doc)."""
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


def memory(b: Bench, formats) -> list[dict]:
    """Activation bytes of the first batch's step, every block compressed in each format, against none."""
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


def step_times(b: Bench, formats) -> list[dict]:
    """Median step seconds of every-block-compressed models, each paired with the plain model's."""
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
    p = get_preset(preset) if isinstance(preset, str) else preset
    s = setup(p, override(p.train, steps=steps, seed=seed, jagged=True, kernel="auto",
                          ac_compress=spec.format if spec else "none"), device="cpu", data_root=data_root, progress=False)
    batches = iter(make_loader(s.train_set, batch_sampler=StepBatches(s.sampler, 0), device=s.device))
    for _ in range(steps):
        s.step(next(batches))
    return float(evaluate(s, s.train.eval_batches, steps)["eval_loss"])


def parity(preset: str | Preset, spec: CompressionSpec, seeds: int, steps: int, data_root=None, log=print) -> dict:
    """Eval loss without and with compression per seed, the mean difference and the seed band."""
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
