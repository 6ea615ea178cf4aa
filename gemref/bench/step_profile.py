"""Where a CPU training step's time goes by op class, and how fast it could be with its GEMMs at their best rate.

`--precision bf16` profiles the step under bf16 autocast: its GEMMs are probed in bf16 and its
MFU divides by the bf16 peak; the "gemm_free" limit is the step with no GEMM time at all, the
most a faster GEMM (bf16 on a matrix engine included) can give it.

The measurement is gemref/mfu/step_profile.py `profile_step` (op classes with the profiler's
own cost out: the same account as the waterfall's breakdown); this command builds the step,
prints its tables and writes its record.
"""
from __future__ import annotations

import argparse
import statistics
from dataclasses import asdict

import torch

from ..options import add_dataset_arg, nonnegative_int, output_file, positive_int
from ..train.presets import PRESETS, dataset_preset
from ..train.override import override
from ..mfu.gemm_paths import DTYPES
from ..mfu.peak import device_name
from ..mfu.step_profile import profile_step
from ..report import format_table
from ..runtime.files import write_json
from ..env import versions
from ..train import sample_batch, setup

PRECISIONS = tuple(DTYPES)   # the precisions with CPU GEMM paths of their own (float8/MX are emulated there)
OTHER_ROWS = 15      # rows of the printed "other" table (the record holds every op)


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="small", choices=list(PRESETS), help="model/data preset")
    add_dataset_arg(p)
    p.add_argument("--batch-size", type=positive_int, default=64, help="samples per step")
    p.add_argument("--kernel", default="auto", help="gdpa kernel (auto: the fastest that runs here)")
    p.add_argument("--padded", action="store_true", help="the padded layout instead of jagged")
    p.add_argument("--precision", choices=PRECISIONS, default="fp32",
                   help="the step's precision (bf16: autocast with fp32 master weights; GEMMs probed in bf16)")
    p.add_argument("--threads", type=positive_int, default=1, help="torch CPU threads (default 1)")
    p.add_argument("--warmup", type=nonnegative_int, default=3, help="untimed steps first")
    p.add_argument("--timed-steps", type=positive_int, default=10, help="timed training steps (median)")
    p.add_argument("--profile-steps", type=positive_int, default=3, help="profiled steps (op classes are their mean)")
    p.add_argument("--probe-reps", type=positive_int, default=20, help="timed calls per GEMM shape and path (best kept)")
    p.add_argument("--json", metavar="PATH", type=output_file, help="write the record here")


def run(args: argparse.Namespace) -> int:
    torch.set_num_threads(args.threads)
    preset = dataset_preset(args.preset, args.dataset)
    train = override(preset.train, batch_size=args.batch_size, jagged=not args.padded, kernel=args.kernel,
                     precision=args.precision)
    s = setup(preset, train, device="cpu")
    rec = profile_step(s, sample_batch(s), warmup=args.warmup, timed_steps=args.timed_steps,
                       profile_steps=args.profile_steps, probe_reps=args.probe_reps)
    where = (f"{preset.name}, {args.precision}, {'padded' if args.padded else 'jagged'}, kernel {s.kernel}, "
             f"batch {args.batch_size}, {args.threads} thread(s), {device_name('cpu')}")
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
                       title=f"GEMM shapes of the step: in the step vs alone on the best {rec['gemm_dtype']} path"))
    print(format_table(rec["limits"], title=f"the step and its limits; MFU against {rec['peak_source']}"))
    if args.json:
        write_json(args.json, {"bench": "step_profile", "preset": preset.name, "data": asdict(preset.data),
                               "batch_size": args.batch_size, "precision": args.precision,
                               "kernel": s.kernel, "jagged": not args.padded, "threads": args.threads,
                               "device": device_name("cpu"), "versions": versions(), **rec})
        print(f"wrote {args.json}")
    return 0
