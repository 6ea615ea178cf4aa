"""Shared helpers for the attention kernel tests: jagged batches with skewed lengths
(hypothesis strategies), running a kernel forward and backward, and comparing to reference."""
from __future__ import annotations

import torch
from hypothesis import strategies as st

from gemref.attention import ACTIVATIONS, gdpa
from gemref.data.jagged import lengths_to_offsets

# Skewed: mostly short sequences (including empty and length-1 ones), now and then a long one.
LENGTH = st.one_of(st.sampled_from([0, 1, 1, 2, 3, 5]), st.integers(0, 40))


@st.composite
def attention_case(draw, max_batch: int = 5, cross: bool | None = None) -> dict:
    """One GDPA problem: lengths, mask, activation, scales (self or cross attention)."""
    B = draw(st.integers(1, max_batch))
    q_lens = draw(st.lists(LENGTH, min_size=B, max_size=B))
    cross = draw(st.booleans()) if cross is None else cross
    kv_lens = draw(st.lists(LENGTH, min_size=B, max_size=B)) if cross else q_lens
    causal = False if cross else draw(st.booleans())
    return {
        "q_lens": q_lens, "kv_lens": kv_lens, "cross": cross, "causal": causal,
        "window": draw(st.one_of(st.none(), st.integers(1, 12))),
        "activation": draw(st.sampled_from(ACTIVATIONS)),
        "heads": draw(st.integers(1, 2)),
        "qk_scale": draw(st.sampled_from([None, 0.3])),
        "out_scale": draw(st.sampled_from([1.0, 0.5])),
        "seed": draw(st.integers(0, 2 ** 16)),
    }


def make_inputs(case: dict, head_dim: int, dtype: torch.dtype, device: str):
    """q, k, v (leaf tensors requiring grad), the output gradient, q and kv offsets."""
    gen = torch.Generator().manual_seed(case["seed"])
    q_off = lengths_to_offsets(torch.tensor(case["q_lens"], dtype=torch.int64))
    kv_off = lengths_to_offsets(torch.tensor(case["kv_lens"], dtype=torch.int64)) if case["cross"] else q_off
    H = case["heads"]
    q = torch.randn(int(q_off[-1]), H, head_dim, generator=gen, dtype=torch.float64)
    k = torch.randn(int(kv_off[-1]), H, head_dim, generator=gen, dtype=torch.float64)
    v = torch.randn(int(kv_off[-1]), H, head_dim, generator=gen, dtype=torch.float64)
    grad = torch.randn(q.shape, generator=gen, dtype=torch.float64)
    leaves = [x.to(device, dtype).requires_grad_(True) for x in (q, k, v)]
    q_off, kv_off = q_off.to(device), (kv_off.to(device) if case["cross"] else None)
    return leaves, grad.to(device, dtype), q_off, kv_off


def run(kernel: str, case: dict, leaves, grad, q_off, kv_off) -> list[torch.Tensor]:
    """[out, dq, dk, dv] of one kernel on the given inputs."""
    out = gdpa(*leaves, q_off, kv_offsets=kv_off, activation=case["activation"],
               causal=case["causal"], window=case["window"], qk_scale=case["qk_scale"],
               out_scale=case["out_scale"], kernel=kernel)
    grads = torch.autograd.grad(out, leaves, grad, allow_unused=False)
    return [out.detach(), *grads]


def reference_results(case: dict, head_dim: int, device: str = "cpu") -> list[torch.Tensor]:
    """The reference kernel in float64 on CPU: the ground truth."""
    leaves, grad, q_off, kv_off = make_inputs(case, head_dim, torch.float64, "cpu")
    return run("reference", case, leaves, grad, q_off, kv_off)


def assert_matches(actual: list[torch.Tensor], expected: list[torch.Tensor], rel: float, what: str) -> None:
    """Max abs error of each of out, dq, dk, dv within `rel` of that tensor's largest entry."""
    for name, a, e in zip(("out", "dq", "dk", "dv"), actual, expected):
        a = a.detach().to("cpu", torch.float64)
        assert a.shape == e.shape, (what, name, a.shape, e.shape)
        assert torch.isfinite(a).all(), f"{what}: {name} has non-finite entries"
        err = float((a - e).abs().max()) if a.numel() else 0.0
        scale = max(1.0, float(e.abs().max()) if e.numel() else 0.0)
        assert err <= rel * scale, f"{what}: {name} max error {err:.3g} > {rel} x {scale:.3g}"
