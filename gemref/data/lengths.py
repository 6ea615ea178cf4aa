"""The lengths of one benchmark batch in a named profile (LENGTH_PROFILES), each with one
sequence at the max length; torch only (no numpy: the GPU check's kernel sections import it):

    fixed    every sequence at the max length;
    uniform  the others uniform in [1, max];
    skewed   the others max * u^4 (u uniform): mostly short histories, as in ads logs."""
from __future__ import annotations

import math

import torch

LENGTH_PROFILES = ("fixed", "uniform", "skewed")


def make_lengths(profile: str, max_len: int, tokens: int, seed: int) -> list[int]:
    """Sequence lengths of one batch in a LENGTH_PROFILES profile (module doc): the first at
    max_len, about `tokens` rows (events) in all, the same for the same seed."""
    gen = torch.Generator().manual_seed(seed)
    lengths = [max_len]
    while sum(lengths) < tokens:
        u = float(torch.rand((), generator=gen))
        if profile == "fixed":
            lengths.append(max_len)
        elif profile == "uniform":
            lengths.append(1 + int(u * max_len) if u < 1 else max_len)
        elif profile == "skewed":
            lengths.append(max(1, math.ceil(max_len * u ** 4)))
        else:
            raise ValueError(f"unknown length profile {profile!r}; valid: {', '.join(LENGTH_PROFILES)}")
    return lengths
