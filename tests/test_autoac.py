"""AutoAC: checkpointing never changes gradients, the solver is optimal and never over budget,
and the profile's predictions match what a step then measures."""
import dataclasses
import itertools
import json
import random
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings, strategies as st
from torch.utils.flop_counter import FlopCounterMode

from gemref.autoac.batch_search import SEARCH_CAP, find_batch_size, larger_batch, largest_fitting
from gemref.autoac.profile import SavedTensors, activation_bytes, existing_storages, profile_blocks
from gemref.data.batches import batch_with_lengths
from gemref.autoac.solver import (OPTIONS, ActivationProfile, BlockProfile, ac_blocks, applied_plan, apply_plan,
                                  plan_of, remove_plan, solve)
from gemref.config import get_preset, override
from gemref.mfu.flops import BLOCK_KINDS, executed_flops, recompute_flops
from gemref.model import GEMRef
from gemref.train import forward_loss

TINY = get_preset("tiny")
CFG = TINY.model
LENGTHS = [5, 9, 2, 30, 64, 17, 3, 40, 1, 12]


def tiny_model(jagged=True, cfg=CFG, kernel="reference"):
    torch.manual_seed(0)
    return GEMRef(cfg, jagged=jagged, kernel=kernel)


def loss_and_grads(model, batch):
    model.zero_grad(set_to_none=True)
    loss = forward_loss(model, batch)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.fixture(scope="module")
def profiled():
    model = tiny_model()
    batch = batch_with_lengths(CFG, LENGTHS, seed=1)
    return model, batch, profile_blocks(model, batch)


# ----------------------------------------------------------------------------- exact gradients

skewed = st.lists(st.one_of(st.integers(1, 4), st.integers(1, CFG.max_len), st.just(CFG.max_len)),
                  min_size=1, max_size=6)
names = list(ac_blocks(tiny_model()))


@settings(max_examples=20, deadline=None)
@given(skewed, st.lists(st.sampled_from(OPTIONS), min_size=len(names), max_size=len(names)),
       st.sampled_from(["silu", "softmax"]),
       st.sampled_from([(False, "reference"), (True, "reference"), (True, "cpu_jagged")]))
def test_any_plan_gives_the_no_ac_gradients_exactly(lengths, options, activation, layout):
    """Bitwise equal: recomputation replays the same CPU kernels on the same inputs (and the
    selective policy saves the original outputs), so nothing may differ, not even rounding."""
    jagged, kernel = layout
    cfg = dataclasses.replace(CFG, activation=activation)
    batch = batch_with_lengths(cfg, lengths, seed=len(lengths))
    model = tiny_model(jagged, cfg, kernel)
    loss0, grads0 = loss_and_grads(model, batch)
    apply_plan(model, dict(zip(names, options)))
    loss1, grads1 = loss_and_grads(model, batch)
    assert torch.equal(loss0, loss1)
    assert grads0.keys() == grads1.keys()
    for name in grads0:
        assert torch.equal(grads0[name], grads1[name]), name


# ----------------------------------------------------------------------------- solver


def brute_force(profile, budget):
    """Best (recompute FLOPs, freed bytes) over every assignment that fits, or None."""
    best = None
    for combo in itertools.product(("none",) + profile.options, repeat=len(profile.blocks)):
        plan = plan_of(profile, {b.name: o for b, o in zip(profile.blocks, combo)})
        if plan.predicted_bytes <= budget:
            cost = (plan.recompute_flops, profile.base_bytes - plan.predicted_bytes)
            best = cost if best is None or cost < best else best
    return best


@st.composite
def profiles(draw):
    n = draw(st.integers(1, 6))
    blocks = []
    for i in range(n):
        freed = {o: draw(st.integers(1, 1000)) for o in ("selective", "full")}
        flops = {"selective": draw(st.sampled_from([0, 0, 5])), "full": draw(st.integers(0, 1000))}
        blocks.append(BlockProfile(f"layers.{i // 3}.{BLOCK_KINDS[i % 3]}", 0, 0, 0.0, freed, flops))
    base = sum(max(b.freed_bytes.values()) for b in blocks) + draw(st.integers(1, 500))
    return ActivationProfile(base, tuple(blocks), ("selective", "full"), "synthetic", 1)


