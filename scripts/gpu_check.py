"""The GPU check's driver (run through scripts/gpu_check.sh): sections in order, each in child
processes with a time budget, one summary JSON and one log.

Sections (each a script in scripts/, run as `python SCRIPT --result FILE [--dry-run]`):
  environment  (here, no torch) Python, packages, wheels, nvidia-smi, git;
  ceilings     bf16 8192^3 GEMM TFLOP/s, device-to-device copy GB/s, optional packages;
  correctness  the Triton GDPA kernel on CUDA at fixed tiles against the float64 reference,
               every variant, plus repeat-run determinism; split over parallel shards, which
               also compiles every kernel the timing section needs (Triton's disk cache);
  timing       forward and backward of every variant at L = 2048, D = 128, bf16, fixed and
               skewed lengths, beside torch's flash/cuDNN attention for softmax;
  rungs        the base preset's rungs 0-2 (padded, jagged, fused attention) on one small
               generated shard, MFU in bf16; gets whatever time is left.
After the timing section the summary's "gdpa_default" names the fastest correct variant
(scripts/gpu_check_winner.py: the rule that makes the measured winner the library default).
Every child runs in its own session (process group); at its budget or the overall deadline
the whole group is killed (SIGTERM, then SIGKILL). A child rewrites its --result file after
every finished item, so a killed section still reports what it finished. The summary
(gpu_check.json) is rewritten after every section; gpu_check.log holds every child's output.
Only those two files are written to --out; scratch goes to a temporary folder.

--dry-run runs the same sections on CPU (Triton interpreter, tiny shapes, small budgets):
tests/test_gpu_check.py runs it, so the check cannot rot between GPU sessions.
"""
from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import importlib.util
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from gpu_check_common import VARIANTS
from gpu_check_winner import choose

ROOT = Path(__file__).resolve().parents[1]
TOTAL_BUDGET_S = 470          # the whole run, wheel install included, stays under 8 minutes
DRY_BUDGET_S = 300            # safety nets only: the dry run takes ~30 s of CPU in all
MIN_SECTION_S = 20            # skip a section with less time than this left
KILL_GRACE_S = 3
PACKAGES = ("torch", "triton", "numpy", "pyarrow", "yaml", "hypothesis", "tqdm", "narwhals", "packaging",
            "torchao", "plotly", "flash_attn")


@dataclass(frozen=True)
class Section:
    name: str
    script: str
    budget_s: int            # on a GPU
    dry_budget_s: int        # in --dry-run
    shards: int = 1          # parallel children (shard i of n)


SECTIONS = (
    Section("ceilings", "gpu_check_ceilings.py", 60, 90),
    Section("correctness", "gpu_check_correctness.py", 150, 90, shards=0),   # 0: one per 2 CPUs, <= 8
    Section("timing", "gpu_check_timing.py", 150, 90),
    Section("rungs", "gpu_check_rungs.py", 240, 90),
)
_running: list[subprocess.Popen] = []


def kill_group(proc: subprocess.Popen) -> None:
    """End a child and everything it started (its whole session): TERM, then KILL."""
    for sig, wait_s in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            if sig == signal.SIGTERM:    # the leader is gone; finish off any survivors
                os.killpg(proc.pid, signal.SIGKILL)
            return
        except subprocess.TimeoutExpired:
            continue
        except ProcessLookupError:
            return


def run_children(commands: list[list[str]], logs: list[Path], timeout_s: float, env: dict) -> list[dict]:
    """Start every command in its own session, wait until all end or `timeout_s` passes, then
    kill the groups still running. Returns [{status, seconds}] in order."""
    start = time.monotonic()
    procs = []
    for cmd, log in zip(commands, logs):
        with open(log, "ab") as out:
            procs.append(subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=env,
                                          start_new_session=True))
    _running.extend(procs)
    results = []
    for proc in procs:
        try:
            rc = proc.wait(timeout=max(0.0, timeout_s - (time.monotonic() - start)))
            status = "ok" if rc == 0 else f"failed (exit {rc})"
        except subprocess.TimeoutExpired:
            kill_group(proc)
            status = f"timeout after {timeout_s:.0f} s (process group killed)"
        kill_group(proc)      # the leader exited: end anything it left behind in its group
        _running.remove(proc)
        results.append({"status": status, "seconds": round(time.monotonic() - start, 1)})
    return results


