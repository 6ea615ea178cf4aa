"""Pointwise GDPA activations and their derivatives, as Triton device functions.

`_act(x)` is the forward weight; `_act_and_grad(x)` gives (act(x), act'(x)) from ONE evaluation
of the shared special function (one sigmoid for silu, one erf for gelu, one tanh for
gelu_tanh): the dK/dV pass needs both. `_act_grad` is the derivative alone (the dQ pass).
Derivatives match torch's autograd (relu'(0) = 0, leaky_relu'(0) = 0.01).

SILU_TANH (a constexpr) selects how SiLU's sigmoid is computed:
  0  tl.sigmoid(x) = 1 / (1 + exp(-x)): two special-function (MUFU) ops per score;
  1  sigmoid(x) = 0.5 (1 + tanh(x / 2)) with tanh from the plain formula (CPU interpreter);
  2  the same with PTX tanh.approx.f32 (CUDA only): ONE MUFU op per score. Its relative
     error (~2^-11) is below bf16/fp16 rounding; the wrapper never uses it for fp32 inputs.
"""
import triton
import triton.language as tl


@triton.jit
def _tanh(z, SILU_TANH: tl.constexpr):
    if SILU_TANH == 2:
        return tl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=f,f", [z], dtype=tl.float32,
                                         is_pure=True, pack=1)
    else:
        return 2.0 * tl.sigmoid(2.0 * z) - 1.0


@triton.jit
def _sigmoid(x, SILU_TANH: tl.constexpr):
    if SILU_TANH == 0:
        return tl.sigmoid(x)
    else:
        return 0.5 + 0.5 * _tanh(0.5 * x, SILU_TANH)


@triton.jit
def _act(x, ACT: tl.constexpr, SILU_TANH: tl.constexpr):
    if ACT == "silu":
        return x * _sigmoid(x, SILU_TANH)
    elif ACT == "gelu":
        return 0.5 * x * (1.0 + tl.erf(x * 0.7071067811865476))
    elif ACT == "gelu_tanh":
        t = 2.0 * tl.sigmoid(1.5957691216057308 * (x + 0.044715 * x * x * x)) - 1.0  # tanh(z) = 2 sigmoid(2z) - 1
        return 0.5 * x * (1.0 + t)
    elif ACT == "relu":
        return tl.maximum(x, 0.0)
    elif ACT == "relu2":
        r = tl.maximum(x, 0.0)
        return r * r
    elif ACT == "leaky_relu":
        return tl.where(x > 0, x, 0.01 * x)
    else:  # identity
        return x


@triton.jit
def _act_and_grad(x, ACT: tl.constexpr, SILU_TANH: tl.constexpr):
    """(act(x), act'(x)) sharing one special-function evaluation."""
    if ACT == "silu":
        sig = _sigmoid(x, SILU_TANH)
        return x * sig, sig * (1.0 + x * (1.0 - sig))
    elif ACT == "gelu":
        cdf = 0.5 * (1.0 + tl.erf(x * 0.7071067811865476))
        return x * cdf, cdf + x * tl.exp(-0.5 * x * x) * 0.3989422804014327
    elif ACT == "gelu_tanh":
        t = 2.0 * tl.sigmoid(1.5957691216057308 * (x + 0.044715 * x * x * x)) - 1.0
        grad = 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * 0.7978845608028654 * (1.0 + 0.134145 * x * x)
        return 0.5 * x * (1.0 + t), grad
    elif ACT == "relu":
        return tl.maximum(x, 0.0), tl.where(x > 0, 1.0, 0.0)
    elif ACT == "relu2":
        r = tl.maximum(x, 0.0)
        return r * r, 2.0 * r
    elif ACT == "leaky_relu":
        return tl.where(x > 0, x, 0.01 * x), tl.where(x > 0, 1.0, 0.01)
    else:
        return x, tl.full(x.shape, 1.0, tl.float32)


@triton.jit
def _act_grad(x, ACT: tl.constexpr, SILU_TANH: tl.constexpr):
    """act'(x) alone (the dQ pass needs no act(x))."""
    if ACT == "silu":
        sig = _sigmoid(x, SILU_TANH)
        return sig * (1.0 + x * (1.0 - sig))
    else:
        return _act_and_grad(x, ACT, SILU_TANH)[1]
