"""Where a CPU training step's time goes by op class, and how fast it could be with its GEMMs at their best rate.

1. Step time: --timed-steps training steps on one batch after --warmup, unprofiled: median wall
   and median process CPU time (their gap shows a shared machine's contention).
2. Op classes: --profile-steps more steps under torch.profiler; each op's *self* CPU time
   goes to one class of gemref/mfu/op_classes.py (gemm, attention, elementwise, optimizer,
   communication, other): an op inside a fused attention op or inside the optimizer counts
   for that op's class; the step's time no op accounts for (Python, gaps) goes to other.
   The profiler makes a step slower, and that cost sits in the self times of the events it
   records, mostly in the parents of many small ops (autograd nodes, a block's
   record_function), which are "other". Each profiled step runs right after an unprofiled
   one; their mean gap, spread over the event boundaries recorded (profiler_cost_per_boundary),
   comes out of each event's self time. An estimate, as noisy as the gap (the record keeps
   the raw profile: "classes_profiled", each op's "profiled_ms_per_step"). Shares are of the
   step so accounted. Profiler times are wall clock: where the process CPU time is well
   below the wall time, other jobs share the cores and every figure is inflated.
3. Attainable: every distinct GEMM shape of the step (from the profile) is timed alone on
   each GEMM path this torch offers (torch.mm; oneDNN via mkldnn._linear_pointwise and via
   F.linear on to_mkldnn() tensors; MKL packed-weight mkl._mkl_linear), best of --probe-reps
   calls each. The attainable step replaces the step's GEMM time by its FLOPs at those best
   rates: step - GEMM + sum over shapes of FLOPs / best rate. MFU (model FLOPs / step / the
   CPU's measured fp32 peak, gemref.mfu.peak) is shown for the step, the attainable step, and
   with GEMMs at the peak itself, so the gap to the limit is visible.
"""
from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict
from dataclasses import asdict
from typing import Callable

import torch
import torch.nn.functional as F

from ..options import add_dataset_arg, nonnegative_int, output_file, positive_int
from ..config import PRESETS, override
from ..data.folder import dataset_preset
from ..mfu.flops import model_flops
from ..mfu.op_classes import CLASSES, ancestors_of, op_class
from ..mfu.peak import device_name, peak_flops
from ..mfu.profile import quiet_profile
from ..report import format_table
from ..runtime.files import write_json
from ..env import versions
from ..train import sample_batch, setup

def _gemm_shape(name: str, shapes: list) -> tuple[int, int, int, int] | None:
    """(batch, M, K, N) of a leaf GEMM op from its recorded input shapes."""
    op = name.split("::")[-1]
    try:
        if op == "mm":
            (m, k), (_, n) = shapes[0], shapes[1]
            return 1, m, k, n
        if op == "_linear_pointwise":            # oneDNN's linear: x (M, K), W (N, K)
            (m, k), (n, _) = shapes[0], shapes[1]
            return 1, m, k, n
        if op == "addmm":
            (m, k), (_, n) = shapes[1], shapes[2]
            return 1, m, k, n
        if op in ("bmm", "baddbmm"):
            (b, m, k), (_, _, n) = shapes[-2:] if op == "bmm" else shapes[1:3]
            return b, m, k, n
    except (ValueError, IndexError, TypeError):
        return None
    return None


OTHER_ROWS = 15      # rows of the printed "other" table (the record holds every op)
UNTRACED = "(untraced: Python, autograd engine, gaps)"


