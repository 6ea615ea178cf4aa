"""The sentences a chapter prints about its own run, produced from the run's measurements.

A chapter's fixed prose explains the idea; whatever states a result (faster or slower, which
rung gained, whether a trend holds) comes from here, so it says which way this run went and
never claims what the run did not show. The verdicts are the same everywhere:

* `ratio_verdict(r, lo, hi)`: a throughput or time ratio is a gain only if its whole measured
  interval lies above 1 (a loss only if below); with no interval, only outside +-NOISE; in
  between it is "no measurable difference" (a small median inside the spread is not a gain).
* `trend(xs, ys)`: whether a measured series rises, falls, or neither, across its points.
"""
from __future__ import annotations

from typing import Sequence

NOISE = 0.05     # a ratio without a measured interval must leave 1 +- NOISE to count


def ratio_verdict(ratio: float | None, low: float | None = None, high: float | None = None) -> str:
    """"faster", "slower" or "no measurable difference" for a new/old throughput (or old/new
    time) ratio, by its interval when one was measured (module doc)."""
    if ratio is None:
        return "not measured"
    lo = low if low is not None else ratio / (1 + NOISE)
    hi = high if high is not None else ratio * (1 + NOISE)
    if lo > 1:
        return "faster"
    if hi < 1:
        return "slower"
    return "no measurable difference"


def trend(values: Sequence[float], rel: float = NOISE) -> str:
    """How a measured series moves from point to point: "rises", "falls", "stays flat", or two
    phases ("rises, then levels off", "rises, then falls", ...); a step within `rel` of the
    previous value is flat."""
    moves: list[int] = []
    for a, b in zip(values, values[1:]):
        step = 0 if abs(b - a) <= rel * max(abs(a), 1e-300) else (1 if b > a else -1)
        if not moves or moves[-1] != step:
            moves.append(step)
    word = {1: "rises", -1: "falls", 0: "stays flat"}
    if len(moves) == 1:
        return word[moves[0]]
    if len(moves) == 2:
        first, second = moves
        return f"{word[first] if first else 'is flat'}, then " + ("levels off" if second == 0 else word[second])
    return "goes up and down" if moves else "stays flat"


def _x(r: float) -> str:
    return f"{r:.2f}x"


def compile_findings(steps: dict, regions: list[dict], fused_kernels: int,
                     overhead_s: float | None = None) -> list[str]:
    """Chapter 04: compile time, the step-time verdict of every compiled variant, how many regions
    gained or lost, and which ones the region plan keeps (rows with "kept"); `overhead_s`: the
    measured fixed cost of one compiled call (gemref.compile.plan.call_overhead), seconds."""
    eager, compiled = steps["rows"][:2]
    out = [f"Compiling {compiled['graphs']} region graphs took {compiled['compile_s']:.1f} s once; "
           f"{compiled['recompiles_after_warmup']} recompiles after warm-up; {fused_kernels} fused kernels."]
    verdicts = []
    for row in steps["rows"][1:]:
        speed = 1 / row["vs_eager"]                  # eager time / compiled time: above 1 = compiled faster
        spread = [e / c for e, c in zip(eager["steps_s"], row["steps_s"])]
        verdicts.append(ratio_verdict(speed, min(spread), max(spread)))
        who = "every region compiled" if row["variant"] == "compiled" else \
            f"only the plan's regions compiled ({row.get('regions') or 'none'})"
        out.append(f"Training step, {who}: {_x(speed)} the eager speed (paired steps {_x(min(spread))}.."
                   f"{_x(max(spread))}): {verdicts[-1]}.")
    faster = [r for r in regions if r["speedup"] > 1 + NOISE]
    slower = [r for r in regions if r["speedup"] < 1 / (1 + NOISE)]
    same = [r for r in regions if r not in faster and r not in slower]
    def listed(rs):
        return ", ".join(r["region"] + " " + _x(r["speedup"]) for r in rs)
    parts = [f"{len(faster)} of {len(regions)} ran faster compiled" + (f" ({listed(faster)})" if faster else "")]
    if slower:
        parts.append(f"{len(slower)} slower ({listed(slower)})")
    if same:
        parts.append(f"{len(same)} within {NOISE:.0%} ({', '.join(r['region'] for r in same)})")
    out.append("Regions alone: " + "; ".join(parts) + ".")
    if regions and "kept" in regions[0]:
        kept = [r["region"] for r in regions if r["kept"]]
        out.append(f"The region plan compiles {', '.join(kept) if kept else 'nothing'} and leaves "
                   f"{', '.join(r['region'] for r in regions if not r['kept']) or 'nothing'} eager: a region is "
                   "compiled only where it measured faster, so the regions that lost here run eagerly in the "
                   "plan's step.")
    if slower:
        short = max(r["eager_ms"] for r in slower)
        cost = (f" (measured here: {1e3 * overhead_s:.2f} ms for a trivial region, forward+backward; more for a "
                "region with more inputs)") if overhead_s is not None else ""
        out.append(f"The regions that lost run for {min(r['eager_ms'] for r in slower):.2f}-{short:.2f} ms eagerly: at "
                   f"that size a compiled call's fixed cost (guard checks, the graph's wrapper, autograd's){cost} is "
                   "comparable to the element-wise traffic fusion saves.")
    if same or (verdicts[0] != "faster" and not slower):
        out.append("A region that neither gains nor loses is mostly its GEMMs, which are the same library calls "
                   "compiled or not: fusion saves only the memory traffic of the element-wise work around them.")
    return out


