"""How the GPU check's driver runs a section: its children (`python -m MODULE --result FILE
[--dry-run] [--shard i/n]`, cwd = the repository root) each in their own session (process
group); at the section's budget or the overall deadline the whole group is killed (SIGTERM,
then SIGKILL). A child rewrites its --result file after every finished item, so a killed
section still reports what it finished, and the driver copies it into the summary every POLL_S
seconds while the section runs; shards' results are merged and their logs appended to the one
log in order."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[2]
KILL_GRACE_S = 3
POLL_S = 1.0          # how often the driver copies a running section's finished items into the summary
running: list[subprocess.Popen] = []   # children alive now (the driver's SIGTERM handler ends them)


@dataclass(frozen=True)
class Section:
    name: str
    module: str              # run as `python -m MODULE`
    budget_s: int            # on a GPU: the most seconds it may take (its children are killed then)
    dry_budget_s: int        # the same in --dry-run
    shards: int = 1          # parallel children (shard i of n); 0: one per 2 CPUs, <= 8 (2 in --dry-run)
    needs: tuple[str, ...] = ()   # modules beyond torch and Triton its children import (checked first)
    estimate_s: int = 0      # on a GPU: the seconds it is expected to take (skipped when less is left)
    dry_estimate_s: int = 0  # the same in --dry-run


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


def run_children(commands: list[list[str]], logs: list[Path], timeout_s: float, env: dict,
                 on_poll: Callable[[], None] | None = None) -> list[dict]:
    """Start every command in its own session, wait until all end or `timeout_s` passes, then
    kill the groups still running; `on_poll()` runs every POLL_S seconds meanwhile (the driver
    copies the children's finished items into the summary). Returns [{status, seconds}] in order."""
    start = time.monotonic()
    procs = []
    for cmd, log in zip(commands, logs):
        with open(log, "ab") as out:
            procs.append(subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=env,
                                          start_new_session=True))
    running.extend(procs)
    ended: dict[int, dict] = {}
    while len(ended) < len(procs):
        for i, proc in enumerate(procs):
            if i not in ended and proc.poll() is not None:
                kill_group(proc)      # the leader exited: end anything it left behind in its group
                ended[i] = {"status": "ok" if proc.returncode == 0 else f"failed (exit {proc.returncode})",
                            "seconds": round(time.monotonic() - start, 1)}
        if time.monotonic() - start >= timeout_s:
            for i, proc in enumerate(procs):
                if i not in ended:
                    kill_group(proc)
                    ended[i] = {"status": f"timeout after {timeout_s:.0f} s (process group killed)",
                                "seconds": round(time.monotonic() - start, 1)}
        if on_poll is not None:
            on_poll()
        if len(ended) < len(procs):
            time.sleep(min(POLL_S, max(0.0, timeout_s - (time.monotonic() - start))) or 0.01)
    for proc in procs:
        running.remove(proc)
    return [ended[i] for i in range(len(procs))]


def shard_count(section: Section, dry_run: bool) -> int:
    if section.shards:
        return section.shards
    return 2 if dry_run else max(1, min(8, (os.cpu_count() or 2) // 2))


def read_results(results: list[Path]) -> dict:
    """What a section's children have written so far (each rewrites its file atomically), shards merged."""
    parts = []
    for r in results:
        try:
            parts.append(json.loads(r.read_text()))
        except (OSError, ValueError):    # not written yet
            parts.append({})
    return parts[0] if len(parts) == 1 else merge_shards(parts)


def run_section(section: Section, left_s: float, dry_run: bool, scratch: Path, log: Path, env: dict,
                on_result: Callable[[dict], None] | None = None) -> dict:
    """Run one section within min(its budget, `left_s`): {status, seconds, budget_s, result}.
    on_result(result so far) is called about every POLL_S seconds while it runs."""
    budget = min(section.dry_budget_s if dry_run else section.budget_s, left_s)
    n = shard_count(section, dry_run)
    results = [scratch / f"{section.name}.{i}.json" for i in range(n)]
    logs = [log] if n == 1 else [scratch / f"{section.name}.{i}.log" for i in range(n)]
    commands = [[sys.executable, "-m", section.module, "--result", str(r),
                 *(["--dry-run"] if dry_run else []), *(["--shard", f"{i}/{n}"] if n > 1 else [])]
                for i, r in enumerate(results)]
    with open(log, "a") as out:
        out.write(f"\n===== {section.name}: {n} child(ren), budget {budget:.0f} s =====\n")
    runs = run_children(commands, logs, budget, env,
                        on_poll=(lambda: on_result(read_results(results))) if on_result else None)
    if n > 1:   # shard logs go into the one log, in order
        with open(log, "a") as out:
            for i, shard_log in enumerate(logs):
                out.write(f"----- {section.name} shard {i}/{n} -----\n")
                out.write(shard_log.read_text(errors="replace") if shard_log.exists() else "(no output)\n")
    statuses = [r["status"] for r in runs]
    status = "ok" if all(s == "ok" for s in statuses) else "; ".join(
        f"shard {i}: {s}" if n > 1 else s for i, s in enumerate(statuses) if s != "ok")
    return {"status": status, "seconds": max(r["seconds"] for r in runs), "budget_s": round(budget),
            "result": read_results(results)}


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
