"""gemref/walkthrough/findings.py and takeaways.py: the sentences follow the measurements, whichever way they went."""
import pytest

from gemref.walkthrough.findings import (autoac_findings, compile_findings, engines_findings, ladder_findings,
                                         ratio_verdict, tail_findings, trend)
from gemref.walkthrough.takeaways import (autoac_takeaway, balance_findings, baseline_findings, best_rung_findings,
                                          flash_findings, foreign_model_findings, gdpa_findings, jagged_findings,
                                          mxfp8_findings, real_data_findings)


@pytest.mark.parametrize("ratio, low, high, verdict", [
    (1.3, 1.1, 1.5, "faster"), (1.3, 0.9, 1.5, "no measurable difference"), (0.7, 0.6, 0.8, "slower"),
    (1.02, None, None, "no measurable difference"), (1.2, None, None, "faster"), (0.8, None, None, "slower"),
    (None, None, None, "not measured")])
def test_ratio_verdict_uses_the_interval(ratio, low, high, verdict):
    assert ratio_verdict(ratio, low, high) == verdict


@pytest.mark.parametrize("values, words", [([1, 2, 3], "rises"), ([3, 2, 1], "falls"), ([1, 1.01, 1], "stays flat"),
                                           ([1.25, 1.51, 1.48], "rises, then levels off"), ([1, 2, 1], "rises, then falls"),
                                           ([2, 1, 1], "falls, then levels off"), ([1, 2, 1, 2], "goes up and down")])
def test_trend(values, words):
    assert trend(values) == words


