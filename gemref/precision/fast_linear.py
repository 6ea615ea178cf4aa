"""nn.Linear on the fastest CPU GEMM path for its dtype: the model's own GEMMs run where a
measurement says this CPU is fastest, in fp32 and, under bf16 autocast, in bf16.

On x86 wheels F.linear runs MKL sgemm in fp32, which takes its AVX2 code on AMD CPUs; oneDNN's
matmul (torch.ops.mkldnn._linear_pointwise) uses AVX-512 and can be faster. In bf16 both
torch.mm and oneDNN's linear run oneDNN kernels (AMX tiles where the CPU has them). A Linear
has three GEMMs (gemref/mfu/gemm_paths.py ROLES: forward y = x W^T, grad_input g W,
grad_weight g^T x); `FastLinear` runs each on the path its plan names, through two custom ops
(`fast_linear`: fastlinear::forward with an autograd formula calling fastlinear::backward for
the grad GEMMs), which torch.compile keeps as calls, so compiled regions run the same GEMMs.
Wherever oneDNN runs them, the GEMMs go over row blocks of a few fixed sizes
(gemref/mfu/row_blocks.py): oneDNN builds a primitive per shape, and a jagged batch has a new
token count every step.

bf16 (the precision switch's "bf16", autocast with fp32 master weights): the layer casts its
input to bf16 and its fp32 weight to bf16 inside the op (autocast's rule), returns bf16, and
hands the fp32 weight an fp32 gradient (bf16 products of each row block, summed in fp32).
Plans are per (in_features, out_features, dtype) and per role:

  GEMREF_CPU_GEMM=auto    (default) measured at start-up: blas vs onednn, interleaved
                          (A B A B), median of `SAMPLES`, at `rows` rows (capped so one call
                          stays under ~0.25 GFLOP); onednn wins a role if > 5% faster. Cached beside the
                          peak probe (same file, same CPU/threads/torch key) when the process
                          got >= 90% of its cores; onednn is only a candidate if it passes
                          gemm_paths.check_path in that dtype on this machine.
  GEMREF_CPU_GEMM=onednn  every GEMM on oneDNN (no measurement).
  GEMREF_CPU_GEMM=blas    off: the model keeps plain nn.Linear (bf16 then runs autocast's own
                          F.linear, one oneDNN primitive per new row count).

`use_fastest_cpu_gemms(model, device, dtype)` applies it for the dtype the GEMMs will run in;
it does nothing on CUDA (or any non-CPU device) and leaves Linear subclasses (float8/MX layers
of gemref/precision) alone. At call time FastLinear falls back to F.linear whenever its plan
does not apply: a non-CPU tensor, tensor subclasses (DTensor, in eager mode), an empty batch,
or a dtype other than the plan's (fp32 plans run without autocast, bf16 plans under CPU bf16
autocast). Results equal F.linear within the dtype's tolerance, not bitwise (a different
summation order); tests/test_fast_linear.py checks forward and backward on random shapes.
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
from ..mfu.gemm_paths import DTYPES, MODEL_PATHS, ROLES, check_path, linear_gemm, role_operands
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


def forward_gemm(x: Tensor, weight: Tensor, bias: Tensor | None, plan: str) -> Tensor:
    """y = x W^T + b for a 2-D x, the GEMM on the plan's forward path, in x's dtype (the
    weight and bias cast to it)."""
    return linear_gemm(plan.split("/")[0], "forward", x, weight, bias)


def backward_gemms(g: Tensor, x: Tensor, weight: Tensor, plan: str, need_x: bool) -> tuple[Tensor, Tensor]:
    """(grad_x = g W in g's dtype, grad_W = g^T x in the weight's dtype), each GEMM on the plan's
    path for its role; grad_x is an empty tensor when the input needs no gradient (its GEMM is
    not run)."""
    paths = plan.split("/")
    g = g.contiguous()
    grad_x = linear_gemm(paths[1], "grad_input", g, weight) if need_x else g.new_empty(0)
    return grad_x, linear_gemm(paths[2], "grad_weight", g, x).to(weight.dtype)


@torch.library.custom_op("fastlinear::forward", mutates_args=())
def _forward(x: Tensor, weight: Tensor, bias: Tensor | None, plan: str) -> Tensor:
    """forward_gemm as an op torch.compile keeps as a call."""
    return forward_gemm(x, weight, bias, plan)


@_forward.register_fake
def _(x, weight, bias, plan):
    return x.new_empty(x.shape[0], weight.shape[0])


@torch.library.custom_op("fastlinear::backward", mutates_args=())
def _backward(g: Tensor, x: Tensor, weight: Tensor, plan: str, need_x: bool) -> tuple[Tensor, Tensor]:
    """backward_gemms as an op torch.compile keeps as a call."""
    return backward_gemms(g, x, weight, plan, need_x)


@_backward.register_fake
def _(g, x, weight, plan, need_x):
    return g.new_empty(x.shape if need_x else (0,)), weight.new_empty(weight.shape)


def _setup_context(ctx, inputs, output):
    x, weight, bias, plan = inputs
    ctx.save_for_backward(x, weight)
    ctx.plan, ctx.has_bias = plan, bias is not None


def _grads(ctx, grad_out, backward):
    """(grad_x, grad_W, grad_b, None) of fast_linear from `backward` (the op or its plain body)."""
    x, weight = ctx.saved_tensors
    need_x = ctx.needs_input_grad[0]
    grad_x, grad_w = backward(grad_out, x, weight, ctx.plan, need_x)
    # the bias gradient sums in grad_out's dtype (fp32 accumulation inside aten's CPU sum), cast after:
    # sum(dtype=float32) on a bf16 grad converts the whole (M, N) grad first (3.7x the time at
    # 9078 x 192 on a Xeon, one thread); autocast's own F.linear backward also sums in bf16
    grad_b = grad_out.sum(0).to(weight.dtype) if ctx.has_bias else None
    return grad_x if need_x else None, grad_w, grad_b, None


_forward.register_autograd(lambda ctx, grad_out: _grads(ctx, grad_out, _backward), setup_context=_setup_context)


class FastLinearFunction(torch.autograd.Function):
    """fast_linear's eager path: the same GEMM functions as the custom ops, without the custom
    ops' dispatch (measured on a Xeon, one thread, bf16 at 64 rows: 175 us per forward and
    backward against 265 us through the ops). A profile shows it as "FastLinearFunction" and
    "FastLinearFunctionBackward", its GEMMs inside as their own events."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor | None, plan: str) -> Tensor:
        _setup_context(ctx, (x, weight, bias, plan), None)
        return forward_gemm(x, weight, bias, plan)

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        return _grads(ctx, grad_out, backward_gemms)