def autoac_findings(sweep: dict, gain: dict | None) -> list[str]:
    """Chapter 05: where a block's saved bytes come from, recompute FLOPs against recompute time,
    and whether the larger batch bought throughput."""
    blocks = sweep["profile"]["blocks"]
    base = sweep["profile"]["base_bytes"]
    # "selective": the name of save_matmuls in records written before it was renamed
    matmuls = sum(b["freed_bytes"].get("save_matmuls", b["freed_bytes"].get("selective", 0)) for b in blocks)
    full = sum(b["freed_bytes"].get("full", 0) for b in blocks)
    out = [f"Checkpointing that saves every matmul's output (save_matmuls: recompute nothing that costs FLOPs) "
           f"frees {matmuls / base:.0%} of the no-checkpoint activation bytes; full checkpointing {full / base:.0%}: "
           + ("most of the bytes are the outputs of cheap element-wise work." if matmuls > 0.5 * full else
              "most of the bytes are outputs of FLOP-costing ops (matmuls, attention), which only a full "
              "recompute can drop.")]
    half = {r["strategy"]: r for r in sweep["rows"] if r["budget"] == 0.5 and "step_s" in r}
    if {"auto", "full"} <= half.keys():
        auto, full_row = half["auto"], half["full"]
        flops_word = "less" if auto["recompute_pct"] < full_row["recompute_pct"] else "no less"
        time_verdict = ratio_verdict(full_row["step_s"] / auto["step_s"])
        out.append(f"At a 50% budget AutoAC (by time) recomputes {auto['recompute_pct']:.1f}% of the step's model FLOPs, "
                   f"full checkpointing {full_row['recompute_pct']:.1f}% ({flops_word}); its step runs "
                   f"{_x(full_row['step_s'] / auto['step_s'])} full checkpointing's speed: {time_verdict}. "
                   + ("Recompute FLOPs are not recompute time: the ops AutoAC reruns are cheap in FLOPs but not "
                      "in time (element-wise passes over memory, and each checkpoint's own overhead)."
                      if time_verdict != "faster" else "Fewer recomputed FLOPs showed as a faster step here."))
    if gain:
        none_row, auto_row = gain["rows"]
        verdict = ratio_verdict(gain["samples_per_s_ratio"])
        who = "full checkpointing (AutoAC's plan there)" if gain.get("full_checkpointing") else "AutoAC"
        cap = " (the search's cap, not a measured limit)" if gain.get("capped") else ""
        out.append(f"In the no-checkpoint step's memory {who} grows the batch {none_row['batch_size']} -> "
                   f"{auto_row['batch_size']}{cap}; samples/s {_x(gain['samples_per_s_ratio'])}: {verdict}"
                   + (f" (MFU {none_row['mfu']:.2%} -> {auto_row['mfu']:.2%})" if none_row["mfu"] is not None else "")
                   + ".")
    return out


