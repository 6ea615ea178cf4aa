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


def _texts(fig):
    return [a.text for a in fig.layout.annotations]


def test_the_formats_diagram_counts_bits_and_mx_bits_per_value():
    from gemref.report.diagrams import formats_diagram

    texts = _texts(formats_diagram())
    assert "<b>bf16</b>: 16 bits" in texts and "<b>fp32</b>: 32 bits" in texts and "<b>fp8 E4M3</b>: 8 bits" in texts
    assert any("8.25 bits per value" in t for t in texts)          # (32 x 8 + 8) / 32
    widths = sorted(s.x1 - s.x0 for s in formats_diagram({"x": (1, 5, 10)}).layout.shapes)
    assert widths == [1, 5, 10]


def test_the_ladder_and_wrap_diagrams_draw_one_box_per_item():
    from gemref.report.diagrams import ladder_diagram, wrap_diagram

    fig = ladder_diagram([(0, "0 baseline", "(baseline)"), (1, "1 + jagged", "--jagged")])
    assert [s.y1 for s in fig.layout.shapes] == [1, 2] and "<b>1 + jagged</b><br>--jagged" in _texts(fig)
    flow = wrap_diagram(["model", "count", "meter"])
    assert len(flow.layout.shapes) == 3 and sum(a.showarrow is True for a in flow.layout.annotations) == 2
    with pytest.raises(ValueError):
        wrap_diagram(["alone"])
    with pytest.raises(ValueError):
        ladder_diagram([])


def test_the_cluster_diagram_numbers_every_gpu():
    from gemref.report.diagrams import cluster_diagram

    fig = cluster_diagram(2, 4)
    assert [t for t in _texts(fig) if t.isdigit()] == [str(i) for i in range(8)]
    assert fig.layout.title.text == "2 nodes x 4 GPUs = 8 ranks"
    with pytest.raises(ValueError):
        cluster_diagram(0, 8)


def test_the_split_diagram_sizes_splits_by_rows():
    from gemref.report.diagrams import split_diagram

    fig = split_diagram([{"split": "train", "rows": 300}, {"split": "eval", "rows": 100}], 64)
    assert [s.x1 - s.x0 for s in fig.layout.shapes] == pytest.approx([15, 5])        # of 20 units
    assert "train: 300 rows (75%)" in _texts(fig)
    with pytest.raises(ValueError):
        split_diagram([{"split": "train", "rows": 0}], 64)
