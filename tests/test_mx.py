"""gemref.precision.mx_reference (our MX reference) against torchao's to_mx, bit for bit, and against the format's math."""
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st
from hypothesis.extra import numpy as hnp

from gemref.precision.mx_reference import (ELEMENT_FORMATS, SCALE_MODES, block_stats, from_mx, mx_fake_quant,
                                           rounding_sqnr_db, scaled_fake_quant, scaling_sqnr,
                                           scale_exponents, to_mx)

pytest.importorskip("torchao")
from torchao.prototype.mx_formats.config import ScaleCalculationMode  # noqa: E402
from torchao.prototype.mx_formats.mx_tensor import to_dtype as ao_to_dtype, to_mx as ao_to_mx  # noqa: E402

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
SETTINGS = settings(max_examples=40, deadline=None)


def codes(scale):
    return scale.view(torch.uint8).to(torch.int32)


def same_elements(a, b):
    """Equal bits, except that any NaN equals any NaN (E4M3 has two NaN encodings)."""
    assert a.dtype == b.dtype
    as_int = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[a.element_size()]
    nan = torch.isnan(a.float()) & torch.isnan(b.float())
    return (a.view(as_int) == b.view(as_int)) | nan


def assert_matches_torchao(x, block_size, elem_dtype, mode):
    """Scales and elements bit-equal torchao's, and dequantisation too. The one allowed
    difference (rceil only): torchao's eager float32 ceil(log2 d) rounds d = 2^k (1 + a few
    ulps) down to k; ours is exact, so there the scale code is one higher than torchao's."""
    scale, elements = to_mx(x, block_size, elem_dtype, mode)
    ao_scale, ao_elements = ao_to_mx(x, elem_dtype, block_size, ScaleCalculationMode(mode))
    assert scale.dtype == torch.float8_e8m0fnu and elements.dtype == elem_dtype
    assert scale.shape == ao_scale.shape and elements.shape == ao_elements.shape == x.shape
    diff = codes(scale) - codes(ao_scale)
    agree = diff == 0
    if mode == "rceil" and not agree.all():
        assert set(diff[~agree].tolist()) == {1}
        amax = x.float().reshape(*scale.shape, block_size).abs().amax(-1)[~agree]
        descale = amax / ELEMENT_FORMATS[elem_dtype].max_pos
        power = torch.exp2((codes(ao_scale)[~agree] - 127).double())
        ratio = descale.double() / power
        assert ((ratio > 1) & (ratio < 1 + 2**-16)).all(), ratio
    else:
        assert agree.all(), (codes(scale)[~agree], codes(ao_scale)[~agree])
    block_ok = agree.repeat_interleave(block_size, dim=-1)
    assert (same_elements(elements, ao_elements) | ~block_ok).all()
    for dtype in (torch.float32, torch.bfloat16):
        ours = from_mx(scale, elements, block_size, dtype)
        theirs = ao_to_dtype(elements, scale, elem_dtype, block_size, dtype)
        assert (same_elements(ours, theirs) | ~block_ok).all()


@st.composite
def wide_range_tensors(draw):
    """Gaussian blocks scaled by powers of two from subnormal to near float32's max, with
    zeros, all-zero blocks, NaN and inf sprinkled at drawn positions."""
    rows, blocks = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    block_size = draw(st.sampled_from([32, 16, 8]))
    seed = draw(st.integers(0, 2**31 - 1))
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, blocks * block_size, generator=gen)
    exponents = torch.randint(-150, 125, (rows, blocks), generator=gen).float()
    x = x * torch.exp2(exponents).repeat_interleave(block_size, dim=1)
    n = x.numel()
    for value in draw(st.lists(st.sampled_from([0.0, math.nan, math.inf, -math.inf, -0.0]), max_size=3)):
        x.view(-1)[draw(st.integers(0, n - 1))] = value
    if draw(st.booleans()):
        r, b = draw(st.integers(0, rows - 1)), draw(st.integers(0, blocks - 1))
        x[r, b * block_size:(b + 1) * block_size] = 0
    dtype = draw(st.sampled_from([torch.float32, torch.bfloat16]))
    return x.to(dtype), block_size


@SETTINGS
@given(data=wide_range_tensors(), mode=st.sampled_from(SCALE_MODES), elem=st.sampled_from([E4M3, E5M2]))
def test_matches_torchao_on_wide_range_tensors(data, mode, elem):
    x, block_size = data
    assert_matches_torchao(x, block_size, elem, mode)


@SETTINGS
@given(arr=hnp.arrays(np.float32, st.tuples(st.integers(1, 3), st.sampled_from([32, 64])),
                      elements=st.floats(width=32)),
       mode=st.sampled_from(SCALE_MODES))
