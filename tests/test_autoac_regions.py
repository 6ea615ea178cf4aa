"""Per-region AutoAC (gemref/measure/autoac_regions.py): the joint solver against one global fraction
and against brute force on random profiles (by FLOPs, as the chapter's fronts compare them); the
compressed option measured on a real model."""
import itertools
import json

import pytest
import torch
from hypothesis import given, settings, strategies as st

from gemref.autoac import ActivationProfile, BlockProfile, apply_plan, auto_checkpoint, plan_of, remove_plan, solve
from gemref.measure.batch_search import gemref_activation_bytes as activation_bytes, gemref_profile
from gemref.activation_compression import CompressionSpec
from gemref.measure.autoac_regions import (pareto_front, region_budgets, region_bytes, uniform_front, uniform_plan,
                                           without_option)
from gemref.cli import main
from gemref.train.presets import get_preset
from gemref.data.batches import batch_with_lengths
from gemref.model.gem import GEMRef

OPTIONS = ("save_matmuls", "full", "compressed")
CFG = get_preset("tiny").model


@st.composite
def profiles(draw):
    """Random blocks: each saves some bytes; each option frees part of them at some FLOPs
    (compressed and save_matmuls cost no FLOPs in the model, but any cost is allowed here)."""
    n = draw(st.integers(1, 6))
    blocks = []
    for i in range(n):
        saved = draw(st.integers(1, 10**6))
        freed = {o: draw(st.integers(0, saved)) for o in OPTIONS}
        flops = {o: draw(st.integers(0, 10**9)) for o in OPTIONS}
        blocks.append(BlockProfile(f"layers.{i // 3}.{('sequence', 'interaction', 'cross')[i % 3]}", saved, 0,
                                   freed, flops, dict.fromkeys(OPTIONS, 0.0)))
    # + at least one byte no plan frees (a real step keeps its loss): a plan never predicts 0 bytes,
    # which solve refuses as a budget
    base = sum(b.saved_bytes for b in blocks) + draw(st.integers(1, 10**5))
    return ActivationProfile(base, tuple(blocks), OPTIONS, "synthetic", 10**9)


def every_plan(profile):
    """Brute force: (bytes, FLOPs) of every combination of options."""
    names = [b.name for b in profile.blocks]
    for combo in itertools.product(("none",) + profile.options, repeat=len(names)):
        by = {b.name: b for b in profile.blocks}
        freed = sum(by[n].freed_bytes[o] for n, o in zip(names, combo) if o != "none")
        flops = sum(by[n].recompute_flops[o] for n, o in zip(names, combo) if o != "none")
        yield profile.base_bytes - freed, flops


@settings(max_examples=60, deadline=None)
@given(profiles(), st.floats(0.0, 1.0))
def test_joint_never_exceeds_the_budget_and_never_recomputes_more_than_one_fraction(profile, fraction):
    uniform = uniform_plan(profile, fraction)
    joint = solve(profile, uniform.predicted_bytes, "flops")
    assert joint.predicted_bytes <= uniform.predicted_bytes
    assert joint.recompute_flops <= uniform.recompute_flops
    # the uniform plan keeps each region within the fraction wherever some option can
    own, kept = region_bytes(profile), region_budgets(profile, uniform)
    for b in profile.blocks:
        reachable = min([own[b.name]] + [own[b.name] - f for f in b.freed_bytes.values()])
        if reachable <= fraction * own[b.name]:
            assert kept[b.name] <= fraction * own[b.name] + 1e-6


@settings(max_examples=40, deadline=None)
@given(profiles())
def test_pareto_front_is_the_brute_force_front(profile):
    points = set(every_plan(profile))
    front = {(b, f) for b, f in points if not any(b2 <= b and f2 <= f and (b2, f2) != (b, f) for b2, f2 in points)}
    assert {(p.predicted_bytes, p.recompute_flops) for p in pareto_front(profile)} == front
    # every uniform point is matched or beaten by a point of the joint front
    for u in uniform_front(profile):
        assert any(b <= u.predicted_bytes and f <= u.recompute_flops for b, f in front)


@settings(max_examples=40, deadline=None)
@given(profiles(), st.floats(0.0, 1.0))
def test_a_fourth_option_never_hurts(profile, fraction):
    plain = without_option(profile, "compressed")
    budget = max(int(plain.min_bytes + fraction * (plain.base_bytes - plain.min_bytes)), 1)
    with_c, without = solve(profile, budget, "flops"), solve(plain, budget, "flops")
    assert with_c.predicted_bytes <= budget and with_c.recompute_flops <= without.recompute_flops
    assert "compressed" not in without.choices.values()


