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

import statistics
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


def baseline_findings(preset: str, report: dict, record: dict, breakdown: list[dict]) -> list[str]:
    """Chapter 00: what a padded step executes against the model FLOPs and how FlopCounterMode
    agrees (`report`: gemref.mfu.verify.flops_report), the baseline's throughput and MFU (`record`:
    the run record), and where the profiled step's seconds go (`breakdown`: rows of region, seconds)."""
    step_s = sum(r["seconds"] for r in breakdown)
    backward = sum(r["seconds"] for r in breakdown if r["region"] == "backward") / step_s
    top = max((r for r in breakdown if r["region"] not in ("backward", "optimizer")), key=lambda r: r["seconds"])
    return [f"One padded step of the {preset} preset executes {report['executed_flops'] / report['model_flops']:.2f}x "
            f"the model's {report['model_flops']:.3g} FLOPs; FlopCounterMode agrees with the analytic executed count to "
            f"{report['relative_error']:.2%} (tolerance 2%).",
            f"The baseline trains at {record['tokens_per_s']:,.0f} tokens/s, MFU {record['mfu']:.2%} of this device's "
            f"peak ({record['peak_flops'] / 1e9:.0f} GFLOP/s, {record['peak_source'].split(':')[0]}).",
            f"The backward takes {backward:.0%} of the profiled step; in the forward, {top['region']} leads with "
            f"{top['seconds'] / step_s:.0%}."]


def jagged_findings(skewed: dict, padded: dict, jagged: dict, max_len: int, d_model: int) -> list[str]:
    """Chapter 01: the FLOPs a padded and a jagged step execute on the skewed profile (`skewed`: a
    row of executed / model FLOPs per layout), and what the two runs (`padded`, `jagged`: run
    records of the same batches) measured; a time that missed a large FLOP cut is noted, never judged."""
    flop_cut = skewed["padded_over_model"] / skewed["jagged_over_model"]
    speedup = jagged["tokens_per_s"] / padded["tokens_per_s"]
    out = [f"Skewed histories (mean {skewed['mean_len']:.0f} of max {max_len} events): a padded step executes "
           f"{skewed['padded_over_model']:.2f}x the model FLOPs, a jagged one {skewed['jagged_over_model']:.2f}x; "
           "the rest is the padding inside the materialised attention, which chapters 02-03 remove.",
           f"Trained on the same batches, jagged runs {speedup:.2f}x the padded tokens per second with "
           f"{padded['peak_memory_bytes'] / jagged['peak_memory_bytes']:.1f}x less peak memory; MFU "
           f"{padded['mfu']:.2%} -> {jagged['mfu']:.2%}."]
    if speedup < 1.1:
        out.append(f"No gain at this size: {flop_cut:.1f}x fewer FLOPs, but at d_model {d_model} and histories up to "
                   f"{max_len} events each op is too small for its FLOPs to set its time; per-op overhead and the "
                   "attention, padded in both runs, dominate. A longer MAX_LEN or a larger preset shows the cut.")
    else:
        out.append(f"The {flop_cut:.1f}x cut in executed FLOPs shows as {speedup:.2f}x the throughput: the time a padded "
                   "step spends on pad rows is gone, but the attention still pads to the batch's longest history.")
    if flop_cut >= 3 and not speedup > 1.2:   # a structural gap this large should show in the step time
        out.append(f"timing note: jagged executes {flop_cut:.1f}x fewer FLOPs but ran only {speedup:.2f}x as fast")
    return out


