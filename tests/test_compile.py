"""The compile rung: compiled and eager agree, a new jagged batch does not recompile, and
compile composes with activation checkpointing and PyTorch 2's memory budget."""
import pytest
import torch

from gemref.autoac.profile import forward_with_bytes
from gemref.train import forward_loss
from gemref.data.batches import batch_with_lengths
from gemref.autoac.solver import ac_blocks, apply_plan
from gemref.compile import compile_model, compile_stats
from gemref.config import get_preset, override
from gemref.model import GEMRef

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


def loss_and_grads(model, batch):
    model.zero_grad(set_to_none=True)
    loss = forward_loss(model, batch)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


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
    stats = compile_model(compiled)
    for i, lengths in enumerate(BATCHES):
        assert_same_step(eager, compiled, batch_with_lengths(CFG, lengths, seed=i))
        if i == 0:
            after_warmup = stats.graphs
    assert stats.recompiles == 0 and stats.graphs == after_warmup
    assert len(stats.regions) == 5 * CFG.n_layers + 1


def test_compile_after_checkpointing():
    """AC then compile: full checkpoints wrap compiled regions (and sit inside the
    interaction block's graph); gradients still match eager."""
    eager, compiled = model_pair()
    apply_plan(compiled, {name: "full" for name in ac_blocks(compiled)})
    stats = compile_model(compiled)
    for i, lengths in enumerate(BATCHES[:3]):
        assert_same_step(eager, compiled, batch_with_lengths(CFG, lengths, seed=i))
    assert stats.recompiles == 0


def test_pt2_memory_budget_saves_fewer_bytes():
    batch = batch_with_lengths(CFG, [5, 9, 2, 30, 64, 17, 3, 40, 1, 12], seed=1)
    eager, free = model_pair()
    compile_model(free)
    _, tight = model_pair()
    compile_model(tight, activation_memory_budget=0.05)
    loss_free, bytes_free = forward_with_bytes(free, batch)
    loss_tight, bytes_tight = forward_with_bytes(tight, batch)
    assert bytes_tight < bytes_free
    torch.testing.assert_close(loss_tight, loss_free, rtol=1e-5, atol=1e-6)
    assert_same_step(eager, tight, batch)


def test_compile_settings_are_checked():
    _, model = model_pair()
    with pytest.raises(ValueError, match=r"activation_memory_budget must be in \(0, 1\]"):
        compile_model(model, activation_memory_budget=0.0)
    compile_model(model)
    with pytest.raises(ValueError, match="already compiled"):
        compile_model(model)


def test_compiled_autoac_run_records_compile_stats_and_plan(data_root):
    """AutoAC then compile in build_model: under compile the plan uses full checkpoints only."""
    from gemref.train import run

    train = override(TINY.train, steps=5, warmup_steps=1, eval_batches=1, jagged=True, batch_size=16,
                     compile=True, ac="auto", ac_budget=0.5)
    record = run(TINY, train, device="cpu", progress=False, measure_memory=False)
    assert record["config"]["train"]["compile"] is True and record["config"]["train"]["ac"] == "auto"
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
    eager, compiled = record["rows"]
    assert compiled["recompiles_after_warmup"] == 0 and compiled["graphs_after_warmup"] == 0
    assert record["ratio"] == compiled["vs_eager"] > 0 and eager["vs_eager"] == 1.0
    assert {r["region"] for r in record["regions"]} == {"sequence.project", "sequence.mix", "interaction",
                                                        "cross.project", "cross.mix"}
