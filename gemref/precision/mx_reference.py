"""OCP Microscaling (MX) quantisation in plain torch: the reference for MXFP8.

An MX tensor stores, for every block of `block_size` (32) consecutive values along the last
dim, one shared scale X = 2^e (E8M0: an 8-bit biased exponent, bias 127, code 255 = NaN,
no zero, no sign) and `block_size` narrow floats P_i (FP8 E4M3 for MXFP8), so that
v_i ~= X * P_i. Storage: 8 bits per element + 8 bits per block (8.25 bits/value).

How X is picked (`scale_mode`; the element's largest power of two is 2^emax, 2^8 for E4M3,
and its largest value is max_pos, 448 for E4M3; amax is the block's largest |v|):
  floor  X = 2^(floor(log2 amax) - emax). The OCP MX v1.0 spec's rule. Values in
         [max_pos, 2^(emax+1)) * X overflow the element and saturate to max_pos.
  ceil   X = 2^(ceil(log2 amax) - emax). Never saturates, loses the bottom of small blocks.
  even   floor, after rounding amax to the element's mantissa width (a max that would
         round up to the next power of two moves to the next exponent).
  rceil  X = 2^ceil(log2(amax / max_pos)): the smallest power of two with amax / X <=
         max_pos (cuBLAS / NVIDIA Blackwell `cvt.rp.satfinite.ue8m0`). torchao's default
         for MXFP8 training.
The exponent is clamped to E8M0's range [-127, 127]; a block holding a NaN gets code 255.
Elements are v / X, clamped to +-max_pos (NaN stays NaN), rounded to nearest-even.

Edge cases follow torchao 0.18 (torchao.prototype.mx_formats.mx_tensor.to_mx), which
`tests/test_mx.py` checks bit for bit:
  - floor/ceil/even: a block whose scale is 2^-127 (amax < 2^-118, e.g. all zeros) is
    divided by 2^-126, torchao's guard against float32 subnormals in Triton. from_mx then
    returns half of such (tiny) values.
  - rceil: a block whose scale is 2^-127 is not rescaled at all (NVIDIA TransformerEngine's
    convention), so its elements underflow to zero. An inf in a block gives scale 2^127.
  - A NaN anywhere in a block: floor/ceil/even keep the NaN and turn the block's finite
    values into (signed) zeros; rceil turns the whole block into NaN.
One deliberate difference: our rceil takes ceil(log2) exactly from the float bits (as the
hardware does). torchao's eager fallback computes float32 `ceil(log2(d))`, which rounds
d = 2^k * (1 + a few ulps) down to k and so picks a scale half as large (the block max then
saturates by a few ulps). The test pins that difference down exactly.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

SCALE_MODES = ("floor", "ceil", "even", "rceil")
E8M0_BIAS = 127
E8M0_NAN = 255
F32_MANTISSA_BITS = 23


@dataclass(frozen=True)
class ElementFormat:
    max_pos: float   # largest finite value
    emax: int        # exponent of the largest power of two <= max_pos
    mbits: int       # explicit mantissa bits


ELEMENT_FORMATS = {
    torch.float8_e4m3fn: ElementFormat(max_pos=448.0, emax=8, mbits=3),
    torch.float8_e5m2: ElementFormat(max_pos=57344.0, emax=15, mbits=2),
}
INPUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _check(x: torch.Tensor, block_size: int, elem_dtype: torch.dtype, scale_mode: str) -> None:
    if scale_mode not in SCALE_MODES:
        raise ValueError(f"scale_mode={scale_mode!r}; valid: {', '.join(SCALE_MODES)}")
    if elem_dtype not in ELEMENT_FORMATS:
        valid = ", ".join(str(d) for d in ELEMENT_FORMATS)
        raise ValueError(f"elem_dtype={elem_dtype}; valid: {valid}")
    if x.dtype not in INPUT_DTYPES:
        valid = ", ".join(str(d) for d in INPUT_DTYPES)
        raise ValueError(f"x.dtype={x.dtype} cannot be quantised exactly; valid: {valid}")
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    if x.ndim == 0 or x.shape[-1] % block_size:
        raise ValueError(f"the last dim of x (shape {tuple(x.shape)}) must be a multiple of "
                         f"block_size={block_size}")


def _fp32_fields(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Biased exponent field (0..255) and mantissa field of non-negative float32 values."""
    bits = a.view(torch.int32)
    return (bits >> F32_MANTISSA_BITS) & 0xFF, bits & ((1 << F32_MANTISSA_BITS) - 1)


