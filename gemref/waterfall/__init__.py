"""The MFU waterfall: the ladder of docs/design.md (gemref/waterfall/ladder.py), each rung = the previous + one switch.

Every rung trains the same preset from the same seed (on its synthetic data, or on a dataset
folder: the preset's `data`, which the record names), in ONE launch (one process, or
`ranks` processes), with the rungs' timed windows interleaved: round k runs window k of
every rung before any rung's window k+1, so a slow phase of the machine hits every rung
alike (gemref/waterfall/schedule.py: the order, which rungs are alive together, contended
windows and their re-measurement). Per rung the table shows the windows kept, the median
window's tokens/s with the min..max spread, local MFU x scaling ratio = E2E MFU, and
`vs_previous` as the median of the paired per-window ratios with their spread
(gemref/waterfall/stats.py); the record adds a step-time breakdown per rung (GEMMs,
attention, element-wise, optimizer, exposed communication, waiting at the collective, data).

    rungs.py     how each rung changes the TrainConfig (or why it does not apply here)
    schedule.py  interleaved rounds, groups of live rungs, contention
    runner.py    the measurement on each rank, built from gemref.train's setup and Setup.timed_step
    stats.py     window figures, paired ratios, the breakdown
    rows.py      rows, tables and footnotes
    ladder.py    the rungs' names, switches and what each changes in the scale projection
(Rung 7 on its own and a technique's cost in eval NE/AUC are measured in gemref/measure/:
precision_step.py, quality.py.)
"""
from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import torch

from ..train.record import RECORD_VERSION, train_as_record
from ..parallel.config import MeshShape
from ..train.presets import Preset
from ..train.override import override
from ..env import knobs
from ..runtime.files import write_json
from ..parallel import launch
from ..report.records import provenance
from .rows import BREAKDOWN_COLUMNS, TABLE_COLUMNS, breakdown_rows, build_rows, notes, table_rows
from .runner import Settings, dtype_name, launch_measure
from .rungs import LADDER, WITH_OPTIONS, Context, Rung, check_options, plan, preset_with, skipped

__all__ = ["BREAKDOWN_COLUMNS", "LADDER", "TABLE_COLUMNS", "WITH_OPTIONS", "Context", "Rung", "Settings",
           "breakdown_rows", "check_options", "notes", "provenance", "run_waterfall", "skipped", "table_rows"]

RUNG_TIMEOUT_S = 900   # a multi-rank launch fails (instead of hanging) past this per rung


def run_waterfall(preset: Preset, *, device: str = "cpu", ranks: int = 1, windows: int = 3,
                  steps_per_window: int = 4, warmup: int = 2, window_warmup: int = 1, max_retries: int | None = None,
                  profile_steps: int = 1, measure_memory: bool = True, ladder: list[Rung] | None = None,
                  options: tuple[str, ...] = (), out_dir: str | Path | None = None, log=print) -> dict:
    """Run every rung interleaved; return the waterfall record, one row per rung in its "rungs"
    (and write it as waterfall.json, with one record per rung, into `out_dir`).

    windows: timed windows per rung (>= 3); steps_per_window: training steps in each; warmup:
    untimed steps per rung once built; window_warmup: untimed steps of a rung before each of
    its windows; max_retries: contended rounds re-measured over the whole run (default:
    `windows`); profile_steps: profiled steps per rung for the breakdown; options: names of
    gemref/waterfall/rungs.py WITH_OPTIONS (GEM's later techniques swapped into their rungs;
    the record's "with" names them). Under torchrun, ranks other than 0 return {}.
    """
    if windows < 3:
        raise ValueError(f"windows must be >= 3 (median of repeated windows), got {windows}")
    if steps_per_window < 1 or warmup < 1 or ranks < 1:
        raise ValueError(f"need steps_per_window >= 1, warmup >= 1, ranks >= 1; "
                         f"got {steps_per_window}, {warmup}, {ranks}")
    if window_warmup < 0 or profile_steps < 0 or (max_retries is not None and max_retries < 0):
        raise ValueError(f"need window_warmup, profile_steps, max_retries >= 0; "
                         f"got {window_warmup}, {profile_steps}, {max_retries}")
    settings = Settings(windows, steps_per_window, warmup, window_warmup,
                        windows if max_retries is None else max_retries, profile_steps, measure_memory)
    options = check_options(options)
    launch.preflight(device, [preset.train.parallelism.backend], [MeshShape(ranks, 1)], ranks)   # before any rung is planned
    preset = preset_with(preset, options)
    ctx = Context(preset, torch.device(device), ranks, options)
    steps = plan(ladder or LADDER, override(preset.train, eval_every=0, eval_batches=1), ctx)
    for i, (rung, c) in enumerate(steps):
        if isinstance(c, str):
            log(f"[{i + 1}] {rung.title}: {c}")
        else:   # rung 7 says which format it chose here (bf16 on a CPU whose bf16 GEMMs win)
            chosen = f" in {c.mixed_precision.recipe}" if rung.key == "low_precision" else ""
            log(f"[{i + 1}] {rung.title}: runs{chosen}")
    configs = [c for _, c in steps if not isinstance(c, str)]
    result = launch_measure(preset, configs, ranks=ranks, device=device, settings=settings,
                            timeout_s=RUNG_TIMEOUT_S * len(configs))
    if result is None:
        return {}
    peaks = [result["peaks"][dtype_name(c, ctx.device)] for c in configs]
    rows = build_rows(steps, result, [p["flops"] for p in peaks])
    ran = [r for r in rows if r["status"] == "ran"]
    for row, c, peak in zip(ran, configs, peaks):
        row.update(peak_flops=peak["flops"], peak_source=peak["source"], mfu_basis=f"{peak['dtype']} peak",
                   config={"model": asdict(preset.model), "train": train_as_record(c)})
    schedule = ("every rung alive, interleaved" if len(result["groups"]) == 1 else
                "sliding pairs (the rungs' training state exceeds the memory share for all at once)")
    record = {"record_version": RECORD_VERSION, "preset": preset.name, "data": asdict(preset.data), "device": device, "ranks": ranks,
              "with": {name: WITH_OPTIONS[name] for name in options}, **asdict(settings), "schedule": schedule,
              "groups": result["groups"], "schedstat": result["schedstat"], "retries_used": result["retries_used"],
              "measured_on": provenance(device, ranks), "environment": knobs(), "rungs": rows}
    if out_dir:
        out = Path(out_dir)
        for j, (row, c) in enumerate(zip(ran, configs)):
            write_json(out / f"rung{rows.index(row)}_{row['key']}.json",
                       {"row": row, "peak": peaks[j], "profile": result["profiles"][j],
                        "memory": result["memory"][j],
                        "rounds": [{k: r[k] for k in ("group", "index", "attempt", "kept")}
                                   | {"windows": [rank[result["groups"][r["group"]].index(j)] for rank in r["windows"]]}
                                   for r in result["rounds"] if j in result["groups"][r["group"]]]})
        write_json(out / "waterfall.json", record)
    return record