def test_matches_torchao_on_arbitrary_float32(arr, mode):
    """hypothesis' own float32 values: NaN, +-inf, subnormals, float32 max, 1 +- ulp."""
    assert_matches_torchao(torch.from_numpy(arr.copy()), 32, E4M3, mode)


def adversarial_tensors():
    tiny = torch.finfo(torch.float32).tiny
    big = torch.finfo(torch.float32).max
    blocks = {
        "zeros": torch.zeros(32),
        "negative zeros": -torch.zeros(32),
        "subnormals": torch.full((32,), 1e-45) * torch.arange(32),
        "just under the smallest normal": torch.full((32,), tiny) * 0.75,
        "2^-118 boundary of the E8M0 floor": torch.full((32,), 2.0**-118) * torch.linspace(-1, 1, 32),
        "float32 max": torch.full((32,), big) * torch.linspace(-1, 1, 32),
        "448 * 2^k exactly": 448.0 * torch.exp2(torch.arange(-20, 12).float()),
        "powers of two": torch.exp2(torch.arange(-16, 16).float()),
        "single outlier": torch.cat([torch.tensor([2.0**20]), torch.ones(31)]),
        "nan": torch.cat([torch.tensor([math.nan]), torch.randn(31)]),
        "negative nan": torch.cat([torch.tensor([-math.nan]), torch.randn(31)]),
        "inf": torch.cat([torch.tensor([math.inf, -1.5]), torch.randn(30)]),
        "-inf and nan": torch.cat([torch.tensor([-math.inf, math.nan]), torch.randn(30)]),
        "inf and -inf": torch.cat([torch.tensor([math.inf, -math.inf]), torch.randn(30)]),
        "E4M3 rounding ties": torch.tensor([1.0 + k / 16 for k in range(32)]) * 2.0**-3,
        "even: amax 1.1111b rounds up at E4M3": torch.cat([torch.tensor([1.9375]), torch.ones(31)]),
        "even: amax just below 1.1111b": torch.cat([torch.tensor([1.9375 - 2.0**-20]), torch.ones(31)]),
        "even: amax 1.111b rounds up at E5M2": torch.cat([torch.tensor([-1.875 * 2**40]), torch.ones(31)]),
    }
    return torch.stack(list(blocks.values()))


