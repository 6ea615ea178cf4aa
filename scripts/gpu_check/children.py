"""How the GPU check's driver runs a section: its children (`python -m MODULE --result FILE
[--dry-run] [--shard i/n]`, cwd = the repository root) each in their own session (process
group); at the section's budget or the overall deadline the whole group is killed (SIGTERM,
then SIGKILL). A child rewrites its --result file after every finished item, so a killed
section still reports what it finished; shards' results are merged and their logs appended
to the one log in order."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
KILL_GRACE_S = 3
running: list[subprocess.Popen] = []   # children alive now (the driver's SIGTERM handler ends them)


@dataclass(frozen=True)
class Section:
    name: str
    module: str              # run as `python -m MODULE`
    budget_s: int            # on a GPU
    dry_budget_s: int        # in --dry-run
    shards: int = 1          # parallel children (shard i of n); 0: one per 2 CPUs, <= 8 (2 in --dry-run)


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
    running.extend(procs)
    results = []
    for proc in procs:
        try:
            rc = proc.wait(timeout=max(0.0, timeout_s - (time.monotonic() - start)))
            status = "ok" if rc == 0 else f"failed (exit {rc})"
        except subprocess.TimeoutExpired:
            kill_group(proc)
            status = f"timeout after {timeout_s:.0f} s (process group killed)"
        kill_group(proc)      # the leader exited: end anything it left behind in its group
        running.remove(proc)
        results.append({"status": status, "seconds": round(time.monotonic() - start, 1)})
    return results


def shard_count(section: Section, dry_run: bool) -> int:
    if section.shards:
        return section.shards
    return 2 if dry_run else max(1, min(8, (os.cpu_count() or 2) // 2))


def run_section(section: Section, left_s: float, dry_run: bool, scratch: Path, log: Path, env: dict) -> dict:
    """Run one section within min(its budget, `left_s`): {status, seconds, budget_s, result}."""
    budget = min(section.dry_budget_s if dry_run else section.budget_s, left_s)
    n = shard_count(section, dry_run)
    results = [scratch / f"{section.name}.{i}.json" for i in range(n)]
    logs = [log] if n == 1 else [scratch / f"{section.name}.{i}.log" for i in range(n)]
    commands = [[sys.executable, "-m", section.module, "--result", str(r),
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
