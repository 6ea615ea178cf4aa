"""gemref/mfu/meter.py: MFU defined once. A run's summary (what `gemref train` records) and a
waterfall window's figures, computed from ONE list of step records, agree with each other and
with the definition worked out by hand (sum of model FLOPs / (devices x wall x peak))."""
import math

import pytest

from gemref.mfu.meter import figures, mfu, summary
from gemref.mfu.peak import Peak
from gemref.mfu.timing import StepRecord
from gemref.waterfall.schedule import Window
from gemref.waterfall.stats import window_figures

PEAK = 1e11   # FLOP/s of one device


def step(wall, data, cpu, flops, executed=None, samples=8, tokens=100) -> StepRecord:
    return StepRecord(wall_s=wall, data_s=data, cpu_s=cpu, process_cpu_s=cpu, samples=samples, tokens=tokens,
                      model_flops=flops, executed_flops=executed if executed is not None else flops,
                      recompute_flops=0)


# Two one-thread CPU ranks, three steps each: rank 1 computes less and waits at the collective.
RANK0 = [step(0.50, 0.05, 0.40, 3 * 10**10), step(0.40, 0.00, 0.38, 2 * 10**10), step(0.60, 0.10, 0.45, 4 * 10**10)]
RANK1 = [step(0.50, 0.02, 0.30, 2 * 10**10), step(0.41, 0.01, 0.20, 1 * 10**10), step(0.58, 0.03, 0.35, 3 * 10**10)]


def test_the_definition_by_hand():
    assert mfu(6e10, 2 * 1.5, PEAK) == pytest.approx(6e10 / 3e11)
    assert mfu(1.0, 1.0, None) is None and mfu(1.0, 0.0, PEAK) is None


def test_train_summary_and_window_figures_agree_with_hand_arithmetic():
    flops = sum(s.model_flops for s in RANK0 + RANK1)          # 1.5e11
    wall = max(sum(s.wall_s for s in RANK0), sum(s.wall_s for s in RANK1))   # 1.50 (rank 0)
    compute = sum(s.cpu_s for s in RANK0 + RANK1)              # 2.08 thread-CPU seconds
    e2e, local = flops / (2 * wall * PEAK), flops / (compute * PEAK)
    run = summary([RANK0, RANK1], Peak(PEAK, "test", "fp32"), warmup_steps=0, device_type="cpu", threads=1)
    windows = [Window(0, 0, 0, list(r), 0.0, "cpu", 1, 2) for r in (RANK0, RANK1)]
    fig = window_figures(windows, PEAK)
    for got in (run, fig):
        assert got["mfu"] == pytest.approx(e2e, rel=1e-12)
        assert got["local_mfu"] == pytest.approx(local, rel=1e-12)
        assert got["scaling_ratio"] == pytest.approx(compute / (2 * wall), rel=1e-12)
        assert got["mfu"] == pytest.approx(got["local_mfu"] * got["scaling_ratio"], rel=1e-12)
        assert got["tokens_per_s"] == pytest.approx(600 / wall)
    assert run["median_step_s"] == 0.5 and run["ranks"] == 2 and run["steps_timed"] == 3


def test_the_summary_leaves_out_warmup_and_is_not_a_median_of_rates():
    timed = [step(0.5, 0.05, 0.4, 3 * 10**10), step(0.4, 0.0, 0.38, 2 * 10**10), step(0.6, 0.1, 0.45, 5 * 10**10)]
    run = summary([[step(2.0, 0.0, 2.0, 10**10)] + timed], Peak(PEAK, "test", "fp32"), warmup_steps=1)
    assert run["mfu"] == pytest.approx(1e11 / (1.5 * PEAK))
    per_step = sorted(s.model_flops / s.wall_s for s in timed)      # 5e10, 6e10, 8.3e10 FLOP/s
    assert not math.isclose(run["mfu"], per_step[1] / PEAK, rel_tol=0.05)   # a median rate is another number
    assert run["local_mfu"] == pytest.approx(1e11 / (1.35 * PEAK))   # one rank: compute = step time


def test_gpu_ranks_need_their_profiled_compute():
    fig = figures([RANK0, RANK1], PEAK, device_type="cuda")
    assert fig["local_mfu"] is None and fig["scaling_ratio"] is None and fig["mfu"] is not None
    fig = figures([RANK0, RANK1], PEAK, device_type="cuda", compute_s=[1.2, 0.8])
    assert fig["local_mfu"] == pytest.approx(1.5e11 / (2.0 * PEAK))


def test_a_summary_without_timed_steps_says_so():
    with pytest.raises(ValueError, match="no timed steps"):
        summary([RANK0], Peak(PEAK, "test", "fp32"), warmup_steps=3)


def test_seconds_at_is_the_definition_solved_for_time():
    """6e12 FLOPs at 40% of a 1e15 FLOP/s peak take 6e12 / 4e14 = 15 ms, and that time gives
    back 40% through `mfu`; an MFU outside (0, 1] or no peak is a clear error."""
    from gemref.mfu import meter

    assert meter.seconds_at(6e12, 0.4, 1e15) == pytest.approx(0.015)
    assert meter.mfu(6e12, meter.seconds_at(6e12, 0.4, 1e15), 1e15) == pytest.approx(0.4)
    for bad in ((1e12, 0.0, 1e15), (1e12, 1.5, 1e15), (1e12, 0.5, None), (1e12, 0.5, 0.0)):
        with pytest.raises(ValueError, match="need 0 < mfu <= 1 and a positive peak"):
            meter.seconds_at(*bad)


def test_a_foreign_models_mfu_credits_no_padding():
    """MyRec (tests/my_rec.py) with its attention on gdpa's sdpa kernel, which on CPU runs padded
    length buckets: MFU divides the real lengths' model FLOPs (linears on T tokens, causal pairs
    L(L+1)/2, x3) by the time, HFU the executed FLOPs (padding and backward's recompute included),
    so HFU / MFU = executed / model > 1."""
    import torch
    from my_rec import MyRec, make_batch, my_loss, with_attention

    from gemref.attention import gdpa
    from gemref.mfu.foreign import measure

    def attention(q, k, v, offsets):
        return gdpa(q, k, v, offsets, activation="softmax", causal=True, kernel="sdpa")
    torch.manual_seed(0)
    model = with_attention(MyRec(), attention)
    lengths = [[3, 40, 0, 17], [9, 30, 30, 1, 2]]
    record = measure(model, my_loss, [make_batch(ls, seed=s) for s, ls in enumerate(lengths)],
                     torch.optim.SGD(model.parameters(), 0.1), lengths_of=lambda b: b.lengths,
                     peak=Peak(PEAK, "test", "fp32"))
    d, hidden, T, B = 32, 64, sum(lengths[1]), len(lengths[1])
    linears = 2 * 2 * T * (d * 3 * d + d * d + d * 4 * d + 4 * d * d) + 2 * B * (2 * d * hidden + hidden)
    attention_flops = 2 * 2 * 2 * d * sum(L * (L + 1) // 2 for L in lengths[1])
    (step,) = record.steps
    assert step.model_flops == 3 * (linears + attention_flops)
    fig = record.figures
    assert fig["mfu"] == pytest.approx(step.model_flops / (step.wall_s * PEAK), rel=1e-12)
    assert fig["hfu"] / fig["mfu"] == pytest.approx(step.executed_flops / step.model_flops, rel=1e-12)
    assert step.executed_flops > step.model_flops and record.waste_flops_per_step > 0
