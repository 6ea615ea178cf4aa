"""Tile operations of the `cpu_jagged` kernel (gemref/attention/cpu_jagged/op.py).

Moving rows between the jagged (T, H, D) tensors and the padded buffers of a plan
(gemref/attention/cpu_jagged/plan.py) is one `index_select` each way (a gather runs ~3x
faster than advanced indexing or index_put on CPU). A piece's operands are strided views of
those buffers; its score tile is a slice of a workspace shared by the wave.

Masks never use `masked_fill_` (a broadcast boolean fill costs ~10x an elementwise op):
pointwise activations zero the masked scores with `tril_`/`triu_` (act(0) = 0 for every
pointwise activation, so a zeroed score gives a zero weight), and zero-padded keys need no
mask at all (score 0, weight 0, and the zero key adds nothing to dq). Softmax adds a cached
0 / -inf-like bias: one (rows, keys) tile per mask shape, one value per key row for padding.
"""
from __future__ import annotations

from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import Tensor

from .plan import Piece, Side

_aten = torch.ops.aten


def activation_(name: str, s: Tensor) -> Tensor:
    """act(s), in place."""
    if name == "silu":
        return F.silu(s, inplace=True)
    if name == "gelu":
        return _aten.gelu_(s)
    if name == "gelu_tanh":
        return _aten.gelu_(s, approximate="tanh")
    if name == "relu":
        return s.relu_()
    if name == "relu2":
        return s.relu_().square_()
    if name == "leaky_relu":
        return _aten.leaky_relu_(s, 0.01)
    assert name == "identity", name
    return s


def activation_backward_(name: str, grad: Tensor, s: Tensor) -> Tensor:
    """grad * act'(s), in place in grad, with the fused kernels autograd itself uses."""
    if name == "silu":
        return _aten.silu_backward.grad_input(grad, s, grad_input=grad)
    if name in ("gelu", "gelu_tanh"):
        approximate = "tanh" if name == "gelu_tanh" else "none"
        return _aten.gelu_backward.grad_input(grad, s, approximate=approximate, grad_input=grad)
    if name == "relu":
        return _aten.threshold_backward.grad_input(grad, s, 0, grad_input=grad)
    if name == "relu2":
        return grad.mul_(s.clamp(min=0)).mul_(2)
    if name == "leaky_relu":
        return _aten.leaky_relu_backward.grad_input(grad, s, 0.01, False, grad_input=grad)
    assert name == "identity", name
    return grad


def zero_masked_(s: Tensor, p: Piece) -> Tensor:
    """Zero the entries of a piece's (batch, rows, keys) tile that its masks exclude."""
    if p.tril is not None:
        s.tril_(p.tril)
    if p.triu is not None:
        s.triu_(p.triu)
    return s


@lru_cache(maxsize=64)
def _mask_bias(rows: int, keys: int, tril: int | None, triu: int | None, dtype: torch.dtype) -> Tensor:
    allowed = torch.ones(rows, keys, dtype=torch.bool)
    if tril is not None:
        allowed = allowed.tril(tril)
    if triu is not None:
        allowed = allowed.triu(triu)
    return torch.zeros(rows, keys, dtype=dtype).masked_fill_(~allowed, masked_score(dtype))


def masked_score(dtype: torch.dtype) -> float:
    """The additive bias of a masked score: half the dtype's min, so that a score under both
    biases (mask and padding) is still finite."""
    return torch.finfo(dtype).min / 2


def softmax_(s: Tensor, p: Piece, key_bias: Tensor | None) -> Tensor:
    """Row softmax of a contiguous (batch, rows, keys) tile in place, masked entries -> 0.

    Masked scores get masked_score() added (finite, not -inf: a row with no allowed key stays
    finite). `key_bias` is the plan's per-key-row padding bias. A row with no allowed key
    (cross attention: a query beyond its keys' window) ends uniform over masked keys; zeroing
    the mask afterwards makes it 0 like the reference (its padding keys have v = 0)."""
    if p.tril is not None or p.triu is not None:
        s.add_(_mask_bias(p.rows, p.keys, p.tril, p.triu, s.dtype))
    if p.pad_keys:
        s.add_(key_bias.as_strided((p.batch, 1, p.keys), (p.k_stride, 0, 1), p.k_start))
    # In place: the CPU softmax kernel reads each row before writing it (contiguous rows only).
    _aten._softmax.out(s, -1, False, out=s)
    return zero_masked_(s, p)


def key_padding_bias(side: Side, dtype: torch.dtype) -> Tensor:
    """(rows,) 0 for real key rows, masked_score() for padding rows."""
    return torch.zeros(side.rows, dtype=dtype).masked_fill_(side.gather == side.scatter.numel(), masked_score(dtype))


def queries(buf: Tensor, p: Piece) -> Tensor:
    """The piece's query-side view (batch, rows, D) of a padded (rows, D) buffer."""
    D = buf.shape[-1]
    return buf.as_strided((p.batch, p.rows, D), (p.q_stride * D, D, 1), p.q_start * D)


def keys(buf: Tensor, p: Piece) -> Tensor:
    """The piece's key-side view (batch, keys, D)."""
    D = buf.shape[-1]
    return buf.as_strided((p.batch, p.keys, D), (p.k_stride * D, D, 1), p.k_start * D)


def pad(x: Tensor, side: Side, dtype: torch.dtype, scale: float = 1.0) -> Tensor:
    """Jagged x (T, H, D) -> the padded (side.rows, D) buffer in `dtype`, times `scale`."""
    flat = x.new_empty((x.shape[0] * x.shape[1] + 1, x.shape[2]), dtype=dtype)
    flat[-1].zero_()
    rows = flat[:-1].view(x.shape)   # one pass from any strides (q, k, v are often views of one qkv)
    if scale != 1.0 and x.dtype == dtype:
        torch.mul(x, scale, out=rows)
    else:
        rows.copy_(x)
        if scale != 1.0:
            rows.mul_(scale)
    return flat.index_select(0, side.gather)


def new_padded(side: Side, D: int, like: Tensor, dtype: torch.dtype, written: bool) -> Tensor:
    """A padded result buffer with one extra zero row at the end (read by `unpad` for
    jagged rows that are in no bucket). `written`: the plan's writing pieces cover every
    row (Plan.q_written / k_written), so only that extra row is zeroed; else all rows are."""
    if not written:
        return like.new_zeros((side.rows + 1, D), dtype=dtype)
    buf = like.new_empty((side.rows + 1, D), dtype=dtype)
    buf[-1].zero_()
    return buf


def unpad(buf: Tensor, side: Side, like: Tensor, scale: float = 1.0) -> Tensor:
    """A padded (side.rows + 1, D) buffer -> jagged, shaped and typed like `like`."""
    out = buf.index_select(0, side.scatter)
    if scale != 1.0:
        out.mul_(scale)
    return out.view(like.shape).to(like.dtype)


def compute_dtype(x: Tensor) -> torch.dtype:
    """float32 for half-precision inputs (see cpu_jagged's docstring), else x's dtype."""
    return torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
