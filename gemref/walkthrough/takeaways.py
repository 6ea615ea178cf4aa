"""Each chapter's takeaway: the sentences about what its own run measured, in one call per chapter.

The verdicts (`ratio_verdict`, `trend`) and the sentences the benches share are findings.py's;
these read one chapter's results: 00 `baseline_findings`, 01 `jagged_findings`, 02
`flash_findings`, 03 `gdpa_findings`, 05 `autoac_takeaway`, 06 `balance_findings`, 10
`best_rung_findings`, 09 `mxfp8_findings`, 12 `real_data_findings`, 13
`foreign_model_findings`. A time that missed a large structural cut is noted ("timing note: ..."),
never judged: it moves with the machine's load.
"""
from __future__ import annotations

import statistics
from typing import Sequence

from ..mfu.attention_cost import window_takeaway
from .findings import autoac_findings, paired_findings, scaling_findings


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


def gdpa_findings(batch_lengths: Sequence[int], max_len: int, kernels: list[dict], reference_rows: dict[str, dict],
                  reference: dict, fused: dict, model: str, window_rows: list[dict],
                  quality: dict | None = None) -> list[str]:
    """Chapter 03: the fused GDPA kernels against the reference on one skewed batch (`kernels`:
    the fused kernels' rows, per activation in the order measured; `reference_rows`: the
    reference's, by activation), what it did for the whole model (`reference`, `fused`: run
    records), the sliding window's cost and quality (gemref.mfu.attention_cost.window_takeaway of
    `window_rows`, `quality`); times that missed a large cut are noted, never judged."""
    ref = reference_rows[kernels[0]["activation"]]
    speedups = [r["speedup_fwdbwd"] for r in kernels]
    work_cut = reference["executed_flops_per_step"] / fused["executed_flops_per_step"]
    mfu_gain = fused["mfu"] / reference["mfu"]
    out = [f"On a batch of {len(batch_lengths)} sequences up to {max_len} events ({sum(batch_lengths):,} rows), the "
           f"reference executes {ref['exec_over_model']:.1f}x the model FLOPs and {kernels[0]['kernel']} "
           f"{kernels[0]['exec_over_model']:.2f}x; forward+backward runs {min(speedups):.2f}x-{max(speedups):.2f}x "
           f"faster across {', '.join(dict.fromkeys(r['activation'] for r in kernels))}, with "
           f"{ref['peak_mib'] / kernels[0]['peak_mib']:.1f}x less peak memory.",
           f"The whole model ({model}): {work_cut:.2f}x fewer executed FLOPs per step; MFU "
           f"{reference['mfu']:.2%} -> {fused['mfu']:.2%} ({mfu_gain:.2f}x)."]
    if mfu_gain < 1.1:
        out.append("No gain for the model at this size: the batch's longest history is short enough that the padded "
                   "attention costs little next to the dense layers and each kernel call's overhead. A longer "
                   "MODEL_MAX_LEN or a heavier tail (LEN_SIGMA) makes attention, and the kernel's gain, dominate.")
    out += window_takeaway(window_rows, quality)
    out += [f"timing note: {r['activation']}: only {r['speedup_fwdbwd']:.2f}x" for r in kernels
            if reference_rows[r["activation"]]["exec_over_model"] / r["exec_over_model"] >= 3
            and not r["speedup_fwdbwd"] > 1.2]
    if work_cut >= 2 and not mfu_gain > 1.2:
        out.append(f"timing note: {work_cut:.1f}x less executed work per step but MFU only {mfu_gain:.2f}x")
    windows = {}
    for r in window_rows:
        windows.setdefault(r["history_len"], {})[r["variant"]] = r
    out += [f"timing note: L={L}: window only {by['window']['speedup']:.2f}x" for L, by in windows.items()
            if by["window"]["executed_flops"] <= by["full"]["executed_flops"] / 3 and not by["window"]["speedup"] > 1]
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