def _steps(eager, compiled, planned=None):
    def row(name, s):
        return {"variant": name, "steps_s": s, "compile_s": 3.0, "graphs": 6, "recompiles_after_warmup": 0,
                "median_step_s": sorted(s)[len(s) // 2], "regions": "sequence.mix",
                "vs_eager": sorted(c / e for c, e in zip(s, eager))[len(eager) // 2]}
    rows = [{"variant": "eager", "steps_s": eager, "median_step_s": sorted(eager)[len(eager) // 2], "vs_eager": 1.0},
            row("compiled", compiled)] + ([row("planned", planned)] if planned else [])
    return {"rows": rows, "ratio": rows[1]["vs_eager"]}


def test_compile_findings_say_which_way_each_region_went():
    regions = [{"region": "a", "speedup": 1.4, "eager_ms": 2.0}, {"region": "b", "speedup": 0.7, "eager_ms": 0.3},
               {"region": "c", "speedup": 1.01, "eager_ms": 1.0}]
    faster = compile_findings(_steps([1.0, 1.0, 1.0], [0.8, 0.82, 0.79]), regions, 12)
    assert "faster." in faster[1] and "1 of 3 ran faster compiled (a 1.40x)" in faster[2]
    assert "1 slower (b 0.70x)" in faster[2] and "0.30-0.30 ms" in faster[3]
    slower = compile_findings(_steps([1.0, 1.0, 1.0], [1.3, 1.25, 1.35]), regions[1:2], 12)
    assert "slower." in slower[1] and "0 of 1 ran faster" in slower[2]


def test_compile_findings_judge_the_plans_variant_and_name_what_it_keeps():
    regions = [{"region": "a", "speedup": 1.4, "eager_ms": 2.0, "kept": True},
               {"region": "b", "speedup": 0.7, "eager_ms": 0.3, "kept": False}]
    wins = compile_findings(_steps([1.0] * 3, [1.1, 1.2, 1.15], planned=[0.8, 0.85, 0.82]), regions, 3)
    assert "every region compiled" in wins[1] and "slower." in wins[1]
    assert "only the plan's regions compiled (sequence.mix)" in wins[2] and wins[2].endswith("faster.")
    assert "compiles a and leaves b eager" in wins[4]
    assert "measured here" not in " ".join(wins)
    costed = compile_findings(_steps([1.0] * 3, [1.1, 1.2, 1.15]), regions, 3, overhead_s=2.5e-4)
    assert "(measured here: 0.25 ms for a trivial region" in " ".join(costed)
    none = compile_findings(_steps([1.0] * 3, [1.1, 1.2, 1.15]), [{**r, "kept": False} for r in regions], 3)
    assert len([line for line in none if line.startswith("Training step")]) == 1
    assert "compiles nothing and leaves a, b eager" in none[3]


def _sweep(matmuls, full, auto_step, full_step, name="save_matmuls"):
    blocks = [{"name": "layers.0.sequence", "freed_bytes": {name: matmuls, "full": full}}]
    rows = [{"budget": 0.5, "strategy": "full", "recompute_pct": 30.0, "step_s": full_step},
            {"budget": 0.5, "strategy": "auto", "recompute_pct": 10.0, "step_s": auto_step}]
    return {"profile": {"blocks": blocks, "base_bytes": 100}, "rows": rows}


def test_autoac_findings_follow_the_bytes_the_time_and_the_batch():
    cheap = autoac_findings(_sweep(60, 90, 1.0, 1.5), None)
    assert "frees 60%" in cheap[0] and "cheap element-wise work" in cheap[0]
    assert "faster" in cheap[1] and "showed as a faster step" in cheap[1]
    dear = autoac_findings(_sweep(20, 90, 1.5, 1.0), {"rows": [{"batch_size": 64, "mfu": 0.1}, {"batch_size": 256, "mfu": 0.09}],
                                                     "samples_per_s_ratio": 0.97})
    assert "FLOP-costing ops" in dear[0] and "slower" in dear[1] and "are not recompute time" in dear[1]
    assert "64 -> 256" in dear[2] and "no measurable difference" in dear[2] and "AutoAC grows" in dear[2]
    assert "frees 60%" in autoac_findings(_sweep(60, 90, 1.0, 1.5, name="selective"), None)[0], "an old record"
    full = autoac_findings(_sweep(20, 90, 1.5, 1.0), {"rows": [{"batch_size": 64, "mfu": 0.1}, {"batch_size": 256, "mfu": 0.09}],
                                                      "samples_per_s_ratio": 0.97, "capped": True, "full_checkpointing": True})
    assert "full checkpointing (AutoAC's plan there) grows" in full[2] and "the search's cap, not a measured limit" in full[2]


def test_ladder_findings_judge_each_rung_by_its_interval_and_name_the_skipped():
    rows = [{"rung": "0 baseline", "status": "ran", "mfu": 0.01},
            {"rung": "1 + jagged", "status": "ran", "mfu": 0.02, "vs_previous": 1.4, "vs_previous_min": 1.2,
             "vs_previous_max": 1.6, "breakdown": {"step_s": 0.1, "gemm_s": 0.06, "other_s": 0.04}},
            {"rung": "3 + compile", "status": "ran", "mfu": 0.019, "vs_previous": 0.95, "vs_previous_min": 0.85,
             "vs_previous_max": 1.05},
            {"rung": "7 + float8", "status": "n/a here: needs a GPU"}]
    lines = ladder_findings(rows)
    assert lines[0].endswith(": faster.") and lines[1].endswith(": no measurable difference.")
    assert lines[2] == "7 + float8: n/a here: needs a GPU."
    assert "1 + jagged, 2.00%" in lines[3] and "gemm (60%" in lines[3]


def test_tail_findings_follow_the_series():
    up = tail_findings([0.6, 1.8], [1.2, 1.6], [1.0, 1.0])[0]
    down = tail_findings([1.8, 0.6], [1.6, 1.2], [1.0, 1.0])[0]
    assert "round robin's straggler factor rises" in up and "falls" in down


def _engines(trec_over_native, refusal="DMPCollection only supports CUDA or MTIA", windows=3):
    """compare_sharded's result with every TorchRec variant at `trec_over_native` x its pair's time
    (paired windows +-10%), gemref's tables at 100 B per rank and AdamW's 200."""
    def row(variant, engine, sharding, baseline, weights, ratio):
        return {"variant": variant, "engine": engine, "sharding": sharding, "baseline": baseline, "windows": windows,
                "vs_native": ratio, "vs_min": ratio * 0.9, "vs_max": ratio * 1.1, "table_bytes_per_rank": weights,
                "table_opt_bytes_per_rank": [(2 if engine == "native" else 1) * w for w in weights]}
    r = trec_over_native
    return {"rows": [row("native row", "native", "row", "native row", [100, 100], 1.0),
                     row("TorchRec row_wise", "torchrec", "row_wise", "native row", [100, 100], r),
                     row("native table", "native", "table", "native table", [120, 80], 1.0),
                     row("TorchRec table_wise", "torchrec", "table_wise", "native table", [150, 50], r),
                     row("TorchRec planner", "torchrec", "auto", "native row", [125, 75], r)],
            "plan": {"ec.item": {"sharding": "row_wise", "ranks": [0, 1]},
                     "ebc.sparse_0": {"sharding": "table_wise", "ranks": [0]}},
            "dmp_collection_cpu": refusal}


def test_engines_findings_flip_with_the_measured_times():
    quick = engines_findings(_engines(0.5), readable_lines=46)
    assert quick[0].startswith("TorchRec row_wise against native row: 2.00x its speed (paired windows "
                               "1.82x..2.22x): faster; the same table weights on its fullest rank (100 vs 100 B) "
                               "and 0.50x")
    assert "TorchRec table_wise against native table" in quick[1] and "1.25x the table weights" in quick[1]
    assert "row_wise for 1 table (ec.item); table_wise for 1 table (ebc.sparse_0)" in quick[3]
    assert "1.25x the mean rank's table weights, 1.25x gemref's row-wise fullest rank" in quick[3]
    assert "were faster in 3 of 3 pairs here" in quick[4] and "(46 lines of torch.distributed)" in quick[4]
    assert "refused a CPU device ('DMPCollection only supports CUDA or MTIA')" in quick[4]
    slow = engines_findings(_engines(2.0, refusal=None))
    assert "0.50x its speed (paired windows 0.45x..0.56x): slower" in slow[0]
    assert "faster in none of the 3 pairs here, so the readable tables cost no step time" in slow[4]
    assert "did not refuse a CPU device" in slow[4] and "lines of torch.distributed" not in slow[4]
    even = engines_findings(_engines(0.99))
    assert "no measurable difference" in even[0] and "faster in none of the 3 pairs" in even[4]


def test_engines_findings_judge_one_window_by_the_noise_band():
    one = engines_findings(_engines(0.97, windows=1))      # 1.03x: inside +-5% without a measured spread
    assert "1.03x its speed (one window): no measurable difference" in one[0]
    assert "faster." not in one[0]


def test_baseline_findings_state_the_measured_step():
    report = {"executed_flops": 3.0e9, "model_flops": 1.2e9, "relative_error": 0.004}
    record = {"tokens_per_s": 12345.6, "mfu": 0.0123, "peak_flops": 2.5e11, "peak_source": "measured: fp32 GEMM"}
    breakdown = [{"region": "sequence", "seconds": 3.0}, {"region": "heads", "seconds": 1.0},
                 {"region": "backward", "seconds": 5.0}, {"region": "optimizer", "seconds": 1.0}]
    assert baseline_findings("tiny", report, record, breakdown) == [
        "One padded step of the tiny preset executes 2.50x the model's 1.2e+09 FLOPs; FlopCounterMode agrees with the "
        "analytic executed count to 0.40% (tolerance 2%).",
        "The baseline trains at 12,346 tokens/s, MFU 1.23% of this device's peak (250 GFLOP/s, measured).",
        "The backward takes 50% of the profiled step; in the forward, sequence leads with 30%."]


def _policy(policy, imbalance, kept, of_optimum, idle=None, plan_ms=1.0, exchange=0, moved=0):
    return {"policy": policy, "imbalance": imbalance, "kept": kept, "of_optimum": of_optimum,
            "idle": 1 - 1 / imbalance if idle is None else idle, "plan_ms": plan_ms, "exchange_bytes": exchange,
            "displacement_max": moved, "once": True}


def test_balance_findings_follow_the_rank_counts_and_the_real_rows():
    def at(rr_kept, kk=True):
        rows = [_policy("round_robin", 1 / rr_kept, rr_kept, rr_kept), _policy("lpt", 1.01, 0.99, 0.995, exchange=512),
                _policy("local", 1.05, 0.95, 0.96, moved=3)]
        return rows + ([_policy("kk", 1.001, 0.999, 0.9995, exchange=512, plan_ms=20.0)] if kk else [])
    falling = balance_findings({8: at(0.8), 1024: at(0.6, kk=False)}, 32, 256)
    assert falling[0].startswith("At 8 ranks x 32 samples, round robin idles 20.0% of the cluster's time (imbalance 1.250)")
    assert "the more ranks, the likelier one draws the tail." in falling[1] and "lpt 99.0% at 1024" in falling[1]
    assert "(kk skipped above 256 ranks)" in falling[2]
    assert "8 ranks: local keeps 96.0% of the optimum (round robin 80.0%, the kept share of section 3" in falling[3]
    assert "lpt 99.5%), receiving 0 bytes per step where lpt all-gathers 512" in falling[4] and len(falling) == 5
    rising = balance_findings({8: at(0.6), 64: at(0.8)}, 32, 256,
                              ("MovieLens-100K", [_policy("round_robin", 1.2, 0.8, 0.8), _policy("kk", 1.0, 1.0, 1.0)]))
    assert "more ranks did not lower it at every step here." in rising[1] and ", Karmarkar-Karp 20 ms" in rising[2]
    assert rising[-1].startswith("On MovieLens-100K rows at 8 ranks round robin's imbalance is 1.200 (synthetic 1.667)")
    assert "equal counts leave real rows less unbalanced than the synthetic ones; " in rising[-1]


def _profile(best_rate_ms, peak_ms, wall_s=0.010):
    limits = [{"case": "step", "step_ms": 10.0, "mfu": 0.05}, {"case": "gemm_at_best_rate", "step_ms": best_rate_ms, "mfu": 0.06},
              {"case": "gemm_at_peak", "step_ms": peak_ms, "mfu": 0.08}, {"case": "gemm_free", "step_ms": 2.5, "mfu": None}]
    classes = [{"class": "gemm", "share": 0.5}, {"class": "attention", "share": 0.3}, {"class": "other", "share": 0.2}]
    return {"limits": limits, "classes": classes, "step_wall_s": [wall_s] * 3, "step_cpu_s": [0.010] * 3}


def test_best_rung_findings_place_the_gap_inside_or_outside_the_gemms():
    outside = best_rung_findings("fused_attention", "highest MFU", _profile(9.99, 6.0))
    assert outside[0] == ("What this run measured: fused_attention (highest MFU): a step of 10.0 ms wall, 10.0 ms of "
                          "process CPU: the core was this process's. GEMMs take 50% of its step (the profiler's cost "
                          "out), attention 30%.")
    assert "they already take their best path here" in outside[1] and "more than 4.00x faster" in outside[2]
    assert outside[3].startswith("The gap to the limit is mostly outside the GEMMs: with them at the peak the step keeps 60%")
    inside = best_rung_findings("jagged", "highest MFU", _profile(8.0, 4.0, wall_s=0.020))
    assert "other jobs shared the core" in inside[0] and "would take 8.0 ms instead of 10.0 ms: MFU 6.0%" in inside[1]
    assert inside[3].startswith("The gap to the limit is mostly in the GEMMs: at the peak rate they would cut the step to 40%")


def test_autoac_takeaway_reads_the_sweep_the_regions_and_the_compression():
    sweep = _sweep(60, 90, 1.0, 1.5)
    sweep["rows"][0].update(act_pct=10.0)
    sweep["rows"][1].update(act_pct=48.0, plan="sequence:F", act_bytes=49, predicted_bytes=50)
    sweep.update(done_when={"auto_over_full": 0.33, "flops_plan_over_full": 0.25}, head_to_head=None)
    mem = [{"act_mb": 4.0}, {"act_mb": 1.5, "vs_none": 0.375, "compressed_mb": 3.0, "stored_mb": 0.5}]
    cbatch = {"rows": [{"no_ac_batch": 64, "full_ac_batch": 128}, {"no_ac_batch": 256}], "max_batch": 256}
    lines = autoac_takeaway(sweep, None, {"fronts": {"uniform": [(1, 2, "x")] * 3}, "joint_no_worse_at": "3 of 3"}, True,
                            "mxfp8", mem, cbatch, {"mean_difference": 0.0001, "within_band": False, "seed_band": 0.002},
                            "3 seeds x 20 steps")
    assert lines[0] == ("No checkpointing keeps 0.00 MiB of activations; checkpointing every block cuts that to 10% and "
                        "recomputes 30.0% of the step's model FLOPs.")
    assert lines[1] == ("  budget 50%: AutoAC keeps 48% and recomputes 10.0% (plan sequence:F; its bytes within 2.00% "
                        "of the solver's)")
    assert lines[2].startswith("At 50%, AutoAC by time recomputes 0.33") and lines[3] == autoac_findings(sweep, None)[0]
    assert "reaches 3 plans; at each one's bytes, per-region budgets recompute no more (3 of 3)" in lines[5]
    assert "in mxfp8: 1.50 MiB instead of 4.00 MiB (38%)" in lines[6]
    assert "grows 64 -> at least 256 (the search's cap) with compression alone" in lines[7] and "reaches 128 by" in lines[7]
    assert lines[8] == ("Loss parity over 3 seeds x 20 steps: mean difference +0.00010, OUTSIDE the uncompressed seed "
                        "band of 0.00200.")


def _layout_run(tokens_per_s, mfu, peak_bytes, executed=None):
    return {"tokens_per_s": tokens_per_s, "mfu": mfu, "peak_memory_bytes": peak_bytes, "executed_flops_per_step": executed}


def test_jagged_findings_say_whether_the_flop_cut_showed_in_the_time():
    skewed = {"mean_len": 20.4, "padded_over_model": 6.0, "jagged_over_model": 1.5}
    gained = jagged_findings(skewed, _layout_run(100, 0.01, 4 << 20), _layout_run(250, 0.025, 1 << 20), 256, 32)
    assert gained[0].startswith("Skewed histories (mean 20 of max 256 events): a padded step executes 6.00x")
    assert "jagged runs 2.50x the padded tokens per second with 4.0x less peak memory; MFU 1.00% -> 2.50%" in gained[1]
    assert gained[2].startswith("The 4.0x cut in executed FLOPs shows as 2.50x") and len(gained) == 3
    flat = jagged_findings(skewed, _layout_run(100, 0.01, 4 << 20), _layout_run(105, 0.0105, 1 << 20), 256, 32)
    assert flat[2].startswith("No gain at this size: 4.0x fewer FLOPs, but at d_model 32")
    assert flat[3] == "timing note: jagged executes 4.0x fewer FLOPs but ran only 1.05x as fast"


def test_flash_findings_follow_the_lengths_in_the_order_measured():
    def at(ref_mib, sdpa_mib, speedup):
        return {"reference": {"peak_mib": ref_mib}, "sdpa": {"peak_mib": sdpa_mib, "speedup_fwdbwd": speedup}}
    lines = flash_findings({256: at(2.0, 1.0, 1.1), 2048: at(128.0, 8.0, 1.1)},
                           _layout_run(0, 0.01, 64 << 20, 9e9), _layout_run(0, 0.011, 16 << 20, 3e9), "small")
    assert lines[0] == ("From L = 256 to 2048 (8x longer) the materialised kernel's peak memory grew 64.0x and the flash "
                        "kernel's 8.0x; at L = 2048 the gap is 16.0x and flash runs forward+backward 1.10x faster.")
    assert lines[1] == ("The whole model (small, softmax): 3.00x fewer executed FLOPs per step, peak memory 64 -> 16 MiB, "
                        "MFU 1.00% -> 1.10% (1.10x).")
    assert lines[2].startswith("No gain for the model at this size")
    assert lines[3:] == ["timing note: flash only 1.10x at L = 2048",
                         "timing note: 3.0x less executed work per step but MFU only 1.10x"]


def test_gdpa_findings_read_the_kernels_the_model_and_the_window():
    kernels = [{"activation": "silu", "kernel": "cpu_fused", "exec_over_model": 1.0, "peak_mib": 2.0, "speedup_fwdbwd": 3.0},
               {"activation": "silu", "kernel": "cpu_jagged", "exec_over_model": 1.0, "peak_mib": 2.0, "speedup_fwdbwd": 2.0},
               {"activation": "gelu", "kernel": "cpu_fused", "exec_over_model": 1.0, "peak_mib": 2.0, "speedup_fwdbwd": 1.1}]
    reference_rows = {a: {"exec_over_model": 4.0, "peak_mib": 10.0} for a in ("silu", "gelu")}
    def window(L, variant, flops, speedup):
        return {"history_len": L, "variant": variant, "window": 64, "flops_vs_full": 0.5, "executed_flops": flops,
                "speedup": speedup, "wall_ms": 1.0, "cpu_over_wall": 1.0, "peak_mib": 1.0, "model_flops": flops}
    windows = [window(1024, "full", 9e6, 1.0), window(1024, "window", 2e6, 0.9)]
    lines = gdpa_findings([200, 3, 17], 256, kernels, reference_rows, _layout_run(0, 0.01, 0, 6e9),
                          _layout_run(0, 0.0105, 0, 2e9), "small", windows)
    assert lines[0] == ("On a batch of 3 sequences up to 256 events (220 rows), the reference executes 4.0x the model "
                        "FLOPs and cpu_fused 1.00x; forward+backward runs 1.10x-3.00x faster across silu, gelu, with "
                        "5.0x less peak memory.")
    assert lines[1] == "The whole model (small): 3.00x fewer executed FLOPs per step; MFU 1.00% -> 1.05% (1.05x)."
    assert lines[2].startswith("No gain for the model at this size") and lines[3].startswith("At L = 1024 events a window")
    assert lines[-3:] == ["timing note: gelu: only 1.10x", "timing note: 3.0x less executed work per step but MFU only 1.05x",
                          "timing note: L=1024: window only 0.90x"]


def test_real_data_findings_place_the_model_against_the_regression_by_the_seed_spread():
    def row(ne, auc=0.7, sd=0.001, within=True):
        return {"ne_click": ne, "auc_click": auc, "ne_click_sd": sd, "seeds": 3, "ne_click_within": within,
                "auc_click_within": True}
    by = {"fast": row(0.90), "logistic u+i": row(0.95), "candidate rate": row(0.97), "train base rate": row(1.01),
          "mxfp8": row(0.90), "window": row(0.93, within=False)}
    lines = real_data_findings("MovieLens-100K", 80000, 100, 400, "tiny", by, ["mxfp8", "window"])
    assert lines[0].startswith("On MovieLens-100K (80,000 train rows), the GEM-like model (tiny architecture, 100 steps of "
                               "batch 400 (0.5 epochs)) reaches eval NE 0.9000 +- 0.0010 and AUC 0.7000 on like over 3 seeds")
    assert lines[1].startswith("The model beats the id-only regression by 0.0500 NE")
    assert lines[2] == "Outside the fp32 seed band: window (see the table for by how much)."
    by["fast"] = row(0.951, sd=0.01)
    same = real_data_findings("sample", 40, 1, 40, "tiny", by, ["mxfp8"])
    assert "within the seeds' spread (+0.0010 NE)" in same[1] and same[2].startswith("Every technique stays inside")


def test_mxfp8_findings_read_the_blocks_the_layers_and_the_seed_band():
    from types import SimpleNamespace

    import torch

    from gemref.precision.mx_reference import block_stats, scaling_sqnr
    from gemref.report.seed_band import paired_difference, seed_band

    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(0))
    stats = block_stats(x, scale_mode="rceil")
    layers = {"mxfp8": [SimpleNamespace(output_db=30.0), SimpleNamespace(output_db=22.5)], "bf16": []}
    loss = {"fp32": [0.50, 0.52, 0.51], "mxfp8": [0.505, 0.52, 0.512]}
    bands = {"mxfp8": seed_band(loss["fp32"], loss["mxfp8"])}
    lines = mxfp8_findings(stats, 31.0, scaling_sqnr(x), layers, {"mxfp8": 25.0}, "fp32", loss, 20, bands,
                           {"mxfp8": paired_difference(loss["fp32"], loss["mxfp8"])})
    assert lines[0].startswith("One (16 x 256) activation") and f"median {stats.sqnr_db.median():.1f} dB" in lines[0]
    assert lines[1].startswith("Worst block:")
    assert lines[2] == ("mxfp8: 2 layers converted; per-layer output SQNR 22.5-30.0 dB (first layer 30.0 dB, deeper ones "
                        "compound); the model's output 25.0 dB")
    assert lines[3] == "fp32 after 20 steps over 3 seeds: eval loss mean 0.5100, seed-to-seed sd 0.0100, 0.5000..0.5200"
    assert lines[4].startswith("mxfp8 - fp32, seed by seed") and len(lines) == 5


def test_foreign_model_findings_split_the_step_and_judge_the_compiled_one():
    from types import SimpleNamespace

    base = SimpleNamespace(figures={"mfu": 0.02, "local_mfu": 0.025, "scaling_ratio": 0.8}, profiled_step_s=2.0,
                           op_seconds={"attention": 0.5, "gemm": 1.0, "optimizer": 0.1, "other": 0.4})
    eager = foreign_model_findings(8, 120, 64, 2.5e9, 5e9, "cpu_jagged", base)
    assert eager == ["The example ranker's step on 8 skewed histories (120 events) is 2.500 GFLOPs of model work; padded "
                     "to 64 the same users cost 2.0x as much.",
                     "With kernel cpu_jagged it ran at 2.00% MFU = local 2.50% x scaling 0.800; attention took 25.0% of "
                     "a profiled step, GEMMs 50.0%, the optimizer 5.0%, other 20.0%."]
    slower = foreign_model_findings(8, 120, 64, 2.5e9, 5e9, "cpu_jagged", base, SimpleNamespace(figures={"mfu": 0.019}),
                                    SimpleNamespace(graphs=1, recompiles=0))
    assert slower[2].startswith("Compiling the dense region: 1 graph(s), 0 recompiles; MFU 1.90% vs eager 2.00%: here "
                                "the compiled step was not faster")
