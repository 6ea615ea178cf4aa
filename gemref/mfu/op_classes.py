"""Which class of work each profiled op or kernel is: GEMM, attention, element-wise, ...

One mapping from torch.profiler event names to the classes of a training step's time, so a
profile reads as "where the step went". Classes:

    gemm           matrix multiplies (aten::mm/addmm/bmm/..., cuBLAS/CUTLASS kernels)
    attention      fused attention kernels: gemref's custom ops (gemref::...), SDPA/Flash/
                   FlexAttention. The materialised attention of the baseline is not one op:
                   it shows as the GEMMs and element-wise ops it is made of.
    elementwise    point-wise, normalisation, activation and reduction ops, Inductor's
                   fused kernels (what torch.compile turns them into; on CPU they record no
                   event of their own, so the self time of the "## Call CompiledFxGraph ##"
                   event that runs a compiled graph is its fused kernels)
    optimizer      everything inside the training step's "optimizer" region (AdamW)
    communication  collectives and the waits on them (c10d, gloo, NCCL)
    other          the rest: embedding lookups, indexing and scatter, copies, layout
                   changes, the autograd engine's and Python's own time

On CPU an event's SELF time is classified (nested ops are not counted twice; `classify_cpu`,
which also takes the profiler's own cost out when told it, and lists the GEMM shapes and the
ops classed other); on CUDA each kernel's device time (`classify_cuda`). Names are matched by
substring, lower-cased. gemref/mfu/op_profile.py turns a profiled step into the one account of
where it went.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

CLASSES = ("gemm", "attention", "elementwise", "optimizer", "communication", "other")
COMPUTE = ("gemm", "attention", "elementwise", "optimizer", "other")   # what a rank computes

_COMM = ("c10d::", "gloo:", "nccl", "record_param_comms", "all_gather", "allgather", "reduce_scatter",
         "all_reduce", "allreduce", "all_to_all", "alltoall", "broadcast", "barrier", "wait_tensor")
_ATTENTION = ("gemref::", "gemref_", "scaled_dot_product", "flash_attention", "efficient_attention",
              "flex_attention", "cudnn_attention", "fmha", "flash_fwd", "flash_bwd", "gdpa", "attn_fwd",
              "attn_bwd")
# gemref's FastLinear ops (gemref/precision/fast_linear.py: fastlinear::forward / ::backward)
# are not GEMMs themselves: their GEMMs are their own events inside them (aten::mm / addmm on
# BLAS, mkldnn::_linear_pointwise on oneDNN, each with its shapes), so the ops' self time is
# what a Linear costs around its GEMMs (custom-op dispatch, row-block bookkeeping in Python),
# classed "other" and listed there by name.
_GEMM = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_addmm_activation", "aten::matmul",
         "aten::linear", "aten::einsum", "aten::mkldnn_", "aten::_mkldnn", "aten::_scaled_mm", "aten::_int_mm",
         "mkldnn::_linear_pointwise", "mkl::_mkl_linear",
         "gemm", "cutlass", "xmma", "cublas", "nvjet", "splitk")
# aten ops by base name (trailing "_" and "_backward" dropped)
_ELEMENTWISE_OPS = {
    "add", "sub", "rsub", "mul", "div", "neg", "abs", "exp", "log", "log1p", "pow", "sqrt", "rsqrt", "reciprocal",
    "silu", "gelu", "relu", "leaky_relu", "sigmoid", "tanh", "threshold", "hardtanh", "clamp", "clamp_min",
    "where", "masked_fill", "lerp", "addcdiv", "addcmul", "fill", "zero", "sum", "mean", "amax", "amin", "max",
    "min", "norm", "native_layer_norm", "layer_norm", "rms_norm", "_fused_rms_norm", "softmax", "_softmax",
    "log_softmax", "_log_softmax", "_softmax_backward_data", "_log_softmax_backward_data", "dropout",
    "native_dropout", "binary_cross_entropy_with_logits", "bitwise_and", "bitwise_or", "bitwise_not",
    "logical_and", "logical_not", "eq", "ne", "gt", "lt", "ge", "le", "sign", "square"}
# device kernels and compiled regions, by substring of the name
_ELEMENTWISE_KERNELS = ("triton_", "cpp_fused", "elementwise", "vectorized", "reduce_kernel", "compiledfunction",
                        "call compiledfxgraph",
                        "torch-compiled region", "layer_norm", "softmax", "silu", "gelu")


OPTIMIZER_REGIONS = ("optimizer", "Optimizer.step#", "Optimizer.zero_grad#")   # the step's label, torch's own


def op_class(name: str, ancestors: tuple[str, ...] | list[str] = ()) -> str:
    """The class of one profiler event by its name and the names of the events enclosing it
    (innermost first): an op inside a fused attention op or inside the optimizer belongs to
    that op's class, whatever it is itself."""
    chain = [name.lower(), *(a.lower() for a in ancestors)]
    if any(p in chain[0] for p in _COMM):
        return "communication"
    if any(p in n for n in chain for p in _ATTENTION):
        return "attention"
    if any(a == "optimizer" or a.startswith(r.lower()) for a in chain for r in OPTIMIZER_REGIONS):
        return "optimizer"
    n = chain[0]
    if any(p in n for p in _GEMM):
        return "gemm"
    if n.startswith("aten::"):
        base = n.removeprefix("aten::").split(".")[0].rstrip("_").removesuffix("_backward")
        return "elementwise" if base in _ELEMENTWISE_OPS else "other"
    return "elementwise" if any(p in n for p in _ELEMENTWISE_KERNELS) else "other"


