"""The model's shape (ModelConfig): widths, depth, vocabularies, the attention's activation and window.

It imports only gemref/config/'s helpers (never torch, nor gemref/errors.py: `require` raises
its UsageError): presets, TrainConfig's checks, the command line and the data layer's callers
read it without loading the model."""
from __future__ import annotations

from dataclasses import dataclass

from ..config.checks import at_least, one_of, require
from ..config.values import check_field_types

ATTENTION_ACTIVATIONS = (
    "softmax", "silu", "gelu", "gelu_tanh", "relu", "relu2", "leaky_relu", "identity",
)


@dataclass(frozen=True)
class ModelConfig:
    """Shape of a GEM-like ranking model (see gemref/model/gem.py for the architecture)."""

    d_model: int            # width of every token (history, non-sequence, cross)
    n_heads: int            # attention heads; head_dim = d_model // n_heads
    n_layers: int           # sequence + interaction + cross blocks, one of each per layer
    ffn_mult: int           # gated FFN hidden width = ffn_mult * d_model
    max_len: int            # longest user history kept (events)
    item_vocab: int         # item ids in the history and the candidate-ad table
    action_vocab: int       # action types (view, click, like, ...)
    time_buckets: int       # time-gap buckets between history events
    sparse_vocab: tuple[int, ...]  # one table per non-sequence categorical feature
    n_dense: int            # dense float features per sample
    fm_rank: int            # rank of the compressed factorisation-machine interaction
    activation: str = "silu"  # GDPA activation in the sequence tower ("softmax" = standard)
    # Sliding window of the history self-attention: event i attends events i-W+1..i (W keys,
    # itself included); None = full causal. Cross attention (non-sequence tokens over the
    # history) never windows: it is linear in L, and it keeps every event visible to the heads.
    window: int | None = None

    def __post_init__(self) -> None:
        check_field_types(self)
        at_least(self, 1, "d_model", "n_heads", "n_layers", "ffn_mult", "max_len", "item_vocab",
                  "action_vocab", "time_buckets", "n_dense", "fm_rank")
        require(self.d_model % self.n_heads == 0, f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")
        one_of("activation", self.activation, ATTENTION_ACTIVATIONS)
        require(self.window is None or 1 <= self.window <= self.max_len,
                f"ModelConfig.window must be None (full causal) or in [1, max_len={self.max_len}] "
                f"(events attended per event; a wider window is full causal), got {self.window}")
        require(bool(self.sparse_vocab) and min(self.sparse_vocab, default=0) >= 1,
                f"sparse_vocab needs >= 1 table of vocab >= 1, got {self.sparse_vocab}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def n_sparse(self) -> int:
        return len(self.sparse_vocab)

    @property
    def n_ns_tokens(self) -> int:
        """Non-sequence tokens per sample: one per sparse table + candidate ad + dense."""
        return self.n_sparse + 2
