"""What the scale projection says: measured inputs from a waterfall, rung deltas, where GEM's band lands,
and what an SM-free transport is worth against GEM's reported ~5% QPS (`compare_transports`).

`gemref simulate`, `gemref bench sm_contention` and notebooks 08/11 print these; the projection
itself is gemref/simulate/projection.py.
"""
from __future__ import annotations

import json
from pathlib import Path

from dataclasses import replace

from ..mfu import meter
from .cost_model import NCCL_COLLECTIVE_SMS, sm_count
from .projection import (GEM_MFU_BAND, GEM_SM_CONTENTION_MAX, GEM_SMFREE_QPS_GAIN, LADDER, Options, RungModel,
                         check_mfu, hardware_of, project)
from .step_model import predict_step

TABLE_COLUMNS = ("gpus", "rung", "mesh", "batch_per_gpu", "local_mfu", "scaling_ratio", "mfu", "compute_s",
                 "comm_latency_s", "comm_bandwidth_s", "exposed_s", "imbalance", "bubble_s", "step_s", "state_gb",
                 "fits")
# One row's collectives: latency and bandwidth seconds apart (step_model.comm_rows), per step and rank.
COLLECTIVE_COLUMNS = ("kind", "dim", "group_size", "count", "bytes", "tier", "algorithm", "latency_s", "bandwidth_s",
                      "seconds", "overlappable_s")


def at(rows: list[dict], gpus: int) -> list[dict]:
    """The rows of one GPU count, in ladder order."""
    return [r for r in rows if r["gpus"] == gpus]


def table_rows(rows: list[dict]) -> list[dict]:
    return [{k: r[k] for k in TABLE_COLUMNS} for r in rows]


def tables_assumed(row: dict) -> str:
    """How a projected row's tables train, in words: its `table_optimizer` and `table_sync_every`
    (the projection prices the tables' replica traffic and state from these two)."""
    optimizer, every = row["table_optimizer"], row["table_sync_every"]
    if optimizer == "adamw":
        return "tables on AdamW, their summed gradient all-reduced every step"
    name = {"rowwise_adagrad": "row-wise Adagrad", "rowwise_adam": "row-wise Adam"}[optimizer]
    return f"tables on {name}, replica weights and row state averaged every {every} step" + ("s" if every > 1 else "")


def collective_rows(row: dict) -> list[dict]:
    """The priced collectives of one projected (GPU count, rung) row, COLLECTIVE_COLUMNS only."""
    return [{k: c.get(k) for k in COLLECTIVE_COLUMNS} for c in row["collectives"]]


def rung_pivot(rows: list[dict], column: str) -> list[dict]:
    """One row per GPU count, one column per rung: `column` of that (GPU count, rung) row."""
    return [{"gpus": g, **{r["rung"]: r[column] for r in at(rows, g)}} for g in sorted({r["gpus"] for r in rows})]


def mfu_pivot(rows: list[dict]) -> list[dict]:
    """One row per GPU count, one column per rung: the projected MFU."""
    return rung_pivot(rows, "mfu")


def rung_deltas(rows: list[dict], gpus: int) -> list[dict]:
    """MFU each rung adds over the previous one at `gpus`, and at the smallest GPU count projected;
    `fits` (the rung's state fits the GPU's memory at `gpus`; None where the profile has no memory)."""
    here, low = at(rows, gpus), at(rows, min(r["gpus"] for r in rows))
    return [{"rung": h["rung"], "key": h["key"], "mfu": h["mfu"], "fits": h.get("fits"),
             "fits_at_min": l.get("fits"),
             "delta": h["mfu"] - here[i - 1]["mfu"] if i else 0.0,
             "delta_at_min": l["mfu"] - low[i - 1]["mfu"] if i else 0.0}
            for i, (h, l) in enumerate(zip(here, low))]


def fitting(rows: list[dict]) -> list[dict]:
    """The rows whose configuration fits the GPU's memory (`fits` not False): the only ones ranked."""
    return [r for r in rows if r.get("fits") is not False]


