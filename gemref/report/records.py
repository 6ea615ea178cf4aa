"""The run record: its schema, typed, and the one function that builds it.

`gemref.measure.run.run` writes a run record (returned, and saved as JSON); the CLI tables
(gemref/report/rows.py `run_row`, `gemref train`'s per-rank tables), `report.figures.run_figure`
and the notebooks read it. (The waterfall writes its own record, one per ladder, whose rows
carry the same "config" and "resolved" entries.) The config is the record of the switches:
there is no second copy of them; what they resolved to (the kernel, the precision) and the
environment knobs that change what runs (gemref/env.py KNOBS) are recorded beside it.
Records stay plain JSON-able dicts, so readers
keep `record["key"]`; the TypedDicts below name every key and its type, for the writer and
the readers alike (docs/design.md describes the fields). Units are base units throughout:
seconds, bytes, FLOPs, FLOP/s. (No `from __future__ import annotations` here: TypedDict
reads NotRequired from evaluated annotations.)
"""
import datetime
import os
from dataclasses import asdict
from typing import Any, Literal, NotRequired, TypedDict

import torch

from ..train.record import RECORD_VERSION, train_as_record
from ..train.presets import Preset
from ..train.config import TrainConfig
from ..env import knobs, versions
from ..mfu.meter import MeterSummary, gemm_dtype
from ..mfu.timing import StepRecord
from ..mfu.peak import device_name, peak_flops
from ..precision.apply import PrecisionReport
from ..train.metrics import EvalResult


class Resolved(TypedDict):
    """What the config's choices resolved to where the run ran (the config itself is the switches)."""

    kernel: str                   # the concrete gdpa kernel ("auto" resolved once, at build)
    precision: str                # the precision that ran ("auto" resolved)


class DeviceInfo(TypedDict):
    type: str                     # "cpu" | "cuda"
    name: str
    threads: int                  # torch CPU threads of this process
    ranks: int


class StepLog(TypedDict):
    """One step of `step_log` (= dataclasses.asdict of gemref.mfu.timing.StepRecord), rank 0's."""

    wall_s: float
    data_s: float
    cpu_s: float
    process_cpu_s: float
    samples: int
    tokens: int
    model_flops: int
    executed_flops: int
    recompute_flops: int
    op_seconds: dict[str, float] | None


class ParallelRecord(TypedDict):
    """What a multi-rank run adds (gemref/parallel/parallelize.py)."""

    parallel: dict[str, Any]      # world, mesh, backend, balance, sparse_sharding, reshard_after_forward,
    #                               fsdp_param_dtype (the dtype FSDP gathered parameters in; None: no FSDP)
    ranks: list[dict[str, float]]             # per rank: samples, step_s, compute_cpu_s, wait_s
    memory_per_rank: list[dict[str, Any]]     # per rank: parameter, gradient, optimizer bytes
    comm: dict[str, Any]                      # one measured step's collectives vs the analytic volume


class MemoryRecord(TypedDict):
    peak_memory_bytes: int        # peak of one forward+backward (CPU: live tensor bytes)
    peak_memory_method: str


class RunRecord(MeterSummary):
    """A training run (`kind` "train"), with the meter's summary keys (gemref/mfu/meter.py)."""

    record_version: int                   # gemref/train/record.py RECORD_VERSION (none before the config's sections: 1)
    kind: Literal["train"]
    preset: str
    config: dict[str, dict[str, Any]]     # {"model", "data", "train"}: the dataclasses as dicts (the switches, by section)
    resolved: Resolved
    environment: dict[str, str | None]    # the knobs that change what runs (gemref/env.py KNOBS)
    compile: dict[str, Any] | None        # gemref/compile/apply.py CompileStats, None when not compiled
    ac_plan: dict[str, Any] | None        # the checkpointing plan applied, None when none
    hfu_counts_recompute: bool            # False for ac memory_budget: its partitioner's recompute is not counted
    device: DeviceInfo
    dtype: str                            # e.g. "fp32", "bf16-autocast", "mxfp8 (emulated)"
    precision: dict[str, Any]             # PrecisionReport.as_record()
    versions: dict[str, str]
    parameters: int
    start_step: int                       # > 0 when resumed from a checkpoint
    loss_curve: list[float]               # the global batch's loss, per step from start_step
    step_log: list[StepLog]               # every step, warm-up steps first
    eval: EvalResult                      # the final evaluation
    eval_history: list[EvalResult]
    mfu_basis: str                        # the peak the MFU divides by: "fp32 peak", "bf16 peak", "bf16-equivalent"
    mfu_basis_dtype: str                  # that peak's dtype (the dtype the GEMMs ran in): "fp32" or "bf16"
    mfu_basis_gflops: float | None        # that peak, GFLOP/s of one device (= peak_flops / 1e9)
    fp8_peak_utilization: NotRequired[float]   # float8/MXFP8 on CUDA: model FLOP/s / fp8 peak
    speed_claim_valid: NotRequired[bool]       # float8/MXFP8: False when the GEMMs were emulated
    parallel: NotRequired[dict[str, Any]]      # the ParallelRecord keys, multi-rank runs only
    ranks: NotRequired[list[dict[str, float]]]
    memory_per_rank: NotRequired[list[dict[str, Any]]]
    comm: NotRequired[dict[str, Any]]
    ac_compression: NotRequired[dict[str, Any]]  # ac_compress != none: format, bytes per value, per-step counts
    embeddings: NotRequired[dict[str, Any]]   # embeddings torchrec: engine, table optimizer, per-table plan
    peak_memory_bytes: NotRequired[int]        # the MemoryRecord keys, when memory was measured
    peak_memory_method: NotRequired[str]