@settings(max_examples=60, deadline=None)
@given(profiles(), st.floats(0.0, 1.0))
def test_solver_is_optimal_and_never_over_budget(profile, fraction):
    budget = max(1, int(fraction * profile.base_bytes))
    best = brute_force(profile, budget)
    if best is None:
        with pytest.raises(ValueError, match=f"minimum achievable {profile.min_bytes:,} bytes"):
            solve(profile, budget)
        return
    plan = solve(profile, budget)
    assert plan.predicted_bytes <= budget
    assert (plan.recompute_flops, profile.base_bytes - plan.predicted_bytes) == best


def test_solver_skips_options_that_free_nothing():
    block = BlockProfile("layers.0.sequence", 0, 0, 0.0, {"selective": 0, "full": 10}, {"selective": 0, "full": 7})
    profile = ActivationProfile(100, (block,), ("selective", "full"), "synthetic", 1)
    assert solve(profile, 100).choices == {}
    assert solve(profile, 95).choices == {"layers.0.sequence": "full"}


def test_solver_rejects_bad_budgets(profiled):
    _, _, profile = profiled
    with pytest.raises(ValueError, match="budget_bytes must be > 0"):
        solve(profile, 0)
    with pytest.raises(ValueError, match=f"below the minimum achievable {profile.min_bytes:,} bytes"):
        solve(profile, profile.min_bytes - 1)
    assert solve(profile, profile.min_bytes).predicted_bytes == profile.min_bytes


# ----------------------------------------------------------------------------- profile vs measurement


def test_measured_bytes_of_a_plan_match_the_prediction(profiled):
    model, batch, profile = profiled
    rng = random.Random(0)
    plans = [solve(profile, int(f * profile.base_bytes)) for f in (0.9, 0.5, 0.25)] + [plan_of(profile, {b.name: "full" for b in profile.blocks})]
    plans += [plan_of(profile, {n: rng.choice(OPTIONS) for n in names}) for _ in range(3)]
    for plan in plans:
        apply_plan(model, plan)
        try:
            measured = activation_bytes(model, batch)
        finally:
            remove_plan(model)
        assert abs(measured - plan.predicted_bytes) <= 0.05 * plan.predicted_bytes, (plan.summary(), measured)


def test_checkpointing_frees_less_than_a_block_saves(profiled):
    """A checkpoint keeps the block's inputs: what it frees is below what the block saves."""
    _, _, profile = profiled
    for block in profile.blocks:
        assert 0 < block.freed_bytes["selective"] < block.freed_bytes["full"] <= block.saved_bytes
        assert block.recompute_flops["selective"] == 0 < block.recompute_flops["full"] <= block.forward_flops


def test_the_unmeasured_no_ac_bytes_are_predicted_and_both_cpu_instruments_agree(profiled):
    """The profile never runs the un-checkpointed step; its base bytes are predicted. Measure
    that step with both CPU instruments: live storages and saved_tensors_hooks."""
    model, batch, profile = profiled
    live = activation_bytes(model, batch)
    saved = SavedTensors(existing_storages(model, batch))
    with saved.active():
        loss = forward_loss(model, batch)
    hooks = sum(saved.bytes_by_block().values())
    del loss
    assert abs(live - profile.base_bytes) <= 0.01 * profile.base_bytes
    assert abs(hooks - live) <= 0.01 * live


@pytest.mark.parametrize("jagged,kernel,activation", [(True, "reference", "silu"), (False, "reference", "silu"),
                                                       (True, "cpu_jagged", "silu"), (True, "cpu_jagged", "softmax")])
def test_analytic_recompute_flops_match_flop_counter(jagged, kernel, activation):
    """Full blocks rerun their forward; selective ones rerun no FLOPs (cpu_jagged included:
    its forward is one custom op whose output the selective policy saves)."""
    cfg = dataclasses.replace(CFG, activation=activation)
    model = tiny_model(jagged, cfg, kernel)
    batch = batch_with_lengths(cfg, LENGTHS[:6], seed=2)
    choices = {"layers.0.sequence": "full", "layers.0.interaction": "full", "layers.1.cross": "full",
               "layers.1.sequence": "selective", "layers.0.cross": "selective"}
    apply_plan(model, choices)
    with FlopCounterMode(display=False) as counter:
        forward_loss(model, batch).backward()
    expected = (executed_flops(cfg, batch.lengths, jagged=jagged, kernel=kernel).total
                + recompute_flops(cfg, batch.lengths, choices, jagged=jagged, kernel=kernel))
    assert abs(counter.get_total_flops() - expected) <= 0.02 * expected