@pytest.mark.parametrize("mode", SCALE_MODES)
@pytest.mark.parametrize("elem", [E4M3, E5M2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_torchao_on_adversarial_blocks(mode, elem, dtype):
    assert_matches_torchao(adversarial_tensors().to(dtype), 32, elem, mode)


def test_rceil_is_exact_where_torchao_eager_log2_rounds():
    """amax/448 = 2^k (1 + j ulps): the smallest power of two >= it is 2^(k+1) (hardware's
    cvt.rp.ue8m0 gives that); torchao's eager path takes 2^k for small j and large |k|."""
    k = torch.arange(-120, 110).float()
    for ulps in (0, 1, 5, 40):
        amax = (448.0 * torch.exp2(k)).view(torch.int32) + ulps
        x = torch.zeros(len(k), 32)
        x[:, 0] = amax.view(torch.float32)
        scale, elements = to_mx(x, 32, E4M3, "rceil")
        assert (scale_exponents(scale).squeeze(-1) == k + (ulps > 0)).all()
        assert (elements.float().abs().amax(-1) <= 448).all()
        assert_matches_torchao(x, 32, E4M3, "rceil")


def test_edge_case_conventions():
    x = adversarial_tensors()
    names = ["zeros", "nan", "inf"]
    rows = {"zeros": 0, "nan": 9, "inf": 11}
    floor_scale, floor_el = to_mx(x, 32, E4M3, "floor")
    rceil_scale, rceil_el = to_mx(x, 32, E4M3, "rceil")
    for name in names:
        r = rows[name]
        if name == "zeros":
            assert scale_exponents(floor_scale)[r] == -127 and (floor_el[r].float() == 0).all()
            assert scale_exponents(rceil_scale)[r] == -127 and (rceil_el[r].float() == 0).all()
        if name == "nan":  # NaN scale; floor keeps finite values as zeros, rceil poisons the block
            assert codes(floor_scale)[r] == 255 == codes(rceil_scale)[r]
            assert torch.isnan(floor_el[r].float()).sum() == 1
            assert torch.isnan(rceil_el[r].float()).all()
        if name == "inf":  # inf saturates to +-448; rceil's scale is 2^127
            assert floor_el[r, 0].float() == 448 and scale_exponents(rceil_scale)[r] == 127
            assert rceil_el[r, 0].float() == 448


@SETTINGS
@given(data=wide_range_tensors(), mode=st.sampled_from(SCALE_MODES))
def test_quantisation_error_is_within_half_an_element_ulp(data, mode):
    """The format's own promise, independent of torchao: for finite blocks whose scale is
    in range, |x - dequant(x)| <= max(2^-4 |x|, X 2^-10) (E4M3: 3 mantissa bits, smallest
    subnormal 2^-9), plus saturation above max_pos * X (floor/even only)."""
    x, block_size = data
    x = torch.nan_to_num(x.float(), nan=0.0, posinf=0.0, neginf=0.0)
    scale, elements = to_mx(x, block_size, E4M3, mode)
    e = scale_exponents(scale).repeat_interleave(block_size, dim=-1).double()
    err = (x.double() - from_mx(scale, elements, block_size).double()).abs()
    bound = torch.maximum(x.double().abs() * 2**-4, torch.exp2(e - 10))
    clipped = x.double().abs() > 448 * torch.exp2(e)
    in_range = e > -127  # torchao's 2^-126 divisor / rceil's 1.0 multiplier at the floor
    assert ((err <= bound) | clipped | ~in_range).all()
    if mode in ("rceil", "ceil"):
        assert not (clipped & in_range).any()


def test_block_stats():
    x = torch.cat([torch.exp2(torch.arange(-8, 8).float()).repeat(2),  # exact in E4M3
                   torch.cat([torch.tensor([500.0]), torch.ones(31)]),  # floor: 500 saturates
                   torch.cat([torch.tensor([1.0]), torch.full((31,), 2.0**-20)])])  # flushed
    stats = block_stats(x, 32, E4M3, "floor")
    assert stats.sqnr_db[0] == math.inf and stats.at_max.tolist() == [0, 1, 0]
    assert stats.clipped.tolist() == [0, 1, 0]
    assert stats.flushed.tolist() == [0, 0, 31]
    assert stats.exponent.tolist() == [7 - 8, 8 - 8, 0 - 8]
    assert stats.amax.tolist() == [2.0**7, 500.0, 1.0]
    assert block_stats(x, 32, E4M3, "rceil").clipped[1] == 0


def test_fake_quant_keeps_dtype_and_shape():
    x = torch.randn(2, 3, 64, dtype=torch.bfloat16)
    y = mx_fake_quant(x)
    assert y.dtype == x.dtype and y.shape == x.shape
    assert 20 * torch.log10(x.float().norm() / (x.float() - y.float()).norm()) > 25


@pytest.mark.parametrize("kwargs, message", [
    (dict(scale_mode="nearest"), "scale_mode='nearest'; valid: floor, ceil, even, rceil"),
    (dict(elem_dtype=torch.int8), "elem_dtype=torch.int8; valid"),
    (dict(block_size=0), "block_size must be >= 1"),
    (dict(block_size=48), "must be a multiple of block_size=48"),
])
def test_to_mx_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        to_mx(torch.randn(2, 64), **kwargs)


def test_bad_inputs():
    with pytest.raises(ValueError, match="x.dtype=torch.float64 cannot be quantised exactly"):
        to_mx(torch.randn(64, dtype=torch.float64))
    with pytest.raises(ValueError, match="last dim of x"):
        to_mx(torch.tensor(1.0))
    scale, elements = to_mx(torch.randn(2, 64))
    with pytest.raises(ValueError, match=r"elements shape \(2, 64\) does not match scale shape \(2, 2\)"):
        from_mx(scale, elements, block_size=16)


def test_rounding_sqnr_matches_round_to_nearest_on_log_uniform_values():
    # log-uniform significands over many octaves, all inside E4M3's normal range after no scaling
    g = torch.Generator().manual_seed(0)
    x = torch.exp2(torch.rand(200_000, generator=g, dtype=torch.float64) * 8 - 4).float()
    q = x.to(E4M3).float()
    measured = 20 * math.log10(x.double().norm() / (x.double() - q.double()).norm())
    assert rounding_sqnr_db(3) == pytest.approx(32.2, abs=0.05)
    assert measured == pytest.approx(rounding_sqnr_db(3), abs=0.3)
    assert rounding_sqnr_db(4) - rounding_sqnr_db(3) == pytest.approx(20 * math.log10(2))


def test_mx_keeps_the_blocks_a_per_tensor_scale_flushes():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(16, 256, generator=g) * torch.logspace(-4, 0, 16)[:, None]
    x[3, 40] = 60.0
    by = {r["scaling"]: r for r in scaling_sqnr(x)}
    assert by["mx"]["block_sqnr_worst_db"] > 25 > by["row"]["block_sqnr_worst_db"] > by["tensor"]["block_sqnr_worst_db"]
    assert by["mx"]["flushed"] < by["row"]["flushed"] < by["tensor"]["flushed"]
    # a well-scaled tensor: every granularity near the rounding SQNR
    y = torch.randn(8, 64, generator=g)
    for r in scaling_sqnr(y):
        assert abs(r["block_sqnr_median_db"] - rounding_sqnr_db(3)) < 2.5, r
    with pytest.raises(ValueError, match="granularity"):
        scaled_fake_quant(y, "column")