def ladder_findings(rows: list[dict]) -> list[str]:
    """Chapter 10: every rung's verdict against the rung before (by its paired interval), the
    rungs that did not run and why, and where the best rung's step goes."""
    out = []
    ran = [r for r in rows if r["status"] == "ran"]
    for r in ran[1:]:
        verdict = ratio_verdict(r.get("vs_previous"), r.get("vs_previous_min"), r.get("vs_previous_max"))
        spread = (f" ({_x(r['vs_previous_min'])}..{_x(r['vs_previous_max'])})"
                  if r.get("vs_previous_min") is not None else "")
        out.append(f"{r['rung']}: {_x(r['vs_previous'])} the rung before{spread}: {verdict}." if r.get("vs_previous")
                   else f"{r['rung']}: no uncontended pair of windows to compare.")
    out += [f"{r['rung']}: {r['status']}." for r in rows if r["status"] != "ran"]
    measured = [r for r in ran if r.get("mfu") is not None]
    if measured:
        best = max(measured, key=lambda r: r["mfu"])
        out.append(f"Highest E2E MFU: {best['rung']}, {best['mfu']:.2%} (baseline {ran[0]['mfu']:.2%})"
                   if ran[0].get("mfu") is not None else f"Highest E2E MFU: {best['rung']}, {best['mfu']:.2%}.")
        parts = {k.removesuffix("_s"): v for k, v in (best.get("breakdown") or {}).items()
                 if k not in ("step_s",) and v > 0}
        if parts:
            top = max(parts, key=parts.get)
            out[-1] += (f"; the largest part of its step is {top} ({parts[top] / best['breakdown']['step_s']:.0%} "
                        f"of {best['breakdown']['step_s'] * 1e3:.1f} ms).")
    return out


def tail_findings(sigmas: Sequence[float], round_robin: Sequence[float], balanced: Sequence[float]) -> list[str]:
    """Chapter 11: how the straggler factor moves with the length tail, with and without balancing."""
    gaps = [rr / b for rr, b in zip(round_robin, balanced)]
    return [f"As the log-normal sigma of the lengths goes {sigmas[0]:g} -> {sigmas[-1]:g}, round robin's straggler "
            f"factor {trend(round_robin)} ({', '.join(f'{v:.2f}' for v in round_robin)}), the balanced one "
            f"{trend(balanced)} ({', '.join(f'{v:.2f}' for v in balanced)}); what balancing removes "
            f"(round robin / balanced) {trend(gaps)} ({', '.join(f'{v:.2f}x' for v in gaps)})."]