def test_profile_recompute_matches_the_analytic_count(profiled):
    _, batch, profile = profiled
    for block in profile.blocks:
        assert block.recompute_flops["full"] == recompute_flops(CFG, batch.lengths, {block.name: "full"},
                                                                 jagged=True), block.name


def test_profile_of_a_cpu_jagged_model_recomputes_no_flops_selectively():
    """The measured recompute FLOPs of every block under the cpu_jagged kernel: zero when
    selective (attention's output is saved, not recomputed), the analytic count when full."""
    model = tiny_model(kernel="cpu_jagged")
    batch = batch_with_lengths(CFG, LENGTHS, seed=1)
    profile = profile_blocks(model, batch)
    for block in profile.blocks:
        assert block.recompute_flops["selective"] == 0, block.name
        assert block.recompute_flops["full"] == recompute_flops(CFG, batch.lengths, {block.name: "full"},
                                                                 jagged=True, kernel="cpu_jagged"), block.name


# ----------------------------------------------------------------------------- batch search


def first_of(count: int):
    """batch_of(n): the first n of `count` samples of lengths 1..40, in one fixed order."""
    lengths = [((7 * i) % 40) + 1 for i in range(count)]
    return lambda n: batch_with_lengths(CFG, lengths[:n], seed=3)


def test_find_batch_size_spends_the_freed_memory_on_a_larger_batch():
    model, batch_of = tiny_model(), first_of(200)
    budget = activation_bytes(model, batch_of(16))
    found = find_batch_size(model, batch_of, budget, max_batch=200)
    assert found.no_ac_batch == 16 and found.no_ac_bytes == budget
    assert found.autoac_batch > 16 and found.autoac_bytes <= budget
    assert found.plan.predicted_bytes <= budget and found.plan.choices
    assert not applied_plan(model)


@pytest.mark.parametrize("low,high,limit", [(1, 100, 37), (1, 100, 100), (1, 100, 0), (8, 32, 8), (8, 32, 20),
                                            (8, 32, 5), (8, 32, 99), (0, 3, 2)])
def test_one_search_finds_the_largest_fitting_batch_in_a_range(low, high, limit):
    asked = []

    def fits(n):
        asked.append(n)
        return n <= limit
    assert largest_fitting(fits, low, high) == (min(limit, high) if limit >= low else low - 1)
    assert all(low <= n <= high for n in asked)