def flash_findings(by_length: dict[int, dict[str, dict]], reference: dict, fused: dict, model: str) -> list[str]:
    """Chapter 02: how the materialised and the flash (sdpa) kernel's peak memory grow from the
    first length measured to the last (`by_length`: {L: {kernel: row}}, in that order), and what the fused kernel
    did for the whole model (`reference`, `fused`: run records); times that missed a large cut are
    noted, never judged."""
    lo, hi = list(by_length)[0], list(by_length)[-1]
    first, last = by_length[lo], by_length[hi]
    growth = [last[k]["peak_mib"] / first[k]["peak_mib"] for k in ("reference", "sdpa")]
    gap = last["reference"]["peak_mib"] / last["sdpa"]["peak_mib"]
    work_cut = reference["executed_flops_per_step"] / fused["executed_flops_per_step"]
    mfu_gain = fused["mfu"] / reference["mfu"]
    speedup = last["sdpa"]["speedup_fwdbwd"]
    out = [f"From L = {lo} to {hi} ({hi / lo:.0f}x longer) the materialised kernel's peak memory grew "
           f"{growth[0]:.1f}x and the flash kernel's {growth[1]:.1f}x; at L = {hi} the gap is {gap:.1f}x and flash runs forward+backward {speedup:.2f}x faster.",
           f"The whole model ({model}, softmax): {work_cut:.2f}x fewer executed FLOPs per step, peak memory "
           f"{reference['peak_memory_bytes'] / 2**20:.0f} -> {fused['peak_memory_bytes'] / 2**20:.0f} MiB, MFU "
           f"{reference['mfu']:.2%} -> {fused['mfu']:.2%} ({mfu_gain:.2f}x)."]
    if mfu_gain < 1.1:
        out.append("No gain for the model at this size: its histories are short enough that materialised attention "
                   "costs little next to the dense layers; a longer MAX_LEN or a heavier tail (LEN_SIGMA) shows the gap.")
    if hi >= 1024 and not speedup > 1.2:
        out.append(f"timing note: flash only {speedup:.2f}x at L = {hi}")
    if work_cut >= 2 and not mfu_gain > 1.2:
        out.append(f"timing note: {work_cut:.1f}x less executed work per step but MFU only {mfu_gain:.2f}x")
    return out


def balance_findings(by_ranks: dict[int, list[dict]], per_rank: int, kk_max_ranks: int,
                     real: tuple[str, list[dict]] | None = None) -> list[str]:
    """Chapter 06: the bubble round robin leaves and Karmarkar-Karp removes, the MFU share each
    keeps as ranks grow, what planning a step costs, and local rebalancing against the global
    splits. `by_ranks`: {ranks: gemref.measure.balance_compare.compare rows} (round_robin, lpt,
    local; kk up to `kk_max_ranks`); `real`: (dataset name, compare rows of its real rows at the
    smallest rank count), or None."""
    ranks = list(by_ranks)
    at = {R: {r["policy"]: r for r in rows} for R, rows in by_ranks.items()}
    naive, best = at[ranks[0]]["round_robin"], at[ranks[0]]["kk"]
    out = [f"At {ranks[0]} ranks x {per_rank} samples, round robin idles {naive['idle']:.1%} of the cluster's time "
           f"(imbalance {naive['imbalance']:.3f}); Karmarkar-Karp idles {best['idle']:.2%} "
           f"(imbalance {best['imbalance']:.4f}): the bubble is {1 - best['idle'] / naive['idle']:.2%} smaller."]
    top_best = at[ranks[-1]].get("kk") or at[ranks[-1]]["lpt"]
    kept_rr = [at[R]["round_robin"]["kept"] for R in ranks]
    out.append("Over the epoch round robin keeps " + ", ".join(f"{k:.1%} at {R} ranks" for k, R in zip(kept_rr, ranks))
               + f" of single-device MFU, {top_best['policy']} {top_best['kept']:.1%} at {ranks[-1]}: "
               + ("the more ranks, the likelier one draws the tail." if all(a > b for a, b in zip(kept_rr, kept_rr[1:]))
                  else "more ranks did not lower it at every step here."))
    last = at[ranks[-1]]
    out.append(f"Planning one step at {ranks[-1]} ranks: LPT {last['lpt']['plan_ms']:.1f} ms"
               + (f", Karmarkar-Karp {last['kk']['plan_ms']:.0f} ms" if "kk" in last
                  else f" (kk skipped above {kk_max_ranks} ranks)")
               + f". LPT keeps {last['lpt']['of_optimum']:.1%} of the optimum, for 0 bytes when every rank holds the "
                 f"lengths and an all-gather of {last['lpt']['exchange_bytes']:,} bytes per step when it does not. "
                 "`gemref bench local_balance --ranks 1024` prices both at larger scales.")
    for R in ranks:
        loc, rr = at[R]["local"], at[R]["round_robin"]
        global_best = at[R].get("kk", at[R]["lpt"])
        same = f"{rr['of_optimum']:.1%}" == f"{rr['kept']:.1%}"
        out.append(f"{R} ranks: local keeps {loc['of_optimum']:.1%} of the optimum (round robin {rr['of_optimum']:.1%}, "
                   + ("the kept share of section 3: no sample outweighed a rank's fair share; " if same else
                      f"above its kept share of {rr['kept']:.1%}, since the best split of these batches is not perfect; ")
                   + f"{global_best['policy']} {global_best['of_optimum']:.1%}), receiving 0 bytes per step where "
                   f"{global_best['policy']} all-gathers {global_best['exchange_bytes']:,}; samples move at most "
                   f"{loc['displacement_max']} steps, every one used once: {loc['once']}.")
    if real:
        name, rows = real
        rr_real, kk_real = (next(r for r in rows if r["policy"] == p) for p in ("round_robin", "kk"))
        out.append(f"On {name} rows at {ranks[0]} ranks round robin's imbalance is {rr_real['imbalance']:.3f} "
                   f"(synthetic {naive['imbalance']:.3f}) and Karmarkar-Karp's {kk_real['imbalance']:.4f}: "
                   + ("equal counts leave real rows about as unbalanced as the synthetic ones (within 5%); "
                      if abs(rr_real["imbalance"] / naive["imbalance"] - 1) <= 0.05 else
                      "equal counts leave real rows less unbalanced than the synthetic ones; "
                      if rr_real["imbalance"] < naive["imbalance"] else "equal counts leave real rows more unbalanced; ")
                   + "balancing by cost removes the bubble on both.")
    return out