def ancestors_of(event) -> list[str]:
    """The names of the CPU events enclosing a profiler event, innermost first."""
    out, parent = [], event.cpu_parent
    while parent is not None:
        out.append(parent.name)
        parent = parent.cpu_parent
    return out


def gemm_shape(name: str, shapes: list) -> tuple[int, int, int, int] | None:
    """(batch, M, K, N) of a leaf GEMM op from its recorded input shapes; None for any other op."""
    op = name.split("::")[-1]
    try:
        if op == "mm":
            (m, k), (_, n) = shapes[0], shapes[1]
            return 1, m, k, n
        if op == "_linear_pointwise":            # oneDNN's linear: x (M, K), W (N, K)
            (m, k), (n, _) = shapes[0], shapes[1]
            return 1, m, k, n
        if op == "addmm":
            (m, k), (_, n) = shapes[1], shapes[2]
            return 1, m, k, n
        if op in ("bmm", "baddbmm"):
            (b, m, k), (_, _, n) = shapes[-2:] if op == "bmm" else shapes[1:3]
            return b, m, k, n
    except (ValueError, IndexError, TypeError):
        return None
    return None


def step_events(events) -> list:
    """The events of a CPU profile on the thread that ran the training step (the thread of its
    "optimizer" region; gloo's worker threads move the bytes, the step's thread waits for them)."""
    events = list(events)
    regions = [e for e in events if e.name == "optimizer"]
    if not regions:
        raise ValueError("no 'optimizer' region in the profile: profile whole training steps (train.train_step)")
    return [e for e in events if e.thread == regions[0].thread]


@dataclass
class CpuClasses:
    """A CPU profile's self times by op class (seconds per step)."""

    profiled: dict[str, float]           # as the profiler recorded them
    seconds: dict[str, float]            # each event's share of the profiler's own cost taken out
    gemm_shapes: dict[tuple, dict]       # {(B, M, K, N): {"calls", "seconds"}} of the GEMM ops
    other_ops: dict[str, dict]           # {op name: {"calls", "seconds", "profiled_seconds"}} of the ops classed other


def classify_cpu(events, steps: int = 1, per_boundary: float = 0.0) -> CpuClasses:
    """The one classifier of a CPU profile of `steps` training steps: the self time of every event
    on the step's thread (step_events) to its class (op_class). The profiler's own cost comes out
    event by event: each event gives back `per_boundary` seconds for itself and for each direct
    child (gemref/mfu/op_profile.py estimates it), never going below 0."""
    profiled: dict[str, float] = dict.fromkeys(CLASSES, 0.0)
    seconds: dict[str, float] = dict.fromkeys(CLASSES, 0.0)
    shapes: dict[tuple, dict] = defaultdict(lambda: {"calls": 0.0, "seconds": 0.0})
    other: dict[str, dict] = defaultdict(lambda: {"calls": 0.0, "seconds": 0.0, "profiled_seconds": 0.0})
    for e in step_events(events):
        cls = op_class(e.name, ancestors_of(e))
        s = e.self_cpu_time_total / 1e6
        kept = max(0.0, s - per_boundary * (1 + len(e.cpu_children))) / steps
        profiled[cls] += s / steps
        seconds[cls] += kept
        # a GEMM event wrapping another (autocast's aten::bmm around the kernel's aten::bmm) is not a
        # GEMM of its own: the shape is counted once, at the innermost event
        shape = gemm_shape(e.name, e.input_shapes) if cls == "gemm" and not any(
            gemm_shape(c.name, c.input_shapes) for c in e.cpu_children) else None
        use = shapes[shape] if shape is not None else other[e.name] if cls == "other" else None
        if use is not None:
            use["calls"] += 1 / steps
            use["seconds"] += kept
            if cls == "other":
                use["profiled_seconds"] += s / steps
    return CpuClasses(profiled, seconds, dict(shapes), dict(other))


def classify_cuda(events, steps: int = 1) -> dict[str, float]:
    """Seconds per step by class, from the CUDA kernels of a profile of `steps` steps (device
    time; AdamW's kernels are recognised by name: multi_tensor_apply, adam)."""
    from torch.autograd import DeviceType

    out = dict.fromkeys(CLASSES, 0.0)
    for e in events:
        if e.device_type != DeviceType.CUDA:
            continue
        n = e.name.lower()
        cls = "optimizer" if ("multi_tensor_apply" in n or "adam" in n) else op_class(e.name)
        out[cls] += (e.time_range.end - e.time_range.start) / 1e6 / steps
    return out
