"""The GEMM paths torch's CPU build offers, one definition each, shared by the peak probe and
the probe of a profiled step's GEMM shapes (gemref/mfu/cpu_probe.py `probe`, `probe_gemm`) and
the model's fast Linear (gemref/precision/fast_linear.py), so the peak is measured on exactly
the code the model can run.

Paths (all compute Y = X @ W^T for X (M, K), W (N, K), in and out in the probed dtype; fp32
takes every path below, bf16 the first four, `probe_paths`: in bf16 torch.mm and oneDNN run
oneDNN's bf16 kernels, on AMX tiles where the CPU has them, else AVX512-BF16 `vdpbf16ps`, else
bf16 converted to fp32 FMAs):
  blas           torch.mm -> aten's BLAS (MKL sgemm in the x86 wheels; MKL takes its AVX2
                 code on AMD CPUs). This is what F.linear / nn.Linear run by default.
  onednn         torch.ops.mkldnn._linear_pointwise on plain strided tensors: oneDNN's
                 matmul primitive (AVX-512 where the CPU has it), weight used as is.
  onednn_packed  the same op with the weight reordered once into oneDNN's blocked layout
                 (mkldnn._reorder_linear_weight): the frozen-weight inference pattern.
  onednn_layout  aten mkldnn_linear on tensors converted to the opaque mkldnn layout
                 (Tensor.to_mkldnn), conversion outside the timed call.
  mkl_packed     MKL's packed sgemm (mkl._mkl_reorder_linear_weight + mkl._mkl_linear).
  mm_onednn_fpmath  torch.mm with torch.backends.mkldnn.matmul.fp32_precision = "bf16":
                 aten then routes fp32 mm to oneDNN with bf16 "fpmath" allowed. Where the
                 CPU has bf16 dot-product units that is NOT an fp32 GEMM; `check_fp32`
                 measures it and excludes it if so (on CPUs where oneDNN keeps fp32 it passes).
and, outside the peak probe, for the batched GEMMs of a step (a materialised attention's):
  bmm            torch.bmm of X (B, M, K) and W (B, N, K) transposed (BATCHED_PATH): the aten
                 op the step itself ran, so it is timed without the check below.

A path exists only if the ops exist in this torch build (`available`). Every candidate is
checked against an fp64 GEMM of the same (dtype-rounded) operands (`check_path`) before it is
timed or used: an fp32 path must be fp32-exact, a bf16 path must compute the GEMM to bf16's
output rounding.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator

import torch
from torch import Tensor

from .row_blocks import blocked_reduction, blocked_rows

PROBE_PATHS = ("blas", "onednn", "onednn_packed", "onednn_layout", "mkl_packed", "mm_onednn_fpmath")
BF16_PROBE_PATHS = ("blas", "onednn", "onednn_packed", "onednn_layout")   # MKL's packed sgemm is fp32 only
BATCHED_PATH = "bmm"                 # the one path of a batched GEMM (not a peak probe path)
MODEL_PATHS = ("blas", "onednn")     # the paths a training Linear can use (its weight changes)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
# relative Frobenius error vs fp64 of the same operands: fp32 GEMMs land ~1e-7; a bf16 GEMM
# with fp32 accumulation lands at its output's rounding, ~2e-3 (2^-9 relative per element)
TOLERANCE = {"fp32": 1e-5, "bf16": 1e-2}
FP32_TOLERANCE = TOLERANCE["fp32"]


def probe_paths(dtype: str) -> tuple[str, ...]:
    """The paths the peak probe times in `dtype` ("fp32" or "bf16")."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r}; CPU GEMM paths exist for: {', '.join(DTYPES)}")
    return PROBE_PATHS if dtype == "fp32" else BF16_PROBE_PATHS


def _has(namespace: str, op: str) -> bool:
    try:
        getattr(getattr(torch.ops, namespace), op)
        return True
    except (AttributeError, RuntimeError):
        return False


