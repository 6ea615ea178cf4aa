"""The GPU check's rule that names the Triton GDPA default: the fastest correct variant.

Read from one summary (scripts/gpu_check.py calls `choose` after the timing section):
  correct   every correctness record of the variant passed (determinism included), and
            every record of "base" passed (the variants are flags on that kernel; only base
            is checked on the wider case set: fp16, full mask, window, cross attention);
  timed     at least one timing row, no row with an error;
  score     per (profile, activation) row timed for both, the variant's fwd_ms + bwd_ms over
            base's (a training step runs both passes); the geometric mean of those ratios,
            lower is faster. silu_tanh is scored on silu rows only (its flag changes nothing
            else, so it is not timed on softmax).
The winner is the correct, timed variant with the lowest score; forward and backward winners
(fwd_ms and bwd_ms alone) are reported too. Rule for the library: triton_gdpa_variant.Variant's
defaults are set to the winner's flags (its spec text, also usable as GEMREF_GDPA) when a
GPU check's JSON is committed to benchmarks/; "autotune" winning means the defaults stay.
"""
from __future__ import annotations

import math

BASE = "base"


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def choose(summary: dict, variants: dict[str, str]) -> dict:
    """{"winner", "spec", "fwd_winner", "bwd_winner", "scores", "reason"} from a summary's
    correctness and timing sections; winner None (with the reason) when none qualifies."""
    sections = summary.get("sections", {})
    corr = sections.get("correctness", {}).get("result", {})
    records = corr.get("cases", []) + corr.get("determinism", [])
    rows = [r for r in sections.get("timing", {}).get("result", {}).get("rows", []) if r.get("kernel") in variants]
    if not records or not rows:
        return {"winner": None, "reason": "no correctness records or no timing rows"}
    base_ok = all(r["passed"] for r in records if r["variant"] == BASE)
    base_ms = {(r["profile"], r["activation"]): r for r in rows if r["kernel"] == BASE and "fwd_ms" in r}
    scores = {}
    for name in variants:
        mine = [r for r in records if r["variant"] == name]
        timed = [r for r in rows if r["kernel"] == name]
        pairs = [(r, base_ms[(r["profile"], r["activation"])]) for r in timed
                 if "fwd_ms" in r and (r["profile"], r["activation"]) in base_ms]
        entry = {"correct": bool(mine) and base_ok and all(r["passed"] for r in mine),
                 "timed": bool(pairs) and all("fwd_ms" in r for r in timed), "rows": len(pairs)}
        if pairs:
            entry.update({f"{key}_ratio": _geomean([fn(r) / fn(b) for r, b in pairs]) for key, fn in (
                ("step", lambda x: x["fwd_ms"] + x["bwd_ms"]), ("fwd", lambda x: x["fwd_ms"]),
                ("bwd", lambda x: x["bwd_ms"]))})
        scores[name] = entry
    eligible = {n: s for n, s in scores.items() if s["correct"] and s["timed"]}
    if not eligible:
        return {"winner": None, "scores": scores,
                "reason": "no variant is both correct and timed" + ("" if base_ok else " (base failed a case)")}
    best = {key: min(eligible, key=lambda n: eligible[n][f"{key}_ratio"]) for key in ("step", "fwd", "bwd")}
    return {"winner": best["step"], "spec": variants[best["step"]], "fwd_winner": best["fwd"],
            "bwd_winner": best["bwd"], "scores": scores,
            "reason": "lowest geometric-mean (fwd + bwd) time relative to base among correct, timed variants"}