def classify(events, steps: int, per_boundary: float = 0.0) -> tuple[dict[str, float], dict[str, float],
                                                                dict[tuple, dict], dict[str, dict]]:
    """(seconds per step by class as profiled, the same with the profiler's cost out, {(B, M, K,
    N): {"calls", "seconds"} per step} of the GEMM ops, {op name: {"calls", "seconds",
    "profiled_seconds"} per step} of the ops classed other). Classes: gemref/mfu/op_classes.py.

    The profiler's cost comes out event by event: each event gives back `per_boundary` seconds
    for itself and for each direct child (profiler_cost_per_boundary), never going
    below 0; "seconds" are net of it, "profiled_seconds" as recorded."""
    raw: dict[str, float] = dict.fromkeys(CLASSES, 0.0)
    net: dict[str, float] = dict.fromkeys(CLASSES, 0.0)
    shapes: dict[tuple, dict] = defaultdict(lambda: {"calls": 0.0, "seconds": 0.0})
    other: dict[str, dict] = defaultdict(lambda: {"calls": 0.0, "seconds": 0.0, "profiled_seconds": 0.0})
    for e in events:
        cls = op_class(e.name, ancestors_of(e))
        s = e.self_cpu_time_total / 1e6
        kept = max(0.0, s - per_boundary * (1 + len(e.cpu_children))) / steps
        raw[cls] += s / steps
        net[cls] += kept
        shape = _gemm_shape(e.name, e.input_shapes) if cls == "gemm" else None
        use = shapes[shape] if shape is not None else other[e.name] if cls == "other" else None
        if use is not None:
            use["calls"] += 1 / steps
            use["seconds"] += kept
            if cls == "other":
                use["profiled_seconds"] += s / steps
    return raw, net, dict(shapes), dict(other)


def event_boundaries(events) -> int:
    """The profiler's event boundaries: every event once, and once more per direct child."""
    return sum(1 + len(e.cpu_children) for e in events)


def profiler_cost_per_boundary(boundaries: float, profiled_s: float, unprofiled_s: float) -> float:
    """Seconds the profiler adds per event boundary (an estimate): the step timed with and without
    it, cost = profiled_s - unprofiled_s, spread evenly over the boundaries it recorded (an event
    counts once for itself and once per direct child: recording a child runs inside its parent's
    self time); 0 when the profiled step was not slower. Left in, that cost lands mostly in the
    parents of many small ops (autograd nodes, a block's record_function), which are "other"."""
    cost = profiled_s - unprofiled_s
    return cost / boundaries if cost > 0 and boundaries > 0 else 0.0


def _paths(b: int, m: int, k: int, n: int) -> dict[str, Callable[[], object]]:
    """The GEMM paths this torch offers for one shape (operands made here, untimed)."""
    gen = torch.Generator().manual_seed(0)
    if b > 1:
        x, y = torch.randn(b, m, k, generator=gen), torch.randn(b, k, n, generator=gen)
        return {"torch.bmm": lambda: torch.bmm(x, y)}
    a, w = torch.randn(m, k, generator=gen), torch.randn(n, k, generator=gen)   # w: a Linear's (out, in)
    wt = w.t().contiguous()
    paths = {"torch.mm": lambda: torch.mm(a, wt)}
    if torch.backends.mkldnn.is_available():
        if hasattr(torch.ops.mkldnn, "_linear_pointwise"):
            paths["onednn _linear_pointwise"] = lambda: torch.ops.mkldnn._linear_pointwise(a, w, None, "none", [], "")
        am, wm = a.to_mkldnn(), w.to_mkldnn()
        paths["onednn F.linear (mkldnn tensors)"] = lambda: F.linear(am, wm)
    if torch.backends.mkl.is_available() and hasattr(torch.ops.mkl, "_mkl_linear"):
        packed = torch.ops.mkl._mkl_reorder_linear_weight(w, m)
        paths["mkl packed _mkl_linear"] = lambda: torch.ops.mkl._mkl_linear(a, packed, w, None, m)
    return paths


def probe_gemm(b: int, m: int, k: int, n: int, reps: int) -> dict:
    """Best FLOP/s of each GEMM path on this shape (one warm-up call, then the fastest of `reps`)."""
    flops = 2 * b * m * k * n
    rates = {}
    for name, fn in _paths(b, m, k, n).items():
        try:
            fn()
        except RuntimeError:      # a path this build lists but cannot run for this shape
            continue
        best = min(_timed(fn) for _ in range(reps))
        rates[name] = flops / best
    path = max(rates, key=rates.get)
    return {"best_path": path, "best_flops_per_s": rates[path], "rates": rates}