def rung_that_matters(rows: list[dict], gpus: int) -> dict:
    """Among configurations that fit, the rung with the largest MFU gain at `gpus`, and the one whose
    gain grows most with scale. A gain counts only where the rung and the rung before it both fit
    (at `gpus`, and for growth also at the smallest GPU count): a projected MFU of a configuration
    that does not fit the GPU is not a run anyone can make. Each is None where no such pair exists
    (grows_most also where no such gain grows); `not_fitting` names the rungs left out at `gpus`."""
    deltas = rung_deltas(rows, gpus)
    pairs = [d for prev, d in zip(deltas, deltas[1:]) if prev["fits"] is not False and d["fits"] is not False]
    grown = [d for prev, d in zip(deltas, deltas[1:]) if d in pairs and prev["fits_at_min"] is not False
             and d["fits_at_min"] is not False]
    return {"largest": max(pairs, key=lambda d: d["delta"]) if pairs else None,
            "grows_most": max(grown, key=lambda d: d["delta"] - d["delta_at_min"])
            if grown and max(d["delta"] - d["delta_at_min"] for d in grown) > 0 else None,
            "not_fitting": [d["rung"] for d in deltas if d["fits"] is False]}


def gem_band(rows: list[dict], gpus: int, band=GEM_MFU_BAND) -> dict:
    """Where GEM's public MFU band lands at `gpus`: the rungs that fit and land inside it, and the
    first fitting rung to reach it (a configuration that does not fit is never counted)."""
    here = at(rows, gpus)
    ok = fitting(here)
    return {"gpus": gpus, "band": tuple(band), "inside": [r["rung"] for r in ok if band[0] <= r["mfu"] <= band[1]],
            "first_reaching": next((r["rung"] for r in ok if r["mfu"] >= band[0]), None),
            "baseline_mfu": here[0]["mfu"], "full_ladder_mfu": here[-1]["mfu"],
            "not_fitting": [r["rung"] for r in here if r.get("fits") is False]}


def mfu_at(row: dict, local_mfu: float) -> float:
    """The row's projected E2E MFU had its local MFU been `local_mfu` (same collectives, same imbalance)."""
    compute = meter.seconds_at(row["rank_flops"], local_mfu, row["peak_flops"])
    step = predict_step(compute, row["imbalance"], row["collectives"])["step_s"]   # each holds its sm_share
    return meter.mfu(row["rank_flops"], step, row["peak_flops"])


def required_local_mfu(row: dict, target: float) -> float | None:
    """Local MFU the row's rung needs to reach `target` E2E MFU at its GPU count (bisection: the
    projected MFU rises with it); None when even 1.0 falls short."""
    if mfu_at(row, 1.0) < target:
        return None
    lo, hi = 0.0, 1.0
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if mfu_at(row, mid) < target else (lo, mid)
    return hi


def parse_mfu_assumption(values: list[str] | None, ladder: list[RungModel] = LADDER) -> dict[str, tuple[float, str]]:
    """["0.4"] -> every rung at 0.4; ["jagged=0.1", "compile=0.45"] -> those rungs. ValueError otherwise."""
    keys = [r.key for r in ladder]
    out: dict[str, tuple[float, str]] = {}
    for item in values or []:
        key, _, raw = item.rpartition("=")
        try:
            value = float(raw)
        except ValueError:
            raise ValueError(f"--mfu-assumption {item!r}: expected VALUE or RUNG=VALUE with VALUE in (0, 1]") from None
        if key and key not in keys:
            raise ValueError(f"--mfu-assumption {item!r}: unknown rung {key!r}; valid: {', '.join(keys)}")
        for k in ([key] if key else keys):
            out[k] = (check_mfu(value, f"--mfu-assumption {item}"), "given (--mfu-assumption)")
    return out


def load_waterfall(path: str | Path) -> dict:
    """waterfall.json written by `gemref waterfall --out DIR` (the file or its folder)."""
    path = Path(path)
    path = path / "waterfall.json" if path.is_dir() else path
    if not path.exists():
        raise ValueError(f"--from-waterfall {path}: no such file (run gemref waterfall --out DIR first)")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"--from-waterfall {path}: not JSON ({e})") from None
    if not isinstance(data, dict) or not isinstance(data.get("rungs"), list):
        raise ValueError(f"--from-waterfall {path}: expected a waterfall record with a 'rungs' list")
    return data