def precision_label(report: PrecisionReport) -> str:
    """e.g. "fp32", "bf16-autocast", "mxfp8 (emulated)"."""
    if report.precision == "bf16":
        return "bf16-autocast"
    if report.precision == "fp32":
        return "fp32"
    return f"{report.precision} ({report.kernel})"


def mfu_basis(report: PrecisionReport, device: torch.device, ranks: int, model_tflops_per_s: float,
              peak_flops_used: float | None = None) -> dict:
    """What the MFU is measured against (the peak of the dtype its GEMMs ran in, and that peak's
    figure); for float8/MXFP8 also the fp8-peak utilisation (CUDA) and whether the run may claim
    a speed (not when its GEMMs were emulated)."""
    precision = report.precision
    dtype = gemm_dtype(precision, device.type, report.is_emulated)
    label = "bf16-equivalent" if dtype == "bf16" and precision not in ("fp32", "bf16") else f"{dtype} peak"
    out: dict[str, Any] = {"mfu_basis": label, "mfu_basis_dtype": dtype,
                           "mfu_basis_gflops": None if peak_flops_used is None else peak_flops_used / 1e9}
    if precision.startswith("float8") or precision == "mxfp8":
        fp8 = peak_flops(device, "mxfp8" if precision == "mxfp8" else "fp8")
        if device.type == "cuda" and fp8.flops:
            out["fp8_peak_utilization"] = model_tflops_per_s * 1e12 / (fp8.flops * ranks)
        out["speed_claim_valid"] = not report.is_emulated
    return out


def run_record(preset: Preset, train: TrainConfig, *, kernel: str, precision: PrecisionReport,
               device: torch.device, ranks: int, compile: dict | None, ac_plan: dict | None,
               parameters: int, start_step: int, summary: MeterSummary, steps: list[StepRecord],
               losses: list[float], evals: list[EvalResult], parallel: ParallelRecord | None = None,
               memory: MemoryRecord | None = None, ac_compression: dict | None = None,
               embeddings: dict | None = None) -> RunRecord:
    """The record of a finished run from its typed parts (`evals[-1]` is the final evaluation)."""
    record: RunRecord = {
        "record_version": RECORD_VERSION,
        "kind": "train",
        "preset": preset.name,
        "config": {"model": asdict(preset.model), "data": asdict(preset.data), "train": train_as_record(train)},
        "resolved": {"kernel": kernel, "precision": precision.precision},
        "environment": knobs(),
        "compile": compile,
        "ac_plan": ac_plan,
        "hfu_counts_recompute": train.activation_checkpoint.mode != "memory_budget",
        "device": {"type": device.type, "name": device_name(device), "threads": torch.get_num_threads(),
                   "ranks": ranks},
        "dtype": precision_label(precision),
        "precision": precision.as_record(),
        "versions": versions(),
        "parameters": parameters,
        "start_step": start_step,
        **summary,
        "loss_curve": losses,
        "step_log": [asdict(step) for step in steps],
        "eval": evals[-1],
        "eval_history": evals,
        **mfu_basis(precision, device, ranks, summary["model_tflops_per_s"], summary["peak_flops"]),
        **(parallel or {}),
        **(memory or {}),
        **({"ac_compression": ac_compression} if ac_compression else {}),
        **({"embeddings": embeddings} if embeddings else {}),
    }
    return record


def provenance(device: str, ranks: int) -> dict:
    """Where and when a measurement (a waterfall, a quality run) was made: UTC date, device name, CPU count, threads per
    rank, ranks, and the torch/gemref versions and git sha."""
    return {"date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
            "device": device_name(device), "cpu_count": os.cpu_count(),
            "threads_per_rank": 1 if ranks > 1 else torch.get_num_threads(),   # launch.py: 1 per spawned rank
            "ranks": ranks, **versions()}
