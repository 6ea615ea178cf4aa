"""One opaque op per direction: the custom-op scaffolding of the CPU jagged GDPA kernels.

A kernel supplies its two bodies,

    forward(q, k, v, q_offsets, kv_offsets, activation, causal, window, qk_scale, out_scale) -> out
    backward(grad_out, q, k, v, q_offsets, kv_offsets, activation, causal, window, qk_scale,
             out_scale) -> (dq, dk, dv)

(window 0: none), and `JaggedGDPAOps(name, forward, backward)` makes them the torch.library
custom ops gemref::<name>_fwd and gemref::<name>_bwd: fake (meta) implementations, autograd
(only q, k, v and the offsets are saved; the backward recomputes the rest), and each op's body
listed in OPAQUE_BODIES, so that a tool tracing tensors by dispatch can run the body inside
its mode (the CPU memory tracker, gemref/mfu/memory.py, does: the tensors the bodies
allocate count towards the peak). Dispatch-level tools then see one op per direction: torch.compile traces
around it, FlopCounterMode prices it by the formula the kernel registers on `.fwd` / `.bwd`,
AutoAC's save_matmuls checkpointing saves its output. The instance is the kernel's `gdpa`
entry point (gemref/attention/api.py KernelFn).
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor
from torch.utils.flop_counter import register_flop_formula

from ..data.jagged import offsets_to_lengths
from .reference import default_qk_scale


# {custom op: its Python body}, for every op JaggedGDPAOps made (read by gemref/mfu/memory.py).
OPAQUE_BODIES: dict = {}


class JaggedGDPAOps:
    """gemref::<name>_fwd / _bwd from two bodies; calling it runs the forward op (autograd on)."""

    def __init__(self, name: str, forward: Callable[..., Tensor], backward: Callable[..., tuple]):
        self.name = name
        self.fwd = torch.library.custom_op(f"gemref::{name}_fwd", forward, mutates_args=())
        self.bwd = torch.library.custom_op(f"gemref::{name}_bwd", backward, mutates_args=())
        # the bodies return contiguous tensors, whatever the inputs' strides
        self.fwd.register_fake(lambda q, *rest: q.new_empty(q.shape))
        self.bwd.register_fake(lambda grad_out, q, k, v, *rest: (q.new_empty(q.shape), k.new_empty(k.shape),
                                                                 v.new_empty(v.shape)))
        self.fwd.register_autograd(self._backward, setup_context=self._setup_context)
        OPAQUE_BODIES.update({self.fwd: forward, self.bwd: backward})

    def count_flops(self, executed_flops: Callable[..., tuple[int, int]]) -> None:
        """FlopCounterMode prices the two ops by the kernel's formula: `executed_flops(q_lengths,
        kv_lengths, heads, head_dim, causal, window)` -> (forward, backward) FLOPs (window 0: None)."""
        def flops(q: Tensor, q_offsets: Tensor, kv_offsets: Tensor, causal: bool, window: int) -> tuple[int, int]:
            return executed_flops(offsets_to_lengths(q_offsets), offsets_to_lengths(kv_offsets), q.shape[1],
                                  q.shape[2], causal, window or None)

        def fwd(q, k, v, q_offsets, kv_offsets, activation, causal, window, *args, out_val=None, **kwargs) -> int:
            return flops(q, q_offsets, kv_offsets, causal, window)[0]

        def bwd(grad_out, q, k, v, q_offsets, kv_offsets, activation, causal, window, *args, out_val=None,
                **kwargs) -> int:
            return flops(q, q_offsets, kv_offsets, causal, window)[1]

        register_flop_formula(getattr(torch.ops.gemref, f"{self.name}_fwd"), get_raw=True)(fwd)
        register_flop_formula(getattr(torch.ops.gemref, f"{self.name}_bwd"), get_raw=True)(bwd)

    @staticmethod
    def _setup_context(ctx, inputs, output):
        q, k, v, q_offsets, kv_offsets, activation, causal, window, qk_scale, out_scale = inputs
        ctx.save_for_backward(q, k, v, q_offsets, kv_offsets)
        ctx.args = (activation, causal, window, qk_scale, out_scale)

    def _backward(self, ctx, grad_out):
        q, k, v, q_offsets, kv_offsets = ctx.saved_tensors
        dq, dk, dv = self.bwd(grad_out.contiguous(), q, k, v, q_offsets, kv_offsets, *ctx.args)
        return dq, dk, dv, None, None, None, None, None, None, None

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, q_offsets: Tensor, kv_offsets: Tensor, *,
                 activation: str, causal: bool = False, window: int | None = None,
                 qk_scale: float | None = None, out_scale: float = 1.0,
                 max_q: int | None = None, max_kv: int | None = None) -> Tensor:
        """Jagged GDPA, q (Tq, H, D), k/v (Tk, H, D) -> (Tq, H, D)."""
        if qk_scale is None:
            qk_scale = default_qk_scale(q.shape[-1])
        return self.fwd(q, k, v, q_offsets, kv_offsets, activation, causal, window or 0, float(qk_scale),
                        float(out_scale))
