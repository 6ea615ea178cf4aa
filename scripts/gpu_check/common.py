"""What the GPU check's section children (ceilings.py, correctness.py, timing.py, rungs.py)
share: their arguments, the incremental result file, the device, a timer, the TF32 policy,
an error's text.
The variants they run are gemref.attention.testing.VARIANTS."""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Callable


def parse_args(description: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--result", required=True, help="JSON file rewritten after every finished item")
    parser.add_argument("--dry-run", action="store_true", help="CPU, Triton interpreter, tiny shapes")
    parser.add_argument("--shard", default="0/1", help="i/n: run every n-th item starting at i")
    args = parser.parse_args()
    args.shard_index, args.shard_count = (int(x) for x in args.shard.split("/"))
    if args.dry_run and os.environ.get("TRITON_INTERPRET") != "1":
        os.environ["TRITON_INTERPRET"] = "1"    # before any kernel is decorated
    return args


class Result:
    """A dict written to `path` (atomically) whenever `save` is called."""

    def __init__(self, path: str, **fields) -> None:
        self.path = Path(path)
        self.data = dict(fields)
        self.save()

    def save(self) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=str))
        os.replace(tmp, self.path)

    def append(self, key: str, item: dict) -> None:
        self.data.setdefault(key, []).append(item)
        self.save()


def device(dry_run: bool):
    import torch

    if dry_run:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device (use --dry-run on CPU)")
    return torch.device("cuda")


def bench_ms(fn: Callable[[], object], device) -> float:
    """Median milliseconds of fn: triton.testing.do_bench on CUDA (L2 flushed between calls),
    else one perf_counter call (the dry run: it tests the plumbing, and interpreted kernels
    are too slow to repeat; callers have run fn once already)."""
    if device.type == "cuda":
        from triton.testing import do_bench

        return float(do_bench(fn, warmup=10, rep=60, return_mode="median"))
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def tf32_policy() -> dict:
    """How this process runs fp32 GEMMs: torch's TF32 switches as they stand (gemref sets none of
    them; its Triton GDPA kernel's fp32 dot follows torch.backends.cuda.matmul.allow_tf32), and the
    newer per-backend fp32_precision settings where this torch has them."""
    import torch

    policy = {"float32_matmul_precision": torch.get_float32_matmul_precision(),
              "cuda_matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
              "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
              "triton_gdpa_fp32_dot": "tf32" if torch.backends.cuda.matmul.allow_tf32 else "ieee"}
    for name, backend in (("cuda_matmul", torch.backends.cuda.matmul), ("cudnn", torch.backends.cudnn)):
        if hasattr(backend, "fp32_precision"):
            policy[f"{name}_fp32_precision"] = backend.fp32_precision
    return policy


def error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ''}"
