"""The explanatory diagrams draw the numbers they are given: checked against hand arithmetic."""
import pytest

from gemref.report.diagrams import jagged_diagram, mfu_split, partition_diagram


def test_the_mfu_split_is_model_flops_over_step_time_at_peak():
    # 6 GFLOPs of model work, 8 executed, in 0.5 s on a 40 GFLOP/s device: 20 GFLOPs possible
    split = mfu_split(6e9, 8e9, 0.5, 40e9)
    assert list(split.values()) == pytest.approx([0.30, 0.10, 0.60])


@pytest.mark.parametrize("args", [(0, 1, 1, 1), (2, 1, 1, 1), (1, 1, 0, 1), (1, 1, 1, -1), (1, 3e9, 1, 1e9)])
def test_an_impossible_step_is_refused(args):
    with pytest.raises(ValueError):
        mfu_split(*args)


def test_the_jagged_diagram_states_slots_and_offsets():
    texts = [a.text for a in jagged_diagram([3, 1, 4], 6).layout.annotations]
    assert any("3 x 6 = 18 slots, 8 real (44%)" in t for t in texts)
    assert any("offsets [0, 3, 4, 8]" in t for t in texts)


def test_the_partition_diagram_stacks_each_ranks_samples_to_its_load():
    costs = [9, 5, 4, 3, 3, 2]
    fig = partition_diagram(costs, {"lpt": [[0, 4, 5], [1, 2, 3]]})
    tops = {}
    for bar in fig.data:
        tops[bar.x[0]] = max(tops.get(bar.x[0], 0), bar.base + bar.y[0])
    assert tops == {"lpt<br>rank 0": 14, "lpt<br>rank 1": 12}