def available(path: str) -> bool:
    """Whether this torch build has the ops `path` needs."""
    if path == "blas":
        return True
    if not torch.backends.mkldnn.is_available() and path != "mkl_packed":
        return False
    return {"onednn": _has("mkldnn", "_linear_pointwise"),
            "onednn_packed": _has("mkldnn", "_linear_pointwise") and _has("mkldnn", "_reorder_linear_weight"),
            "onednn_layout": hasattr(torch._C._nn, "mkldnn_linear"),
            "mkl_packed": torch.backends.mkl.is_available() and _has("mkl", "_mkl_linear"),
            "mm_onednn_fpmath": hasattr(getattr(torch.backends.mkldnn, "matmul", None), "fp32_precision"),
            }[path]


def onednn_linear(x: Tensor, w: Tensor, bias: Tensor | None = None) -> Tensor:
    """x (M, K) @ w (N, K)^T (+ bias) through oneDNN; strided (e.g. transposed) views accepted."""
    return torch.ops.mkldnn._linear_pointwise(x, w, bias, "none", [], "")


@contextmanager
def _fpmath_bf16() -> Iterator[None]:
    settings = torch.backends.mkldnn.matmul
    old = settings.fp32_precision
    settings.fp32_precision = "bf16"
    try:
        yield
    finally:
        settings.fp32_precision = old


def prepare(path: str, x: Tensor, w: Tensor) -> Callable[[], Tensor]:
    """A zero-argument callable computing x @ w^T on `path`; one-off preparation (weight
    packing, layout conversion) happens here, outside the call that gets timed."""
    if path == "blas":
        wt = w.t()
        return lambda: torch.mm(x, wt)
    if path == "onednn":
        return lambda: onednn_linear(x, w)
    if path == "onednn_packed":
        packed = torch.ops.mkldnn._reorder_linear_weight(w, x.shape[0])
        return lambda: onednn_linear(x, packed)
    if path == "onednn_layout":
        xm, wm = x.to_mkldnn(), w.to_mkldnn()
        return lambda: torch._C._nn.mkldnn_linear(xm, wm)
    if path == "mkl_packed":
        packed = torch.ops.mkl._mkl_reorder_linear_weight(w, x.shape[0])
        return lambda: torch.ops.mkl._mkl_linear(x, packed, w, None, x.shape[0])
    if path == BATCHED_PATH:
        wt = w.transpose(1, 2)
        return lambda: torch.bmm(x, wt)
    if path == "mm_onednn_fpmath":
        wt = w.t()

        def run() -> Tensor:
            with _fpmath_bf16():
                return torch.mm(x, wt)
        return run
    raise ValueError(f"unknown GEMM path {path!r}; valid: {', '.join((*PROBE_PATHS, BATCHED_PATH))}")


def relative_error(path: str, m: int = 96, k: int = 200, n: int = 72, seed: int = 0, dtype: str = "fp32") -> float:
    """||path(x, w) - x @ w^T in fp64|| / ||fp64 result|| on random `dtype` inputs (the fp64
    GEMM takes the same rounded operands: only the GEMM's own error counts)."""
    g = torch.Generator().manual_seed(seed)
    x, w = (torch.randn(*s, generator=g).to(DTYPES[dtype]) for s in ((m, k), (n, k)))
    y = prepare(path, x, w)()
    if y.is_mkldnn:
        y = y.to_dense()
    ref = x.double() @ w.double().t()
    return float((y.double() - ref).norm() / ref.norm())


def check_path(path: str, dtype: str = "fp32") -> tuple[bool, str]:
    """(usable, why not): the path exists here and computes the GEMM to `dtype`'s accuracy."""
    if path not in probe_paths(dtype):
        return False, f"no {dtype} variant"
    if not available(path):
        return False, "not in this torch build"
    try:
        err = relative_error(path, dtype=dtype)
    except RuntimeError as e:       # e.g. an op that exists but rejects this CPU or layout
        return False, f"failed: {str(e).splitlines()[0][:80]}"
    if not err <= TOLERANCE[dtype]:
        return False, f"not {dtype}: relative error {err:.1e} > {TOLERANCE[dtype]:.0e}"
    return True, ""


def check_fp32(path: str) -> tuple[bool, str]:
    """(usable, why not): the path exists here and computes an fp32-accurate GEMM."""
    return check_path(path, "fp32")


