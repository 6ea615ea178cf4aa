"""Is a variant's trained result inside a reference's seed-to-seed band?

A trained quantity (say the eval loss after N steps) moves with the seed (initial weights, data
order), and one seeded run lands elsewhere on another CPU, whose rounding differs. So a variant
(a precision, a compressed path) is judged against a reference trained over several seeds:

    difference = mean(variant) - mean(reference)
    tolerance  = k * s_ref * sqrt(1 / n_ref + 1 / n_variant)

with s_ref the reference's sample standard deviation over its n_ref seeds: the tolerance is k
standard errors of a difference of two means, both spread like the reference (sqrt(2 / n) x
s_ref for n seeds each). The variant is inside the band when |difference| <= tolerance.
Values are in the quantity's own unit (an eval loss: nats per sample).
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Mapping, Sequence

from ..errors import UsageError

K_SE = 3.0      # default: within 3 standard errors of the difference of means


@dataclass(frozen=True)
class SeedBand:
    """A variant against the reference's seed band (see the module doc)."""
    reference_mean: float
    variant_mean: float
    reference_sd: float         # sample standard deviation over the reference's seeds
    tolerance: float            # k standard errors of the difference of means
    k: float

    @property
    def difference(self) -> float:
        return self.variant_mean - self.reference_mean

    @property
    def within(self) -> bool:
        return abs(self.difference) <= self.tolerance


def _checked(values: Sequence[float], what: str, at_least: int) -> list[float]:
    values = [float(v) for v in values]
    if len(values) < at_least:
        raise UsageError(f"a seed band needs at least {at_least} {what} value(s), one per seed; got {len(values)}")
    if not all(math.isfinite(v) for v in values):
        raise UsageError(f"{what} values must be finite, got {values}")
    return values


def difference_tolerance(reference: Sequence[float], k: float = K_SE, variant_seeds: int | None = None) -> float:
    """k standard errors of mean(variant) - mean(reference), from the reference's spread over its
    seeds; `variant_seeds` defaults to as many seeds as the reference's."""
    ref = _checked(reference, "reference", 2)
    if not k > 0:
        raise UsageError(f"k (standard errors) must be > 0, got {k}")
    n_var = len(ref) if variant_seeds is None else variant_seeds
    if n_var < 1:
        raise UsageError(f"variant_seeds must be >= 1, got {n_var}")
    return k * statistics.stdev(ref) * math.sqrt(1 / len(ref) + 1 / n_var)


def seed_band(reference: Sequence[float], variant: Sequence[float], k: float = K_SE) -> SeedBand:
    """The variant's values (one per seed) against the reference's seed band."""
    ref, var = _checked(reference, "reference", 2), _checked(variant, "variant", 1)
    return SeedBand(reference_mean=statistics.mean(ref), variant_mean=statistics.mean(var),
                    reference_sd=statistics.stdev(ref), tolerance=difference_tolerance(ref, k, len(var)), k=k)


@dataclass(frozen=True)
class PairedDifference:
    """variant - reference seed by seed (same seed: same initial weights and batches)."""
    mean: float                 # mean of the per-seed differences
    sd: float                   # their sample standard deviation
    largest: float              # the largest |difference| of one seed
    half_width: float           # k standard errors of the mean difference
    k: float

    @property
    def low(self) -> float:
        return self.mean - self.half_width

    @property
    def high(self) -> float:
        return self.mean + self.half_width


def paired_difference(reference: Sequence[float], variant: Sequence[float], k: float = K_SE) -> PairedDifference:
    """The variant's effect measured seed by seed: the mean of variant[i] - reference[i] and its
    k-standard-error interval. Seed-to-seed spread cancels in each pair, so this interval is far
    narrower than the unpaired band (`seed_band`) and says how large the variant's own effect is."""
    ref, var = _checked(reference, "reference", 2), _checked(variant, "variant", 2)
    if len(ref) != len(var):
        raise UsageError(f"a paired difference needs one variant value per reference seed: {len(var)} vs {len(ref)}")
    if not k > 0:
        raise UsageError(f"k (standard errors) must be > 0, got {k}")
    d = [v - r for r, v in zip(ref, var)]
    sd = statistics.stdev(d)
    return PairedDifference(mean=statistics.mean(d), sd=sd, largest=max(abs(x) for x in d),
                            half_width=k * sd / math.sqrt(len(d)), k=k)


def seed_band_rows(values: Mapping[str, Sequence[float]], reference: str, k: float = K_SE) -> list[dict]:
    """One table row per label of `values` (label -> one value per seed): its seeds, mean,
    standard deviation, min and max, and (None on the reference's own row) its difference of means
    from the reference (absolute and relative), the tolerance, and whether it lies inside the band."""
    if reference not in values:
        raise UsageError(f"reference {reference!r} is not among {sorted(values)}")
    rows = []
    for label, vals in values.items():
        vals = _checked(vals, label, 1)
        row = {"label": label, "seeds": len(vals), "mean": statistics.mean(vals),
               "sd": statistics.stdev(vals) if len(vals) > 1 else None, "min": min(vals), "max": max(vals)}
        band = seed_band(values[reference], vals, k) if label != reference else None
        row.update(difference=band and band.difference,
                   relative=band.difference / band.reference_mean if band and band.reference_mean else None,
                   tolerance=band and band.tolerance, within=band and band.within)
        rows.append(row)
    return rows