def real_data_findings(dataset: str, train_rows: int, steps: int, batch_size: int, architecture: str,
                       by: dict[str, dict], variants: Sequence[str]) -> list[str]:
    """Chapter 12: the GEM-like model's eval NE and AUC on like (mean over seeds, `by["fast"]`)
    beside the id-only baselines ("logistic u+i", "candidate rate", "train base rate"), whether
    it beats the regression by more than 3 seed standard deviations, and which `variants` left
    the fp32 seed band (`by`: gemref.measure.quality rows by variant)."""
    fast, logistic, item = by["fast"], by["logistic u+i"], by["candidate rate"]
    out = [f"On {dataset} ({train_rows:,} train rows), the GEM-like model ({architecture} architecture, {steps} steps of "
           f"batch {batch_size} ({steps * batch_size / train_rows:.1f} epochs)) reaches eval NE {fast['ne_click']:.4f} +- "
           f"{fast['ne_click_sd']:.4f} and AUC {fast['auc_click']:.4f} on like over {fast['seeds']} seeds; the logistic "
           f"regression on user and movie ids {logistic['ne_click']:.4f} / {logistic['auc_click']:.4f}, the movie's "
           f"like-rate {item['ne_click']:.4f} / {item['auc_click']:.4f}, the constant train rate "
           f"{by['train base rate']['ne_click']:.4f}."]
    gap = fast["ne_click"] - logistic["ne_click"]
    if gap < -3 * fast["ne_click_sd"]:
        out.append(f"The model beats the id-only regression by {-gap:.4f} NE: the history and the features carry signal "
                   "ids alone do not.")
    elif gap > 3 * fast["ne_click_sd"]:
        out.append(f"The model is {gap:.4f} NE behind the id-only regression: at this many steps it has not learnt what "
                   "one weight per user and per movie captures (the cpu profile trains longer).")
    else:
        out.append(f"The model and the id-only regression are within the seeds' spread ({gap:+.4f} NE): the history adds "
                   "little over who rates which movie at this size and training length.")
    outside = [v for v in variants if not (by[v]["ne_click_within"] and by[v]["auc_click_within"])]
    out.append("Every technique stays inside the fp32 seed band on like NE and AUC." if not outside else
               f"Outside the fp32 seed band: {', '.join(outside)} (see the table for by how much).")
    return out


def mxfp8_findings(blocks, theory_db: float, scalings: list[dict], layers: dict[str, list], output_sqnr: dict[str, float],
                   reference: str, eval_loss: dict[str, list[float]], steps: int, bands: dict, paired: dict) -> list[str]:
    """Chapter 09: one activation's MX blocks (`blocks`: gemref.precision.sqnr.block_stats columns,
    dB, counts) against the rounding floor `theory_db`, MX against one scale per tensor
    (`scalings`), each precision's converted layers and model output SQNR (dB), and each
    precision's eval loss against the `reference`'s seed band (`bands`, `paired` per precision)."""
    out = [f"One (16 x 256) activation, rows 1e-4 to 1 and an outlier: MX block SQNR median {blocks.sqnr_db.median():.1f} "
           f"dB (rounding alone: {theory_db:.1f} dB), worst block {blocks.sqnr_db.min():.1f} dB; "
           f"{int(blocks.at_max.sum())} values rounded to +-448, {int(blocks.clipped.sum())} clipped, "
           f"{int(blocks.flushed.sum())} flushed."]
    out += scaling_findings(scalings, theory_db)[1:2]
    out += [f"{precision}: {len(ls)} layers converted; per-layer output SQNR {min(l.output_db for l in ls):.1f}-"
            f"{max(l.output_db for l in ls):.1f} dB (first layer {ls[0].output_db:.1f} dB, deeper ones compound); "
            f"the model's output {output_sqnr[precision]:.1f} dB" for precision, ls in layers.items() if ls]
    ref = eval_loss[reference]
    out.append(f"{reference} after {steps} steps over {len(ref)} seeds: eval loss mean {statistics.mean(ref):.4f}, "
               f"seed-to-seed sd {statistics.stdev(ref):.4f}, {min(ref):.4f}..{max(ref):.4f}")
    out += [paired_findings(precision, reference, band, paired[precision]) for precision, band in bands.items()]
    return out


def foreign_model_findings(batch_size: int, events: int, max_len: int, jagged_flops: float, padded_flops: float,
                           kernel: str, base, compiled=None, stats=None) -> list[str]:
    """Chapter 13: a model gemref did not define, measured: its model FLOPs jagged and padded, its
    MFU (local x scaling) and where its profiled step went (`base`: gemref.mfu.foreign's result,
    figures and op_seconds), and, when its dense region was compiled (`compiled`, `stats`: that
    run's result and compile stats), whether the compiled step was faster."""
    fig, share = base.figures, {k: 100 * v / base.profiled_step_s for k, v in base.op_seconds.items()}
    out = [f"The example ranker's step on {batch_size} skewed histories ({events} events) is {jagged_flops / 1e9:.3f} "
           f"GFLOPs of model work; padded to {max_len} the same users cost {padded_flops / jagged_flops:.1f}x as much.",
           f"With kernel {kernel} it ran at {fig['mfu']:.2%} MFU = local {fig['local_mfu']:.2%} x scaling "
           f"{fig['scaling_ratio']:.3f}; attention took {share['attention']:.1f}% of a profiled step, GEMMs "
           f"{share['gemm']:.1f}%, the optimizer {share['optimizer']:.1f}%, other {share['other']:.1f}%."]
    if compiled is not None:
        faster = compiled.figures["mfu"] > fig["mfu"]
        out.append(f"Compiling the dense region: {stats.graphs} graph(s), {stats.recompiles} recompiles; MFU "
                   f"{compiled.figures['mfu']:.2%} vs eager {fig['mfu']:.2%}: here the compiled step was "
                   + ("faster." if faster else "not faster: the region is one small MLP, little for inductor to fuse, "
                                              "and a compiled call pays for its guards."))
    return out