def _timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return max(time.perf_counter() - t0, 1e-9)


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="small", choices=list(PRESETS), help="model/data preset")
    add_dataset_arg(p)
    p.add_argument("--batch-size", type=positive_int, default=64, help="samples per step")
    p.add_argument("--kernel", default="auto", help="gdpa kernel (auto: the fastest that runs here)")
    p.add_argument("--padded", action="store_true", help="the padded layout instead of jagged")
    p.add_argument("--threads", type=positive_int, default=1, help="torch CPU threads (default 1)")
    p.add_argument("--warmup", type=nonnegative_int, default=3, help="untimed steps first")
    p.add_argument("--timed-steps", type=positive_int, default=10, help="timed training steps (median)")
    p.add_argument("--profile-steps", type=positive_int, default=3, help="profiled steps (op classes are their mean)")
    p.add_argument("--probe-reps", type=positive_int, default=20, help="timed calls per GEMM shape and path (best kept)")
    p.add_argument("--json", metavar="PATH", type=output_file, help="write the record here")


def profile_step(s, batch, *, warmup: int = 3, timed_steps: int = 10, profile_steps: int = 3,
                 probe_reps: int = 20) -> dict:
    """Steps 1-3 of the module docstring for a built Setup `s` (gemref.train.setup) on one batch:
    {"step_wall_s", "step_cpu_s" (lists, seconds), "profiled_step_s", "paired_unprofiled_step_s"
    (the steps run right before the profiled ones), "profiled_step_cpu_s", "classes" (ms per
    step and share, the profiler's cost out), "classes_profiled" (as profiled),
    "profiler_s_per_boundary", "gemm_shapes", "other_ops" (the ops classed other, largest
    first, with the untraced remainder as one row), "limits" (step_ms and MFU of the
    step, with GEMMs at the best probed rate, with GEMMs at the peak), "model_flops",
    "peak_flops", "peak_source"}."""
    for _ in range(warmup):
        s.step(batch)
    timed = [s.timed_step(lambda: batch)[0] for _ in range(timed_steps)]   # the one step timer
    wall, cpu = [r.step_s for r in timed], [r.process_cpu_s for r in timed]
    step_s = statistics.median(wall)
    # Each profiled step right after an unprofiled one (A B A B): their mean gap is the profiler's
    # own cost, which, spread over the event boundaries it recorded, comes out of each event's self
    # time (classify).
    sessions, plain, profiled, profiled_cpu = [], [], [], []
    for _ in range(profile_steps):
        t0 = time.perf_counter()
        s.step(batch)
        plain.append(time.perf_counter() - t0)
        prof = quiet_profile("cpu")
        prof.record_shapes = True   # read when the trace starts
        with prof:
            t0, c0 = time.perf_counter(), time.process_time()
            s.step(batch)
            profiled.append(time.perf_counter() - t0)
            profiled_cpu.append(time.process_time() - c0)
        sessions.append(prof)
    profiled_s, profiled_cpu_s = statistics.fmean(profiled), statistics.fmean(profiled_cpu)
    events = [e for prof in sessions for e in prof.events()]
    per = profiler_cost_per_boundary(event_boundaries(events) / profile_steps, profiled_s, statistics.fmean(plain))
    profiled_seconds, seconds, shapes, other = classify(events, profile_steps, per)
    untraced = max(0.0, profiled_s - sum(profiled_seconds.values()))    # untraced Python and gaps
    for by_class in (profiled_seconds, seconds):
        by_class["other"] += untraced
    other[UNTRACED] = {"calls": 0.0, "seconds": untraced, "profiled_seconds": untraced}
    gemm_rows = []
    for (b, m, k, n), use in sorted(shapes.items(), key=lambda kv: -kv[1]["seconds"]):
        probe = probe_gemm(b, m, k, n, probe_reps)
        flops = 2 * b * m * k * n * use["calls"]
        gemm_rows.append({"shape_bmkn": f"{b}x{m}x{k}x{n}", "calls_per_step": use["calls"],
                          "ms_per_step": 1e3 * use["seconds"], "step_gflops_per_s": flops / use["seconds"] / 1e9
                          if use["seconds"] else None, "best_gflops_per_s": probe["best_flops_per_s"] / 1e9,
                          "best_path": probe["best_path"], "best_ms_per_step": 1e3 * flops / probe["best_flops_per_s"],
                          "gflop_per_step": flops / 1e9, "rates": {p: r / 1e9 for p, r in probe["rates"].items()}})
    accounted = sum(seconds.values()) or 1.0                 # the step's seconds by class, the profiler's cost out
    gemm_s = seconds["gemm"] * step_s / accounted            # the GEMM share of the unprofiled step
    gemm_best_s = sum(r["best_ms_per_step"] for r in gemm_rows) / 1e3
    gemm_flops = sum(r["gflop_per_step"] for r in gemm_rows) * 1e9
    peak = peak_flops("cpu", "fp32")
    model = model_flops(s.preset.model, batch.lengths).total
    limits = {"step": step_s, "gemm_at_best_rate": step_s - gemm_s + gemm_best_s,
              "gemm_at_peak": step_s - gemm_s + (gemm_flops / peak.flops if peak.flops else 0.0)}
    return {"step_wall_s": wall, "step_cpu_s": cpu, "profiled_step_s": profiled_s,
            "paired_unprofiled_step_s": statistics.fmean(plain),
            "profiled_step_cpu_s": profiled_cpu_s,
            "classes": [{"class": c, "ms_per_step": 1e3 * seconds[c], "share": seconds[c] / accounted}
                        for c in CLASSES],
            "classes_profiled": [{"class": c, "ms_per_step": 1e3 * profiled_seconds[c],
                                  "share": profiled_seconds[c] / profiled_s} for c in CLASSES],
            "profiler_s_per_boundary": per,
            "gemm_shapes": gemm_rows,
            "other_ops": [{"op": name, "calls_per_step": use["calls"], "ms_per_step": 1e3 * use["seconds"],
                           "share_of_step": use["seconds"] / accounted,
                           "profiled_ms_per_step": 1e3 * use["profiled_seconds"]}
                          for name, use in sorted(other.items(), key=lambda kv: -kv[1]["seconds"])],
            "limits": [{"case": case, "step_ms": 1e3 * t, "mfu": model / t / peak.flops if peak.flops else None}
                       for case, t in limits.items()],
            "model_flops": model, "peak_flops": peak.flops, "peak_source": peak.source}


