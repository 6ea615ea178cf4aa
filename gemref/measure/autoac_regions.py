"""Per-region AutoAC with compressed saved activations: fronts, memory, step time, loss parity.

  fronts      the bench's model profiled on one batch (every block's save_matmuls / full /
              compressed options, gemref/autoac/profile.py). At every budget (a fraction of the no-AC
              activation bytes) three strategies: uniform (one fraction for every region,
              PyTorch 2's activation_memory_budget style), joint (per-region budgets solved
              together: AutoAC, gemref/autoac/plan.py, here by FLOPs) and joint+C (the same with
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

Per-region budgets against one fraction (the functions below `region_bytes`): a region is one
checkpointable block. Two ways to turn a step's memory budget into per-region choices:
  * joint (AutoAC, `solve`): every region gets its own budget, the bytes of the option chosen
    for it, solved together (a multiple-choice knapsack) for the least recompute under the
    step's budget; `region_budgets` reads the budgets off a plan;
  * uniform (one fraction, as PyTorch 2's activation_memory_budget applies one fraction to
    every compiled graph): each region keeps at most `fraction` of its own saved bytes, at
    its least recompute (`uniform_plan`).
Any uniform plan is a feasible joint plan at its own bytes, so at equal memory the joint solver
never recomputes more (tests check it on random profiles). Both compare recompute FLOPs
(objective "flops"); `pareto_front` is the joint front exactly (the solver's dynamic
programme, uncapped), `uniform_front` the plans of every distinct fraction.
"""
from __future__ import annotations

import statistics

from dataclasses import replace

from ..activation_compression import CompressionSpec
from ..autoac.plan import ActivationProfile, Plan, partial_plans, plan_of, saved_compression, solve
from .batch_search import gemref_forward_with_bytes, gemref_profile
from ..mfu.flops import model_flops
from ..train.presets import Preset, get_preset
from ..train.override import override
from ..data.loader import make_loader
from ..data.sampler import StepBatches
from ..train import evaluate, setup
from .bench import Bench, Trainer, paired_steps, strategy_model


def fronts(b: Bench, spec: CompressionSpec, budgets) -> dict:
    """uniform, joint and joint+C at every budget, and their Pareto fronts (module doc)."""
    model = strategy_model(b, "none", compiled=False)
    profile = gemref_profile(model, b.batches[0], options=("save_matmuls", "full", "compressed"), compression=spec,
                             autocast_dtype=b.autocast)
    plain = without_option(profile, "compressed")
    base, flops = profile.base_bytes, model_flops(b.preset.model, b.batches[0].lengths).total
    rows = []
    for f in budgets:
        for strategy, make in (("uniform", lambda: uniform_plan(plain, f)), ("joint", lambda: solve(plain, int(f * base), "flops")),
                               ("joint+C", lambda: solve(profile, int(f * base), "flops"))):
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
    dominated = sum(solve(plain, nbytes, "flops").recompute_flops <= fl for nbytes, fl, _ in curve["uniform"])
    return {"base_bytes": base, "model_flops": flops, "rows": rows, "fronts": curve,
            "joint_no_worse_at": f"{dominated}/{len(curve['uniform'])} uniform points"}


def memory(b: Bench, formats) -> list[dict]:
    """Activation bytes of the first batch's step, every block compressed in each format, against none."""
    plain = strategy_model(b, "none", compiled=False)
    _, base = gemref_forward_with_bytes(plain, b.batches[0], b.autocast)
    rows = [{"format": "none", "act_mb": base / 2**20, "vs_none": 1.0}]
    for fmt in formats:
        model = strategy_model(b, "none", compiled=False, compress=fmt)      # every block compressed
        _, nbytes = gemref_forward_with_bytes(model, b.batches[0], b.autocast)
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


# ----------------------------------------------------------------------------- per-region budgets


def without_option(profile: ActivationProfile, option: str) -> ActivationProfile:
    """The same profile with one option removed (to solve with and without compression)."""
    if option not in profile.options:
        raise ValueError(f"option {option!r} is not in the profile's {profile.options}")
    drop = lambda d: {o: v for o, v in d.items() if o != option}   # noqa: E731
    return replace(profile, options=tuple(o for o in profile.options if o != option),
                   blocks=tuple(replace(b, freed_bytes=drop(b.freed_bytes), recompute_flops=drop(b.recompute_flops),
                                        recompute_seconds=drop(b.recompute_seconds)) for b in profile.blocks))


def region_bytes(profile: ActivationProfile) -> dict[str, int]:
    """Each region's own activation bytes with nothing checkpointed: what it saves, or what
    an option frees if that is more (a checkpoint also frees temporaries the block created)."""
    return {b.name: max([b.saved_bytes] + list(b.freed_bytes.values())) for b in profile.blocks}


def region_budgets(profile: ActivationProfile, plan: Plan) -> dict[str, int]:
    """The bytes each region keeps under `plan` (its per-region budget)."""
    own = region_bytes(profile)
    return {b.name: own[b.name] - (b.freed_bytes[plan.choices[b.name]] if b.name in plan.choices else 0)
            for b in profile.blocks}


def uniform_plan(profile: ActivationProfile, fraction: float) -> Plan:
    """One fraction for every region: each keeps at most `fraction` of its own bytes, by its
    least-recompute option that does (ties: the one keeping more); a region that cannot
    takes its most memory-saving option."""
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"fraction must be in [0, 1], got {fraction}")
    own, choices = region_bytes(profile), {}
    for b in profile.blocks:
        options = [("none", 0, 0)] + [(o, b.freed_bytes[o], b.recompute_flops[o]) for o in profile.options]
        fits = [opt for opt in options if own[b.name] - opt[1] <= fraction * own[b.name]]
        best = min(fits, key=lambda opt: (opt[2], -(own[b.name] - opt[1]))) if fits else \
            max(options, key=lambda opt: (opt[1], -opt[2]))
        choices[b.name] = best[0]
    return plan_of(profile, choices, objective="flops")


def _undominated(plans: list[Plan]) -> list[Plan]:
    """Plans not beaten on both predicted bytes and recompute FLOPs, by bytes ascending."""
    out: list[Plan] = []
    for plan in sorted(plans, key=lambda p: (p.recompute_flops, p.predicted_bytes)):
        if not out or plan.predicted_bytes < out[-1].predicted_bytes:
            out.append(plan)
    return sorted(out, key=lambda p: p.predicted_bytes)


def uniform_front(profile: ActivationProfile) -> list[Plan]:
    """The undominated plans over every fraction at which some region changes its choice."""
    own = region_bytes(profile)
    fractions = {0.0, 1.0} | {(own[b.name] - f) / own[b.name] for b in profile.blocks if own[b.name] > 0
                              for f in b.freed_bytes.values() if 0 <= f <= own[b.name]}
    return _undominated([uniform_plan(profile, f) for f in sorted(fractions)])


def pareto_front(profile: ActivationProfile) -> list[Plan]:
    """Every joint plan on the front of activation bytes vs recompute FLOPs (exact)."""
    names = [b.name for b in profile.blocks]
    uncapped = 1 + sum(max([0] + list(b.freed_bytes.values())) for b in profile.blocks)
    states = partial_plans(profile, uncapped, "flops")
    return _undominated([plan_of(profile, dict(zip(names, choices)), objective="flops") for _, _, choices in states])
