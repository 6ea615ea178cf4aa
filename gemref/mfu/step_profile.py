"""Where a CPU training step's time goes by op class, and how fast it could be with its GEMMs at
their best rate (`profile_step`; `gemref bench step_profile` and chapter 10's best-rung profile,
gemref/walkthrough/best_rung.py, show it).

1. Step time: `timed_steps` training steps on one batch after `warmup`, unprofiled, by the one
   step timer (gemref/mfu/timing.py): median wall and median process CPU time (their gap
   shows a shared machine's contention).
2. Op classes: `profile_steps` more steps, each profiled right after an unprofiled one, by
   op class with the profiler's own cost out (gemref/mfu/op_profile.py: the same account as
   the waterfall's breakdown): gemm, attention, elementwise, optimizer, communication, other,
   "other" also op by op, the untraced remainder as one row. The record keeps the raw profile
   too ("classes_profiled", each op's "profiled_ms_per_step"). Shares are of the step so
   accounted. Profiler times are wall clock: where the process CPU time is well below the
   wall time, other jobs share the cores and every figure is inflated.
3. Attainable: every distinct GEMM shape of the step (from the profile) is timed alone on
   each GEMM path this torch offers in the dtype the run's GEMMs ran in (fp32, or bf16 under
   bf16 autocast, which runs every mm/addmm/bmm in bf16: gemref/mfu/meter.py `gemm_dtype`;
   gemref/mfu/cpu_probe.py `probe_gemm`, the peak probe's paths), best of `probe_reps` calls
   each. The limits replace the step's GEMM time: by its FLOPs at those best rates
   ("gemm_at_best_rate": step - GEMM + sum over shapes of FLOPs / best rate), by its FLOPs at
   the peak ("gemm_at_peak"), and by nothing ("gemm_free": step - GEMM, the most that any
   faster GEMM, a lower precision included, can give the step; Amdahl's bound). MFU (model
   FLOPs / step / the CPU's measured peak in that dtype, gemref/mfu/peak.py) is given for each.
"""
from __future__ import annotations

import statistics

from .cpu_probe import probe_gemm
from .flops import model_flops
from .meter import gemm_dtype
from .op_classes import CLASSES
from .op_profile import StepClasses, account, profile_op_classes
from .peak import peak_flops


def class_record(c: StepClasses) -> dict:
    """The op-class part of profile_step's record: "classes" (ms per step and share, the
    profiler's cost out), "classes_profiled" (as profiled), "other_ops" (the ops classed other,
    largest first, the untraced remainder one of them), the profiled and paired unprofiled
    step's seconds, "profiler_s_per_boundary"."""
    accounted = sum(c.seconds.values()) or 1.0
    return {"profiled_step_s": c.profiled_step_s, "paired_unprofiled_step_s": c.unprofiled_step_s,
            "classes": [{"class": k, "ms_per_step": 1e3 * c.seconds[k], "share": c.seconds[k] / accounted}
                        for k in CLASSES],
            "classes_profiled": [{"class": k, "ms_per_step": 1e3 * c.profiled[k],
                                  "share": c.profiled[k] / c.profiled_step_s} for k in CLASSES],
            "profiler_s_per_boundary": c.profiler_s_per_boundary,
            "other_ops": [{"op": name, "calls_per_step": use["calls"], "ms_per_step": 1e3 * use["seconds"],
                           "share_of_step": use["seconds"] / accounted,
                           "profiled_ms_per_step": 1e3 * use["profiled_seconds"]}
                          for name, use in sorted(c.other_ops.items(), key=lambda kv: -kv[1]["seconds"])]}


def gemm_rows(shapes: dict[tuple, dict], probe_reps: int, dtype: str = "fp32") -> list[dict]:
    """One row per GEMM shape of the step, costliest first: its calls, ms and GFLOP per step, its
    rate in the step, and its best rate and path alone in `dtype` (cpu_probe.probe_gemm), in GFLOP/s."""
    rows = []
    for (b, m, k, n), use in sorted(shapes.items(), key=lambda kv: -kv[1]["seconds"]):
        probe = probe_gemm(b, m, k, n, probe_reps, dtype)
        flops = 2 * b * m * k * n * use["calls"]
        rows.append({"shape_bmkn": f"{b}x{m}x{k}x{n}", "calls_per_step": use["calls"],
                     "ms_per_step": 1e3 * use["seconds"], "step_gflops_per_s": flops / use["seconds"] / 1e9
                     if use["seconds"] else None, "best_gflops_per_s": probe["best_flops_per_s"] / 1e9,
                     "best_path": probe["best_path"], "best_ms_per_step": 1e3 * flops / probe["best_flops_per_s"],
                     "gflop_per_step": flops / 1e9, "rates": {p: r / 1e9 for p, r in probe["rates"].items()}})
    return rows


def profile_step(s, batch, *, warmup: int = 3, timed_steps: int = 10, profile_steps: int = 3,
                 probe_reps: int = 20) -> dict:
    """Steps 1-3 of the module docstring for a built Setup `s` (gemref.train.setup) on one batch:
    {"step_wall_s", "step_cpu_s" (lists, seconds), "profiled_step_s", "paired_unprofiled_step_s",
    "profiled_step_cpu_s", "classes", "classes_profiled", "profiler_s_per_boundary",
    "other_ops" (class_record), "gemm_shapes" (gemm_rows), "limits" (step_ms and MFU of the
    step, with GEMMs at the best probed rate, at the peak, taking no time), "model_flops",
    "gemm_dtype", "peak_flops", "peak_source"}."""
    for _ in range(warmup):
        s.step(batch)
    timed = [s.timed_step(lambda: batch)[0] for _ in range(timed_steps)]   # the one step timer
    wall, cpu = [r.step_s for r in timed], [r.process_cpu_s for r in timed]
    step_s = statistics.median(wall)
    profiled = profile_op_classes(lambda: s.step(batch), profile_steps, "cpu")
    classes = account(profiled)
    dtype = gemm_dtype(s.precision.precision, "cpu", s.precision.is_emulated)
    gemms = gemm_rows(classes.gemm_shapes, probe_reps, dtype)
    gemm_s = classes.seconds["gemm"] * step_s / (sum(classes.seconds.values()) or 1.0)   # of the unprofiled step
    gemm_best_s = sum(r["best_ms_per_step"] for r in gemms) / 1e3
    gemm_flops = sum(r["gflop_per_step"] for r in gemms) * 1e9
    peak = peak_flops("cpu", dtype)
    model = model_flops(s.preset.model, batch.lengths).total
    limits = {"step": step_s, "gemm_at_best_rate": step_s - gemm_s + gemm_best_s,
              "gemm_at_peak": step_s - gemm_s + (gemm_flops / peak.flops if peak.flops else 0.0),
              "gemm_free": step_s - gemm_s}
    return {"step_wall_s": wall, "step_cpu_s": cpu, **class_record(classes),
            "profiled_step_cpu_s": statistics.fmean(profiled.profiled_cpu_s),
            "gemm_shapes": gemms,
            "limits": [{"case": case, "step_ms": 1e3 * t, "mfu": model / t / peak.flops if peak.flops else None}
                       for case, t in limits.items()],
            "model_flops": model, "gemm_dtype": dtype, "peak_flops": peak.flops, "peak_source": peak.source}
