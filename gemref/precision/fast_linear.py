"""nn.Linear on the fastest fp32 CPU GEMM path: the model's own GEMMs run where the peak
probe (gemref/mfu/peak.py) says this CPU is fastest.

On x86 wheels F.linear runs MKL sgemm, which takes its AVX2 code on AMD CPUs; oneDNN's
matmul (torch.ops.mkldnn._linear_pointwise) uses AVX-512 and can be faster. A Linear has
three GEMMs (gemref/mfu/gemm_paths.py ROLES: forward y = x W^T, grad_input g W, grad_weight
g^T x); `FastLinear` runs each on the path its plan names, through two custom ops
(`fast_linear`: fastlinear::forward with an autograd formula calling fastlinear::backward for
the grad GEMMs), which torch.compile keeps as calls, so compiled regions run the same GEMMs.
The plan is per (in_features, out_features) and per role:

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
non-CPU tensors, tensor subclasses (DTensor, in eager mode), CPU autocast on, an empty batch. Results equal F.linear
within fp32 tolerance, not bitwise (a different summation order); tests/test_fast_linear.py checks
forward and backward on random shapes.
"""
from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.flop_counter import register_flop_formula

from ..env import CPU_GEMM_MODES, env_choice
from ..mfu.cpu_probe import CONTENDED_BELOW
from ..mfu.gemm_paths import MODEL_PATHS, ROLES, check_fp32, linear_gemm, role_operands
from ..mfu.peak import cache_key, key_fields, read_cache, write_cache_entry

ENV = "GEMREF_CPU_GEMM"
MODES = CPU_GEMM_MODES
SAMPLES = 5
MARGIN = 0.05            # onednn must be this much faster (median) to replace blas for a role
MAX_CALL_FLOPS = 0.25e9
Plan = tuple[str, str, str]      # path per ROLES entry


def gemm_mode() -> str:
    return env_choice(ENV, MODES, "auto")


def _plan_text(plan: Plan) -> str:
    return "/".join(plan)


@torch.library.custom_op("fastlinear::forward", mutates_args=())
def _forward(x: Tensor, weight: Tensor, bias: Tensor | None, plan: str) -> Tensor:
    """y = x W^T + b for a 2-D x, the GEMM on the plan's forward path."""
    return linear_gemm(plan.split("/")[0], "forward", x, weight, bias)


@_forward.register_fake
def _(x, weight, bias, plan):
    return x.new_empty(x.shape[0], weight.shape[0])


@torch.library.custom_op("fastlinear::backward", mutates_args=())
def _backward(g: Tensor, x: Tensor, weight: Tensor, plan: str, need_x: bool) -> tuple[Tensor, Tensor]:
    """(grad_x = g W, grad_W = g^T x), each GEMM on the plan's path for its role; grad_x is an
    empty tensor when the input needs no gradient (its GEMM is not run)."""
    paths = plan.split("/")
    g = g.contiguous()
    grad_x = linear_gemm(paths[1], "grad_input", g, weight) if need_x else g.new_empty(0)
    return grad_x, linear_gemm(paths[2], "grad_weight", g, x)


@_backward.register_fake
def _(g, x, weight, plan, need_x):
    return g.new_empty(x.shape if need_x else (0,)), g.new_empty(weight.shape)


def _setup_context(ctx, inputs, output):
    x, weight, bias, plan = inputs
    ctx.save_for_backward(x, weight)
    ctx.plan, ctx.has_bias = plan, bias is not None


def _autograd(ctx, grad_out):
    x, weight = ctx.saved_tensors
    need_x = ctx.needs_input_grad[0]
    grad_x, grad_w = _backward(grad_out, x, weight, ctx.plan, need_x)
    return grad_x if need_x else None, grad_w, grad_out.sum(0) if ctx.has_bias else None, None


_forward.register_autograd(_autograd, setup_context=_setup_context)


# FlopCounterMode sees the custom ops, not the GEMMs inside them: their formulas (2 M K N per GEMM).
@register_flop_formula(torch.ops.fastlinear.forward)
def _forward_flops(x_shape, w_shape, *args, **kwargs) -> int:
    return 2 * x_shape[0] * x_shape[1] * w_shape[0]


@register_flop_formula(torch.ops.fastlinear.backward)
def _backward_flops(g_shape, x_shape, w_shape, plan, need_x, *args, **kwargs) -> int:
    return (1 + bool(need_x)) * 2 * g_shape[0] * x_shape[1] * w_shape[0]    # grad_W = g^T x, and grad_x = g W


def fast_linear(x: Tensor, weight: Tensor, bias: Tensor | None, plan: Plan) -> Tensor:
    """y = x W^T + b with each of the three GEMMs on the path `plan` names (any leading dims).

    The forward and the two grad GEMMs are custom ops (fastlinear::forward / ::backward):
    eager autograd and torch.compile alike call them, so a compiled region keeps its GEMMs on
    the measured path while inductor fuses the element-wise work around them (inductor's own
    lowering of a Linear is a BLAS mm). The CPU profiler records no event for the oneDNN op
    inside, so an op's self time is its GEMM (gemref/mfu/op_classes.py counts it as one)."""
    y = _forward(x.reshape(-1, x.shape[-1]), weight, bias, _plan_text(plan))
    # A 2-D input keeps the op's own tensor: reshaping it would return a view, and FSDP2 warns
    # ("returned a view tensor") when a sharded module's output is one (the heads).
    return y if x.dim() == 2 else y.reshape(*x.shape[:-1], weight.shape[0])


def _fast_path_applies(x: Tensor, weight: Tensor) -> bool:
    """CPU fp32 without autocast; eagerly also plain tensors (not DTensor) and a non-empty x.
    While torch.compile traces, the tensors are fake and dim 0 is symbolic: dtype, device and
    autocast decide, and the op itself sends an empty operand to BLAS."""
    plain = x.device.type == "cpu" and x.dtype == weight.dtype == torch.float32 and x.dim() >= 1 \
        and not torch.is_autocast_enabled("cpu")
    if torch.compiler.is_compiling():
        return plain
    return plain and type(x) is Tensor and type(weight) is nn.Parameter and x.numel() > 0


class FastLinear(nn.Linear):
    """nn.Linear whose GEMMs follow `plan` (same parameters, same state_dict)."""

    plan: Plan = ("blas", "blas", "blas")

    def forward(self, x: Tensor) -> Tensor:
        if self.plan == ("blas",) * 3 or not _fast_path_applies(x, self.weight):
            return F.linear(x, self.weight, self.bias)
        return fast_linear(x, self.weight, self.bias, self.plan)

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