def best_rung_findings(rung: str, chosen: str, prof: dict) -> list[str]:
    """Chapter 10: the best rung's step (`prof`: gemref.walkthrough.best_rung.profile_rung) by op
    class, what it would take with its GEMMs at the probe's best rate, at the CPU's peak and at no
    time at all, and whether the gap to the limit lies inside or outside the GEMMs."""
    limits = {r["case"]: r for r in prof["limits"]}
    now, attainable, at_peak, gemm_free = (limits[c] for c in ("step", "gemm_at_best_rate", "gemm_at_peak", "gemm_free"))
    shares = {r["class"]: r["share"] for r in prof["classes"] if r["share"] > 0}
    biggest = max((c for c in shares if c != "gemm"), key=shares.get)
    kept = at_peak["step_ms"] / now["step_ms"]
    wall, cpu = (statistics.median(prof[k]) for k in ("step_wall_s", "step_cpu_s"))
    shared = (": other jobs shared the core, and every time here is inflated" if wall > 1.2 * cpu else
              ": the core was this process's")
    out = [f"What this run measured: {rung} ({chosen}): a step of {1e3 * wall:.1f} ms wall, {1e3 * cpu:.1f} ms of "
           f"process CPU{shared}. GEMMs take {shares.get('gemm', 0):.0%} of its step (the profiler's cost out), "
           f"{biggest} {shares[biggest]:.0%}."]
    if attainable["step_ms"] < 0.98 * now["step_ms"]:
        out.append(f"With every GEMM at the best rate the probe found for its shape the step would take "
                   f"{attainable['step_ms']:.1f} ms instead of {now['step_ms']:.1f} ms: MFU {attainable['mfu']:.1%} "
                   f"instead of {now['mfu']:.1%}.")
    else:
        out.append(f"Timed alone on every path, its GEMM shapes ran no faster than inside the step "
                   f"({attainable['step_ms']:.1f} ms vs {now['step_ms']:.1f} ms): they already take their best path here.")
    out.append(f"With every GEMM at the CPU's peak: MFU {at_peak['mfu']:.1%} instead of {now['mfu']:.1%}. With no GEMM "
               f"time at all the step would take {gemm_free['step_ms']:.1f} ms: no faster GEMM, a lower precision "
               f"included, can make it more than {now['step_ms'] / gemm_free['step_ms']:.2f}x faster.")
    out.append(f"The gap to the limit is mostly outside the GEMMs: with them at the peak the step keeps {kept:.0%} of "
               f"its time, most of it {biggest}. That is the part to attack next (fewer, larger ops; fused kernels)."
               if kept > 0.5 else
               f"The gap to the limit is mostly in the GEMMs: at the peak rate they would cut the step to {kept:.0%} of "
               "its time. Their shapes (small M or K) keep them below the peak: larger batches or fused projections "
               "help.")
    return out


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


