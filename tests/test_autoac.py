"""AutoAC: checkpointing never changes gradients, the solver is optimal and never over budget,
the profile's predictions match what a step then measures, and the API works on a model gemref
did not define (tests/my_rec.py)."""
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

from gemref.autoac import (OPTIONS, ActivationProfile, BlockProfile, CheckpointedBlock, applied_plan, apply_plan,
                           auto_checkpoint, parse_plan, plan_of, profile_blocks, remove_plan, solve)
from gemref.measure.run import plan_record
from gemref.autoac.plan import PREFIX
from gemref.measure.batch_search import (SEARCH_CAP, find_batch_size, gemref_activation_bytes,
                                        gemref_profile, larger_batch, largest_fitting)
from gemref.mfu.memory import SavedTensors
from gemref.autoac.plan import option_cost
from gemref.data.batches import batch_with_lengths
from gemref.train.presets import get_preset
from gemref.train.override import override
from gemref.mfu.flops import executed_flops, recompute_flops
from gemref.model.gem import GEMRef
from gemref.train import forward_loss
from my_rec import MyRec, make_batch, my_loss

TINY = get_preset("tiny")
CFG = TINY.model
LENGTHS = [5, 9, 2, 30, 64, 17, 3, 40, 1, 12]
activation_bytes = gemref_activation_bytes


def tiny_model(jagged=True, cfg=CFG, kernel="reference"):
    torch.manual_seed(0)
    return GEMRef(cfg, jagged=jagged, kernel=kernel)


def grads_of(model, loss_fn):
    """Loss and {parameter name: gradient}, names without the checkpoint wrapper's part."""
    model.zero_grad(set_to_none=True)
    loss = loss_fn()
    loss.backward()
    return loss.detach(), {n.replace(PREFIX, ""): p.grad.clone() for n, p in model.named_parameters()
                           if p.grad is not None}


def loss_and_grads(model, batch):
    return grads_of(model, lambda: forward_loss(model, batch))


@pytest.fixture(scope="module")
def profiled():
    model = tiny_model()
    batch = batch_with_lengths(CFG, LENGTHS, seed=1)
    return model, batch, gemref_profile(model, batch, repeats=1)


# ----------------------------------------------------------------------------- a model gemref did not define

MY_BLOCKS = ["stack.0", "stack.1"]


def my_model():
    torch.manual_seed(0)
    return MyRec(), make_batch([5, 9, 0, 30, 17, 3], seed=1)


@pytest.fixture(scope="module")
def my_profiled():
    model, batch = my_model()
    return model, batch, profile_blocks(model, MY_BLOCKS, lambda: my_loss(model, batch),
                                        options=("save_matmuls", "full", "compressed"), repeats=1)


