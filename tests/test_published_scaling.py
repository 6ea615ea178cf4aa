"""The step model against torchtitan's published FSDP scaling (gemref/simulate/published_scaling.py)."""
import pytest

from gemref.simulate.published_scaling import (LLAMA31_8B, TOKENS_PER_GPU_STEP, compute_for_step, fsdp_rows,
                                               torchtitan_scaling)
from gemref.simulate.step_model import predict_step


def test_the_llama_shape_has_its_published_parameter_count():
    assert LLAMA31_8B.params == pytest.approx(8.03e9, rel=1e-3)     # "Llama 3.1 8B": 8.03 B parameters


def test_the_fsdp_rows_gather_every_unit_and_reduce_it_once():
    n = LLAMA31_8B.layers
    rows = fsdp_rows(LLAMA31_8B, 16)
    gathers = [r for r in rows if r["kind"] == "all_gather"]
    scatters = [r for r in rows if r["kind"] == "reduce_scatter"]
    assert sum(r["count"] for r in gathers) == 1 + 2 * n - 1            # the root once, blocks twice but the last
    assert sum(r["bytes"] for r in gathers) == 2 * (LLAMA31_8B.root_params + (2 * n - 1) * LLAMA31_8B.block_params)
    assert sum(r["bytes"] for r in scatters) == 4 * LLAMA31_8B.params   # every gradient once, in fp32
    exposed = {r["dim"] for r in rows if r["overlappable_s"] == 0}
    assert exposed == {"root", "first block, forward", "last block"}
    assert all(r["latency_s"] + r["bandwidth_s"] == pytest.approx(r["seconds"]) for r in rows)


def test_the_compute_solved_from_a_step_gives_that_step_back():
    rows = fsdp_rows(LLAMA31_8B, 128)
    for step in (0.5, 2.0, 2.843):
        assert predict_step(compute_for_step(step, rows), 1.0, rows)["step_s"] == pytest.approx(step, rel=1e-9)


def test_a_step_shorter_than_its_exposed_collectives_is_refused():
    with pytest.raises(ValueError, match="shorter than its exposed collectives"):
        compute_for_step(1e-4, fsdp_rows(LLAMA31_8B, 128))


def test_the_comparison_states_the_published_figures_and_the_models_error():
    rows = torchtitan_scaling()
    assert [r["published_tps_small"] for r in rows] == [5762, 6667, 8532]
    for r in rows:
        assert r["step_small_s"] == pytest.approx(TOKENS_PER_GPU_STEP / r["published_tps_small"])
        assert r["model_ratio"] == pytest.approx(r["step_small_s"] / r["step_large_s"])
        assert r["error"] == pytest.approx(r["model_ratio"] / r["published_ratio"] - 1)
        assert r["exposed_large_s"] > r["exposed_small_s"] and "torchtitan" in r["source"]
    same = torchtitan_scaling(small=8, large=8)
    assert all(r["model_ratio"] == pytest.approx(1.0) for r in same)