def engines_findings(result: dict, readable_lines: int | None = None) -> list[str]:
    """Chapter 07: each TorchRec variant against its native pair (speed by its paired windows,
    table weights on the fullest rank, table optimizer state over all ranks), what TorchRec's
    planner chose, and what the run says about keeping gemref's readable tables; `result` from
    gemref.measure.table_engines.compare_sharded, `readable_lines` the length of gemref's ShardedEmbedding."""
    rows = {r["variant"]: r for r in result["rows"]}
    out, faster = [], []
    for r in result["rows"]:
        if r["engine"] == "native":
            continue
        base = rows[r["baseline"]]
        speed = 1 / r["vs_native"]
        lo, hi = (1 / r["vs_max"], 1 / r["vs_min"]) if r["windows"] > 1 else (None, None)   # one window: no spread
        verdict = ratio_verdict(speed, lo, hi)
        paired = f" (paired windows {_x(lo)}..{_x(hi)})" if lo is not None else " (one window)"
        if verdict == "faster":
            faster.append(r["variant"])
        mine, theirs = max(r["table_bytes_per_rank"]), max(base["table_bytes_per_rank"])
        held = ("the same table weights on its fullest rank" if mine == theirs else
                f"{mine / theirs:.2f}x the table weights on its fullest rank")
        state = sum(r["table_opt_bytes_per_rank"]) / sum(base["table_opt_bytes_per_rank"])
        out.append(f"{r['variant']} against {base['variant']}: {_x(speed)} its speed{paired}: {verdict}; {held} "
                   f"({mine:,} vs {theirs:,} B) and {state:.2f}x its table optimizer state over all ranks.")
    planner = next((r for r in result["rows"] if r["sharding"] == "auto"), None)
    if planner is not None and result.get("plan"):
        chose: dict[str, list[str]] = {}
        for table, entry in result["plan"].items():
            chose.setdefault(entry["sharding"], []).append(table)
        weights = planner["table_bytes_per_rank"]
        row_wise = max(rows[planner["baseline"]]["table_bytes_per_rank"])
        out.append("TorchRec's planner chose " + "; ".join(f"{kind} for {len(t)} table{'s' * (len(t) > 1)} "
                                                           f"({', '.join(t)})" for kind, t in chose.items())
                   + f": its fullest rank holds {max(weights) / (sum(weights) / len(weights)):.2f}x the mean rank's "
                   f"table weights, {max(weights) / row_wise:.2f}x gemref's row-wise fullest rank.")
    pairs = sum(r["engine"] != "native" for r in result["rows"])
    if faster:
        why = (f"TorchRec's fused kernels (lookup, backward and optimizer in fbgemm) were faster in {len(faster)} of "
               f"{pairs} pairs here ({', '.join(faster)}); gemref keeps its readable tables anyway")
    else:
        why = (f"TorchRec was faster in none of the {pairs} pairs here, so the readable tables cost no step time on "
               "this run; gemref keeps them")
    size = f" ({readable_lines} lines of torch.distributed)" if readable_lines else ""
    why += (f": ShardedEmbedding{size} is code a reader can step through, trains its tables with AdamW like the dense "
            "layers, saves DCP checkpoints, and runs the 2D layout (shard within a group, replicate across) on CPU "
            "gloo ranks.")
    refusal = result.get("dmp_collection_cpu")
    why += (f" TorchRec's own 2D path, DMPCollection, refused a CPU device ({refusal!r}): on CPU only "
            "DistributedModelParallel, sharding over every rank, runs." if refusal else
            " This TorchRec's DMPCollection did not refuse a CPU device.")
    out.append(why)
    return out


def scaling_findings(rows: list[dict], theory_db: float) -> list[str]:
    """Chapter 09: per-tensor, per-row and per-block (MX) scaling of one tensor
    (`precision.mx_reference.scaling_sqnr` rows), against the rounding SQNR `theory_db`."""
    by = {r["scaling"]: r for r in rows}
    mx, tensor = by["mx"], by["tensor"]
    better = mx["block_sqnr_worst_db"] > tensor["block_sqnr_worst_db"] and mx["flushed"] <= tensor["flushed"]
    return [
        f"Rounding to E4M3's 3 mantissa bits alone gives {theory_db:.1f} dB; the median block here keeps "
        f"{mx['block_sqnr_median_db']:.1f} dB under MX scaling and {tensor['block_sqnr_median_db']:.1f} dB under one "
        "scale per tensor.",
        f"Worst block: {tensor['block_sqnr_worst_db']:.1f} dB with one scale per tensor "
        f"({tensor['flushed']} values flushed to zero), {by['row']['block_sqnr_worst_db']:.1f} dB per row "
        f"({by['row']['flushed']} flushed) and {mx['block_sqnr_worst_db']:.1f} dB with MX's 32-value blocks "
        f"({mx['flushed']} flushed): " + ("MX keeps the small blocks that a shared scale loses." if better else
                                          "MX does not beat one scale per tensor on this tensor."),
        f"The whole tensor's SQNR, weighted by its largest values, barely tells them apart: "
        f"{tensor['tensor_sqnr_db']:.1f} dB per tensor, {by['row']['tensor_sqnr_db']:.1f} dB per row, "
        f"{mx['tensor_sqnr_db']:.1f} dB MX.",
    ]