def environment(dry_run: bool) -> dict:
    """What this host has, without importing torch (that is the children's job)."""
    def version(name):
        if importlib.util.find_spec(name) is None:
            return None
        dist = {"yaml": "PyYAML"}.get(name, name)
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return "present (version unknown)"

    def command(*cmd):
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=15, cwd=ROOT)
            return (out.stdout.strip() or out.stderr.strip())[:2000]
        except (OSError, subprocess.SubprocessError) as e:
            return f"unavailable: {type(e).__name__}"

    return {"python": platform.python_version(), "platform": platform.platform(), "cpus": os.cpu_count(),
            "packages": {name: version(name) for name in PACKAGES},
            "wheels": os.environ.get("GPU_CHECK_WHEELS", "not reported (run through scripts/gpu_check.sh)"),
            "wheel_site": sorted(os.listdir(site)) if (site := os.environ.get("GPU_CHECK_SITE")) and
            os.path.isdir(site) else None,
            "nvidia_smi": None if dry_run else command("nvidia-smi", "--query-gpu=name,driver_version,memory.total,"
                                                       "clocks.max.sm,power.limit", "--format=csv"),
            "git": command("git", "rev-parse", "--short", "HEAD"),
            "GEMREF_GDPA": os.environ.get("GEMREF_GDPA", "")}


def write_json(path: Path, data: dict) -> None:
    tmp = path.with_name("." + path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str))
    os.replace(tmp, path)