def test_region_budgets_add_up_to_the_plan():
    zero = {"full": 0.0, "compressed": 0.0}
    profile = ActivationProfile(1000, (BlockProfile("layers.0.sequence", 400, 0, {"full": 300, "compressed": 250},
                                                    {"full": 7, "compressed": 0}, zero),
                                       BlockProfile("layers.0.interaction", 100, 0,
                                                    {"full": 120, "compressed": 40}, {"full": 3, "compressed": 0}, zero),
                                       BlockProfile("layers.0.cross", 0, 0, {"full": 0, "compressed": 0},
                                                    {"full": 1, "compressed": 0}, zero)),
                                ("full", "compressed"), "synthetic", 100)
    plan = plan_of(profile, {"layers.0.sequence": "compressed", "layers.0.interaction": "full"})
    assert region_bytes(profile) == {"layers.0.sequence": 400, "layers.0.interaction": 120, "layers.0.cross": 0}
    assert region_budgets(profile, plan) == {"layers.0.sequence": 150, "layers.0.interaction": 0, "layers.0.cross": 0}
    assert plan.predicted_bytes == 1000 - 250 - 120 and plan.summary() == "sequence:C interaction:F cross:-"
    # one fraction of 0.5: sequence keeps <= 200 (compressed: 150, no FLOPs), interaction <= 60 (full: 0)
    assert uniform_plan(profile, 0.5).choices == {"layers.0.sequence": "compressed", "layers.0.interaction": "full"}
    assert uniform_plan(profile, 0.0).choices == {"layers.0.sequence": "full", "layers.0.interaction": "full"}
    # one byte less: sequence full + interaction compressed keeps 660, so both full (580, 7 + 3 FLOPs)
    assert solve(profile, 630, "flops").recompute_flops == 3 and solve(profile, 629, "flops").recompute_flops == 10


@pytest.fixture(scope="module")
def measured():
    torch.manual_seed(0)
    model = GEMRef(CFG, jagged=True, kernel="cpu_jagged")
    batch = batch_with_lengths(CFG, [5, 9, 2, 30, 64, 17, 3, 40, 1, 12] * 3, seed=1)
    return model, batch, gemref_profile(model, batch, options=OPTIONS, compression=CompressionSpec("mxfp8"), repeats=1)


def test_compressed_option_is_measured_frees_bytes_and_recomputes_nothing(measured):
    _, _, profile = measured
    assert profile.options == ("save_matmuls", "full", "compressed")
    for b in profile.blocks:
        assert b.recompute_flops["compressed"] == 0          # FlopCounterMode: no extra backward FLOPs
        assert 0 < b.freed_bytes["compressed"] < b.freed_bytes["full"]


@pytest.mark.parametrize("choices", [
    {"layers.0.sequence": "compressed", "layers.1.cross": "full", "layers.0.interaction": "save_matmuls"},
    {"layers.0.sequence": "compressed", "layers.0.interaction": "compressed", "layers.1.sequence": "compressed"},
])
def test_predicted_bytes_of_mixed_plans_match_the_measurement(measured, choices):
    model, batch, profile = measured
    apply_plan(model, choices, compression=CompressionSpec("mxfp8"))
    try:
        got = activation_bytes(model, batch)
    finally:
        remove_plan(model)
    predicted = plan_of(profile, choices).predicted_bytes
    assert abs(got - predicted) <= 0.01 * predicted


def test_bad_arguments_are_value_errors(measured):
    _, _, profile = measured
    with pytest.raises(ValueError, match="fraction"):
        uniform_plan(profile, 1.5)
    with pytest.raises(ValueError, match="'swap'"):
        without_option(profile, "swap")
    with pytest.raises(ValueError, match="unknown checkpoint option 'swap'"):
        apply_plan(measured[0], {"layers.0.sequence": "swap"})


def test_bench_autoac_regions_command(data_root, tmp_path, capsys):
    out = tmp_path / "r.json"
    rc = main(["bench", "autoac_regions", "--batch-size", "16", "--steps-per-variant", "1", "--warmup", "0",
               "--formats", "fp8_tensor", "--budgets", "1.0,0.5", "--no-batch-search", "--parity-seeds", "0",
               "--json", str(out)])
    assert rc == 0
    record = json.loads(out.read_text())
    assert {r["strategy"] for r in record["fronts"]["rows"]} == {"uniform", "joint", "joint+C"}
    assert record["memory"][1]["vs_none"] < 0.7 and "parity" not in record
    assert "joint no worse than uniform" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--formats", "fp4"], "--formats"),
    (["--budgets", "0"], "--budgets"),
    (["--parity-seeds", "1"], "parity-seeds"),
])
def test_bench_autoac_regions_user_errors_exit_2(argv, message, capsys):
    assert main(["bench", "autoac_regions", *argv]) == 2
    assert message in capsys.readouterr().err


def test_auto_checkpoint_with_compression_applies_the_joint_plan_and_fits():
    from gemref.autoac import applied_plan
    from gemref.measure.run import plan_record
    from gemref.train import forward_loss

    torch.manual_seed(0)
    model = GEMRef(CFG, jagged=True, kernel="cpu_jagged")
    batch = batch_with_lengths(CFG, [5, 9, 2, 30, 64, 17, 3, 40, 1, 12] * 3, seed=4)
    step = lambda: forward_loss(model, batch)   # noqa: E731
    plan, profile = auto_checkpoint(model, model.checkpoint_blocks(), step, 0.55, options=OPTIONS, objective="flops",
                                    compression=CompressionSpec("fp8_tensor"), repeats=1, inputs=batch.tensors())
    assert applied_plan(model) == plan.choices and plan_record(model)["summary"] == plan.summary()
    assert "compressed" in plan.choices.values()
    assert plan.recompute_flops == solve(profile, plan.budget_bytes, "flops").recompute_flops
    assert activation_bytes(model, batch) <= 1.01 * plan.budget_bytes
    with pytest.raises(ValueError, match="budget_fraction"):
        auto_checkpoint(model, model.checkpoint_blocks(), step, 0.0)
