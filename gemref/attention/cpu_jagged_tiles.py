"""In-place tile operations of the `cpu_jagged` kernel (gemref/attention/cpu_jagged.py).

A chunk's score tile (n*H, rows, keys) lives in a workspace reused by every chunk: matmuls
write into it with out=, activations, softmax and masks run in place, and bucket rows are
gathered into / scattered out of zero-padded (n*H, L, D) blocks. Allocating a fresh
multi-MiB tile per chunk costs page faults that on CPU take as long as the matmul itself.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

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


def softmax_(s: Tensor) -> Tensor:
    """Row softmax in place (blocked entries hold the dtype's min, so they become 0)."""
    s.sub_(s.amax(-1, keepdim=True)).exp_()
    return s.div_(s.sum(-1, keepdim=True))


def masked_fill_(x: Tensor, blocked: Tensor | None, n: int, value: float) -> None:
    """Fill the blocked entries of a (n*H, rows, keys) tile; `blocked` broadcasts as (n|1, 1, rows|1, keys)."""
    if blocked is not None:
        x.view(n, -1, *x.shape[1:]).masked_fill_(blocked, value)


class Workspace:
    """Named flat buffers reused across chunks; `take` returns a contiguous view of a prefix.

    Each buffer is allocated once, at the largest size the plan needs (a buffer regrown
    chunk after chunk would briefly hold old and new tiles at once). `tiles` lists every
    chunk as (n*H, query rows, keys)."""

    def __init__(self, like: Tensor, dtype: torch.dtype, tiles: list[tuple[int, int, int]]) -> None:
        self.like, self.dtype, self.buffers = like, dtype, {}
        head_dim = like.shape[-1]
        s = max((nh * rows * keys for nh, rows, keys in tiles), default=0)
        kv = max((nh * keys * head_dim for nh, _, keys in tiles), default=0)
        o = max((nh * rows * head_dim for nh, rows, _ in tiles), default=0)
        self.sizes = {"s": s, "ds": s, "kv": kv, "o": o}

    def take(self, name: str, *shape: int) -> Tensor:
        numel = 1
        for n in shape:
            numel *= n
        if name not in self.buffers:
            self.buffers[name] = self.like.new_empty(self.sizes[name], dtype=self.dtype)
        assert numel <= self.buffers[name].numel(), (name, shape)
        return self.buffers[name][:numel].view(shape)


def compute_dtype(x: Tensor) -> torch.dtype:
    """float32 for half-precision inputs (see cpu_jagged's docstring), else x's dtype."""
    return torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype


def pad(x: Tensor, src: Tensor, dest: Tensor, n: int, length: int, dtype: torch.dtype) -> Tensor:
    """Rows `src` of jagged x (T, H, D) -> zero-padded (n*H, length, D) in `dtype`."""
    H, D = x.shape[1:]
    flat = x.new_zeros((n * length, H, D), dtype=dtype)
    flat[dest] = x[src].to(dtype)
    return flat.view(n, length, H, D).transpose(1, 2).reshape(n * H, length, D)


def unpad_into(target: Tensor, padded: Tensor, src: Tensor, dest: Tensor, n: int) -> None:
    """Inverse of `pad`: write padded (n*H, L, D) rows `dest` into target rows `src`."""
    H, D = target.shape[1:]
    length = padded.shape[1]
    rows = padded.view(n, H, length, D).transpose(1, 2).reshape(n * length, H, D)
    target[src] = rows[dest].to(target.dtype)
