"""The seed band (gemref/report/seed_band.py) against hand arithmetic, and its errors."""
import math
import statistics

import pytest

from gemref.errors import UsageError
from gemref.report.seed_band import K_SE, difference_tolerance, paired_difference, seed_band, seed_band_rows

REF = [1.0, 2.0, 3.0]           # mean 2, sample sd 1


def test_tolerance_is_k_standard_errors_of_a_difference_of_means():
    assert difference_tolerance(REF, k=3) == pytest.approx(3 * math.sqrt(2 / 3))
    assert difference_tolerance(REF, k=2, variant_seeds=1) == pytest.approx(2 * math.sqrt(1 / 3 + 1))
    # the reference's spread, whatever the variant's: sd of [10, 14] is sqrt(8)
    assert difference_tolerance([10.0, 14.0], k=1) == pytest.approx(math.sqrt(8) * 1.0)


def test_inside_and_outside_the_band():
    inside = seed_band(REF, [4.0, 4.0, 4.0], k=3)          # difference 2 <= 2.449
    assert (inside.reference_mean, inside.variant_mean, inside.reference_sd) == (2.0, 4.0, 1.0)
    assert inside.difference == 2.0 and inside.within
    outside = seed_band(REF, [5.0, 4.5, 5.5], k=3)         # difference 3 > 2.449
    assert outside.difference == 3.0 and not outside.within
    below = seed_band(REF, [-1.0, -1.0, -1.0], k=3)        # the band is two-sided
    assert below.difference == -3.0 and not below.within
    assert seed_band([1.0, 1.0], [1.0]).within and not seed_band([1.0, 1.0], [1.0 + 1e-12]).within  # no spread


def test_rows_read_the_band_per_label():
    rows = seed_band_rows({"fp32": REF, "mxfp8": [4.0, 4.0, 4.0], "one": [2.5]}, "fp32", k=3)
    ref, mx, one = rows
    assert ref == {"label": "fp32", "seeds": 3, "mean": 2.0, "sd": 1.0, "min": 1.0, "max": 3.0,
                   "difference": None, "relative": None, "tolerance": None, "within": None}
    assert mx["difference"] == 2.0 and mx["relative"] == 1.0 and mx["within"] and mx["sd"] == 0.0
    assert mx["tolerance"] == pytest.approx(3 * math.sqrt(2 / 3))
    assert one["sd"] is None and one["tolerance"] == pytest.approx(3 * math.sqrt(1 / 3 + 1)) and one["within"]


def test_bad_input_is_a_clear_usage_error():
    with pytest.raises(UsageError, match=r"at least 2 reference value\(s\), one per seed; got 1"):
        seed_band([1.0], [1.0])
    with pytest.raises(UsageError, match=r"at least 1 variant value\(s\), one per seed; got 0"):
        seed_band(REF, [])
    with pytest.raises(UsageError, match="must be finite"):
        seed_band(REF, [math.nan])
    with pytest.raises(UsageError, match=r"k \(standard errors\) must be > 0, got 0"):
        difference_tolerance(REF, k=0)
    with pytest.raises(UsageError, match="variant_seeds must be >= 1, got 0"):
        difference_tolerance(REF, variant_seeds=0)
    with pytest.raises(UsageError, match=r"reference 'bf16' is not among \['fp32'\]"):
        seed_band_rows({"fp32": REF}, "bf16")


def test_paired_difference_cancels_the_seed_spread():
    # seeds spread by 0.1, the variant shifts every seed by +0.01 with a little noise of its own
    reference = [0.70, 0.80, 0.90, 0.75]
    variant = [r + 0.01 + e for r, e in zip(reference, [0.001, -0.001, 0.0005, -0.0005])]
    pd = paired_difference(reference, variant)
    assert pd.mean == pytest.approx(0.01) and pd.largest == pytest.approx(0.011)
    assert pd.low > 0 and pd.high < 0.02                       # the effect is resolved seed by seed
    band = seed_band(reference, variant)
    assert band.within and band.tolerance > 10 * pd.half_width  # the unpaired band cannot see it
    assert pd.half_width == pytest.approx(K_SE * statistics.stdev([v - r for r, v in zip(reference, variant)]) / 2)


def test_paired_difference_errors():
    with pytest.raises(UsageError, match="one variant value per reference seed"):
        paired_difference([1.0, 2.0, 3.0], [1.0, 2.0])
    with pytest.raises(UsageError, match="at least 2"):
        paired_difference([1.0], [1.0])
