"""Every GPU check of gemref in one run, writing one JSON (see scripts/gpu_check.sh).

Each check is a command run in a subprocess with its own time limit; the JSON records, per
check, the command, exit status, seconds, the tail of its output and any JSON record it
wrote. Correctness first (kernel tests on CUDA, FLOP verification), then timings (attention
bench, precision, compile + AutoAC, FSDP on one GPU, the waterfall at the base preset).
The whole run is sized to stay under 8 minutes on one H100/H200.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

PY = sys.executable
TOTAL_BUDGET_S = 470   # the whole run stays under 8 minutes, start-up included


def checks(out: Path) -> list[tuple[str, list[str], int]]:
    """(name, command, time limit in seconds). JSON records go to out/<name>.json."""
    j = lambda name: ["--json", str(out / f"{name}.json")]  # noqa: E731
    return [
        ("kernel_tests", [PY, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                          "tests/test_attention_kernels.py", "tests/test_attention_triton.py"], 90),
        ("flops_verify", [PY, "-m", "gemref", "flops", "--preset", "base", "--verify", "--device", "cuda",
                          "--batch-size", "32", *j("flops_verify")], 40),
        ("bench_attention", [PY, "-m", "gemref", "bench", "attention", "--device", "cuda", "--quick",
                             *j("bench_attention")], 60),
        ("bench_precision", [PY, "-m", "gemref", "bench", "precision", "--device", "cuda",
                             "--precisions", "bf16", "float8_rowwise", "float8_tensorwise", "mxfp8",
                             "--preset", "base", "--steps-per-precision", "12", *j("bench_precision")], 60),
        ("bench_autoac", [PY, "-m", "gemref", "bench", "autoac", "--preset", "base", "--device", "cuda",
                          "--compile", "--budgets", "1.0,0.5", "--steps-per-strategy", "5", "--warmup", "2", "--find-batch",
                          "--max-batch", "2048", *j("bench_autoac")], 90),
        ("fsdp_1x1_nccl", [PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1", "-m",
                           "gemref", "train", "--preset", "tiny", "--device", "cuda", "--mesh", "1x1",
                           "--sparse-sharding", "row", "--steps", "6", "--quiet", *j("fsdp_1x1_nccl")], 40),
        ("waterfall", [PY, "-m", "gemref", "waterfall", "--device", "cuda", "--preset", "base",
                       "--repeats", "3", "--steps-per-window", "3", "--warmup", "2", "--out", str(out / "waterfall")], 90),
    ]


def run_check(name: str, cmd: list[str], limit: int, out: Path) -> dict:
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=limit)
        status, text = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as e:
        status = "timeout"
        text = ((e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or ""))
    result = {"command": " ".join(cmd), "status": status, "seconds": round(time.perf_counter() - start, 1),
              "output_tail": text[-4000:]}
    record = out / f"{name}.json"
    if record.exists():
        result["record"] = json.loads(record.read_text())
    print(f"{name}: {status} in {result['seconds']} s", flush=True)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "artifacts/gpu_check"))
    parser.add_argument("--only", nargs="*", help="run only these checks")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    import torch

    summary = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "platform": platform.platform(),
               "python": platform.python_version(), "torch": torch.__version__,
               "cuda_available": torch.cuda.is_available(),
               "device": torch.cuda.get_device_name() if torch.cuda.is_available() else None, "checks": {}}
    deadline = time.perf_counter() + TOTAL_BUDGET_S
    for name, cmd, limit in checks(out):
        if args.only and name not in args.only:
            continue
        left = deadline - time.perf_counter()
        if left < 15:
            summary["checks"][name] = {"command": " ".join(cmd), "status": "skipped: out of time"}
            continue
        summary["checks"][name] = run_check(name, cmd, min(limit, int(left)), out)
        (out / "gpu_check.json").write_text(json.dumps(summary, indent=2))
    failed = [n for n, c in summary["checks"].items() if c["status"] != 0]
    print(f"wrote {out / 'gpu_check.json'}; failed: {failed or 'none'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