def measured_mfu(waterfall: dict, ladder: list[RungModel] = LADDER) -> dict[str, tuple[float, str]]:
    """{rung key: (local MFU, source)} from a waterfall record.

    Local MFU is one rank's compute-only rate, so a waterfall on any number of ranks serves
    (a record from before local MFU existed serves only from one rank, where its E2E MFU is
    the compute rate plus data loading). A rung that did not run there, or kept no window,
    takes the local MFU of the last rung that did (assumed to change nothing on one device).
    """
    ranks = waterfall.get("ranks", 1)
    where = f"{waterfall.get('device', '?')}, {waterfall.get('preset', '?')} preset, {ranks} rank(s)"
    ran_rows = [r for r in waterfall["rungs"] if r.get("status") == "ran"]
    if ranks != 1 and not any("local_mfu" in r for r in ran_rows):
        raise ValueError(f"the waterfall ran on {ranks} ranks and records no local MFU, so its MFU includes their "
                         "communication: re-run it (gemref waterfall) or use a single-rank waterfall")
    ran = {r["key"]: r.get("local_mfu", r.get("mfu")) for r in ran_rows}
    ran = {k: v for k, v in ran.items() if v}
    if not ran:
        raise ValueError("the waterfall has no rung with a measured MFU")
    out, last = {}, None
    for r in ladder:
        if r.key in ran:
            last = (check_mfu(ran[r.key], f"waterfall rung {r.key}"), f"measured ({where})")
            out[r.key] = last
        elif last is not None:
            out[r.key] = (last[0], last[1] + f", carried to {r.key}")
    return out


def findings(rows: list[dict], band=GEM_MFU_BAND) -> list[str]:
    """Plain sentences: where GEM's band lands at the largest GPU count, which rung matters, what dominates."""
    gpus = max(r["gpus"] for r in rows)
    g, m = gem_band(rows, gpus, band), rung_that_matters(rows, gpus)
    top = at(rows, gpus)[-1]
    lo, hi = (required_local_mfu(top, b) for b in band)
    need = ("no local MFU <= 100% gets it there" if lo is None else
            f"it needs a local MFU of {lo:.0%}-{hi:.0%}" if hi is not None else f"it needs >= {lo:.0%}")
    by_kind = sorted(top["exposed_by_kind"].items(), key=lambda kv: -kv[1])
    unfit = at(rows, gpus)[0]
    largest, grows = m["largest"], m["grows_most"]
    lines = [
        f"At {gpus} GPUs: baseline {g['baseline_mfu']:.1%} MFU, full ladder {g['full_ladder_mfu']:.1%}. "
        f"GEM's {band[0]:.0%}-{band[1]:.0%} band: " + (
            f"rungs that fit and land inside it: {', '.join(g['inside'])}" if g["inside"]
            else "no rung that fits lands inside it")
        + (f"; first fitting rung at or above {band[0]:.0%}: {g['first_reaching']}" if g["first_reaching"] else "")
        + ".",
        (f"Rungs {', '.join(g['not_fitting'])} do not fit at {gpus} GPUs (the baseline's state: "
         f"{unfit['state_gb']:.0f} GB = {unfit['state_gb'] * 1e9 / 2 ** 30:.0f} GiB per GPU"
         + (f" against {unfit['memory_gb']:.0f} GB" if unfit.get("memory_gb") else "") + "): their MFU is "
         "projected, never ranked." if g["not_fitting"] else f"Every rung fits at {gpus} GPUs."),
        f"For the full ladder to land in the band {need} (here: {top['local_mfu']:.0%}, {top['local_mfu_source']}; "
        f"scaling ratio {top['scaling_ratio']:.2f}).",
        (f"Largest MFU gain at {gpus} GPUs among rungs that fit (with the rung before them): {largest['rung']} "
         f"({largest['delta']:+.1%})" if largest else
         f"No rung that fits at {gpus} GPUs follows another that fits: no gain to rank") + "; " + (
            f"the gain that grows most with scale: {grows['rung']} ({grows['delta_at_min']:+.1%} at "
            f"{min(r['gpus'] for r in rows)} GPUs, {grows['delta']:+.1%} at {gpus})." if grows else
            "no gain of a fitting rung (after a fitting rung, at both GPU counts) grows with scale."),
        f"Full ladder at {gpus} GPUs: compute {top['compute_s']:.3g} s, imbalance bubble {top['bubble_s']:.3g} s, "
        f"exposed comm {top['exposed_s']:.3g} s (largest: {by_kind[0][0]} {by_kind[0][1]:.3g} s), SM slowdown of the "
        f"overlapped compute {top['sm_slowdown_s']:.3g} s; of its {top['comm_s']:.3g} s of collectives "
        f"{top['comm_latency_s']:.3g} s is latency, {top['comm_bandwidth_s']:.3g} s bandwidth.",
        "Dominant inputs: the local MFU per rung (assumed unless measured), the batch per GPU (it amortises "
        "the per-step communication), the inter-node bandwidth, "
        f"the table replicas' all-reduce (here: {tables_assumed(top)}), and the overlap of FSDP's collectives.",
    ]
    return lines


