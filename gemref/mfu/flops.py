"""Analytic FLOPs of GEMRef, per component (docs/design.md).

Two numbers are kept apart:
  * model FLOPs: matmul FLOPs of the forward pass over the REAL history lengths, x3 for a
    training step (backward = 2x forward). Attention (gemref/attention/flops.py) counts
    2*H*D per allowed (query, key) pair per matmul, QK^T and PV: causal self-attention of
    length L is L(L+1)/2 pairs, cross attention N * L ("exact" convention, the MFU
    numerator); under a sliding window (`cfg.window` = W) self-attention counts the pairs
    the window allows, sum over positions i of min(i + 1, W), while cross attention stays
    N * L (it never windows). `model_flops(..., convention="palm")` counts the full L^2
    rectangle for causal attention instead (PaLM appendix B, torchtitan), which `gemref flops` shows
    beside it. Embedding lookups, element-wise ops and recomputation are not model FLOPs.
  * executed FLOPs: the matmul FLOPs the kernels really ran for the path that ran: padded
    rows, padded attention tiles, and each op's real backward (e.g. the dense-feature input
    layer has no input gradient, so its backward is 1x, not 2x). `gemref flops --verify`
    checks these against torch's FlopCounterMode, and reports waste = executed - model.

All counts are exact Python ints, in FLOPs (one multiply-add = 2 FLOPs).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Mapping

import torch

from ..attention import KERNELS, attention_model_flops
from ..attention.api import padded_executed_flops
from ..model.config import ModelConfig
from .timing import StepFlops

COMPONENTS = ("sequence_projections", "sequence_attention", "sequence_ffn", "interaction",
              "cross_projections", "cross_attention", "dense_input", "heads", "embeddings")
BLOCK_KINDS = ("sequence", "interaction", "cross")     # the blocks of a layer (gemref/model/blocks.py)
# The components a block's forward runs (for the FLOPs a checkpointed block recomputes).
BLOCK_COMPONENTS = {"sequence": ("sequence_projections", "sequence_attention", "sequence_ffn"),
                    "interaction": ("interaction",),
                    "cross": ("cross_projections", "cross_attention")}


@dataclass
class FlopCount:
    """Forward and backward FLOPs per component (one step over one batch)."""

    forward: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COMPONENTS, 0))
    backward: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COMPONENTS, 0))

    @property
    def total_forward(self) -> int:
        return sum(self.forward.values())

    @property
    def total(self) -> int:
        """FLOPs of one training step (forward + backward)."""
        return self.total_forward + sum(self.backward.values())

    def rows(self) -> list[dict]:
        return [{"component": c, "forward": self.forward[c], "backward": self.backward[c],
                 "train": self.forward[c] + self.backward[c]} for c in COMPONENTS]


def _lengths(lengths) -> list[int]:
    return [int(x) for x in (lengths.tolist() if hasattr(lengths, "tolist") else lengths)]


def _linear_terms(cfg: ModelConfig, rows: int, batch: int) -> dict[str, int]:
    """Forward matmul FLOPs of every Linear / einsum, given history rows and batch size."""
    d, N, k, hff, L = cfg.d_model, cfg.n_ns_tokens, cfg.fm_rank, cfg.ffn_mult * cfg.d_model, cfg.n_layers
    return {
        "sequence_projections": L * rows * (2 * d * 3 * d + 2 * d * d),
        "sequence_ffn": L * rows * 3 * 2 * d * hff,
        "interaction": L * batch * (2 * N * k * d * 2 + 2 * N * k * hff + 2 * hff * N * d + 2 * N * N * d),
        "cross_projections": L * (rows * 2 * d * 2 * d + batch * (2 * N * d * d * 2 + 2 * N * d * d)),
        "dense_input": batch * 2 * cfg.n_dense * d,
        "heads": batch * (2 * d * (1 + N) * 2 * d + 2 * 2 * d * 2),
    }


def model_flops(cfg: ModelConfig, lengths, convention: str = "exact") -> FlopCount:
    """Model FLOPs of one training step on a batch with these real history lengths.
    convention: "exact" (MFU; causal L(L+1)/2 pairs) or "palm" (causal counted as L^2)."""
    ls = _lengths(lengths)
    H, D, N, L = cfg.n_heads, cfg.head_dim, cfg.n_ns_tokens, cfg.n_layers
    fwd = dict.fromkeys(COMPONENTS, 0)
    fwd.update(_linear_terms(cfg, rows=sum(ls), batch=len(ls)))
    fwd["sequence_attention"] = L * attention_model_flops(ls, ls, H, D, causal=True, window=cfg.window,
                                                          convention=convention)
    fwd["cross_attention"] = L * attention_model_flops([N] * len(ls), ls, H, D, causal=False, window=None,
                                                       convention=convention)
    return FlopCount(fwd, {c: 2 * v for c, v in fwd.items()})


def executed_flops(cfg: ModelConfig, lengths, *, jagged: bool, kernel: str = "reference",
                   device: torch.device | str = "cpu") -> FlopCount:
    """Matmul FLOPs the model's kernels run for one training step, in the layout that ran.

    `kernel` must be a concrete kernel name (resolve "auto" first with
    gemref.attention.resolve_kernel); the padded layout always runs materialised attention.
    `device` is where the step ran: a kernel's executed work (tiles, buckets) depends on it.
    """
    ls = _lengths(lengths)
    B, H, D, N, L = len(ls), cfg.n_heads, cfg.head_dim, cfg.n_ns_tokens, cfg.n_layers
    lens = torch.tensor(ls, dtype=torch.int64, device=device)
    q_cross = torch.full_like(lens, N)
    if jagged:
        rows, kv = sum(ls), lens
        attn = KERNELS[kernel].executed_flops
    else:
        rows, kv = B * cfg.max_len, torch.full_like(lens, cfg.max_len)
        attn = padded_executed_flops
    fwd = dict.fromkeys(COMPONENTS, 0)
    fwd.update(_linear_terms(cfg, rows=rows, batch=B))
    bwd = {c: 2 * v for c, v in fwd.items()}
    bwd["dense_input"] = fwd["dense_input"]          # raw dense features need no input grad
    self_f, self_b = attn(kv, kv, H, D, True, cfg.window)
    cross_f, cross_b = attn(q_cross, kv, H, D, False, None)
    fwd["sequence_attention"], bwd["sequence_attention"] = L * self_f, L * self_b
    fwd["cross_attention"], bwd["cross_attention"] = L * cross_f, L * cross_b
    return FlopCount(fwd, bwd)


def sample_cost_coefficients(cfg: ModelConfig) -> tuple[int, int, int]:
    """(c0, c1, c2): model FLOPs of one training sample = c0 + c1 * L + c2 * L^2 (jagged, real L;
    exact convention: causal attention's L(L+1)/2 puts half a term into c1).

    The load balancer's cost model (gemref/balance/) uses these. With a sliding window the
    attention cost per sample is no longer quadratic (linear in L beyond W), which a
    quadratic cannot express: the coefficients are those of full causal attention (an upper
    bound that still orders samples by length), whatever `cfg.window` says.
    """
    cfg = replace(cfg, window=None)
    one, two, three = (model_flops(cfg, [n]).total for n in (0, 1, 2))
    c2 = (three - 2 * two + one) // 2
    c1 = two - one - c2
    return one, c1, c2


def count_with_flop_counter(fn) -> int:
    """FLOPs torch's FlopCounterMode sees while running fn() (e.g. one training step)."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        fn()
    return int(counter.get_total_flops())


def block_kind(name: str) -> str:
    """"layers.2.cross" -> "cross"."""
    return name.rsplit(".", 1)[-1]


def recompute_flops(cfg: ModelConfig, lengths, choices: Mapping[str, str], *, jagged: bool,
                    kernel: str = "reference") -> int:
    """Analytic FLOPs a checkpointing plan ({block name: option}, gemref/autoac/)
    recomputes in one training step (executed, not model, FLOPs).

    "full" reruns the block's forward (its components' executed forward FLOPs, per layer) up
    to the last op whose saved tensors backward reads: a non-reentrant checkpoint stops
    recomputing there (early stop), so the FFN down projection of a sequence block and the
    linear-compression einsum that ends an interaction block are not rerun; a cross block
    ends in a gather that saves its index, so all of it is. "save_matmuls" saves every
    FLOP-costing op and recomputes none, "compressed" recomputes nothing either.
    HFU counts these FLOPs as executed; MFU never does.
    """
    ls = _lengths(lengths)
    fwd = executed_flops(cfg, ls, jagged=jagged, kernel=kernel).forward
    rows = sum(ls) if jagged else len(ls) * cfg.max_len
    d, N = cfg.d_model, cfg.n_ns_tokens
    not_rerun = {"sequence": 2 * rows * cfg.ffn_mult * d * d, "interaction": 2 * len(ls) * N * N * d, "cross": 0}
    per_layer = {}
    for kind, components in BLOCK_COMPONENTS.items():
        total = sum(fwd[c] for c in components)
        assert total % cfg.n_layers == 0
        per_layer[kind] = total // cfg.n_layers - not_rerun[kind]
    return sum(per_layer[block_kind(n)] for n, o in choices.items() if o == "full")


def step_flops(cfg: ModelConfig, lengths, *, jagged: bool, kernel: str, ac_choices: Mapping[str, str],
               device: torch.device | str = "cpu") -> StepFlops:
    """The FLOP accounting of one training step, written once: model FLOPs (the MFU numerator),
    executed FLOPs (the path's kernels plus the plan's recompute) and the recompute alone."""
    recompute = recompute_flops(cfg, lengths, ac_choices, jagged=jagged, kernel=kernel) if ac_choices else 0
    executed = executed_flops(cfg, lengths, jagged=jagged, kernel=kernel, device=device).total + recompute
    return StepFlops(model_flops(cfg, lengths).total, executed, recompute)