def test_profile_solve_apply_on_a_foreign_model(my_profiled):
    model, batch, profile = my_profiled
    assert [b.name for b in profile.blocks] == MY_BLOCKS and profile.options == ("save_matmuls", "full", "compressed")
    for block in profile.blocks:
        assert 0 < block.freed_bytes["save_matmuls"] < block.freed_bytes["full"] <= block.saved_bytes
        assert block.recompute_flops["save_matmuls"] == block.recompute_flops["compressed"] == 0
        assert 0 < block.recompute_flops["full"] <= block.forward_flops
        assert all(s >= 0 for s in block.recompute_seconds.values())
    originals = [model.stack[0], model.stack[1]]
    keys = list(model.state_dict())
    plan = solve(profile, profile.base_bytes // 2)
    assert plan.predicted_bytes <= profile.base_bytes // 2 and plan.choices
    apply_plan(model, plan)
    assert applied_plan(model) == plan.choices and plan_record(model)["summary"] == plan.summary()
    assert all(isinstance(model.get_submodule(n), CheckpointedBlock) for n in plan.choices)
    assert list(model.state_dict()) == keys, "state dicts keep the block's own names"
    plain = {k: v.clone() + 1 for k, v in MyRec().state_dict().items()}
    model.load_state_dict(plain)             # a state dict written without the plan loads under it
    assert all(torch.equal(v, plain[k]) for k, v in model.state_dict().items())
    measured = activation_bytes_of(model, batch)
    assert abs(measured - plan.predicted_bytes) <= 0.05 * plan.predicted_bytes
    remove_plan(model)
    assert [model.stack[0], model.stack[1]] == originals and not applied_plan(model)
    assert all(torch.equal(v, plain[k]) for k, v in model.state_dict().items())
    assert list(model.state_dict()) == keys


def activation_bytes_of(model, batch):
    from gemref.autoac import activation_bytes
    return activation_bytes(model, lambda: my_loss(model, batch), [batch.items, batch.offsets, batch.users])


@pytest.mark.parametrize("option", ["save_matmuls", "full"])
def test_each_exact_option_keeps_the_loss_and_every_gradient_of_a_foreign_model(option):
    model, batch = my_model()
    loss0, grads0 = grads_of(model, lambda: my_loss(model, batch))
    for chosen in ({"stack.0": option}, {n: option for n in MY_BLOCKS}):
        apply_plan(model, chosen)
        loss1, grads1 = grads_of(model, lambda: my_loss(model, batch))
        remove_plan(model)
        torch.testing.assert_close(loss1, loss0, rtol=1e-6, atol=1e-7)
        assert grads1.keys() == grads0.keys()
        for name in grads0:
            torch.testing.assert_close(grads1[name], grads0[name], rtol=1e-5, atol=1e-7, msg=name)


def test_the_compressed_option_stays_close_on_a_foreign_model():
    """Approximate by design (gemref/activation_compression.py): E4M3 keeps ~29 dB of SQNR per tensor."""
    model, batch = my_model()
    _, exact = grads_of(model, lambda: my_loss(model, batch))
    apply_plan(model, {n: "compressed" for n in MY_BLOCKS})
    _, approx = grads_of(model, lambda: my_loss(model, batch))
    remove_plan(model)
    flat = lambda d: torch.cat([d[n].flatten() for n in sorted(d)])   # noqa: E731
    noise = (flat(exact) - flat(approx)).pow(2).sum() / flat(exact).pow(2).sum()
    assert 0 < noise < 10 ** -2


def test_auto_checkpoint_on_a_foreign_model_and_its_plan_text():
    model, batch = my_model()
    plan, profile = auto_checkpoint(model, MY_BLOCKS, lambda: my_loss(model, batch), 0.3, repeats=1)
    assert applied_plan(model) == plan.choices and plan.predicted_bytes <= 0.3 * profile.base_bytes
    assert plan.summary().startswith("stack:") and parse_plan(plan.summary(), MY_BLOCKS) == plan.choices
    remove_plan(model)


def test_bad_block_names_are_value_errors_naming_the_block():
    model, batch = my_model()
    step = lambda: my_loss(model, batch)   # noqa: E731
    with pytest.raises(ValueError, match=r"no block 'stack\.7'.*'stack' has no submodule '7'"):
        profile_blocks(model, ["stack.0", "stack.7"], step)
    with pytest.raises(ValueError, match=r"no block 'tower\.0'.*no module 'tower'"):
        apply_plan(model, {"tower.0": "full"})
    with pytest.raises(ValueError, match="no block 'layers'"):
        apply_plan(model, {"layers": "full"})
    with pytest.raises(ValueError, match="unknown checkpoint option 'selective'"):
        apply_plan(model, {"stack.0": "selective"})
    assert not applied_plan(model)


# ----------------------------------------------------------------------------- exact gradients (GEMRef)

skewed = st.lists(st.one_of(st.integers(1, 4), st.integers(1, CFG.max_len), st.just(CFG.max_len)),
                  min_size=1, max_size=6)
names = tiny_model().checkpoint_blocks()


@settings(max_examples=20, deadline=None)
@given(skewed, st.lists(st.sampled_from(OPTIONS), min_size=len(names), max_size=len(names)),
       st.sampled_from(["silu", "softmax"]),
       st.sampled_from([(False, "reference"), (True, "reference"), (True, "cpu_jagged")]))
def test_any_plan_gives_the_no_ac_gradients_exactly(lengths, options, activation, layout):
    """Bitwise equal: recomputation replays the same CPU kernels on the same inputs (and the
    save_matmuls policy saves the original outputs), so nothing may differ, not even rounding."""
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

EXACT = ("save_matmuls", "full")


def cost_of(profile, plan, objective):
    """A plan's cost as the solver defines it: the sum of its options' cost tuples."""
    by_name = {b.name: b for b in profile.blocks}
    costs = [option_cost(by_name[n], o, objective) for n, o in plan.choices.items()]
    return tuple(sum(c[i] for c in costs) for i in range(3))


def brute_force(profile, budget, objective):
    """The least cost over every option assignment that fits, or None."""
    best = None
    for combo in itertools.product(("none",) + profile.options, repeat=len(profile.blocks)):
        plan = plan_of(profile, {b.name: o for b, o in zip(profile.blocks, combo)})
        if plan.predicted_bytes <= budget:
            cost = cost_of(profile, plan, objective)
            best = cost if best is None or cost < best else best
    return best


def is_optimal(solver, profile, budget, objective) -> bool:
    """What the hypothesis test asserts, as a predicate (so a planted wrong solver can fail it)."""
    plan = solver(profile, budget, objective)
    return plan.predicted_bytes <= budget and cost_of(profile, plan, objective) == brute_force(profile, budget, objective)


@st.composite
def profiles(draw):
    n = draw(st.integers(1, 6))
    seconds = st.integers(0, 256).map(lambda k: k / 64)        # dyadic: float sums are exact
    blocks = []
    for i in range(n):
        freed = {o: draw(st.integers(1, 1000)) for o in EXACT}
        flops = {"save_matmuls": draw(st.sampled_from([0, 0, 5])), "full": draw(st.integers(0, 1000))}
        blocks.append(BlockProfile(f"layers.{i // 3}.{('sequence', 'interaction', 'cross')[i % 3]}", 0, 0, freed,
                                   flops, {o: draw(seconds) for o in EXACT}))
    base = sum(max(b.freed_bytes.values()) for b in blocks) + draw(st.integers(1, 500))
    return ActivationProfile(base, tuple(blocks), EXACT, "synthetic", 1)


@settings(max_examples=80, deadline=None)
@given(profiles(), st.floats(0.0, 1.0), st.sampled_from(["time", "flops"]))
def test_solver_is_optimal_and_never_over_budget(profile, fraction, objective):
    budget = max(1, int(fraction * profile.base_bytes))
    if brute_force(profile, budget, objective) is None:
        with pytest.raises(ValueError, match=f"minimum achievable {profile.min_bytes:,} bytes"):
            solve(profile, budget, objective)
        return
    assert is_optimal(solve, profile, budget, objective)


def worst_plan(profile, budget, objective):
    """A planted wrong solver: the feasible plan of MOST cost."""
    plans = [plan_of(profile, {b.name: o for b, o in zip(profile.blocks, combo)})
             for combo in itertools.product(("none",) + profile.options, repeat=len(profile.blocks))]
    return max((p for p in plans if p.predicted_bytes <= budget), key=lambda p: cost_of(profile, p, objective))


def test_the_optimality_check_fails_a_solver_that_picks_the_most_recompute():
    blocks = tuple(BlockProfile(f"b.{i}", 0, 0, {"save_matmuls": 40, "full": 100}, {"save_matmuls": 0, "full": 90},
                                {"save_matmuls": 0.5, "full": 0.25}) for i in range(3))
    profile = ActivationProfile(400, blocks, EXACT, "synthetic", 1)
    for objective in ("time", "flops"):
        assert is_optimal(solve, profile, 250, objective)
        assert not is_optimal(worst_plan, profile, 250, objective)


def test_the_objective_decides_between_time_and_flops():
    """save_matmuls recomputes no FLOPs but here takes longer than a full recompute."""
    block = BlockProfile("b.0", 0, 0, {"save_matmuls": 60, "full": 80}, {"save_matmuls": 0, "full": 50},
                         {"save_matmuls": 2.0, "full": 1.0})
    profile = ActivationProfile(100, (block,), EXACT, "synthetic", 1)
    assert solve(profile, 50).choices == {"b.0": "full"} and solve(profile, 50).recompute_seconds == 1.0
    assert solve(profile, 50, "flops").choices == {"b.0": "save_matmuls"}
    assert solve(profile, 50, "flops").recompute_flops == 0
    with pytest.raises(ValueError, match="objective='bytes'"):
        solve(profile, 50, "bytes")


def test_solver_skips_options_that_free_nothing():
    block = BlockProfile("layers.0.sequence", 0, 0, {"save_matmuls": 0, "full": 10}, {"save_matmuls": 0, "full": 7},
                         {"save_matmuls": 0.0, "full": 1.0})
    profile = ActivationProfile(100, (block,), EXACT, "synthetic", 1)
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
        assert 0 < block.freed_bytes["save_matmuls"] < block.freed_bytes["full"] <= block.saved_bytes
        assert block.recompute_flops["save_matmuls"] == 0 < block.recompute_flops["full"] <= block.forward_flops


def test_the_unmeasured_no_ac_bytes_are_predicted_and_both_cpu_instruments_agree(profiled):
    """The profile never runs the un-checkpointed step; its base bytes are predicted. Measure
    that step with both CPU instruments: live storages and saved_tensors_hooks."""
    model, batch, profile = profiled
    live = activation_bytes(model, batch)
    existing = {t.untyped_storage()._cdata for t in [*model.parameters(), *batch.tensors()]}
    saved = SavedTensors(existing)
    with saved.active():
        loss = forward_loss(model, batch)
    hooks = sum(saved.bytes_by_block().values())
    del loss
    assert abs(live - profile.base_bytes) <= 0.01 * profile.base_bytes
    assert abs(hooks - live) <= 0.01 * live


@pytest.mark.parametrize("jagged,kernel,activation", [(True, "reference", "silu"), (False, "reference", "silu"),
                                                       (True, "cpu_jagged", "silu"), (True, "cpu_jagged", "softmax")])
def test_analytic_recompute_flops_match_flop_counter(jagged, kernel, activation):
    """Full blocks rerun their forward; save_matmuls ones rerun no FLOPs (cpu_jagged included:
    its forward is one custom op whose output the policy saves)."""
    cfg = dataclasses.replace(CFG, activation=activation)
    model = tiny_model(jagged, cfg, kernel)
    batch = batch_with_lengths(cfg, LENGTHS[:6], seed=2)
    choices = {"layers.0.sequence": "full", "layers.0.interaction": "full", "layers.1.cross": "full",
               "layers.1.sequence": "save_matmuls", "layers.0.cross": "save_matmuls"}
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


def test_profile_of_a_cpu_jagged_model_recomputes_no_flops_under_save_matmuls():
    """The measured recompute FLOPs of every block under the cpu_jagged kernel: zero under
    save_matmuls (attention's output is saved, not recomputed), the analytic count when full."""
    model = tiny_model(kernel="cpu_jagged")
    batch = batch_with_lengths(CFG, LENGTHS, seed=1)
    profile = gemref_profile(model, batch, repeats=1)
    for block in profile.blocks:
        assert block.recompute_flops["save_matmuls"] == 0, block.name
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
    assert found.capped == (found.autoac_batch == 200)
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
    with pytest.raises(ValueError, match="no block 'layers.9.sequence'"):
        apply_plan(model, {"layers.9.sequence": "full"})
    with pytest.raises(ValueError, match="unknown checkpoint option 'half'.*valid: none, save_matmuls, full"):
        apply_plan(model, {"layers.0.sequence": "half"})
    apply_plan(model, {"layers.0.sequence": "full"})
    with pytest.raises(ValueError, match="already checkpointed"):
        apply_plan(model, {"layers.0.sequence": "save_matmuls"})
    with pytest.raises(ValueError, match="profile the eager model before checkpointing"):
        gemref_profile(model, batch_with_lengths(CFG, [3, 4]))
    remove_plan(model)
    for options in (("none",), ("save_matmuls",), ("full", "selective")):
        with pytest.raises(ValueError, match=r"give 'full'.*and any of save_matmuls, compressed"):
            gemref_profile(model, batch_with_lengths(CFG, [3, 4]), options=options)
    with pytest.raises(ValueError, match="ac='lazy'; valid: none, full, auto, memory_budget"):
        override(TINY.train, ac="lazy")
    for bad in (0.0, 1.5):
        with pytest.raises(ValueError, match=r"ac_budget must be in \(0, 1\]"):
            override(TINY.train, ac_budget=bad)
    with pytest.raises(ValueError, match="ac='memory_budget'.*needs compile=True"):
        override(TINY.train, ac="memory_budget")


def test_records_of_the_old_mode_name_still_load():
    """ac 'pt2' was renamed 'memory_budget' (torchtitan's name); records that carry it load."""
    from dataclasses import asdict
    from gemref.train.record import train_from_record

    new = override(TINY.train, compile=True, ac="memory_budget", ac_budget=0.5)
    stored = asdict(new)
    stored["activation_checkpoint"]["mode"] = "pt2"
    assert train_from_record(stored, 2) == new
    assert train_from_record({"compile": True, "ac": "pt2", "ac_budget": 0.5}, 1).activation_checkpoint.mode == \
        "memory_budget"


def test_gemrefs_blocks_and_plan_text():
    model = tiny_model()
    assert model.checkpoint_blocks() == [f"layers.{i}.{k}" for i in range(CFG.n_layers)
                                         for k in ("sequence", "interaction", "cross")]
    text = "sequence:F- interaction:-S cross:C-"
    choices = parse_plan(text, model.checkpoint_blocks())
    assert choices == {"layers.0.sequence": "full", "layers.1.interaction": "save_matmuls", "layers.0.cross": "compressed"}
    options = ("save_matmuls", "full", "compressed")
    profile = ActivationProfile(10, tuple(BlockProfile(n, 0, 0, dict.fromkeys(options, 1), dict.fromkeys(options, 0),
                                                       dict.fromkeys(options, 0.0)) for n in model.checkpoint_blocks()),
                                options, "synthetic", 1)
    assert plan_of(profile, choices).summary() == text


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
    assert applied_plan(model) == {"layers.0.sequence": "full", "layers.1.interaction": "save_matmuls"}
    with pytest.raises(ValueError, match="sequence needs 2 letters"):
        build_model(TINY, override(train, ac_plan="sequence:F interaction:-S cross:--"), torch.device("cpu"))


def test_autoac_profiles_the_batch_each_rank_runs(monkeypatch):
    """With ranks, build_model solves AutoAC on batch_size / world samples, not the global batch."""
    from gemref.data import batches
    from gemref.train import compose

    sizes = []
    real = batches.representative_batch      # build_model imports it when it profiles
    monkeypatch.setattr(batches, "representative_batch", lambda m, d, n, *a, **k: sizes.append(n) or real(m, d, n, *a, **k))
    monkeypatch.setattr(compose, "parallelize", lambda *a, **k: None)       # no process group here
    fake = type("P", (), {"world": 4})()
    compose.build_model(TINY, override(TINY.train, jagged=True, batch_size=64, ac="auto", ac_budget=0.5),
                        torch.device("cpu"), fake)
    assert sizes == [16]


def test_bench_autoac_command(data_root, tmp_path, capsys):
    from gemref.cli import main

    out = tmp_path / "autoac.json"
    assert main(["bench", "autoac", "--preset", "tiny", "--batch-size", "16", "--budgets", "1.0,0.5,0.01",
                 "--steps-per-strategy", "1", "--warmup", "0", "--no-memory-budget", "--json", str(out)]) == 0
    record = json.loads(out.read_text())
    rows = {(r["budget"], r["strategy"]): r for r in record["rows"]}
    assert set(rows) == {(b, s) for b in (1.0, 0.5, 0.01) for s in ("none", "full", "auto")}
    assert rows[0.5, "auto"]["fits"] and rows[0.5, "auto"]["act_pct"] <= 50
    assert rows[0.01, "auto"]["plan"].startswith("impossible: min")
    assert record["done_when"]["auto_recompute_pct"] <= record["done_when"]["full_recompute_pct"]
    head = {r["strategy"]: r for r in record["head_to_head"]["rows"]}
    assert set(head) == {"auto (time)", "auto (flops)", "full"} and head["full"]["vs_full"] == 1.0
    printed = capsys.readouterr().out
    assert "at a 50% budget AutoAC recomputes" in printed and "vs_full" in printed
    assert main(["bench", "autoac", "--preset", "tiny", "--budgets", "1.5"]) == 2
