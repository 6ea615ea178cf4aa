"""`gemref bench step_profile`: the op-class mapping, a tiny run end to end against an
independent FLOP count, and its user errors."""
from __future__ import annotations

import json

import pytest
from torch.utils.flop_counter import FlopCounterMode

from gemref.mfu.op_classes import op_class
from gemref.cli import main


@pytest.mark.parametrize("name,ancestors,expected", [
    ("aten::mm", ["aten::linear", "sequence_block"], "gemm"),
    ("aten::addmm", [], "gemm"),
    ("aten::bmm", ["gemref::cpu_jagged_bwd", "GeneratedBackwardFor_gemref_cpu_jagged_fwd_default"], "attention"),
    ("aten::silu_", ["gemref::cpu_jagged_fwd"], "attention"),
    ("aten::_scaled_dot_product_flash_attention_for_cpu", ["aten::scaled_dot_product_attention"], "attention"),
    ("aten::sqrt", ["Optimizer.step#AdamW.step", "optimizer"], "optimizer"),
    ("aten::_fused_adamw_", ["Optimizer.step#AdamW.step"], "optimizer"),
    ("aten::mm", ["optimizer"], "optimizer"),
    ("aten::silu_backward", ["autograd::engine::evaluate_function: SiluBackward0"], "elementwise"),
    ("aten::add_", [], "elementwise"),
    ("aten::native_layer_norm_backward", [], "elementwise"),
    ("aten::copy_", [], "other"),
    ("aten::index_select", [], "other"),
    ("aten::embedding_dense_backward", [], "other"),
    ("aten::cat", [], "other"),
    # gemref's FastLinear ops hold their GEMMs as events of their own: the ops' self time is not a GEMM
    ("fastlinear::forward", ["sequence_block"], "other"),
    ("fastlinear::backward", ["autograd::engine::evaluate_function: FastlinearForwardBackward0"], "other"),
    ("mkldnn::_linear_pointwise", ["fastlinear::backward"], "gemm"),
    ("aten::mm", ["fastlinear::forward"], "gemm"),
    ("aten::view", ["fastlinear::forward"], "other"),
    # a compiled graph's fused CPU kernels record no event: the graph call's self time is them
    ("## Call CompiledFxGraph fenry5nmrnbgu3zg5v5m4yvmgq4ulh7xsqvsuetqphwmbdoj43dq ##",
     ["CompiledFunction", "Torch-Compiled Region: 0/0"], "elementwise"),
    ("fastlinear::forward", ["## Call CompiledFxGraph fenry5nmrnbg ##"], "other"),
])
def test_op_classes(name, ancestors, expected):
    assert op_class(name, ancestors) == expected


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_tiny_run_writes_its_record_and_its_gemm_flops_match_the_flop_counter(precision, tmp_path, capsys, data_root):
    from gemref.train.presets import get_preset
    from gemref.train.override import override
    from gemref.mfu.gemm_paths import probe_paths
    from gemref.train import sample_batch, setup

    path = tmp_path / "step.json"
    rc = main(["bench", "step_profile", "--preset", "tiny", "--batch-size", "16", "--warmup", "1",
               "--timed-steps", "1", "--profile-steps", "1", "--probe-reps", "1", "--precision", precision,
               "--json", str(path)])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "time per op class" in printed and "gemm_at_best_rate" in printed
    record = json.loads(path.read_text())
    # the GEMMs are probed, and the MFU divided, in the dtype the step's GEMMs ran in
    assert record["precision"] == record["gemm_dtype"] == precision
    assert f"best {precision} GEMM" in record["peak_source"] or "fallback" in record["peak_source"]
    assert all(set(row["rates"]) <= {*probe_paths(precision), "bmm"} for row in record["gemm_shapes"])
    limits = {r["case"]: r["step_ms"] for r in record["limits"]}
    gemm_ms = {r["class"]: r["ms_per_step"] for r in record["classes"]}["gemm"]
    # Amdahl's bound: the step less its GEMM share (of the unprofiled step), under every other limit
    assert limits["gemm_free"] <= min(limits["gemm_at_peak"], limits["gemm_at_best_rate"], limits["step"])
    assert limits["gemm_free"] == pytest.approx(
        limits["step"] * (1 - gemm_ms / sum(r["ms_per_step"] for r in record["classes"])), rel=1e-9)
    classes = {r["class"]: r["ms_per_step"] for r in record["classes"]}
    assert set(classes) == {"gemm", "attention", "elementwise", "optimizer", "communication", "other"}
    assert classes["gemm"] > 0 and classes["attention"] > 0 and classes["optimizer"] > 0
    profiled = {r["class"]: r["ms_per_step"] for r in record["classes_profiled"]}
    assert sum(profiled.values()) == pytest.approx(1e3 * record["profiled_step_s"], rel=1e-6)
    # the profiler's cost comes out of the classes (none goes negative, none grows), at most the whole gap
    assert record["profiler_s_per_boundary"] >= 0
    assert all(0 <= classes[c] <= profiled[c] + 1e-9 for c in classes)
    gap = max(0.0, record["profiled_step_s"] - record["paired_unprofiled_step_s"])
    assert sum(profiled.values()) - sum(classes.values()) <= 1e3 * gap * (1 + 1e-9) + 1e-9
    # "other" op by op adds up to the class (the untraced remainder is its last-named row), and
    # holds none of the ops the other classes took
    assert sum(r["ms_per_step"] for r in record["other_ops"]) == pytest.approx(classes["other"], rel=1e-9)
    names = [r["op"] for r in record["other_ops"]]
    assert "(untraced: Python, autograd engine, gaps)" in names and "what 'other' is, op by op" in printed
    assert not {"aten::mm", "aten::addmm", "mkldnn::_linear_pointwise", "optimizer"} & set(names)
    assert [r["ms_per_step"] for r in record["other_ops"]] == sorted((r["ms_per_step"] for r in record["other_ops"]),
                                                                     reverse=True)
    for row in record["gemm_shapes"]:
        assert row["best_gflops_per_s"] == max(row["rates"].values()) > 0
    # Oracle: torch's FlopCounterMode on the same step counts the GEMMs outside attention
    # (the attention op is one opaque op there) with its own formulas, not from shapes.
    preset = get_preset("tiny")
    s = setup(preset, override(preset.train, batch_size=16, jagged=True, kernel="auto", precision=precision),
              device="cpu")
    batch = sample_batch(s)
    with FlopCounterMode(display=False) as counter:
        s.step(batch)
    counts = counter.get_flop_counts()["Global"]
    gemm_ops = {"aten.mm", "aten.addmm", "aten.bmm", "aten.baddbmm", "mkldnn._linear_pointwise",
                "fastlinear.forward", "fastlinear.backward"}      # FastLinear's custom ops, where compiled
    gemm = sum(n for op, n in counts.items() if op._qualified_op_name.replace("::", ".") in gemm_ops)
    assert sum(r["gflop_per_step"] for r in record["gemm_shapes"]) * 1e9 == pytest.approx(gemm, rel=1e-9)


@pytest.mark.parametrize("argv,message", [
    (["--timed-steps", "0"], "--timed-steps"),
    (["--threads", "0"], "--threads"),
    (["--warmup", "-1"], "--warmup"),
    (["--precision", "mxfp8"], "--precision"),
])
def test_user_errors_exit_2(argv, message, capsys):
    assert main(["bench", "step_profile", *argv]) == 2
    assert message in capsys.readouterr().err
