"""The step model (step_model.py) against torchtitan's published FSDP scaling, 8 -> 128 H100s.

It is the one published end-to-end measurement of FSDP2 (the sharding gemref's dense layers use)
at two scales on a machine a profile describes: Meta's Grand Teton hosts, 8 H100s on NVLink and
400 Gb/s of RDMA per GPU, i.e. `h100_roce_400` (cost_model.py).

Source: pytorch/torchtitan, its performance page (in docs), Tables 1 and 3 (Liang et al., "TorchTitan:
One-stop PyTorch native solution for production ready LLM pre-training", ICLR 2025). The model is
Llama 3.1 8B, 1D FSDP over every GPU, with local batch 2 x 8,192 tokens and selective activation
checkpointing, and TPS per GPU read at step 90. The page's 256- and 512-GPU rows run tensor and
pipeline parallelism, which the step model does not price, so they are not compared.

Method (`torchtitan_scaling`):
- The FSDP units are torchtitan's: each transformer block, and the root (embedding, final norm,
  output).
- Parameters are all-gathered in bf16. Blocks are gathered again in backward, except the last,
  which stays unsharded after forward. Gradients are reduce-scattered in fp32, torchtitan's
  default `mixed_precision_reduce`.
- Overlap follows FSDP2's prefetch: every block gather but the first, and every block
  reduce-scatter but the last, runs under compute. The root's gather and reduce-scatter, the
  first block's gather and the last block's reduce-scatter are exposed. Collectives hold
  NCCL's SMs (cost_model.sm_share).
- The compute is solved from the published 8-GPU step (step_model.predict_step = the 8-GPU
  step). The same compute with the 128-GPU collectives predicts the 128-GPU step.
- `model_ratio` = TPS per GPU at 128 / at 8, predicted. `error` = model_ratio / published_ratio - 1.
- ASSUMED: the float8 row gathers in bf16 (the page does not say that float8 all-gather was on).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..parallel.config import MeshShape
from .cost_model import get_profile, price_group, sm_share
from .step_model import predict_step

SOURCE = ("pytorch/torchtitan performance page, Tables 1 (8 GPUs) and 3 (128 GPUs): Llama 3.1 8B, 1D FSDP, "
          "local batch 2, seq 8192, selective AC, H100 (Grand Teton, 400 Gb/s RDMA per GPU)")
HARDWARE = "h100_roce_400"
TOKENS_PER_GPU_STEP = 2 * 8192          # local batch 2 x sequence length 8,192


@dataclass(frozen=True)
class DenseShape:
    """A Llama-style decoder's parameter counts per FSDP unit."""

    layers: int
    dim: int
    kv_dim: int           # kv heads x head dim
    ffn: int
    vocab: int

    @property
    def block_params(self) -> int:      # wq, wo (dim x dim), wk, wv (dim x kv_dim), w1, w2, w3, two norms
        return 2 * self.dim * self.dim + 2 * self.dim * self.kv_dim + 3 * self.dim * self.ffn + 2 * self.dim

    @property
    def root_params(self) -> int:       # token embedding, output projection, final norm
        return 2 * self.vocab * self.dim + self.dim

    @property
    def params(self) -> int:
        return self.layers * self.block_params + self.root_params


# Llama 3.1 8B (Meta's params.json): 32 layers, dim 4096, 8 kv heads of 128, FFN 14336, vocab 128256.
LLAMA31_8B = DenseShape(layers=32, dim=4096, kv_dim=8 * 128, ffn=14336, vocab=128256)

# (technique, TPS/GPU at 8 GPUs, TPS/GPU at 128 GPUs), Tables 1 and 3.
TORCHTITAN_FSDP = (("FSDP", 5762, 5605), ("FSDP + torch.compile", 6667, 6514),
                   ("FSDP + torch.compile + Float8", 8532, 8380))


def fsdp_rows(shape: DenseShape, gpus: int, hardware: str = HARDWARE, gather_bytes: int = 2,
              reduce_bytes: int = 4) -> list[dict]:
    """One step's FSDP collectives over `gpus` ranks (one shard group), priced on `hardware`, with
    `overlappable_s` as the module doc says, in step_model's row format."""
    hw, mesh = get_profile(hardware), MeshShape(1, gpus)

    def row(kind, unit, params, nbytes, calls, overlapped):
        cost, tier = price_group(kind, params * nbytes, gpus, "shard", mesh, hw)
        seconds = cost.seconds * calls
        return {"kind": kind, "dim": unit, "count": calls, "bytes": params * nbytes * calls, "tier": tier,
                "algorithm": cost.algorithm, "latency_s": cost.latency_s * calls,
                "bandwidth_s": cost.bandwidth_s * calls, "seconds": seconds,
                "overlappable_s": seconds if overlapped else 0.0, "sm_share": sm_share(kind, hw)}

    block, n = shape.block_params, shape.layers
    return [row("all_gather", "root", shape.root_params, gather_bytes, 1, False),
            row("all_gather", "first block, forward", block, gather_bytes, 1, False),
            row("all_gather", "blocks, forward", block, gather_bytes, n - 1, True),
            row("all_gather", "blocks, backward", block, gather_bytes, n - 1, True),
            row("reduce_scatter", "blocks", block, reduce_bytes, n - 1, True),
            row("reduce_scatter", "last block", block, reduce_bytes, 1, False),
            row("reduce_scatter", "root", shape.root_params, reduce_bytes, 1, False)]


def compute_for_step(step_s: float, rows: list[dict]) -> float:
    """The compute seconds whose predicted step (predict_step, no imbalance) is `step_s`."""
    if predict_step(0.0, 1.0, rows)["step_s"] >= step_s:
        raise ValueError(f"a {step_s:.4f} s step is shorter than its exposed collectives alone")
    lo, hi = 0.0, step_s
    for _ in range(100):                # the step grows with the compute: bisection
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if predict_step(mid, 1.0, rows)["step_s"] < step_s else (lo, mid)
    return (lo + hi) / 2


def torchtitan_scaling(shape: DenseShape = LLAMA31_8B, published=TORCHTITAN_FSDP, small: int = 8,
                       large: int = 128, hardware: str = HARDWARE) -> list[dict]:
    """Per published technique: the measured and predicted TPS-per-GPU ratio, large / small GPUs,
    and the model's error (module doc)."""
    rows_small, rows_large = fsdp_rows(shape, small, hardware), fsdp_rows(shape, large, hardware)
    out = []
    for technique, tps_small, tps_large in published:
        step_small = TOKENS_PER_GPU_STEP / tps_small
        compute = compute_for_step(step_small, rows_small)
        small_step, large_step = predict_step(compute, 1.0, rows_small), predict_step(compute, 1.0, rows_large)
        ratio, model = tps_large / tps_small, small_step["step_s"] / large_step["step_s"]
        out.append({"technique": technique, "gpus_small": small, "gpus_large": large, "published_tps_small": tps_small,
                    "published_tps_large": tps_large, "published_ratio": ratio, "model_ratio": model,
                    "error": model / ratio - 1, "compute_s": compute, "step_small_s": small_step["step_s"],
                    "step_large_s": large_step["step_s"], "exposed_small_s": small_step["exposed_s"],
                    "exposed_large_s": large_step["exposed_s"], "comm_small_s": small_step["comm_s"],
                    "comm_large_s": large_step["comm_s"], "sm_slowdown_small_s": small_step["sm_slowdown_s"],
                    "sm_slowdown_large_s": large_step["sm_slowdown_s"], "source": SOURCE})
    return out