def shard_count(section: Section, dry_run: bool) -> int:
    if section.shards:
        return section.shards
    return 2 if dry_run else max(1, min(8, (os.cpu_count() or 2) // 2))


def run_section(section: Section, left_s: float, dry_run: bool, scratch: Path, log: Path, env: dict) -> dict:
    budget = min(section.dry_budget_s if dry_run else section.budget_s, left_s)
    n = shard_count(section, dry_run)
    results = [scratch / f"{section.name}.{i}.json" for i in range(n)]
    logs = [log] if n == 1 else [scratch / f"{section.name}.{i}.log" for i in range(n)]
    commands = [[sys.executable, str(ROOT / "scripts" / section.script), "--result", str(r),
                 *(["--dry-run"] if dry_run else []), *(["--shard", f"{i}/{n}"] if n > 1 else [])]
                for i, r in enumerate(results)]
    with open(log, "a") as out:
        out.write(f"\n===== {section.name}: {n} child(ren), budget {budget:.0f} s =====\n")
    runs = run_children(commands, logs, budget, env)
    if n > 1:   # shard logs go into the one log, in order
        with open(log, "a") as out:
            for i, shard_log in enumerate(logs):
                out.write(f"----- {section.name} shard {i}/{n} -----\n")
                out.write(shard_log.read_text(errors="replace") if shard_log.exists() else "(no output)\n")
    parts = [json.loads(r.read_text()) if r.exists() else {} for r in results]
    statuses = [r["status"] for r in runs]
    status = "ok" if all(s == "ok" for s in statuses) else "; ".join(
        f"shard {i}: {s}" if n > 1 else s for i, s in enumerate(statuses) if s != "ok")
    return {"status": status, "seconds": max(r["seconds"] for r in runs), "budget_s": round(budget),
            "result": parts[0] if n == 1 else merge_shards(parts)}


def merge_shards(parts: list[dict]) -> dict:
    """Lists are concatenated, numbers summed, other values kept from the first shard."""
    merged: dict = {}
    for part in parts:
        for key, value in part.items():
            if isinstance(value, list):
                merged.setdefault(key, []).extend(value)
            elif isinstance(value, (int, float)) and not isinstance(value, bool):
                merged[key] = merged.get(key, 0) + value
            else:
                merged.setdefault(key, value)
    return merged


def headline(summary: dict) -> list[str]:
    """A few lines of the figures that matter, for the console (the JSON has everything)."""
    sections = summary["sections"]
    lines = []
    ceil = sections.get("ceilings", {}).get("result", {})
    if "gemm_bf16" in ceil:
        lines.append(f"ceilings: GEMM {ceil['gemm_bf16']['tflops']:.0f} TFLOP/s, "
                     f"copy {ceil.get('copy_d2d', {}).get('gb_per_s', float('nan')):.0f} GB/s on {ceil.get('gpu', ceil['device'])}")
    corr = sections.get("correctness", {}).get("result", {})
    if corr:
        bad = [c["name"] for c in corr.get("cases", []) + corr.get("determinism", []) if not c.get("passed")]
        lines.append(f"correctness: {corr.get('passed', 0)} passed, {corr.get('failed', 0)} failed {bad or ''}")
    for row in sections.get("timing", {}).get("result", {}).get("rows", []):
        figures = (f"fwd {row['fwd_model_tflops']:7.1f}  bwd {row['bwd_model_tflops']:7.1f} TFLOP/s (model)"
                   if "fwd_ms" in row else row.get("error", ""))
        lines.append(f"timing {row['profile']:6} {row['activation']:7} {row['kernel']:22} {figures}")
    if (pick := summary.get("gdpa_default")) is not None:
        lines.append(f"GDPA default by the rule: {pick['winner']} ({pick.get('spec', pick['reason'])}); "
                     f"fwd {pick.get('fwd_winner')}, bwd {pick.get('bwd_winner')}")
    for rung in sections.get("rungs", {}).get("result", {}).get("rungs", []):
        mfu = f"MFU {rung['mfu']:.3f}" if rung.get("mfu") is not None else rung.get("error", (
            f"no MFU: {rung.get('windows_kept')} of {rung.get('windows')} windows kept, "
            f"{rung.get('contended_windows')} contended attempts"))
        lines.append(f"rung {rung.get('rung', '?'):18} batch {rung.get('batch_size', '?')} {mfu}")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT") or "artifacts/gpu_check")
    parser.add_argument("--dry-run", action="store_true", help="CPU: Triton interpreter, tiny shapes")
    parser.add_argument("--sections", nargs="*", choices=[s.name for s in SECTIONS],
                        help="run only these (none: the environment only)")
    parser.add_argument("--budget", type=float, default=None, help="overall seconds (default 470; dry run 150)")
    args = parser.parse_args()
    t0 = float(os.environ.get("GPU_CHECK_T0") or time.time())
    budget = args.budget or (DRY_BUDGET_S if args.dry_run else TOTAL_BUDGET_S)
    deadline = time.monotonic() + budget - (time.time() - t0)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    summary_path, log = out / "gpu_check.json", out / "gpu_check.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")]))}
    if args.dry_run:
        env.update(TRITON_INTERPRET="1", OMP_NUM_THREADS="1")
    summary = {"check": "gemref gpu_check", "dry_run": args.dry_run, "budget_s": budget,
               "started_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "environment": environment(args.dry_run), "sections": {}, "finished": False}

    def stop(signum, frame):   # killed from outside: end the children, keep what finished
        for proc in list(_running):
            kill_group(proc)
        summary["interrupted"] = f"signal {signum}"
        write_json(summary_path, summary)
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    write_json(summary_path, summary)
    with tempfile.TemporaryDirectory(prefix="gemref_gpu_check_") as scratch:
        env.setdefault("GEMREF_DATA_DIR", str(Path(scratch) / "data"))
        for section in SECTIONS:
            if args.sections is not None and section.name not in args.sections:
                continue
            left = deadline - time.monotonic()
            if left < MIN_SECTION_S:
                summary["sections"][section.name] = {"status": f"skipped: out of time ({left:.0f} s left)"}
            else:
                summary["sections"][section.name] = {"status": "running"}
                write_json(summary_path, summary)
                summary["sections"][section.name] = run_section(section, left, args.dry_run, Path(scratch), log, env)
            print(f"{section.name}: {summary['sections'][section.name]['status']}", flush=True)
            write_json(summary_path, summary)
    if "timing" in summary["sections"]:   # the rule that names the measured winner (gpu_check_winner.py)
        summary["gdpa_default"] = choose(summary, VARIANTS)
    summary.update(finished=True, elapsed_s=round(time.time() - t0, 1))
    write_json(summary_path, summary)
    print("\n".join(headline(summary)), flush=True)
    print(f"wrote {summary_path} and {log} in {summary['elapsed_s']} s", flush=True)
    return 0 if all(s["status"] == "ok" for s in summary["sections"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