def paired_findings(name: str, reference: str, band, paired) -> str:
    """Chapter 09: a variant's eval loss against the reference's, seed by seed (`report.seed_band.
    paired_difference`) and against the unpaired seed band (`seed_band`)."""
    inside = -band.tolerance <= paired.low and paired.high <= band.tolerance
    return (f"{name} - {reference}, seed by seed (same initial weights and batches): mean {paired.mean:+.4f} "
            f"({paired.mean / band.reference_mean:+.2%}), largest {paired.largest:.4f}, {paired.k:g}-standard-error "
            f"interval {paired.low:+.4f}..{paired.high:+.4f}; " + (
                f"inside {reference}'s seed-to-seed band of +-{band.tolerance:.4f}: the precision moves the loss less "
                "than changing the seed does." if inside else
                f"NOT inside {reference}'s seed-to-seed band of +-{band.tolerance:.4f}."))


def cost_terms_findings(cost, max_len: int, median_len: float) -> list[str]:
    """Chapter 06: where a sample's quadratic (attention) term overtakes its linear one, against
    the preset's max_len (`balance.SampleCost.crossover_length`)."""
    cross = cost.crossover_length()
    if cross is None:
        return ["The cost has no quadratic term: a sample's cost grows linearly with its length."]
    at_max = cost.per_token_sq * max_len ** 2 / cost.cost([max_len])[0]
    at_med = cost.per_token_sq * median_len ** 2 / cost.cost([int(median_len)])[0]
    where = ("beyond this preset's max_len of %d, so no sample here is dominated by attention: the tail costs more "
             "mostly because it is longer" % max_len) if cross > max_len else (
             "inside this preset's max_len of %d: the longest samples are dominated by attention" % max_len)
    return [f"The L^2 term overtakes the L term at L = {cost.per_token:.3g} / {cost.per_token_sq:.3g} = {cross:.0f} "
            f"events, {where}; at max_len it is {at_max:.0%} of a sample's cost, at the median length "
            f"({median_len:.0f}) {at_med:.0%}."]


def calibration_findings(fit, flops_r2: float) -> list[str]:
    """Chapter 06: the quadratic cost fitted to measured step times (`balance.calibrate`), and how
    much of those times the FLOP-priced cost explains (`balance.explained_by`)."""
    c = fit.cost
    terms = (f"{fit.per_step * 1e3:.2f} ms per step + {c.per_sample * 1e6:.1f} us per sample + "
             f"{c.per_token * 1e6:.3f} us per event + {c.per_token_sq * 1e9:.4f} ns per event^2")
    if c.per_token > 0 and c.per_token_sq > 0:
        split = f"; its L^2 term overtakes its L term at L = {c.crossover_length():.0f}"
    else:
        split = ("; one of the L and L^2 terms fitted to 0 (over these batches the two columns are nearly "
                 "collinear, so how the length-dependent time splits between them is not determined)")
    return [f"Fitted to the measured steps: {terms}, R^2 {fit.r2:.3f} (RMS error {fit.rel_rms_error:.1%}){split}.",
            f"The FLOP-priced cost above (one scale and a fixed time per step fitted) explains the same times with "
            f"R^2 {flops_r2:.3f}, against the free fit's {fit.r2:.3f}."]