# Where the custom ops run (compiled regions), FlopCounterMode sees them, not the GEMMs inside:
# their formulas (2 M K N per GEMM). Eagerly it sees the GEMM ops FastLinearFunction runs.
@register_flop_formula(torch.ops.fastlinear.forward)
def _forward_flops(x_shape, w_shape, *args, **kwargs) -> int:
    return 2 * x_shape[0] * x_shape[1] * w_shape[0]


@register_flop_formula(torch.ops.fastlinear.backward)
def _backward_flops(g_shape, x_shape, w_shape, plan, need_x, *args, **kwargs) -> int:
    return (1 + bool(need_x)) * 2 * g_shape[0] * x_shape[1] * w_shape[0]    # grad_W = g^T x, and grad_x = g W


def fast_linear(x: Tensor, weight: Tensor, bias: Tensor | None, plan: Plan) -> Tensor:
    """y = x W^T + b with each of the three GEMMs on the path `plan` names (any leading dims).

    While torch.compile traces, the forward and the two grad GEMMs are custom ops
    (fastlinear::forward / ::backward), so a compiled region keeps its GEMMs on the measured
    path while inductor fuses the element-wise work around them (inductor's own lowering of a
    Linear is a BLAS mm); eagerly the same GEMM functions run under FastLinearFunction, which
    costs less per call. A profile shows each GEMM inside as its own event (aten::mm or
    mkldnn::_linear_pointwise); the wrapper's self time is what the layer costs around its
    GEMMs (gemref/mfu/op_classes.py classes it "other")."""
    op = _forward if torch.compiler.is_compiling() else FastLinearFunction.apply
    y = op(x.reshape(-1, x.shape[-1]), weight, bias, _plan_text(plan))
    # A 2-D input keeps the op's own tensor: reshaping it would return a view, and FSDP2 warns
    # ("returned a view tensor") when a sharded module's output is one (the heads).
    return y if x.dim() == 2 else y.reshape(*x.shape[:-1], weight.shape[0])


def _fast_path_applies(x: Tensor, weight: Tensor, dtype: torch.dtype) -> bool:
    """The plan's dtype is the one this call's GEMMs run in (fp32: no autocast; bf16: CPU bf16
    autocast), on CPU, with an fp32 weight; eagerly also plain tensors (not DTensor) and a
    non-empty x. While torch.compile traces, the tensors are fake and dim 0 is symbolic: dtype,
    device and autocast decide, and the op itself sends an empty operand to BLAS."""
    autocast = torch.is_autocast_enabled("cpu")
    runs_in = torch.get_autocast_dtype("cpu") if autocast else x.dtype
    plain = x.device.type == "cpu" and weight.dtype == torch.float32 and x.dim() >= 1 and runs_in == dtype \
        and x.dtype in (torch.float32, dtype)
    if torch.compiler.is_compiling():
        return plain
    return plain and type(x) is Tensor and type(weight) is nn.Parameter and x.numel() > 0


class FastLinear(nn.Linear):
    """nn.Linear whose GEMMs follow `plan` in `plan_dtype` (same parameters, same state_dict)."""

    plan: Plan = ("blas", "blas", "blas")
    plan_dtype: torch.dtype = torch.float32
    computes_as_linear = True     # same math as nn.Linear: precision/apply.py may convert it back and on

    def forward(self, x: Tensor) -> Tensor:
        if (self.plan == ("blas",) * 3 and self.plan_dtype == torch.float32) or \
                not _fast_path_applies(x, self.weight, self.plan_dtype):
            return F.linear(x, self.weight, self.bias)
        return fast_linear(x.to(self.plan_dtype), self.weight, self.bias, self.plan)

    def extra_repr(self) -> str:
        dtype = str(self.plan_dtype).removeprefix("torch.")
        return super().extra_repr() + f", plan={'/'.join(self.plan)} ({dtype})"


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