def transport_variants(nccl_sms: int | None = None, smfree_sms: int = 1) -> dict[str, dict]:
    """Options overrides of the three transports compared: NCCL (`nccl_sms` per collective, None:
    its 24), NCCLX's SM-free transport (cost_model.TRANSPORTS), every collective at `smfree_sms`."""
    return {"nccl": dict(transport="nccl", collective_sms=nccl_sms, sm_share=None),
            "ncclx_smfree": dict(transport="ncclx_smfree", collective_sms=None, sm_share=None),
            "all_smfree": dict(transport="nccl", collective_sms=smfree_sms, sm_share=None)}


def compare_transports(preset, gpus, options: Options = Options(), variants: dict[str, dict] | None = None,
                       mfu=None, ladder=None) -> list[dict]:
    """One row per (GPU count, rung): step seconds and E2E MFU under each variant (the first is
    the reference), the QPS gain of each other one (same samples per step: step ratio - 1),
    and under the reference the compute seconds overlapped by collectives and the share of the
    step lost to SM contention (`contention`)."""
    variants = variants or transport_variants()
    runs = {name: project(preset, gpus, options=replace(options, **v), mfu=mfu, ladder=ladder)
            for name, v in variants.items()}
    ref_name, *others = runs
    out = []
    for i, ref in enumerate(runs[ref_name]):
        row = {"gpus": ref["gpus"], "rung": ref["rung"], "key": ref["key"], "mesh": ref["mesh"],
               "compute_s": ref["compute_s"], "overlapped_s": ref["overlapped_s"],
               "contention": ref["sm_slowdown_s"] / ref["step_s"]}
        for name, rows in runs.items():
            row[f"step_s_{name}"], row[f"mfu_{name}"] = rows[i]["step_s"], rows[i]["mfu"]
        for name in others:
            row[f"qps_gain_{name}"] = ref["step_s"] / runs[name][i]["step_s"] - 1
        out.append(row)
    return out


def contention_findings(rows: list[dict], options: Options = Options(), nccl_sms: int | None = None,
                        smfree_sms: int = 1, gem_gain: float = GEM_SMFREE_QPS_GAIN,
                        gem_cost: float = GEM_SM_CONTENTION_MAX) -> list[str]:
    """Plain sentences from `compare_transports` rows (the variants of `transport_variants(nccl_sms,
    smfree_sms)`): the SM-free gain at the largest GPU count against GEM's, the largest
    contention, and the share of the step under overlapped collectives GEM's gain implies."""
    sms = sm_count(hardware_of(options))
    k = NCCL_COLLECTIVE_SMS if nccl_sms is None else nccl_sms
    gpus = max(r["gpus"] for r in rows)
    top = at(rows, gpus)[-1]
    worst = max(rows, key=lambda r: r["contention"])
    best = max(rows, key=lambda r: r["qps_gain_ncclx_smfree"])
    freed = (k - smfree_sms) / sms        # share of the SMs a collective gives back going from k to smfree_sms
    overlap = top["overlapped_s"] / top["step_s_all_smfree"]
    implied = (f"so GEM's ~{gem_gain:.0%} needs about {gem_gain / freed:.0%} of the step under overlapped "
               "collectives" if freed > 0 else "so it buys nothing")
    return [
        f"At {gpus} GPUs the last rung ({top['rung']}) steps in {top['step_s_nccl']:.4g} s with NCCL's "
        f"{k} of {sms} SMs per collective and {top['step_s_ncclx_smfree']:.4g} s with NCCLX's SM-free transport: "
        f"{top['qps_gain_ncclx_smfree']:+.2%} QPS ({top['qps_gain_all_smfree']:+.2%} with every collective at "
        f"{smfree_sms} SM); GEM reported ~{gem_gain:.0%}.",
        f"SM contention costs NCCL at most {worst['contention']:.2%} of a step here ({worst['rung']}, "
        f"{worst['gpus']} GPUs; GEM: up to {gem_cost:.0%}); the largest SM-free gain is "
        f"{best['qps_gain_ncclx_smfree']:+.2%} ({best['rung']}, {best['gpus']} GPUs).",
        f"A collective going from {k} SMs to {smfree_sms} gives back {freed:.1%} of the SMs for as long as it "
        f"overlaps compute, {implied}; the projected {top['rung']} rung has {overlap:.1%} "
        f"({top['overlapped_s']:.3g} s of {top['step_s_all_smfree']:.3g} s): only the layer units' FSDP collectives "
        "overlap in this model, the embedding all-to-alls and the table replicas' all-reduce are exposed.",
    ]
