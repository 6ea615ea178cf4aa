"""The MFU waterfall: docs/design.md's ladder, one rung at a time, each rung = the previous + one switch.

Every rung trains the same preset from the same seed for `warmup + repeats * steps` steps;
the timed steps are cut into `repeats` consecutive windows (repeated measurements), and
the table reports the median over windows with the min..max spread. A rung that cannot
apply on this device (or rank count) is kept in the table as "n/a here" with the reason,
and the next rung builds on the last rung that ran.

Rungs change how the model runs, never what it computes, so model FLOPs per sample are the
same on every rung (the run records let a test check it); a rung that raises the batch size
(AutoAC spends the memory it frees on a larger batch) changes FLOPs per *step* only. The
AutoAC rung's memory budget is the activation memory (CPU; peak step memory on CUDA) the
previous rung's step used at its batch size.
"""
from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from .autoac.profile import find_batch_size, step_bytes
from .data.batches import representative_batch
from .config import Preset, TrainConfig, override
from .run_ranks import launch_runs
from .mfu.meter import Meter, StepRecord
from .mfu.peak import Peak, device_name
from .precision.apply import native_support
from .report import write_json
from .report.records import RunRecord
from .env import versions
from .train import build_model, run


RUNG_TIMEOUT_S = 900   # a multi-rank launch fails (instead of hanging) past this per rung


@dataclass(frozen=True)
class Context:
    preset: Preset
    device: torch.device
    ranks: int


@dataclass(frozen=True)
class Rung:
    key: str
    title: str
    # Returns the next TrainConfig, or a string: why the rung does not apply here.
    configure: Callable[[TrainConfig, Context], "TrainConfig | str"]


def _low_precision(train: TrainConfig, ctx: Context) -> TrainConfig | str:
    """MXFP8 where the GPU has it (Blackwell), else row-wise float8 (Hopper/Ada); never emulated."""
    for precision in ("mxfp8", "float8_rowwise"):
        ok, _ = native_support(precision, ctx.device)
        if ok:
            return override(train, precision=precision, precision_kernel="native")
    _, why = native_support("float8_rowwise", ctx.device)
    return f"n/a here: {why} (emulation reproduces the numerics, not the speed)"


def _autoac(train: TrainConfig, ctx: Context) -> TrainConfig | str:
    """Rung 4: keep the activation memory the previous rung's step used, let AutoAC checkpoint
    just enough that a larger batch fits in it (ac_profile.find_batch_size), train that batch."""
    device, per_rank = ctx.device, train.batch_size // ctx.ranks
    model = build_model(ctx.preset, override(train, compile=False, ac="none"), device)[0]   # eager twin
    batch_of = lambda n: representative_batch(ctx.preset, n, device, seed=train.seed)  # noqa: E731
    budget = step_bytes(model, batch_of(per_rank))
    options = ("full",) if train.compile else ("selective", "full")
    found = find_batch_size(model, batch_of, budget, max_batch=4 * per_rank, options=options)
    if found.autoac_batch <= per_rank:
        return "n/a here: checkpointing frees no room for a larger batch in this memory budget"
    no_ac_bytes = step_bytes(model, batch_of(found.autoac_batch))
    return override(train, ac="auto", ac_budget=min(1.0, budget / no_ac_bytes),
                    batch_size=found.autoac_batch * ctx.ranks)


def _needs_ranks(configure):
    """A data-parallel rung: n/a on one rank."""
    def rung(train: TrainConfig, ctx: Context) -> TrainConfig | str:
        if ctx.ranks < 2:
            return "n/a here: needs data-parallel ranks (--ranks >= 2)"
        return configure(train, ctx)
    return rung


LADDER: list[Rung] = [
    # 0: eager, padded to max_len, materialised attention, no AC, replicated data parallel.
    Rung("baseline", "0 baseline", lambda t, c: override(t, jagged=False, kernel="reference",
                                                         mesh=f"{c.ranks}x1", balance="none")),
    Rung("jagged", "1 + jagged", lambda t, c: override(t, jagged=True)),
    Rung("fused_attention", "2 + flash/GDPA", lambda t, c: override(t, kernel="auto")),
    Rung("compile", "3 + compile", lambda t, c: override(t, compile=True)),
    Rung("autoac", "4 + AutoAC, larger batch", _autoac),
    Rung("load_balance", "5 + load balance", _needs_ranks(lambda t, c: override(t, balance="kk"))),
    Rung("fsdp_2d", "6 + FSDP/2D sparse",
         _needs_ranks(lambda t, c: override(t, mesh=f"1x{c.ranks}", sparse_sharding="row"))),
    Rung("low_precision", "7 + float8/MXFP8", _low_precision),
]


