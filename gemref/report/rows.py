"""Table rows of run and waterfall records, shared by the `gemref` commands and the notebooks."""
from __future__ import annotations

from .tables import fmt

RUN_COLUMNS = ("preset", "jagged", "kernel", "precision", "median_step_s", "samples_per_s", "tokens_per_s",
               "model_tflops_per_s", "mfu", "hfu", "peak_memory_mb", "data_share", "ne_click", "auc_click")
WATERFALL_COLUMNS = ("rung", "tokens_per_s", "spread", "model_tflops_per_s", "mfu", "peak_memory_mb",
                     "vs_previous", "vs_baseline")


def run_row(r: dict) -> dict:
    """One table row of a run record (peak memory in MiB)."""
    return {"preset": r["preset"], "jagged": r["switches"]["jagged"], "kernel": r["switches"]["kernel_resolved"],
            "precision": r["dtype"], **{k: r.get(k) for k in RUN_COLUMNS[4:10]},
            "peak_memory_mb": r["peak_memory_bytes"] / 2**20 if r.get("peak_memory_bytes") is not None else None,
            "data_share": r["data_share"], "ne_click": r["eval"]["ne_click"], "auc_click": r["eval"]["auc_click"]}


def waterfall_table_rows(rows: list[dict]) -> list[dict]:
    """One table row per waterfall rung: medians, the min..max spread of tokens/s, speed-ups."""
    out = []
    for r in rows:
        if r["status"] != "ran":
            out.append({"rung": r["rung"], "tokens_per_s": "n/a here (see below)"})
            continue
        out.append({**{k: r.get(k) for k in WATERFALL_COLUMNS},
                    "spread": f"{fmt(r['tokens_per_s_min'])}..{fmt(r['tokens_per_s_max'])}",
                    "peak_memory_mb": r["peak_memory_bytes"] / 2**20 if r.get("peak_memory_bytes") else None,
                    "vs_previous": f"{r['vs_previous']:.2f}x", "vs_baseline": f"{r['vs_baseline']:.2f}x"})
    return out