def test_larger_batch_plain_and_compressed_or_why_not():
    model, batch_of = tiny_model(), first_of(64)
    budget = activation_bytes(model, batch_of(8))
    plain = larger_batch(model, batch_of, budget, 8)
    assert 8 < plain.batch <= SEARCH_CAP * 8 and plain.compress == "none" and 0 < plain.budget_fraction < 1
    assert plain.plan.choices and not applied_plan(model)
    packed = larger_batch(model, batch_of, budget, 8, compress="mxfp8")
    assert packed.batch > 8 and packed.compress == "mxfp8" and not applied_plan(model)
    assert larger_batch(model, batch_of, budget // 10, 8) == \
        "checkpointing frees no room for a larger batch in this memory budget"


# ----------------------------------------------------------------------------- user mistakes


def test_bad_plans_and_settings_are_value_errors(profiled):
    model = tiny_model()
    with pytest.raises(ValueError, match="unknown block 'layers.9.sequence'; valid: layers.0.sequence"):
        apply_plan(model, {"layers.9.sequence": "full"})
    with pytest.raises(ValueError, match="unknown checkpoint option 'half'.*valid: none, selective, full"):
        apply_plan(model, {"layers.0.sequence": "half"})
    apply_plan(model, {"layers.0.sequence": "full"})
    with pytest.raises(ValueError, match="already checkpointed"):
        apply_plan(model, {"layers.0.sequence": "selective"})
    with pytest.raises(ValueError, match="profile the eager model before checkpointing"):
        profile_blocks(model, batch_with_lengths(CFG, [3, 4]))
    remove_plan(model)
    for options in (("none",), ("selective",)):
        with pytest.raises(ValueError, match=r"give \('full',\) or \('selective', 'full'\)"):
            profile_blocks(model, batch_with_lengths(CFG, [3, 4]), options=options)
    with pytest.raises(ValueError, match="ac='lazy'; valid: none, full, auto, pt2"):
        override(TINY.train, ac="lazy")
    for bad in (0.0, 1.5):
        with pytest.raises(ValueError, match=r"ac_budget must be in \(0, 1\]"):
            override(TINY.train, ac_budget=bad)
    with pytest.raises(ValueError, match="ac='pt2'.*needs compile=True"):
        override(TINY.train, ac="pt2")


def test_cli_rejects_a_bad_budget_with_one_line():
    out = subprocess.run([sys.executable, "-m", "gemref", "train", "--ac", "auto", "--ac-budget", "2"],
                         capture_output=True, text=True)
    assert out.returncode == 2
    assert "ac_budget must be in (0, 1]" in out.stderr and "Traceback" not in out.stderr


# ----------------------------------------------------------------------------- the training loop


def test_training_with_autoac_is_training_without_it(data_root):
    """Same seed, same batches: AutoAC changes memory and time, never the loss curve."""
    from gemref.measure.run import run

    base = override(TINY.train, steps=4, warmup_steps=1, eval_batches=1, jagged=True, batch_size=16)
    plain = run(TINY, base, device="cpu", progress=False, measure_memory=False)
    auto = run(TINY, override(base, ac="auto", ac_budget=0.4), device="cpu", progress=False,
               measure_memory=False)
    assert auto["loss_curve"] == plain["loss_curve"]
    plan = auto["ac_plan"]
    assert plan["predicted_bytes"] <= plan["budget_bytes"] and plan["counts"]
    assert auto["config"]["train"]["activation_checkpoint"]["mode"] == "auto" and plain["ac_plan"] is None
    recompute = auto["executed_flops_per_step"] - plain["executed_flops_per_step"]
    assert (recompute > 0) == ("full" in plan["counts"])


def test_a_given_plan_is_applied_as_is_without_profiling(monkeypatch):
    """ac_plan (a solved plan's summary) is applied by build_model without a profiling pass."""
    from gemref.autoac import profile
    from gemref.train import build_model

    monkeypatch.setattr(profile, "profile_blocks", lambda *a, **k: pytest.fail("profiled a given plan"))
    train = override(TINY.train, jagged=True, ac="auto", ac_plan="sequence:F- interaction:-S cross:--")
    model, _, _ = build_model(TINY, train, torch.device("cpu"))
    assert applied_plan(model) == {"layers.0.sequence": "full", "layers.1.interaction": "selective"}
    with pytest.raises(ValueError, match="sequence needs 2 letters"):
        build_model(TINY, override(train, ac_plan="sequence:F interaction:-S cross:--"), torch.device("cpu"))


def test_autoac_profiles_the_batch_each_rank_runs(monkeypatch):
    """With ranks, build_model solves AutoAC on batch_size / world samples, not the global batch."""
    from gemref.train import compose

    sizes = []
    real = compose.representative_batch
    monkeypatch.setattr(compose, "representative_batch", lambda p, n, *a, **k: sizes.append(n) or real(p, n, *a, **k))
    monkeypatch.setattr(compose, "parallelize", lambda *a, **k: None)       # no process group here
    fake = type("P", (), {"world": 4})()
    compose.build_model(TINY, override(TINY.train, jagged=True, batch_size=64, ac="auto", ac_budget=0.5),
                        torch.device("cpu"), fake)
    assert sizes == [16]


def test_bench_autoac_command(data_root, tmp_path, capsys):
    from gemref.cli import main

    out = tmp_path / "autoac.json"
    assert main(["bench", "autoac", "--preset", "tiny", "--batch-size", "16", "--budgets", "1.0,0.5,0.01",
                 "--steps-per-strategy", "1", "--warmup", "0", "--no-pt2", "--json", str(out)]) == 0
    record = json.loads(out.read_text())
    rows = {(r["budget"], r["strategy"]): r for r in record["rows"]}
    assert set(rows) == {(b, s) for b in (1.0, 0.5, 0.01) for s in ("none", "full", "auto")}
    assert rows[0.5, "auto"]["fits"] and rows[0.5, "auto"]["act_pct"] <= 50
    assert rows[0.01, "auto"]["plan"].startswith("impossible: min")
    assert record["done_when"]["auto_recompute_pct"] <= record["done_when"]["full_recompute_pct"]
    assert "at a 50% budget AutoAC recomputes" in capsys.readouterr().out
    assert main(["bench", "autoac", "--preset", "tiny", "--budgets", "1.5"]) == 2
