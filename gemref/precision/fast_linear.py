"""nn.Linear on the fastest fp32 CPU GEMM path: the model's own GEMMs run where the peak
probe (gemref/mfu/peak.py) says this CPU is fastest.

On x86 wheels F.linear runs MKL sgemm, which takes its AVX2 code on AMD CPUs; oneDNN's
matmul (torch.ops.mkldnn._linear_pointwise) uses AVX-512 and can be faster. A Linear has
three GEMMs (gemref/mfu/gemm_paths.py ROLES: forward y = x W^T, grad_input g W, grad_weight
g^T x); `FastLinear` runs each on the path its plan names, through `FastLinearFunction`, a
custom autograd.Function whose backward calls the same two paths for the grad GEMMs. The
plan is per (in_features, out_features) and per role:

  GEMREF_CPU_GEMM=auto    (default) measured at start-up: blas vs onednn, interleaved
                          (A B A B), median of `SAMPLES`, at `rows` rows (capped so one call
                          stays under ~0.25 GFLOP); onednn wins a role if > 5% faster. Cached beside the
                          peak probe (same file, same CPU/threads/torch key) when the process
                          got >= 90% of its cores; onednn is only a candidate if it passes
                          gemm_paths.check_fp32 on this machine.
  GEMREF_CPU_GEMM=onednn  every GEMM on oneDNN (no measurement).
  GEMREF_CPU_GEMM=blas    off: the model keeps plain nn.Linear.

`use_fastest_cpu_gemms(model, device)` applies it; it does nothing on CUDA (or any non-CPU
device) and leaves Linear subclasses (float8/MX layers of gemref/precision) alone. At call
time FastLinear falls back to F.linear whenever the fast path does not apply: non-fp32 or
non-CPU tensors, tensor subclasses (DTensor), CPU autocast on, an empty batch, or
torch.compile tracing (inductor then picks its own GEMM lowering). Results equal F.linear
within fp32 tolerance, not bitwise (a different summation order); tests/test_fast_linear.py checks
forward and backward on random shapes.
"""
from __future__ import annotations

import os
import statistics
import time

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..mfu.cpu_probe import CONTENDED_BELOW
from ..mfu.gemm_paths import MODEL_PATHS, ROLES, check_fp32, linear_gemm, role_operands
from ..mfu.peak import cache_key, key_fields, read_cache, write_cache_entry

ENV = "GEMREF_CPU_GEMM"
MODES = ("auto", "blas", "onednn")
SAMPLES = 5
MARGIN = 0.05            # onednn must be this much faster (median) to replace blas for a role
MAX_CALL_FLOPS = 0.25e9
Plan = tuple[str, str, str]      # path per ROLES entry


def gemm_mode() -> str:
    mode = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if mode not in MODES:
        raise ValueError(f"{ENV}={mode!r}; valid: {', '.join(MODES)}")
    return mode


