"""gemref/mfu/timing.py: the one interleaving loop and the one step timer."""
import pytest
import torch

from gemref.data.batches import batch_with_lengths
from gemref.train.presets import get_preset
from gemref.mfu.timing import StepFlops, StepRecord, compute_seconds, interleaved, timed_step
from gemref.model.gem import GEMRef
from gemref.step import train_step


def test_warmup_rounds_run_interleaved_and_are_dropped():
    calls = []
    fns = {name: (lambda k, name=name: calls.append((name, k)) or len(calls)) for name in ("a", "b", "c")}
    samples = interleaved(fns, 3, warmup=2)
    assert calls == [(n, k) for k in range(5) for n in ("a", "b", "c")]
    assert samples == {"a": [7, 10, 13], "b": [8, 11, 14], "c": [9, 12, 15]}


def test_alternate_reverses_every_other_round():
    calls = []
    interleaved({n: (lambda k, n=n: calls.append(n)) for n in ("a", "b")}, 4, alternate=True)
    assert calls == ["a", "b", "b", "a", "a", "b", "b", "a"]


def test_a_redone_round_replaces_its_results_and_counts_attempts():
    seen, results = [], iter(range(100))
    fns = {"a": lambda k: next(results)}

    def redo(k, attempt, got):
        seen.append((k, attempt, got["a"]))
        return k == 1 and attempt < 2          # round 1 runs three times

    assert interleaved(fns, 3, redo=redo) == {"a": [0, 3, 4]}
    assert seen == [(0, 0, 0), (1, 0, 1), (1, 1, 2), (1, 2, 3), (2, 0, 4)]


def test_interleaved_refuses_negative_counts():
    with pytest.raises(ValueError):
        interleaved({"a": lambda k: k}, -1)


def test_timed_step_times_the_step_apart_from_the_fetch_and_counts_after():
    cfg = get_preset("tiny").model
    batch = batch_with_lengths(cfg, [3, 0, 5], seed=1)
    order = []
    record, out, got = timed_step(lambda: order.append("fetch") or batch, lambda b: order.append("run") or 42, "cpu",
                                  lambda lengths: order.append("count") or StepFlops(10, 12, 2))
    assert order == ["fetch", "run", "count"] and out == 42 and got is batch
    assert (record.samples, record.tokens) == (3, 8)
    assert (record.model_flops, record.executed_flops, record.recompute_flops) == (10, 12, 2)
    assert record.wall_s >= record.data_s >= 0 and record.step_s == pytest.approx(record.wall_s - record.data_s)
    assert record.op_seconds is None


def test_timed_step_with_op_classes_profiles_the_step():
    cfg = get_preset("tiny").model
    model = GEMRef(cfg, jagged=True)
    optimizer = torch.optim.AdamW(model.parameters())
    batch = batch_with_lengths(cfg, [4, 9], seed=1)
    record, _, _ = timed_step(lambda: batch, lambda b: train_step(model, optimizer, b), "cpu",
                              lambda lengths: StepFlops(1, 1, 0), op_classes=True)
    assert record.op_seconds is not None and record.op_seconds["gemm"] > 0 and record.op_seconds["optimizer"] > 0


def _record(wall=1.0, data=0.25, cpu=0.5) -> StepRecord:
    return StepRecord(wall, data, cpu, cpu, 1, 1, 1, 1, 0)


def test_compute_seconds_rule():
    r = _record()
    assert compute_seconds(r, 1, "cpu", 4) == 0.75          # one rank: the step itself
    assert compute_seconds(r, 2, "cpu", 1) == 0.5           # one-thread CPU ranks: thread CPU time
    assert compute_seconds(r, 2, "cpu", 2) is None          # several threads: not measurable this way
    assert compute_seconds(r, 2, "cuda", 1) is None         # GPU ranks: from a profiled step
