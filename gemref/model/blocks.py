"""The three blocks of a GEM-like layer. None of them knows about parallelism or kernels.

* SequenceBlock: pre-norm causal GDPA self-attention over the user history + a gated FFN
  (HSTU / InterFormer style; pointwise SiLU attention by default, softmax as an option),
  optionally over a sliding window of the last `cfg.window` events.
* InteractionBlock: Wukong-style factorisation-machine interaction over the non-sequence
  tokens (a compressed FM: every token dotted with k learned mixtures of the tokens, then an
  MLP back to tokens) plus a linear-compression branch.
* CrossBlock: InterFormer-style exchange: the non-sequence tokens attend to the history
  (cross GDPA, always the whole history: `cfg.window` does not apply, see gemref/model/config.py), and a
  summary of the non-sequence side joins every history token.

History tokens are (rows, d) in the layout of `SequenceLayout`; non-sequence tokens are
(B, N, d). Each block is wrapped in `torch.profiler.record_function` so a profile shows
where the time goes. The blocks with attention split at it: `project` (dense, before),
the layout's attention call, `mix` (dense, after). torch.compile compiles `project`, `mix`
and the interaction block as regions (gemref/compile/apply.py) while attention runs its own kernels.
"""
from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.profiler import record_function

from .config import ModelConfig
from .layout import SequenceLayout


def region(name: str):
    """`record_function(name)` for the profiler; nothing while torch.compile traces (dynamo
    would drop it anyway, with a warning per compiled region)."""
    return contextlib.nullcontext() if torch.compiler.is_compiling() else record_function(name)


def attention_out_scale(cfg: ModelConfig, window: int | None = None) -> float:
    """Softmax rows are normalised already; pointwise GDPA sums up to max_len terms (up to
    `window` under a sliding window), so (as HSTU does) it is divided by that count, a
    constant, to keep activations O(1)."""
    if cfg.activation == "softmax":
        return 1.0
    return 1.0 / min(cfg.max_len, window or cfg.max_len)


class GatedFFN(nn.Module):
    """x -> W_down(silu(W_gate x) * W_up x), hidden width ffn_mult * d."""

    def __init__(self, d: int, hidden: int):
        super().__init__()
        self.gate = nn.Linear(d, hidden, bias=False)
        self.up = nn.Linear(d, hidden, bias=False)
        self.down = nn.Linear(hidden, d, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


class SequenceBlock(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d = cfg.d_model
        self.cfg = cfg
        self.norm_attn = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.out = nn.Linear(d, d, bias=False)
        self.norm_ffn = nn.LayerNorm(d)
        self.ffn = GatedFFN(d, cfg.ffn_mult * d)

    def forward(self, x: Tensor, layout: SequenceLayout) -> Tensor:
        with region("sequence_block"):
            q, k, v = self.project(x)
            a = layout.self_attention(q, k, v, activation=self.cfg.activation, window=self.cfg.window,
                                      out_scale=attention_out_scale(self.cfg, self.cfg.window))
            return self.mix(x, a)

    def project(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(rows, d) -> q, k, v, each (rows, H, D)."""
        H, D = self.cfg.n_heads, self.cfg.head_dim
        return self.qkv(self.norm_attn(x)).view(-1, 3, H, D).unbind(1)

    def mix(self, x: Tensor, a: Tensor) -> Tensor:
        """Attention output a (rows, H, D) back into the residual stream, then the FFN."""
        x = x + self.out(a.reshape(x.shape))
        return x + self.ffn(self.norm_ffn(x))


class InteractionBlock(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d, N, k = cfg.d_model, cfg.n_ns_tokens, cfg.fm_rank
        self.norm = nn.LayerNorm(d)
        self.compress = nn.Parameter(torch.randn(N, k) / N ** 0.5)      # FM token mixtures
        self.lcb = nn.Parameter(torch.randn(N, N) / N ** 0.5)            # linear compression
        self.mlp_in = nn.Linear(N * k, cfg.ffn_mult * d)
        self.mlp_out = nn.Linear(cfg.ffn_mult * d, N * d)

    def forward(self, z: Tensor) -> Tensor:
        with region("interaction_block"):
            B, N, d = z.shape
            h = self.norm(z)
            mixtures = torch.einsum("bnd,nk->bkd", h, self.compress)        # (B, k, d)
            fm = torch.einsum("bnd,bkd->bnk", h, mixtures)                 # pairwise dots (B, N, k)
            fm = self.mlp_out(F.silu(self.mlp_in(fm.reshape(B, -1)))).view(B, N, d)
            linear = torch.einsum("bnd,nm->bmd", h, self.lcb)
            return z + fm + linear


class CrossBlock(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d = cfg.d_model
        self.cfg = cfg
        self.norm_q = nn.LayerNorm(d)
        self.norm_kv = nn.LayerNorm(d)
        self.q = nn.Linear(d, d, bias=False)
        self.kv = nn.Linear(d, 2 * d, bias=False)
        self.out = nn.Linear(d, d, bias=False)
        self.norm_summary = nn.LayerNorm(d)
        self.summary = nn.Linear(cfg.n_ns_tokens * d, d)

    def forward(self, x: Tensor, z: Tensor, layout: SequenceLayout) -> tuple[Tensor, Tensor]:
        with region("cross_block"):
            q, k, v = self.project(x, z)
            c = layout.cross_attention(q, k, v, activation=self.cfg.activation,
                                       out_scale=attention_out_scale(self.cfg))
            z, summary = self.mix(z, c)
            return x + layout.broadcast(summary), z

    def project(self, x: Tensor, z: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Queries from z (B*N, H, D); keys and values from x (rows, H, D)."""
        B, N, d = z.shape
        H, D = self.cfg.n_heads, self.cfg.head_dim
        q = self.q(self.norm_q(z)).view(B * N, H, D)
        k, v = self.kv(self.norm_kv(x)).view(-1, 2, H, D).unbind(1)
        return q, k, v

    def mix(self, z: Tensor, c: Tensor) -> tuple[Tensor, Tensor]:
        """Cross-attention output c (B*N, H, D) into z; returns new z and its (B, d) summary."""
        B, N, d = z.shape
        z = z + self.out(c.reshape(B, N, d))
        return z, self.summary(self.norm_summary(z).reshape(B, N * d))


class GEMLayer(nn.Module):
    """One layer: sequence block, interaction block, cross exchange (the unit FSDP, AC and
    compile wrap from outside)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.sequence = SequenceBlock(cfg)
        self.interaction = InteractionBlock(cfg)
        self.cross = CrossBlock(cfg)

    def forward(self, x: Tensor, z: Tensor, layout: SequenceLayout) -> tuple[Tensor, Tensor]:
        x = self.sequence(x, layout)
        z = self.interaction(z)
        return self.cross(x, z, layout)