def measure_plan(k: int, n: int, rows: int, dtype: str = "fp32") -> dict:
    """Seconds per call of blas and onednn for each role of a (k -> n) Linear whose GEMMs run in
    `dtype`, interleaved (A B A B), median of SAMPLES, and the plan they give (`plan_from_timings`)."""
    m = int(max(16, min(rows, MAX_CALL_FLOPS // (2 * k * n))))
    g = torch.Generator().manual_seed(0)
    seconds = {}
    for role in ROLES:
        a, b = role_operands(role, m, k, n, g, DTYPES[dtype])
        calls = {p: (lambda p=p: linear_gemm(p, role, a, b)) for p in MODEL_PATHS}
        for fn in calls.values():
            fn()                                           # warm-up (oneDNN primitive creation)
        times = {p: [] for p in MODEL_PATHS}
        for _ in range(SAMPLES):
            for p, fn in calls.items():
                times[p].append(_seconds(fn))
        seconds[role] = {p: statistics.median(t) for p, t in times.items()}
    return {"rows": m, "dtype": dtype, "seconds": seconds, "plan": plan_from_timings(seconds)}


def plan_from_timings(seconds: dict[str, dict[str, float]]) -> list[str]:
    """Per role: onednn where its median is more than MARGIN below blas's, else blas."""
    return ["onednn" if seconds[r]["onednn"] < (1 - MARGIN) * seconds[r]["blas"] else "blas" for r in ROLES]


def choose_plan(k: int, n: int, rows: int = 2048, mode: str | None = None, dtype: str = "fp32") -> tuple[Plan, dict]:
    """(plan, how it was chosen) for a Linear with k inputs and n outputs whose GEMMs run in `dtype`."""
    mode = mode or gemm_mode()
    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r}; a Linear's GEMMs can be planned in: {', '.join(DTYPES)}")
    if mode == "blas":
        return ("blas",) * 3, {"mode": mode}
    ok, why = check_path("onednn", dtype)
    if not ok:
        return ("blas",) * 3, {"mode": mode, "onednn_unusable": why}
    if mode == "onednn":
        return ("onednn",) * 3, {"mode": mode}
    suffix = "" if dtype == "fp32" else f" {dtype}"     # fp32 keys as before: their cache entries stay valid
    key = cache_key(key_fields()) + f" | linear in={k} out={n} rows={rows}{suffix}"
    cached = read_cache().get(key)
    if isinstance(cached, dict) and len(cached.get("plan", ())) == 3 and set(cached["plan"]) <= set(MODEL_PATHS):
        return tuple(cached["plan"]), dict(cached, mode=mode, origin="cache")
    measured, share = _with_cpu_share(lambda: measure_plan(k, n, rows, dtype))
    measured["cpu_share"] = share
    if share >= CONTENDED_BELOW:
        write_cache_entry(key, measured)
    return tuple(measured["plan"]), dict(measured, mode=mode, origin="measured now" + (
        "" if share >= CONTENDED_BELOW else " (contended: not cached)"))


def use_fastest_cpu_gemms(model: nn.Module, device: torch.device | str, dtype: str = "fp32",
                          rows: int = 2048) -> dict:
    """Put every plain fp32 nn.Linear of `model` on its fastest CPU path for GEMMs in `dtype`
    ("fp32", or "bf16" for a model that runs under bf16 autocast; see the module docstring);
    returns what was chosen per (in, out) shape. No-op off CPU or with GEMREF_CPU_GEMM=blas."""
    if torch.device(device).type != "cpu":
        return {"mode": "off (not a CPU)", "device": str(device), "dtype": dtype, "layers": 0, "shapes": []}
    mode = gemm_mode()
    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r}; a Linear's GEMMs can be planned in: {', '.join(DTYPES)}")
    if mode == "blas":
        return {"mode": mode, "device": str(device), "dtype": dtype, "layers": 0, "shapes": []}
    linears = [m for m in model.modules() if type(m) is nn.Linear and m.weight.dtype == torch.float32]
    plans = {}
    for lin in linears:
        shape = (lin.in_features, lin.out_features)
        if shape not in plans:
            plans[shape] = choose_plan(*shape, rows=rows, mode=mode, dtype=dtype)
        lin.__class__ = FastLinear            # same object, parameters and hooks; new forward
        lin.plan, lin.plan_dtype = plans[shape][0], DTYPES[dtype]
    shapes = [{"in": k, "out": n, **dict(zip(ROLES, plan)), "origin": how.get("origin", mode)}
              for (k, n), (plan, how) in plans.items()]
    return {"mode": mode, "device": str(device), "dtype": dtype, "layers": len(linears), "shapes": shapes}
