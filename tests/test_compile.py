"""The compile rung: compiled and eager agree, a new jagged batch does not recompile, and
compile composes with activation checkpointing and PyTorch 2's memory budget."""
import pytest
import torch

from gemref.autoac import apply_plan
from gemref.measure.batch_search import gemref_forward_with_bytes as forward_with_bytes
from gemref.train import forward_loss
from gemref.data.batches import batch_with_lengths
from gemref.compile import compile_model, compile_stats, gemref_regions
from gemref.compile.config import COMPILE_REGIONS
from gemref.train.presets import get_preset
from gemref.train.override import override
from gemref.model.gem import GEMRef, ranking_loss

TINY = get_preset("tiny")
CFG = TINY.model
# Different row counts T, batch sizes B and longest histories: each would recompile a
# shape-specialised graph.
BATCHES = [[5, 9, 2, 30], [3, 1, 7, 40, 2, 8], [12, 60, 4], [8] * 7, [64, 2]]


def model_pair(jagged=True):
    torch.manual_seed(0)
    eager = GEMRef(CFG, jagged=jagged)
    torch.manual_seed(0)
    return eager, GEMRef(CFG, jagged=jagged)


def compile_gemref(model, kinds=COMPILE_REGIONS, **kwargs):
    """GEMRef's kinds named for compile_model, as gemref/train/compose.py names them."""
    return compile_model(model, gemref_regions(model, kinds), loss=ranking_loss if "loss" in kinds else None, **kwargs)


def loss_and_grads(model, batch):
    model.zero_grad(set_to_none=True)
    loss = forward_loss(model, batch)
    loss.backward()
    return loss.detach(), {n.replace("_checkpoint_wrapped_module.", ""): p.grad.clone()
                           for n, p in model.named_parameters() if p.grad is not None}