def autoac_takeaway(sweep: dict, gain: dict | None, regions: dict, joint_no_worse: bool, compress_format: str,
                    mem: list[dict], cbatch: dict | None, parity: dict | None, parity_runs: str) -> list[str]:
    """Chapter 05's takeaway: what no, full and AutoAC checkpointing keep and recompute per budget
    (`sweep`: gemref.measure.autoac_sweep.budget_sweep), `autoac_findings`, per-region against one
    global budget (`regions`: gemref.measure.autoac_regions, `joint_no_worse` judged by the chapter),
    and compressed saved activations: their bytes (`mem`: no compression, then `compress_format`),
    the batch they fit (`cbatch`) and loss parity over `parity_runs` ("3 seeds x 20 steps")."""
    full_row = next(r for r in sweep["rows"] if r["strategy"] == "full")
    out = [f"No checkpointing keeps {sweep['profile']['base_bytes'] / 2**20:.2f} MiB of activations; checkpointing "
           f"every block cuts that to {full_row['act_pct']:.0f}% and recomputes {full_row['recompute_pct']:.1f}% of the "
           "step's model FLOPs."]
    out += [f"  budget {r['budget']:.0%}: AutoAC keeps {r['act_pct']:.0f}% and recomputes {r['recompute_pct']:.1f}% "
            f"(plan {r['plan']}; its bytes within {abs(r['act_bytes'] / r['predicted_bytes'] - 1):.2%} of the solver's)"
            for r in sweep["rows"] if r["strategy"] == "auto" and "act_pct" in r]
    if half := sweep["done_when"]:
        out.append(f"At 50%, AutoAC by time recomputes {half['auto_over_full']:.2f} of full checkpointing's FLOPs; by "
                   f"FLOPs its plan would recompute {half['flops_plan_over_full']:.2f}.")
    if (head := sweep["head_to_head"]) and "rows" in head:
        out += [f"  {r['strategy']}: step {r['step_s']:.4f} s, {r['vs_full']:.2f}x full checkpointing's (median of "
                f"{head['rounds']} interleaved rounds; plan {r['plan']})" for r in head["rows"]]
    out += autoac_findings(sweep, gain)
    out.append(f"One fraction for every region reaches {len(regions['fronts']['uniform'])} plans; at each one's bytes, "
               "per-region budgets recompute " + ("no more" if joint_no_worse else "MORE (a solver bug)")
               + f" ({regions['joint_no_worse_at']}).")
    plain, compressed = mem[0], mem[1]
    out.append(f"Every block's saved activations in {compress_format}: {compressed['act_mb']:.2f} MiB instead of "
               f"{plain['act_mb']:.2f} MiB ({compressed['vs_none']:.0%}); the {compressed['compressed_mb']:.2f} MiB it "
               f"compressed are stored in {compressed['stored_mb']:.2f} MiB, nothing recomputed.")
    if cbatch:
        plain_b, comp_b = cbatch["rows"]
        def reach(r, key):
            return f"at least {r[key]} (the search's cap)" if r[key] >= cbatch["max_batch"] else str(r[key])
        out.append(f"In the same memory the batch grows {plain_b['no_ac_batch']} -> {reach(comp_b, 'no_ac_batch')} with "
                   f"compression alone (no recompute); full checkpointing reaches {reach(plain_b, 'full_ac_batch')} by "
                   "recomputing every block.")
    if parity:
        out.append(f"Loss parity over {parity_runs}: mean difference {parity['mean_difference']:+.5f}, "
                   f"{'inside' if parity['within_band'] else 'OUTSIDE'} the uncompressed seed band of "
                   f"{parity['seed_band']:.5f}.")
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
