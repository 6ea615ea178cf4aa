"""The GPU check's driver (`python -m scripts.gpu_check`, run by scripts/gpu_check.sh): the
environment, then the sections in priority order, each in children with a time budget
(children.py), one summary JSON and one log; scripts/gpu_check/__init__.py lists the sections.

The whole check fits ONE device call: one overall budget (budget.py: default 300 s, `--budget
S` or GEMREF_GPU_BUDGET_S=S), the sections in priority order (the environment, precision gates
and peak first, then the kernel's correctness, its timing, then the rungs' MFU), and a section
whose estimate no longer fits the time left is skipped with that reason while a later, cheaper
one may still run. After the timing section the summary's "gdpa_default" names the fastest
correct variant (gemref.attention.triton.variant.choose_winner: the rule that makes the measured
winner the library default). The summary (gpu_check.json) is rewritten before and after every
section and whenever a running section finishes an item (a correctness case, a timing row, a
rung: the children's result files are read every POLL_S seconds), so a run killed midway keeps
every row measured so far; gpu_check.log holds every child's output. Only those two files are
written to --out; scratch goes to a temporary folder. Each section's own cap is at most
SECTION_MAX_S (5 minutes): `--sections NAME` reruns a failed one alone. A section whose
packages are missing (the rungs' data pipeline needs numpy, pyarrow and tqdm) is skipped with
the reason; the kernel sections need only torch and Triton.

--dry-run runs the same sections on CPU (Triton interpreter, tiny shapes, small budgets):
tests/test_gpu_check.py runs it, so the check cannot rot between GPU sessions.
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

from .budget import Budget, total_budget
from .children import ROOT, Section, kill_group, run_section, running
from .summary import environment, headline, write_json

SECTION_MAX_S = 300           # no section's cap exceeds this: a failed one reruns alone in 5 minutes
# In priority order: what every later figure needs comes first. ceilings holds the precision
# gates and the bf16 GEMM peak every MFU divides by (~10 s); then whether the kernel is right,
# how fast it is, and the rungs' MFU last (the longest). estimate_s: expected seconds on an
# H100/H200 (never measured yet: no GPU has run the check); dry_estimate_s: the dry run's on a
# shared 2-core Xeon (10, 28, 18 and 43 s measured); budget_s: the cap.
SECTIONS = (
    Section("ceilings", f"{__package__}.ceilings", budget_s=60, dry_budget_s=90, estimate_s=15, dry_estimate_s=10),
    Section("correctness", f"{__package__}.correctness", budget_s=120, dry_budget_s=90, shards=0,
            estimate_s=60, dry_estimate_s=30),
    Section("timing", f"{__package__}.timing", budget_s=120, dry_budget_s=90, estimate_s=60, dry_estimate_s=20),
    # the data pipeline (generated shard, Parquet loader) needs numpy, pyarrow and tqdm; the
    # kernel sections need only torch and Triton
    Section("rungs", f"{__package__}.rungs", budget_s=240, dry_budget_s=150, needs=("numpy", "pyarrow", "tqdm"),
            estimate_s=150, dry_estimate_s=45),
)


def missing_modules(section: Section) -> list[str]:
    return [m for m in section.needs if importlib.util.find_spec(m) is None]


def run_in_order(sections, budget: Budget, dry_run: bool, run: Callable[[Section, float], dict],
                 record: Callable[[str, dict], None],
                 missing: Callable[[Section], list[str]] = missing_modules) -> None:
    """Each section in order (their priority) within `budget`: skipped with the reason when a
    module it needs is missing or the time left cannot fit its estimate (Budget.plan), else
    `run(section, seconds)` -> its entry. `record(name, entry)` (which writes the summary) is
    called as a section starts and as it ends, so a check killed midway keeps what finished."""
    for section in sections:
        estimate = section.dry_estimate_s if dry_run else section.estimate_s
        if lacking := missing(section):
            entry = {"status": f"skipped: needs {', '.join(lacking)}, not installed here "
                               "(carry the wheels in .whl/, docs/gpu.md)"}
        else:
            seconds, why = budget.plan(section, dry_run)
            if seconds is None:
                entry = {"status": why}
            else:
                record(section.name, {"status": "running", "estimate_s": estimate, "given_s": round(seconds)})
                entry = run(section, seconds)
        record(section.name, {**entry, "estimate_s": estimate})


def gdpa_default(summary: dict) -> dict:
    """The rule's pick. gemref (hence torch) is imported here only, after the children: the
    driver itself needs neither, and a torch that does not import still leaves a summary."""
    try:
        from gemref.attention.testing import VARIANTS
        from gemref.attention.triton.variant import choose_winner
    except Exception as e:   # noqa: BLE001  (recorded in the summary)
        return {"winner": None, "reason": f"the rule did not import: {type(e).__name__}: {e}"}
    return choose_winner(summary, VARIANTS)


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.gpu_check", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT") or "artifacts/gpu_check")
    parser.add_argument("--dry-run", action="store_true", help="CPU: Triton interpreter, tiny shapes")
    parser.add_argument("--sections", nargs="*", choices=[s.name for s in SECTIONS],
                        help="run only these (none: the environment only)")
    parser.add_argument("--budget", type=float, default=None,
                        help="overall seconds, the wheel install included (default $GEMREF_GPU_BUDGET_S, "
                             "else 300; dry run 300)")
    args = parser.parse_args()
    try:
        total_s, budget_source = total_budget(args.budget, args.dry_run, os.environ)
    except ValueError as e:
        parser.error(str(e))
    t0 = float(os.environ.get("GPU_CHECK_T0") or time.time())
    budget = Budget(total_s, spent_s=time.time() - t0)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    summary_path, log = out / "gpu_check.json", out / "gpu_check.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")]))}
    if args.dry_run:
        env.update(TRITON_INTERPRET="1", OMP_NUM_THREADS="1")
    summary = {"check": "gemref gpu_check", "dry_run": args.dry_run, "budget_s": total_s, "budget_from": budget_source,
               "started_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "environment": environment(args.dry_run), "sections": {}, "finished": False}

    def stop(signum, frame):   # killed from outside: end the children, keep what finished
        signal.signal(signal.SIGTERM, signal.SIG_IGN)     # a second signal must not cut this short
        for proc in list(running):
            kill_group(proc)
        summary["interrupted"] = f"signal {signum}"
        for entry in summary["sections"].values():
            if entry["status"] == "running":
                entry["status"] = f"interrupted by signal {signum} (its rows so far are kept)"
        write_json(summary_path, summary)
        sys.exit(128 + signum)

    def progress(name):   # a running section's finished items go into the summary as they come
        def update(result: dict) -> None:
            if result != summary["sections"][name].get("result"):
                summary["sections"][name] = {**summary["sections"][name], "result": result}
                write_json(summary_path, summary)
        return update

    def record(name: str, entry: dict) -> None:
        summary["sections"][name] = entry
        write_json(summary_path, summary)
        if entry["status"] != "running":
            print(f"{name}: {entry['status']}", flush=True)

    signal.signal(signal.SIGTERM, stop)
    write_json(summary_path, summary)
    with tempfile.TemporaryDirectory(prefix="gemref_gpu_check_") as scratch:
        env.setdefault("GEMREF_DATA_DIR", str(Path(scratch) / "data"))
        chosen = [s for s in SECTIONS if args.sections is None or s.name in args.sections]
        run_in_order(chosen, budget, args.dry_run, record=record, run=lambda section, seconds: run_section(
            section, seconds, args.dry_run, Path(scratch), log, env, on_result=progress(section.name)))
    if "timing" in summary["sections"]:
        summary["gdpa_default"] = gdpa_default(summary)
    summary.update(finished=True, elapsed_s=round(time.time() - t0, 1))
    write_json(summary_path, summary)
    print("\n".join(headline(summary)), flush=True)
    print(f"wrote {summary_path} and {log} in {summary['elapsed_s']} s", flush=True)
    return 0 if all(s["status"] == "ok" for s in summary["sections"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
