"""The GPU check's driver (`python -m scripts.gpu_check`, run by scripts/gpu_check.sh): the
environment, then the sections in order, each in children with a time budget (children.py),
one summary JSON and one log; scripts/gpu_check/__init__.py lists the sections.

After the timing section the summary's "gdpa_default" names the fastest correct variant
(gemref.attention.triton.variant.choose_winner: the rule that makes the measured winner the
library default). The summary (gpu_check.json) is rewritten whenever a section finishes an
item (a correctness case, a timing row, a rung: the children's result files are read every
POLL_S seconds), so a run killed midway keeps every row measured so far; gpu_check.log holds
every child's output. Only those two files are written to --out; scratch goes to a temporary
folder. Each section has its own budget (at most SECTION_MAX_S, 5 minutes): `--sections NAME`
reruns a failed one alone. A section whose packages are missing (the rungs' data pipeline needs
numpy, pyarrow and tqdm) is skipped with the reason; the kernel sections need only torch and Triton.

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

from .children import ROOT, Section, kill_group, run_section, running
from .summary import environment, headline, write_json

TOTAL_BUDGET_S = 470          # the whole run, wheel install included, stays under 8 minutes
DRY_BUDGET_S = 300            # safety nets only: the dry run takes ~30 s of CPU in all
MIN_SECTION_S = 20            # skip a section with less time than this left
SECTION_MAX_S = 300           # no section's budget exceeds this: a failed one reruns alone in 5 minutes
SECTIONS = (
    Section("ceilings", f"{__package__}.ceilings", 60, 90),
    Section("correctness", f"{__package__}.correctness", 150, 90, shards=0),
    Section("timing", f"{__package__}.timing", 150, 90),
    # the data pipeline (generated shard, Parquet loader) needs numpy, pyarrow and tqdm; the
    # kernel sections need only torch and Triton
    Section("rungs", f"{__package__}.rungs", 240, 150, needs=("numpy", "pyarrow", "tqdm")),
)


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
                        help=f"overall seconds (default {TOTAL_BUDGET_S}; dry run {DRY_BUDGET_S})")
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
        signal.signal(signal.SIGTERM, signal.SIG_IGN)     # a second signal must not cut this short
        for proc in list(running):
            kill_group(proc)
        summary["interrupted"] = f"signal {signum}"
        for record in summary["sections"].values():
            if record["status"] == "running":
                record["status"] = f"interrupted by signal {signum} (its rows so far are kept)"
        write_json(summary_path, summary)
        sys.exit(128 + signum)

    def progress(name):   # a running section's finished items go into the summary as they come
        def update(result: dict) -> None:
            if result != summary["sections"][name].get("result"):
                summary["sections"][name] = {"status": "running", "result": result}
                write_json(summary_path, summary)
        return update

    signal.signal(signal.SIGTERM, stop)
    write_json(summary_path, summary)
    with tempfile.TemporaryDirectory(prefix="gemref_gpu_check_") as scratch:
        env.setdefault("GEMREF_DATA_DIR", str(Path(scratch) / "data"))
        for section in SECTIONS:
            if args.sections is not None and section.name not in args.sections:
                continue
            left = deadline - time.monotonic()
            missing = [m for m in section.needs if importlib.util.find_spec(m) is None]
            if missing:
                summary["sections"][section.name] = {"status": f"skipped: needs {', '.join(missing)}, not installed "
                                                               "here (carry the wheels in .whl/, docs/gpu.md)"}
            elif left < MIN_SECTION_S:
                summary["sections"][section.name] = {"status": f"skipped: out of time ({left:.0f} s left)"}
            else:
                summary["sections"][section.name] = {"status": "running"}
                write_json(summary_path, summary)
                summary["sections"][section.name] = run_section(section, left, args.dry_run, Path(scratch), log, env,
                                                                on_result=progress(section.name))
            print(f"{section.name}: {summary['sections'][section.name]['status']}", flush=True)
            write_json(summary_path, summary)
    if "timing" in summary["sections"]:
        summary["gdpa_default"] = gdpa_default(summary)
    summary.update(finished=True, elapsed_s=round(time.time() - t0, 1))
    write_json(summary_path, summary)
    print("\n".join(headline(summary)), flush=True)
    print(f"wrote {summary_path} and {log} in {summary['elapsed_s']} s", flush=True)
    return 0 if all(s["status"] == "ok" for s in summary["sections"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
