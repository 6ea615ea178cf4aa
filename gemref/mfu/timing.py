"""Interleaved timing for the benchmark commands (gemref/bench/) that compare variants: warm
each variant up, then run the repetitions round-robin (A B A B ...), so a burst of load on a
shared machine hits every variant alike instead of one."""
from __future__ import annotations

from typing import Callable, TypeVar

T = TypeVar("T")


def interleaved(fns: dict[str, Callable[[], object]], warmup: int, reps: int,
                measure: Callable[[Callable[[], object]], T]) -> dict[str, list[T]]:
    """{variant: [measure(fn) per repetition]} after `warmup` untimed calls of each variant."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    samples: dict[str, list[T]] = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            samples[name].append(measure(fn))
    return samples