class FastLinearFunction(torch.autograd.Function):
    """y = x W^T + b with each of the three GEMMs on the path `plan` names."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor | None, plan: Plan) -> Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        ctx.save_for_backward(x2, weight)
        ctx.plan, ctx.x_shape, ctx.has_bias = plan, x.shape, bias is not None
        y = linear_gemm(plan[0], "forward", x2, weight, bias)
        # A 2-D input keeps the GEMM's own tensor: reshaping it would return a view, and FSDP2
        # warns ("returned a view tensor") when a sharded module's output is one (the heads).
        return y if x.dim() == 2 else y.reshape(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        x2, weight = ctx.saved_tensors
        g = grad_out.reshape(-1, grad_out.shape[-1]).contiguous()
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = linear_gemm(ctx.plan[1], "grad_input", g, weight).reshape(ctx.x_shape)
        if ctx.needs_input_grad[1]:
            grad_w = linear_gemm(ctx.plan[2], "grad_weight", g, x2)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = g.sum(0)
        return grad_x, grad_w, grad_b, None


def _fast_path_applies(x: Tensor, weight: Tensor) -> bool:
    return (not torch.compiler.is_compiling() and type(x) is Tensor and type(weight) is nn.Parameter
            and x.device.type == "cpu" and x.dtype == weight.dtype == torch.float32
            and x.numel() > 0 and x.dim() >= 1 and not torch.is_autocast_enabled("cpu"))


class FastLinear(nn.Linear):
    """nn.Linear whose GEMMs follow `plan` (same parameters, same state_dict)."""

    plan: Plan = ("blas", "blas", "blas")

    def forward(self, x: Tensor) -> Tensor:
        if self.plan == ("blas",) * 3 or not _fast_path_applies(x, self.weight):
            return F.linear(x, self.weight, self.bias)
        return FastLinearFunction.apply(x, self.weight, self.bias, self.plan)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", plan={'/'.join(self.plan)}"


def _seconds(fn, min_seconds: float = 0.002) -> float:
    calls, t0 = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - t0) < min_seconds or calls == 0:
        fn()
        calls += 1
    return elapsed / calls


def _with_cpu_share(fn):
    """(fn(), process CPU time / (wall time x threads) while it ran)."""
    wall0, cpu0 = time.perf_counter(), time.process_time()
    out = fn()
    return out, (time.process_time() - cpu0) / (max(time.perf_counter() - wall0, 1e-9) * torch.get_num_threads())


def measure_plan(k: int, n: int, rows: int) -> dict:
    """Seconds per call of blas and onednn for each role of a (k -> n) Linear, interleaved
    (A B A B), median of SAMPLES, and the plan they give (`plan_from_timings`)."""
    m = int(max(16, min(rows, MAX_CALL_FLOPS // (2 * k * n))))
    g = torch.Generator().manual_seed(0)
    seconds = {}
    for role in ROLES:
        a, b = role_operands(role, m, k, n, g)
        calls = {p: (lambda p=p: linear_gemm(p, role, a, b)) for p in MODEL_PATHS}
        for fn in calls.values():
            fn()                                           # warm-up (oneDNN primitive creation)
        times = {p: [] for p in MODEL_PATHS}
        for _ in range(SAMPLES):
            for p, fn in calls.items():
                times[p].append(_seconds(fn))
        seconds[role] = {p: statistics.median(t) for p, t in times.items()}
    return {"rows": m, "seconds": seconds, "plan": plan_from_timings(seconds)}


def plan_from_timings(seconds: dict[str, dict[str, float]]) -> list[str]:
    """Per role: onednn where its median is more than MARGIN below blas's, else blas."""
    return ["onednn" if seconds[r]["onednn"] < (1 - MARGIN) * seconds[r]["blas"] else "blas" for r in ROLES]


def choose_plan(k: int, n: int, rows: int = 2048, mode: str | None = None) -> tuple[Plan, dict]:
    """(plan, how it was chosen) for a Linear with k inputs and n outputs."""
    mode = mode or gemm_mode()
    if mode == "blas":
        return ("blas",) * 3, {"mode": mode}
    ok, why = check_fp32("onednn")
    if not ok:
        return ("blas",) * 3, {"mode": mode, "onednn_unusable": why}
    if mode == "onednn":
        return ("onednn",) * 3, {"mode": mode}
    key = cache_key(key_fields()) + f" | linear in={k} out={n} rows={rows}"
    cached = read_cache().get(key)
    if isinstance(cached, dict) and len(cached.get("plan", ())) == 3:
        return tuple(cached["plan"]), dict(cached, mode=mode, origin="cache")
    measured, share = _with_cpu_share(lambda: measure_plan(k, n, rows))
    measured["cpu_share"] = share
    if share >= CONTENDED_BELOW:
        write_cache_entry(key, measured)
    return tuple(measured["plan"]), dict(measured, mode=mode, origin="measured now" + (
        "" if share >= CONTENDED_BELOW else " (contended: not cached)"))


def use_fastest_cpu_gemms(model: nn.Module, device: torch.device | str, rows: int = 2048) -> dict:
    """Put every plain fp32 nn.Linear of `model` on its fastest CPU path (see the module
    docstring); returns what was chosen per (in, out) shape. No-op off CPU or with
    GEMREF_CPU_GEMM=blas."""
    if torch.device(device).type != "cpu":
        return {"mode": "off (not a CPU)", "device": str(device), "layers": 0, "shapes": []}
    mode = gemm_mode()
    if mode == "blas":
        return {"mode": mode, "device": str(device), "layers": 0, "shapes": []}
    linears = [m for m in model.modules() if type(m) is nn.Linear and m.weight.dtype == torch.float32]
    plans = {}
    for lin in linears:
        shape = (lin.in_features, lin.out_features)
        if shape not in plans:
            plans[shape] = choose_plan(*shape, rows=rows, mode=mode)
        lin.__class__ = FastLinear            # same object, parameters and hooks; new forward
        lin.plan = plans[shape][0]
    shapes = [{"in": k, "out": n, **dict(zip(ROLES, plan)), "origin": how.get("origin", mode)}
              for (k, n), (plan, how) in plans.items()]
    return {"mode": mode, "device": str(device), "layers": len(linears), "shapes": shapes}
