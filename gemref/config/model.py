"""The model's shape (ModelConfig) and the synthetic data's (DataConfig)."""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import UsageError
from .checks import at_least, check_seed, one_of, positive
from .values import check_field_types

ATTENTION_ACTIVATIONS = (
    "softmax", "silu", "gelu", "gelu_tanh", "relu", "relu2", "leaky_relu", "identity",
)
LENGTH_PROFILES = ("skewed", "uniform", "fixed")


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
        if self.d_model % self.n_heads:
            raise UsageError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")
        one_of("activation", self.activation, ATTENTION_ACTIVATIONS)
        if self.window is not None and not 1 <= self.window <= self.max_len:
            raise UsageError(f"ModelConfig.window must be None (full causal) or in [1, max_len={self.max_len}] "
                             f"(events attended per event; a wider window is full causal), got {self.window}")
        if not self.sparse_vocab or min(self.sparse_vocab) < 1:
            raise UsageError(f"sparse_vocab needs >= 1 table of vocab >= 1, got {self.sparse_vocab}")

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


@dataclass(frozen=True)
class DataConfig:
    """Synthetic ads-event data (gemref/data/synthetic.py)."""

    n_train: int
    n_eval: int
    shard_rows: int = 4096
    length_profile: str = "skewed"   # skewed (log-normal, heavy tail to max_len), uniform, fixed
    median_len: int = 32             # median history length of the skewed profile (events)
    len_sigma: float = 1.1           # log-normal sigma of the skewed profile (tail weight)
    zipf_a: float = 1.2              # Zipf exponent of categorical ids
    pos_rate: float = 0.2            # target base rate of the click label
    seed: int = 0

    def __post_init__(self) -> None:
        check_field_types(self)
        one_of("length_profile", self.length_profile, LENGTH_PROFILES)
        at_least(self, 1, "n_train", "n_eval", "shard_rows", "median_len")
        check_seed(self)                             # numpy's generators take seeds >= 0
        # log-normal lengths need sigma > 0; the truncated-Pareto id sampler needs a > 0 (a = 0
        # would be uniform ids, a < 0 would favour the rarest ids: not a Zipf law)
        positive(self, "len_sigma", "zipf_a")
        if not 0.0 < self.pos_rate < 1.0:
            raise UsageError(f"DataConfig.pos_rate must be in (0, 1), got {self.pos_rate}")