def _power_of_two(code: torch.Tensor) -> torch.Tensor:
    """float32 2^(code - 127) for E8M0 codes 0..254 (code 0 is the subnormal 2^-127)."""
    code = code.to(torch.int32)
    bits = torch.where(code == 0, 1 << (F32_MANTISSA_BITS - 1), code << F32_MANTISSA_BITS)
    return bits.view(torch.float32)


def _scale_codes(amax: torch.Tensor, fmt: ElementFormat, scale_mode: str) -> torch.Tensor:
    """E8M0 code (int32, 0..255) of each block's scale from its float32 amax."""
    if scale_mode == "rceil":
        descale = amax / fmt.max_pos
        # exact ceil(log2 d) from the bits; a subnormal d is first scaled up by 2^32 (exactly);
        # d = 0 comes out as -159 and is clamped like every d below 2^-127
        subnormal = _fp32_fields(descale)[0] == 0
        field, mantissa = _fp32_fields(torch.where(subnormal, descale * 2.0**32, descale))
        exponent = field - E8M0_BIAS + (mantissa != 0).int() - 32 * subnormal.int()
        code = exponent.clamp(-E8M0_BIAS, E8M0_BIAS) + E8M0_BIAS  # inf -> 254
    else:
        field, mantissa = _fp32_fields(amax)  # zero/subnormal: field 0; inf: field 255
        if scale_mode == "ceil":
            field = field + (mantissa != 0).int()
        elif scale_mode == "even":  # a mantissa that rounds up at mbits+1 bits carries over
            half_lsb = 1 << (F32_MANTISSA_BITS - fmt.mbits - 1)
            field = field + (mantissa >= (1 << F32_MANTISSA_BITS) - half_lsb).int()
        exponent = field - E8M0_BIAS - fmt.emax
        code = exponent.clamp(-E8M0_BIAS, E8M0_BIAS + 1) + E8M0_BIAS
    return torch.where(torch.isnan(amax), E8M0_NAN, code)


