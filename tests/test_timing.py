"""gemref/mfu/timing.py: warm-up first, then the variants round-robin in every repetition."""
from gemref.mfu.timing import interleaved


def test_warmup_then_round_robin_and_one_sample_per_repetition():
    calls = []
    fns = {name: (lambda name=name: calls.append(name)) for name in ("a", "b", "c")}
    samples = interleaved(fns, warmup=2, reps=3, measure=lambda fn: (fn(), len(calls))[1])
    assert calls == ["a", "a", "b", "b", "c", "c"] + ["a", "b", "c"] * 3
    assert samples == {"a": [7, 10, 13], "b": [8, 11, 14], "c": [9, 12, 15]}