def assert_same_step(eager, compiled, batch):
    """fp32 tolerance: inductor fuses and reorders reductions (LayerNorm, sums), so results
    differ from eager by rounding, ~1e-7 relative; a real bug is orders of magnitude larger."""
    loss_e, grads_e = loss_and_grads(eager, batch)
    loss_c, grads_c = loss_and_grads(compiled, batch)
    torch.testing.assert_close(loss_c, loss_e, rtol=1e-5, atol=1e-6)
    assert grads_c.keys() == grads_e.keys()
    for name in grads_e:
        torch.testing.assert_close(grads_c[name], grads_e[name], rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("jagged", [True, False])
def test_compiled_matches_eager_and_never_recompiles(jagged):
    eager, compiled = model_pair(jagged)
    stats = compile_gemref(compiled)
    for i, lengths in enumerate(BATCHES):
        assert_same_step(eager, compiled, batch_with_lengths(CFG, lengths, seed=i))
        if i == 0:
            after_warmup = stats.graphs
    assert stats.recompiles == 0 and stats.graphs == after_warmup
    assert len(stats.regions) == 5 * CFG.n_layers + 1


def test_compile_after_checkpointing():
    """AC then compile: full checkpoints (wrapper modules) wrap the blocks' compiled regions;
    gradients still match eager."""
    eager, compiled = model_pair()
    apply_plan(compiled, {name: "full" for name in compiled.checkpoint_blocks()})
    stats = compile_gemref(compiled)
    for i, lengths in enumerate(BATCHES[:3]):
        assert_same_step(eager, compiled, batch_with_lengths(CFG, lengths, seed=i))
    assert stats.recompiles == 0


def test_the_memory_budget_saves_fewer_bytes():
    batch = batch_with_lengths(CFG, [5, 9, 2, 30, 64, 17, 3, 40, 1, 12], seed=1)
    eager, free = model_pair()
    compile_gemref(free)
    _, tight = model_pair()
    compile_gemref(tight, activation_memory_budget=0.05)
    loss_free, bytes_free = forward_with_bytes(free, batch)
    loss_tight, bytes_tight = forward_with_bytes(tight, batch)
    assert bytes_tight < bytes_free
    torch.testing.assert_close(loss_tight, loss_free, rtol=1e-5, atol=1e-6)
    assert_same_step(eager, tight, batch)


def test_compile_settings_are_checked():
    _, model = model_pair()
    with pytest.raises(ValueError, match=r"activation_memory_budget must be in \(0, 1\]"):
        compile_gemref(model, activation_memory_budget=0.0)
    compile_gemref(model)
    with pytest.raises(ValueError, match="already compiled"):
        compile_gemref(model)


def test_compiled_autoac_run_records_compile_stats_and_plan(data_root):
    """AutoAC then compile in build_model: under compile the plan uses full checkpoints only."""
    from gemref.measure.run import run

    train = override(TINY.train, steps=5, warmup_steps=1, eval_batches=1, jagged=True, batch_size=16,
                     compile=True, ac="auto", ac_budget=0.5)
    record = run(TINY, train, device="cpu", progress=False, measure_memory=False)
    assert record["config"]["train"]["compilation"]["enabled"] is True
    assert record["config"]["train"]["activation_checkpoint"]["mode"] == "auto"
    assert record["compile"]["recompiles"] == 0 and record["compile"]["regions"] == 5 * CFG.n_layers + 1
    assert record["compile"]["compile_s"] >= 0 and compile_stats(model_pair()[0]) is None
    plan = record["ac_plan"]
    assert set(plan["counts"]) == {"full"} and plan["predicted_bytes"] <= plan["budget_bytes"]
    assert record["executed_flops_per_step"] > record["model_flops_per_step"]


def test_bench_compile_command(data_root, tmp_path):
    import json

    from gemref.cli import main

    out = tmp_path / "compile.json"
    assert main(["bench", "compile", "--preset", "tiny", "--batch-size", "16", "--steps-per-variant", "2", "--warmup", "1",
                 "--region-reps", "1", "--json", str(out)]) == 0
    record = json.loads(out.read_text())
    eager, compiled, *planned = record["rows"]
    assert compiled["recompiles_after_warmup"] == 0 and compiled["graphs_after_warmup"] == 0
    assert record["ratio"] == compiled["vs_eager"] > 0 and eager["vs_eager"] == 1.0
    assert [r["region"] for r in record["regions"]] == ["sequence.project", "sequence.mix", "interaction",
                                                        "cross.project", "cross.mix", "loss"]
    # the third variant compiles exactly the plan's kinds, and exists only when the plan kept some
    assert record["plan"] == [r["region"] for r in record["regions"] if r["kept"]]
    if record["plan"]:
        assert planned[0]["variant"] == "planned" and planned[0]["regions"] == ",".join(sorted(record["plan"]))
        assert record["planned_ratio"] == planned[0]["vs_eager"] > 0
    else:
        assert not planned and record["planned_ratio"] is None
    assert record["call_overhead"]["overhead_s"] == (record["call_overhead"]["compiled_s"]
                                                     - record["call_overhead"]["eager_s"])


def test_only_the_named_region_kinds_are_compiled_and_the_rest_stay_eager():
    eager, compiled = model_pair()
    stats = compile_gemref(compiled, ("sequence.mix", "cross.mix"))
    kinds = {n.split(".", 2)[-1] for n in stats.regions}
    assert kinds == {"sequence.mix", "cross.mix"} and len(stats.regions) == 2 * CFG.n_layers
    for layer in compiled.layers:     # the eager ones are the modules' own bound methods
        assert layer.sequence.project.__func__ is type(layer.sequence).project
        assert layer.interaction.forward.__func__ is type(layer.interaction).forward
        assert type(layer.sequence.mix).__name__ == "CompiledRegion"
    assert stats.loss is None
    assert_same_step(eager, compiled, batch_with_lengths(CFG, [5, 9, 2, 30], seed=0))
    with pytest.raises(ValueError, match=r"unknown GEMRef region kind\(s\) \['sequence.mlp'\]"):
        compile_gemref(model_pair()[1], ("sequence.mlp",))
    with pytest.raises(ValueError, match=r"unknown region\(s\) \['layers.0.sequence.mlp'\]"):
        compile_model(model_pair()[1], ["layers.0.sequence.mlp"])


def test_region_kinds_and_the_config_names_agree():
    from gemref.compile import REGION_KINDS
    from gemref.compile.config import COMPILE_REGIONS

    assert (*REGION_KINDS, "loss") == COMPILE_REGIONS


@pytest.mark.parametrize("text", ["", "sequence.mix,sequence.mix", "attention", "all,loss", "sequence.mix,"])
def test_a_bad_compile_regions_is_a_usage_error(text):
    from gemref.errors import UsageError

    with pytest.raises(UsageError, match="compile_regions"):
        override(TINY.train, compile=True, compile_regions=text)


def test_compile_regions_without_compile_is_refused():
    from gemref.errors import UsageError

    with pytest.raises(UsageError, match="read only with compile"):
        override(TINY.train, compile_regions="loss")
    assert override(TINY.train, compile=True, compile_regions="loss ,sequence.mix").compilation.regions


def test_the_region_plan_keeps_exactly_the_kinds_below_its_margin(monkeypatch):
    """plan_gemref_regions measures every kind (eager and compiled, forward+backward) and keeps a
    kind iff its compiled median is below (1 - margin) x eager's: checked on the rows it reports."""
    from gemref.compile.plan import plan_gemref_regions

    eager, _ = model_pair()
    batch = batch_with_lengths(CFG, [5, 9, 2, 30], seed=0)
    before = {n: p.detach().clone() for n, p in eager.named_parameters()}
    plan = plan_gemref_regions(eager, batch, reps=2, margin=0.03)
    assert [r["region"] for r in plan.rows] == ["sequence.project", "sequence.mix", "interaction",
                                                 "cross.project", "cross.mix", "loss"]
    for r in plan.rows:
        assert r["eager_ms"] > 0 and r["compiled_ms"] > 0 and r["compile_s"] > 0
        assert r["kept"] == (r["compiled_ms"] < 0.97 * r["eager_ms"])
        assert abs(r["speedup"] - r["eager_ms"] / r["compiled_ms"]) < 1e-9
    assert plan.kept == tuple(r["region"] for r in plan.rows if r["kept"])
    assert plan.regions_text() == ",".join(plan.kept)
    assert all(type(getattr(getattr(eager.layers[0], b), m)).__name__ == "method"
               for b, m in [("sequence", "project"), ("interaction", "forward")])   # the model is left eager
    for n, p in eager.named_parameters():
        assert torch.equal(p, before[n]), n
    with pytest.raises(ValueError, match="margin"):
        plan_gemref_regions(eager, batch, margin=1.0)


def test_call_overhead_is_the_compiled_minus_the_eager_time_of_one_trivial_region():
    from gemref.compile.plan import call_overhead

    got = call_overhead(reps=3)
    assert got["eager_s"] > 0 and got["compiled_s"] > 0
    assert got["overhead_s"] == got["compiled_s"] - got["eager_s"]


# ------------------------------------------------------------ regions by name on MyRec (tests/my_rec.py)
def my_rec_pair():
    """MyRec and a twin with the same weights, their attention swapped for gdpa (cpu_jagged, a custom
    op a graph traces around; MyRec's own attention loops in Python over host-side lengths, which
    a compiled region cannot take)."""
    import copy

    from my_rec import MyRec, with_attention

    from gemref.attention import gdpa

    def attention(q, k, v, offsets):
        return gdpa(q, k, v, offsets, activation="softmax", causal=True, kernel="cpu_jagged")
    torch.manual_seed(0)
    eager = with_attention(MyRec(), attention)
    return eager, copy.deepcopy(eager)


def test_compile_model_takes_a_foreign_models_regions_by_name():
    """Every Block (a pattern) and the head compiled, as torchtitan compiles blocks: loss and every
    gradient match eager's on two jagged batches (forward and backward); names stay the model's."""
    from my_rec import make_batch, my_loss

    eager, compiled = my_rec_pair()
    keys = set(compiled.state_dict())
    stats = compile_model(compiled, ["stack.*", "head"])
    assert stats.regions == ["stack.0", "stack.1", "head"] and set(compiled.state_dict()) == keys
    for i, lengths in enumerate([[0, 5, 17, 3], [9, 2, 30, 4, 4]]):
        batch = make_batch(lengths, seed=i)
        grads = []
        for model in (eager, compiled):
            model.zero_grad(set_to_none=True)
            loss = my_loss(model, batch)
            loss.backward()
            grads.append((loss.detach(), {n: p.grad for n, p in model.named_parameters()}))
        torch.testing.assert_close(grads[1][0], grads[0][0], rtol=1e-5, atol=1e-6)
        for name, g in grads[0][1].items():
            torch.testing.assert_close(grads[1][1][name], g, rtol=1e-4, atol=1e-6, msg=name)
    assert stats.graphs > 0 and compile_stats(compiled) is stats
    assert type(compiled.stack[0].forward).__name__ == "CompiledRegion"
    assert type(compiled.stack[0].qkv.forward).__name__ == "method"        # inside a region: not its own


@pytest.mark.parametrize("names, message", [
    (["stack.2", "head", "tail.*"], r"unknown region\(s\) \['stack.2', 'tail.\*'\]: not a submodule of MyRec"),
    (["stack.*", "stack.0.up"], r"region 'stack.0' contains region\(s\) \['stack.0.up'\]"),
    (["head", "stack.0.norm1.weight"], r"unknown region\(s\) \['stack.0.norm1.weight'\]"),
    ("head", "a sequence of names"),
    ([], "no region named"),
])
def test_unknown_or_nested_region_names_are_refused(names, message):
    _, model = my_rec_pair()
    with pytest.raises(ValueError, match=message):
        compile_model(model, names)
    assert compile_stats(model) is None


def test_region_names_resolve_modules_methods_and_patterns():
    from gemref.compile import resolve_regions

    _, model = my_rec_pair()
    got = resolve_regions(model, ["stack.*.up", "head.0", "stack.1.norm2.forward", "stack.0.qkv"])
    assert [(r.name, r.owner_name, r.attr) for r in got] == [
        ("stack.0.up", "stack.0.up", "forward"), ("stack.1.up", "stack.1.up", "forward"), ("head.0", "head.0", "forward"),
        ("stack.1.norm2.forward", "stack.1.norm2", "forward"), ("stack.0.qkv", "stack.0.qkv", "forward")]
    assert all(r.owner is model.get_submodule(r.owner_name) for r in got)
    with pytest.raises(ValueError, match=r"region 'stack.1.norm2' contains region\(s\) \['stack.1.norm2.forward'\]"):
        resolve_regions(model, ["stack.1.norm2", "stack.1.norm2.forward"])
    assert [(r.name, r.owner, r.attr) for r in resolve_regions(model, ["forward"])] == [("forward", model, "forward")]
    with pytest.raises(ValueError, match=r"region 'forward' contains region\(s\) \['head'\]"):
        resolve_regions(model, ["forward", "head"])
    assert gemref_regions(model_pair()[0], ("sequence.mix", "interaction"), layers=[0]) == [
        "layers.0.sequence.mix", "layers.0.interaction"]
    with pytest.raises(ValueError, match="not a GEMRef"):
        gemref_regions(model, ("sequence.mix",))


def test_plan_regions_measures_each_named_region_of_a_foreign_model():
    from my_rec import make_batch, my_loss

    from gemref.compile.plan import plan_regions

    eager, _ = my_rec_pair()
    batch = make_batch([5, 9, 2, 30], seed=0)
    before = {n: p.detach().clone() for n, p in eager.named_parameters()}
    plan = plan_regions(eager, ["head", "stack.0.up"], lambda: my_loss(eager, batch), reps=2, margin=0.03)
    assert [r["region"] for r in plan.rows] == ["head", "stack.0.up"]
    for r in plan.rows:
        assert r["eager_ms"] > 0 and r["compiled_ms"] > 0 and r["compile_s"] > 0
        assert r["kept"] == (r["compiled_ms"] < 0.97 * r["eager_ms"])
    assert plan.kept == tuple(r["region"] for r in plan.rows if r["kept"])
    assert "forward" not in eager.head.__dict__ and "forward" not in eager.stack[0].up.__dict__   # left eager
    assert all(torch.equal(p, before[n]) and p.grad is None for n, p in eager.named_parameters())
    with pytest.raises(ValueError, match=r"region\(s\) \['stack.1.proj'\] were not called"):
        plan_regions(eager, ["stack.1.proj"], lambda: eager.head(torch.zeros(1, 64)), reps=1)