def to_mx(x: torch.Tensor, block_size: int = 32, elem_dtype: torch.dtype = torch.float8_e4m3fn,
          scale_mode: str = "floor") -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise x blockwise along its last dim.

    Returns (scale_e8m0 of shape (..., K // block_size), dtype float8_e8m0fnu;
    elements of x's shape, dtype elem_dtype). See the module docstring for the rules.
    """
    _check(x, block_size, elem_dtype, scale_mode)
    fmt = ELEMENT_FORMATS[elem_dtype]
    x_blocks = x.float().reshape(*x.shape[:-1], x.shape[-1] // block_size, block_size)
    amax = x_blocks.abs().amax(dim=-1, keepdim=True)  # NaN if the block holds a NaN
    code = _scale_codes(amax, fmt, scale_mode)
    if scale_mode == "rceil":
        # times 1/X = 2^(127 - code), whose E8M0 code is 254 - code; a 2^-127 scale (code 0)
        # is left at 1 (TransformerEngine's convention) and a NaN scale poisons the block
        multiplier = torch.where(code == 0, 1.0, _power_of_two(2 * E8M0_BIAS - code.clamp(max=254)))
        multiplier = torch.where(code == E8M0_NAN, float("nan"), multiplier)
        scaled = x_blocks * multiplier
    else:
        # divided by X, but never by less than 2^-126 (torchao's guard); a NaN scale divides
        # by inf, so finite values become signed zeros and the NaN stays
        divisor = _power_of_two(code.clamp(1, 254))
        divisor = torch.where(code == E8M0_NAN, float("inf"), divisor)
        scaled = x_blocks / divisor
    elements = scaled.clamp(-fmt.max_pos, fmt.max_pos).to(elem_dtype).reshape(x.shape)
    scale = code.squeeze(-1).to(torch.uint8).view(torch.float8_e8m0fnu)
    return scale, elements


def from_mx(scale_e8m0: torch.Tensor, elements: torch.Tensor, block_size: int = 32,
            dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Dequantise: element * 2^(scale exponent) per block (NaN where the scale is NaN)."""
    if elements.ndim == 0 or elements.shape[-1] != scale_e8m0.shape[-1] * block_size:
        raise ValueError(f"elements shape {tuple(elements.shape)} does not match scale shape "
                         f"{tuple(scale_e8m0.shape)} with block_size={block_size}")
    code = scale_e8m0.view(torch.uint8).to(torch.int32).unsqueeze(-1)
    scale = torch.where(code == E8M0_NAN, float("nan"), _power_of_two(code.clamp(max=254)))
    blocks = elements.float().reshape(*scale.shape[:-1], block_size) * scale
    return blocks.reshape(elements.shape).to(dtype)


def scale_exponents(scale_e8m0: torch.Tensor) -> torch.Tensor:
    """Unbiased exponent e of each block scale 2^e (int16); the NaN code 255 maps to 128."""
    return scale_e8m0.view(torch.uint8).to(torch.int16) - E8M0_BIAS


@dataclass
class BlockStats:
    """Per-block view of one quantisation, each tensor of shape (..., n_blocks)."""

    exponent: torch.Tensor    # unbiased scale exponent (int16; 128 = NaN block)
    amax: torch.Tensor        # largest |value| in the block (float32)
    sqnr_db: torch.Tensor     # 20 log10(||block|| / ||block - dequantised||); inf if exact
    at_max: torch.Tensor      # elements that landed on +-max_pos: clipped there, or rounded up to it (int64)
    clipped: torch.Tensor     # values beyond max_pos x the block's scale, clipped (int64; 0 under rceil/ceil)
    flushed: torch.Tensor     # non-zero values that became zero (int64)


def block_stats(x: torch.Tensor, block_size: int = 32, elem_dtype: torch.dtype = torch.float8_e4m3fn,
                scale_mode: str = "floor") -> BlockStats:
    """Quantise x and measure the error of every block (for histograms in the notebook)."""
    scale, elements = to_mx(x, block_size, elem_dtype, scale_mode)
    blocks_shape = (*x.shape[:-1], x.shape[-1] // block_size, block_size)
    x_b = x.float().reshape(blocks_shape)
    err_b = x_b - from_mx(scale, elements, block_size).reshape(blocks_shape)
    sqnr = 20 * torch.log10(x_b.norm(dim=-1) / err_b.norm(dim=-1))
    el_b = elements.float().reshape(blocks_shape)
    fmt = ELEMENT_FORMATS[elem_dtype]
    block_scale = torch.exp2(scale_exponents(scale).float()).reshape(*blocks_shape[:-1], 1)
    return BlockStats(
        exponent=scale_exponents(scale),
        amax=x_b.abs().amax(dim=-1),
        sqnr_db=sqnr,
        at_max=(el_b.abs() == fmt.max_pos).sum(-1),
        clipped=(x_b.abs() > fmt.max_pos * block_scale).sum(-1),
        flushed=((el_b == 0) & (x_b != 0)).sum(-1),
    )


def rounding_sqnr_db(mbits: int) -> float:
    """SQNR of rounding to nearest with `mbits` explicit mantissa bits, for values far from under-
    and overflow: a value u x 2^e (u in [1, 2)) is off by at most half an ulp, 2^(e - mbits - 1),
    uniformly, so the noise power is 2^(2e - 2 mbits) / 12; for log-uniformly spread significands
    E[u^2] = 3 / (2 ln 2), and SQNR = 10 log10(12 x 4^mbits x 3 / (2 ln 2)) = 6.02 mbits + 14.1 dB
    (32.2 dB for E4M3's 3 bits)."""
    return 10 * math.log10(12 * 4 ** mbits * 3 / (2 * math.log(2)))


def scaled_fake_quant(x: torch.Tensor, granularity: str, elem_dtype: torch.dtype = torch.float8_e4m3fn) -> torch.Tensor:
    """x cast to `elem_dtype` and back with one scale amax / max_pos per "tensor" or per "row" (float8
    tensorwise / rowwise: the scale is not a power of two) or per 32-value "mx" block (rceil)."""
    if granularity == "mx":
        return mx_fake_quant(x, 32, elem_dtype, "rceil")
    if granularity not in ("tensor", "row"):
        raise ValueError(f"granularity must be 'tensor', 'row' or 'mx', got {granularity!r}")
    x32 = x.float()
    amax = x32.abs().amax() if granularity == "tensor" else x32.abs().amax(dim=-1, keepdim=True)
    scale = ELEMENT_FORMATS[elem_dtype].max_pos / amax.clamp(min=torch.finfo(torch.float32).tiny)
    fmax = ELEMENT_FORMATS[elem_dtype].max_pos
    return ((x32 * scale).clamp(-fmax, fmax).to(elem_dtype).float() / scale).to(x.dtype)


def scaling_sqnr(x: torch.Tensor, granularities=("tensor", "row", "mx"), block_size: int = 32) -> list[dict]:
    """One row per scaling granularity of x (2-D): SQNR of the whole tensor, of its blocks of
    `block_size` (median, worst) and the non-zero values flushed to zero."""
    rows = []
    xb = x.float().reshape(*x.shape[:-1], -1, block_size)
    for g in granularities:
        q = scaled_fake_quant(x, g).float().reshape(xb.shape)
        err = xb - q
        block_db = 20 * torch.log10(xb.norm(dim=-1) / err.norm(dim=-1))
        rows.append({"scaling": g, "tensor_sqnr_db": float(20 * torch.log10(xb.norm() / err.norm())),
                     "block_sqnr_median_db": float(block_db.median()), "block_sqnr_worst_db": float(block_db.min()),
                     "flushed": int(((q == 0) & (xb != 0)).sum())})
    return rows


def mx_fake_quant(x: torch.Tensor, block_size: int = 32, elem_dtype: torch.dtype = torch.float8_e4m3fn,
                  scale_mode: str = "rceil") -> torch.Tensor:
    """to_mx then from_mx along the last dim, back in x's dtype."""
    scale, elements = to_mx(x.contiguous(), block_size, elem_dtype, scale_mode)
    return from_mx(scale, elements, block_size, dtype=x.dtype)


class _MXLinear(torch.autograd.Function):
    """y = x W^T with every GEMM operand MX-quantised along that GEMM's reduction dim."""

    @staticmethod
    def forward(ctx, x_MK, w_NK, scale_mode, block_size):
        ctx.save_for_backward(x_MK, w_NK)
        ctx.scale_mode, ctx.block_size = scale_mode, block_size
        q = lambda t: mx_fake_quant(t, block_size, torch.float8_e4m3fn, scale_mode)  # noqa: E731
        return q(x_MK) @ q(w_NK).t()

    @staticmethod
    def backward(ctx, grad_y_MN):
        x_MK, w_NK = ctx.saved_tensors
        q = lambda t: mx_fake_quant(t, ctx.block_size, torch.float8_e4m3fn, ctx.scale_mode)  # noqa: E731

        def q_tokens(t_XM: torch.Tensor) -> torch.Tensor:
            """Quantise along tokens; a last partial block is completed with zeros."""
            pad = -t_XM.shape[-1] % ctx.block_size
            return q(torch.nn.functional.pad(t_XM, (0, pad)))[..., :t_XM.shape[-1]]

        grad_x = q(grad_y_MN) @ q(w_NK.t()).t()                 # reduction over N
        grad_w = q_tokens(grad_y_MN.t()) @ q_tokens(x_MK.t()).t()  # reduction over M (tokens)
        return grad_x, grad_w, None, None


def mx_linear_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                        *, scale_mode: str = "rceil", block_size: int = 32) -> torch.Tensor:
    """Emulated MXFP8 linear (forward and backward), the plain counterpart of torchao's.

    The three GEMMs (output, grad_input, grad_weight) each see both operands quantised to
    MXFP8 (E4M3 elements) in blocks along their reduction dim, and run in the inputs' dtype.
    Both weight dims must be multiples of block_size; any token count works: grad_weight
    reduces over tokens, and a last partial block of tokens is completed with zeros (which
    changes no block's amax, so it is the natural meaning of a partial block).
    """
    x_MK = x.reshape(-1, x.shape[-1])
    y = _MXLinear.apply(x_MK, weight, scale_mode, block_size).reshape(*x.shape[:-1], weight.shape[0])
    return y if bias is None else y + bias.to(y.dtype)