def _register_onednn_linear_flops() -> None:
    """FlopCounterMode knows aten.mm/addmm but not oneDNN's linear: count it as the GEMM it is,
    2 * rows * in * out FLOPs, so `gemref flops --verify` sees the GEMMs the fast Linear ran."""
    from torch.utils.flop_counter import register_flop_formula

    if not _has("mkldnn", "_linear_pointwise"):
        return

    @register_flop_formula(torch.ops.mkldnn._linear_pointwise)
    def _flops(x_shape, w_shape, *args, out_shape=None, **kwargs) -> int:
        rows = 1
        for d in x_shape[:-1]:
            rows *= d
        return 2 * rows * x_shape[-1] * w_shape[0]


_register_onednn_linear_flops()


# The three GEMMs of a Linear y = x W^T (x (M, K), W (N, K), grad g (M, N)):
#   forward      y  = x @ W^T    (M, K) x (K, N)
#   grad_input   dx = g @ W      (M, N) x (N, K)
#   grad_weight  dW = g^T @ x    (N, M) x (M, K)
ROLES = ("forward", "grad_input", "grad_weight")


def _row_blocked(path: str, dtype: torch.dtype) -> bool:
    """Whether a Linear's GEMMs on `path` in `dtype` run over fixed row blocks (gemref/mfu/row_blocks.py):
    wherever oneDNN runs them, which builds a primitive per shape: the onednn path, and every
    bf16 GEMM (torch.mm runs bf16 on oneDNN too). MKL's fp32 sgemm needs no blocks."""
    return path == "onednn" or dtype == torch.bfloat16


def linear_gemm(path: str, role: str, a: Tensor, b: Tensor, bias: Tensor | None = None) -> Tensor:
    """One of a Linear's GEMMs on a MODEL_PATHS path. (a, b) = (x, W) for forward,
    (g, W) for grad_input, (g, x) for grad_weight, all 2-D. a is fp32 or bf16; W (and the
    bias) may be fp32 with a bf16 `a` and is then cast to bf16 first (autocast's rule: the
    fp32 master weight, its GEMMs in bf16). Results are in a's dtype, except grad_weight with
    bf16 operands: float32, the row blocks' products summed in fp32 (it is the fp32 master
    weight's gradient). An empty operand runs on blas (oneDNN rejects zero-sized primitives)."""
    if path not in MODEL_PATHS:
        raise ValueError(f"path={path!r}; a Linear can use: {', '.join(MODEL_PATHS)}")
    if role not in ROLES:
        raise ValueError(f"role={role!r}; valid: {', '.join(ROLES)}")
    if a.numel() == 0 or b.numel() == 0:
        path = "blas"
    blocked = _row_blocked(path, a.dtype)
    if role == "grad_weight":
        def product(g: Tensor, x: Tensor) -> Tensor:      # g^T x
            return torch.mm(g.t(), x) if path == "blas" else onednn_linear(g.t(), x.t())
        if blocked:
            return blocked_reduction(product, a, b)
        out = product(a, b)
        return out.float() if a.dtype == torch.bfloat16 else out
    w = b.to(a.dtype)
    # forward: x W^T + bias; grad_input: g W. Both as (rows, W') with W' = W^T or W.
    right = w.t() if role == "forward" else w
    bias = bias.to(a.dtype) if role == "forward" and bias is not None else None

    def rows(x: Tensor, out: Tensor | None = None) -> Tensor:
        if path == "blas":                                # torch.mm/addmm write into `out` themselves
            return torch.mm(x, right, out=out) if bias is None else torch.addmm(bias, x, right, out=out)
        result = onednn_linear(x, right.t(), bias)        # oneDNN's op has no out=: copied in
        return result if out is None else out.copy_(result)
    return blocked_rows(rows, a, right.shape[1]) if blocked else rows(a)


def role_operands(role: str, m: int, k: int, n: int, generator: torch.Generator | None = None,
                  dtype: torch.dtype = torch.float32) -> tuple[Tensor, Tensor]:
    """Random (a, b) for `linear_gemm(path, role, a, b)` of a Linear with K inputs, N outputs, M
    rows: activations and gradients in `dtype`, the weight in fp32 (the master weight)."""
    x, w, g = (torch.randn(*s, generator=generator) for s in ((m, k), (n, k), (m, n)))
    x, g = x.to(dtype), g.to(dtype)
    return {"forward": (x, w), "grad_input": (g, w), "grad_weight": (g, x)}[role]
