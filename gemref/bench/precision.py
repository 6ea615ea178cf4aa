"""Linear GEMM time and SQNR per precision (fp32, bf16, float8, MXFP8), side by side.

For each shape MxKxN (M tokens, K in-features, N out-features) and precision, one
bias-free nn.Linear converted by `gemref.precision.apply.apply_precision` runs forward+backward
(3 GEMMs) `--reps` times after `--warmup`: median time, TFLOP/s, the speed-up vs fp32 and bf16
(t_ref / t), and the SQNR of output, input grad and weight grad against the fp32 layer
(gemref/precision/linear_compare.py). Emulated paths (no float8/MXFP8 hardware) reproduce the
numerics only: their ratios read "emulated" and make no speed claim.
With `--preset P`, it also trains that preset for `--steps-per-precision` steps in each
precision through the training loop and reports whole-step time, MFU against the peak of the
dtype its GEMMs ran in (gemref/mfu/meter.py `gemm_dtype`: bf16 runs the bf16 peak, native
float8/MXFP8 "bf16-equivalent", fp32 and CPU emulation the fp32 peak) and the eval loss
(gemref/measure/precision_step.py `train_per_precision`).
"""
from __future__ import annotations

import argparse
import logging

import torch

from ..options import add_dataset_arg, add_device_arg, device_of, nonnegative_int, output_file, positive_int
from ..train.presets import PRESETS, dataset_preset
from ..errors import UsageError
from ..precision.config import PRECISION_KERNELS as KERNELS, PRECISIONS
from ..precision.linear_compare import compare_shape
from ..report import format_table
from ..runtime.files import write_json
from ..measure.precision_step import train_per_precision

DEFAULT_DIMS = {
    "cpu": ["1024x256x1024", "1024x1024x256"],
    "cuda": ["8192x512x2048", "16384x4096x4096", "16384x8192x8192"],
}


def configure_parser(parser: argparse.ArgumentParser) -> None:
    add_device_arg(parser)
    defaults = "; ".join(f"{device}: {' '.join(dims)}" for device, dims in DEFAULT_DIMS.items())
    parser.add_argument("--dims", nargs="+", metavar="MxKxN", help=f"GEMM shapes (default: {defaults})")
    parser.add_argument("--precisions", nargs="+", choices=PRECISIONS, default=list(PRECISIONS))
    parser.add_argument("--kernel", choices=KERNELS, default="auto")
    parser.add_argument("--warmup", type=nonnegative_int, default=3)
    parser.add_argument("--reps", type=positive_int, default=10)
    parser.add_argument("--seed", type=nonnegative_int, default=0)
    parser.add_argument("--preset", choices=list(PRESETS),
                        help="also time whole training steps of this preset per precision")
    add_dataset_arg(parser)
    parser.add_argument("--steps-per-precision", type=positive_int, default=30,
                        help="optimisation steps of each --preset training run")
    parser.add_argument("--min-dim", type=nonnegative_int, default=64, help="precision_min_dim for --preset runs")
    parser.add_argument("--json", metavar="PATH", type=output_file, help="write the record here")


def parse_dims(text: str) -> tuple[int, int, int]:
    parts = text.lower().split("x")
    if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise UsageError(f"--dims {text!r}: expected MxKxN with positive integers, e.g. 1024x256x1024")
    m, k, n = (int(p) for p in parts)
    return m, k, n


def run(args: argparse.Namespace) -> int:
    if args.dataset and not args.preset:
        raise UsageError("--dataset is the data of the --preset training runs: add --preset NAME")
    device = device_of(args.device)
    shapes = [parse_dims(d) for d in (args.dims or DEFAULT_DIMS[device.type])]
    logging.getLogger("gemref.precision.apply").setLevel(logging.ERROR)  # the table states the path
    rows = []
    for m, k, n in shapes:
        rows += compare_shape(m, k, n, args.precisions, device, args.kernel, args.warmup, args.reps, args.seed)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({torch.get_num_threads()} threads)"
    columns = ["shape", "precision", "kernel", "ms", "tflops", "vs_fp32", "vs_bf16",
               "out_sqnr_db", "dgrad_sqnr_db", "wgrad_sqnr_db"]
    print(format_table(rows, columns, title=f"Linear forward+backward on {name}; median of {args.reps} "
                                            f"after {args.warmup} warm-up; vs_* = speed-up (t_ref / t)"))
    for reason in dict.fromkeys(r["kernel_reason"] for r in rows if r["kernel"] == "emulated"):
        print(f"emulated: {reason}")
    steps = whole_steps(args, device) if args.preset else []
    if args.json:
        try:
            import torchao
            torchao_version = torchao.__version__
        except ImportError:
            torchao_version = None
        write_json(args.json, {"bench": "precision", "device": name, "torch": torch.__version__,
                               "torchao": torchao_version, "warmup": args.warmup, "reps": args.reps,
                               "rows": rows, "whole_steps": steps})
    return 0


def whole_steps(args: argparse.Namespace, device: torch.device) -> list[dict]:
    """Train the preset in each precision and print the table; one row per precision (step time, MFU, eval loss)."""
    rows = train_per_precision(dataset_preset(args.preset, args.dataset), args.precisions,
                               steps=args.steps_per_precision, kernel=args.kernel, min_dim=args.min_dim, seed=args.seed,
                               device=device.type)
    print(format_table(rows, title=f"whole training steps, {args.preset} preset"
                                   + (f" on dataset {args.dataset}" if args.dataset else "") + f", {args.steps_per_precision} steps "
                                   f"per precision (speedup vs bf16, else fp32)"))
    return rows