def run(args: argparse.Namespace) -> int:
    torch.set_num_threads(args.threads)
    preset = dataset_preset(args.preset, args.dataset)
    train = override(preset.train, batch_size=args.batch_size, jagged=not args.padded, kernel=args.kernel)
    s = setup(preset, train, device="cpu")
    rec = profile_step(s, sample_batch(s), warmup=args.warmup, timed_steps=args.timed_steps,
                       profile_steps=args.profile_steps, probe_reps=args.probe_reps)
    where = (f"{preset.name}, {'padded' if args.padded else 'jagged'}, kernel {s.kernel}, batch {args.batch_size}, "
             f"{args.threads} thread(s), {device_name('cpu')}")
    print(f"step: median wall {1e3 * statistics.median(rec['step_wall_s']):.1f} ms, process CPU "
          f"{1e3 * statistics.median(rec['step_cpu_s']):.1f} ms over {args.timed_steps} steps ({where}); profiled "
          f"step {1e3 * rec['profiled_step_s']:.1f} ms wall, {1e3 * rec['profiled_step_cpu_s']:.1f} ms CPU")
    print(format_table(rec["classes"], title=f"time per op class (self CPU time of profiled steps, the profiler's own "
                                             f"cost out: {1e6 * rec['profiler_s_per_boundary']:.1f} us per event "
                                             "boundary)"))
    print(format_table(rec["other_ops"][:OTHER_ROWS], title=f"what 'other' is, op by op (self CPU time; the "
                       f"{OTHER_ROWS} largest of {len(rec['other_ops'])})"))
    print(format_table(rec["gemm_shapes"], ["shape_bmkn", "calls_per_step", "ms_per_step", "step_gflops_per_s",
                                            "best_gflops_per_s", "best_path", "best_ms_per_step"],
                       title="GEMM shapes of the step: in the step vs alone on the best path"))
    print(format_table(rec["limits"], title=f"the step and its limits; MFU against {rec['peak_source']}"))
    if args.json:
        write_json(args.json, {"bench": "step_profile", "preset": preset.name, "data": asdict(preset.data),
                               "batch_size": args.batch_size,
                               "kernel": s.kernel, "jagged": not args.padded, "threads": args.threads,
                               "device": device_name("cpu"), "versions": versions(), **rec})
        print(f"wrote {args.json}")
    return 0
