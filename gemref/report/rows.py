"""Table rows of run records, shared by the `gemref` commands and the notebooks."""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..train.config import TrainConfig
from ..train.record import record_version, train_from_record

if TYPE_CHECKING:                 # records imports torch; the CLI's tables must not
    from .records import RunRecord

RUN_COLUMNS = ("preset", "jagged", "kernel", "precision", "median_step_s", "samples_per_s", "tokens_per_s",
               "model_tflops_per_s", "local_mfu", "scaling_ratio", "mfu", "hfu", "peak_memory_mb", "data_share",
               "ne_click", "auc_click")


def recorded_train(r: RunRecord) -> TrainConfig:
    """The TrainConfig a run record ran (records of every readable version, gemref/train/record.py)."""
    return train_from_record(r["config"]["train"], record_version(r))


def run_row(r: RunRecord) -> dict:
    """One table row of a run record (peak memory in MiB; mfu is E2E MFU = local_mfu x scaling_ratio)."""
    return {"preset": r["preset"], "jagged": recorded_train(r).attention.jagged, "kernel": r["resolved"]["kernel"],
            "precision": r["dtype"], **{k: r.get(k) for k in RUN_COLUMNS[4:12]},
            "peak_memory_mb": r["peak_memory_bytes"] / 2**20 if r.get("peak_memory_bytes") is not None else None,
            "data_share": r["data_share"], "ne_click": r["eval"]["ne_click"], "auc_click": r["eval"]["auc_click"]}
