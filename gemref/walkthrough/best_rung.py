"""Chapter 10's last section: the best rung's step by op class, and what its GEMMs leave on the table.

`best_rung(rows)` picks the waterfall rung with the highest MFU; `profile_rung(preset, row)`
splits one rank's step of it by op class (GEMM, attention, element-wise, optimizer, other)
with the step time if every GEMM ran at the best rate a probe finds for its shape
(gemref/mfu/step_profile.py); `limit_stacks` gives the figure's bars.
"""
from __future__ import annotations

LIMIT_CASES = {"step": "measured step", "gemm_at_best_rate": "GEMMs at the probe's best rate",
               "gemm_at_peak": "GEMMs at the CPU's peak (their dtype's)", "gemm_free": "no GEMM time (Amdahl)"}


def best_rung(rows: list[dict]) -> tuple[dict, str]:
    """(the waterfall row that ran with the highest E2E MFU, why it was chosen); on a machine so
    busy that no rung kept a window (no MFU), the last rung that ran. ValueError when none ran."""
    ran = [r for r in rows if r["status"] == "ran"]
    if not ran:
        raise ValueError("no rung of this waterfall ran")
    measured = [r for r in ran if r.get("mfu") is not None]
    if measured:
        best = max(measured, key=lambda r: r["mfu"])
        return best, f"the highest MFU of the waterfall, {best['mfu']:.2%}"
    return ran[-1], "the last rung that ran: every waterfall window was contended, so no rung has an MFU to rank by"


def limit_stacks(record: dict) -> dict[str, dict[str, float]]:
    """{case: {op class: ms per step}} for each case of a step_profile record's "limits": the
    profiled classes scaled to the unprofiled step, the GEMM part replaced by what the case
    allows (the same arithmetic as the limits: step - GEMM + GEMM at that rate)."""
    classes = {r["class"]: r["ms_per_step"] for r in record["classes"] if r["ms_per_step"] > 0 or r["class"] == "gemm"}
    limits = {r["case"]: r["step_ms"] for r in record["limits"]}
    scale = limits["step"] / sum(classes.values())       # the classes (profiler's cost out) to the unprofiled step
    rest = {k: v * scale for k, v in classes.items() if k != "gemm"}
    gemm_now = classes["gemm"] * scale
    return {case: {"gemm": ms - (limits["step"] - gemm_now), **rest} for case, ms in limits.items()}


def profile_rung(preset, row: dict, *, ranks: int = 1, warmup: int = 2, timed_steps: int = 5,
                 profile_steps: int = 2, probe_reps: int = 5, version: int | None = None) -> dict:
    """One rank's step of a waterfall rung (a row of its record) on the CPU, in this process, by
    op class, with its GEMMs probed alone (gemref.mfu.step_profile.profile_step): the rung's
    recorded config (its model, window included, and its switches, AutoAC's plan and saved-
    activation compression included) at its per-rank batch; load balancing and sharding are
    left out, as they split the work and add communication but leave one rank's local step as
    it is. `version`: the record_version of the waterfall record the row comes from (None: this
    gemref's; older records' flat switches load too, gemref/train/record.py). Returns
    profile_step's record with "rung" (key), "title", "batch_size" and "stacks" (limit_stacks)."""
    from dataclasses import replace

    from ..train.record import RECORD_VERSION, train_from_record
    from ..model.config import ModelConfig
    from ..train.override import override
    from ..mfu.step_profile import profile_step
    from ..train import sample_batch, setup

    model = ModelConfig(**{**row["config"]["model"], "sparse_vocab": tuple(row["config"]["model"]["sparse_vocab"])})
    recorded = train_from_record(row["config"]["train"], RECORD_VERSION if version is None else version)
    train = override(recorded, eval_every=0, eval_batches=1, mesh="1x1",
                     balance="none", sparse_sharding="none", batch_size=max(1, row["batch_size"] // ranks))
    s = setup(replace(preset, model=model), train, device="cpu")
    record = profile_step(s, sample_batch(s), warmup=warmup, timed_steps=timed_steps, profile_steps=profile_steps,
                          probe_reps=probe_reps)
    return {**record, "rung": row["key"], "title": row["rung"], "batch_size": train.batch_size,
            "stacks": limit_stacks(record)}