def _window_stats(record: RunRecord, repeats: int) -> dict:
    """Split the timed steps into `repeats` windows; report the median window by tokens/s
    (every figure of a row from that one window, so tokens/s, TFLOP/s and MFU agree) and the
    spread of tokens/s over the windows."""
    meter = Meter(Peak(record["peak_flops"], record["peak_source"], ""), record["warmup_steps"],
                  [StepRecord(**s) for s in record["step_log"]])
    windows = sorted((w.summary() for w in meter.segments(repeats)), key=lambda w: w["tokens_per_s"])
    median = windows[len(windows) // 2]
    return {key: median[key] for key in ("tokens_per_s", "samples_per_s", "model_tflops_per_s", "mfu", "hfu",
                                         "median_step_s")} | {
        "tokens_per_s_min": windows[0]["tokens_per_s"], "tokens_per_s_max": windows[-1]["tokens_per_s"]}


def provenance(device: str, ranks: int) -> dict:
    """Where and when a waterfall was measured: UTC date, device name, CPU count, threads per
    rank, ranks, and the torch/gemref versions and git sha."""
    return {"date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
            "device": device_name(device), "cpu_count": os.cpu_count(),
            "threads_per_rank": 1 if ranks > 1 else torch.get_num_threads(),   # launch.py: 1 per spawned rank
            "ranks": ranks, **versions()}


def run_waterfall(preset: Preset, *, device: str = "cpu", ranks: int = 1, repeats: int = 3,
                  steps: int = 4, warmup: int = 2, ladder: list[Rung] | None = None,
                  out_dir: str | Path | None = None, log=print) -> list[dict]:
    """Run every rung; return one row per rung (and write rung records + waterfall.json)."""
    if repeats < 3:
        raise ValueError(f"repeats must be >= 3 (median of repeated runs), got {repeats}")
    if steps < 1 or warmup < 1 or ranks < 1:
        raise ValueError(f"need steps >= 1, warmup >= 1, ranks >= 1; got {steps}, {warmup}, {ranks}")
    ctx = Context(preset, torch.device(device), ranks)
    train = override(preset.train, steps=warmup + repeats * steps, warmup_steps=warmup,
                     eval_every=0, eval_batches=1)
    plan = []                        # (rung, TrainConfig or the reason it does not apply)
    for rung in ladder or LADDER:
        nxt = rung.configure(train, ctx)
        plan.append((rung, nxt))
        train = train if isinstance(nxt, str) else nxt
    configs = [c for _, c in plan if not isinstance(c, str)]
    for i, (rung, c) in enumerate(plan):
        log(f"[{i + 1}] {rung.title}: " + (c if isinstance(c, str) else "runs"))
    if ranks == 1:
        records = iter([run(preset, c, device=device, progress=False) for c in configs])
    else:   # one launch of `ranks` gloo/NCCL processes runs every rung in turn
        records = iter(launch_runs(preset, configs, ranks=ranks, device=device, progress=False,
                                   timeout_s=RUNG_TIMEOUT_S * len(configs)))
    rows, base, prev = [], None, None
    for i, (rung, c) in enumerate(plan):
        if isinstance(c, str):
            rows.append({"rung": rung.title, "key": rung.key, "status": c})
            continue
        record = next(records)
        if out_dir:
            write_json(Path(out_dir) / f"rung{i}_{rung.key}.json", record)
        row = {"rung": rung.title, "key": rung.key, "status": "ran", **_window_stats(record, repeats),
               "peak_memory_bytes": record.get("peak_memory_bytes"),
               "model_flops_per_sample": record["model_flops_per_step"] / c.batch_size,
               "batch_size": c.batch_size, "peak_source": record["peak_source"],
               "switches": record["switches"], "dtype": record["dtype"]}
        base = base or row
        row["vs_previous"] = row["tokens_per_s"] / prev["tokens_per_s"] if prev else 1.0
        row["vs_baseline"] = row["tokens_per_s"] / base["tokens_per_s"]
        rows.append(row)
        prev = row
    if out_dir:
        write_json(Path(out_dir) / "waterfall.json", {"preset": preset.name, "device": device, "ranks": ranks,
                                                      "repeats": repeats, "steps": steps, "warmup": warmup,
                                                      "measured_on": provenance(device, ranks), "rungs": rows})
    return rows
