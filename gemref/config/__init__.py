"""Configuration: model presets (tiny, small, base, large), data and training switches.

Everything a run depends on is a small frozen dataclass, so a run record can store it with
`dataclasses.asdict` and a test can build a variant with `dataclasses.replace`. Every
dataclass checks its fields' types (gemref/config/values.py) and ranges when built: a bad value is a
UsageError (a ValueError) naming the field, never a silent clamp.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, fields, replace
from typing import Any

from ..errors import UsageError
from .dataset import DatasetFolder
from .values import COMPILE_REGIONS, check_field_types, parse_compile_regions

ATTENTION_ACTIVATIONS = (
    "softmax", "silu", "gelu", "gelu_tanh", "relu", "relu2", "leaky_relu", "identity",
)
LENGTH_PROFILES = ("skewed", "uniform", "fixed")
BALANCE_POLICIES = ("none", "round_robin", "lpt", "kk", "local", "shared")   # gemref/balance/ (none: equal counts)
SPARSE_SHARDINGS = ("none", "row", "table")               # gemref/parallel/sparse.py
EMBEDDING_ENGINES = ("native", "torchrec")                # gemref/interop/tables.py
# every table, EC and EBC alike (table_row_wise: bags only, sequence tables row_wise; gemref/interop/sharders.py)
TORCHREC_SHARDINGS = ("auto", "table_wise", "row_wise", "column_wise", "table_row_wise", "data_parallel")
BACKENDS = ("auto", "gloo", "nccl", "ncclx")              # gemref/parallel/comm.py
AC_MODES = ("none", "full", "auto", "pt2")
# Saved activations stored compressed (gemref/autoac/compress.py FORMATS; a test keeps them equal):
# with ac "none" every block's dense regions, with ac "auto" one more option AutoAC weighs per block.
AC_COMPRESSIONS = ("none", "fp8_tensor", "fp8_block", "mxfp8")
PRECISIONS = ("fp32", "bf16", "float8_rowwise", "float8_tensorwise", "mxfp8")   # gemref/precision/apply.py
PRECISION_KERNELS = ("auto", "native", "emulated")                            # float8/MXFP8 GEMM paths
AC_PLAN_PATTERN = r"sequence:[-SFC]+ interaction:[-SFC]+ cross:[-SFC]+"   # autoac.solver.Plan.summary()
MAX_SEED = 2 ** 63 - 1      # seeds reach torch.manual_seed and int64 records: larger ones overflow there


def _at_least(cfg: Any, low: int, *names: str) -> None:
    for name in names:
        if getattr(cfg, name) < low:
            raise UsageError(f"{type(cfg).__name__}.{name} must be >= {low}, got {getattr(cfg, name)}")


def _positive(cfg: Any, *names: str) -> None:
    for name in names:
        if not getattr(cfg, name) > 0:
            raise UsageError(f"{type(cfg).__name__}.{name} must be > 0, got {getattr(cfg, name)}")


def _seed(cfg: Any) -> None:
    if not 0 <= cfg.seed <= MAX_SEED:
        raise UsageError(f"{type(cfg).__name__}.seed must be in [0, 2**63 - 1], got {cfg.seed}")


def _one_of(cfg: Any, name: str, valid: tuple[str, ...]) -> None:
    if getattr(cfg, name) not in valid:
        raise UsageError(f"{name}={getattr(cfg, name)!r}; valid: {', '.join(valid)}")


@dataclass(frozen=True)
class MeshShape:
    """A 2D device mesh RxS (gemref/parallel/mesh.py builds it): R replica groups of S shards."""

    replicate: int   # R: groups holding a full copy of the (sharded) parameters
    shard: int       # S: ranks a parameter is split across

    @property
    def world(self) -> int:
        return self.replicate * self.shard

    def coordinates(self, rank: int) -> tuple[int, int]:
        """(replicate index, shard index) of a global rank."""
        return divmod(rank, self.shard)

    def __str__(self) -> str:
        return f"{self.replicate}x{self.shard}"


def parse_mesh(spec: str) -> MeshShape:
    """"RxS" -> MeshShape; anything else is a UsageError naming the field."""
    m = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", str(spec))
    if not m or int(m.group(1)) < 1 or int(m.group(2)) < 1:
        raise UsageError(f"mesh={spec!r} must look like RxS with R, S >= 1 (e.g. 1x4, 2x2, 4x1)")
    return MeshShape(int(m.group(1)), int(m.group(2)))


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
        _at_least(self, 1, "d_model", "n_heads", "n_layers", "ffn_mult", "max_len", "item_vocab",
                  "action_vocab", "time_buckets", "n_dense", "fm_rank")
        if self.d_model % self.n_heads:
            raise UsageError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")
        _one_of(self, "activation", ATTENTION_ACTIVATIONS)
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
        _one_of(self, "length_profile", LENGTH_PROFILES)
        _at_least(self, 1, "n_train", "n_eval", "shard_rows", "median_len")
        _seed(self)                             # numpy's generators take seeds >= 0
        # log-normal lengths need sigma > 0; the truncated-Pareto id sampler needs a > 0 (a = 0
        # would be uniform ids, a < 0 would favour the rarest ids: not a Zipf law)
        _positive(self, "len_sigma", "zipf_a")
        if not 0.0 < self.pos_rate < 1.0:
            raise UsageError(f"DataConfig.pos_rate must be in (0, 1), got {self.pos_rate}")


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation settings and the efficiency switches (one per ladder rung)."""

    batch_size: int = 64
    steps: int = 100
    lr: float = 2e-3
    weight_decay: float = 0.01
    warmup_steps: int = 3       # steps excluded from timing (not an LR warm-up)
    eval_every: int = 0         # 0: evaluate once at the end
    eval_batches: int = 8
    seed: int = 0
    num_workers: int = 0        # DataLoader workers
    # --- switches (the ladder of docs/design.md) ---
    jagged: bool = False        # rung 1: keep histories jagged instead of padding to max_len
    kernel: str = "reference"   # rung 2: gdpa kernel (reference = naive materialised)
    compile: bool = False       # rung 3: torch.compile, block by block (gemref/compile/apply.py)
    compile_regions: str = "all"  # with compile: the region kinds compiled (COMPILE_REGIONS, comma-separated); the rest eager
    ac: str = "none"            # rung 4: activation checkpointing: none, full, auto (AutoAC), pt2
    ac_budget: float = 1.0      # auto/pt2: activation memory budget, fraction of the no-AC bytes
    ac_compress: str = "none"   # saved activations as FP8/MX (AC_COMPRESSIONS): ac none = every block, auto = an option
    ac_plan: str = ""           # ac auto: a solved plan to apply as is (Plan.summary text); "": solve at setup
    balance: str = "none"       # rung 5: split each global batch across ranks by cost (BALANCE_POLICIES)
    # rung 6 (gemref/parallel/): batch_size is the GLOBAL batch, split across the ranks
    mesh: str = "1x1"           # RxS: R replica groups x S-way sharding; R*S = number of ranks
    reshard_after_forward: bool = True   # FSDP: free gathered params after forward (ZeRO-3)
    sparse_sharding: str = "none"        # embedding tables: none (in FSDP's root unit), row, table
    backend: str = "auto"                # collectives: auto (nccl on cuda, gloo on cpu), gloo, nccl, ncclx
    checkpoint_dir: str = ""             # distributed checkpoints here ("" = none)
    checkpoint_every: int = 0            # save every N steps (0 = never)
    resume: bool = False                 # continue from the newest checkpoint in checkpoint_dir
    checkpoint_overwrite: bool = False   # a fresh run may delete checkpoints it finds in checkpoint_dir
    precision: str = "auto"     # rung 7: auto (fp32 on CPU, bf16 on CUDA) or one of PRECISIONS
    precision_kernel: str = "auto"  # float8/MXFP8 GEMMs: auto | native | emulated
    precision_min_dim: int = 64     # Linear layers with min(in, out) below this stay high precision
    embeddings: str = "native"      # embedding engine: native nn.Embedding tables or TorchRec (EC/EBC, DMP)
    torchrec_sharding: str = "auto"  # embeddings torchrec with ranks: auto (TorchRec's planner) or one sharding type
    torchrec_2d: bool = False        # embeddings torchrec, mesh RxS: TorchRec's DMPCollection (CUDA only)

    def _check_embeddings(self) -> None:
        """The TorchRec engine shards its tables itself: the native table sharding and checkpoints
        (DCP of TorchRec's sharded tables is not wired) do not combine with it."""
        _one_of(self, "embeddings", EMBEDDING_ENGINES)
        _one_of(self, "torchrec_sharding", TORCHREC_SHARDINGS)
        if self.embeddings == "torchrec" and self.sparse_sharding != "none":
            raise UsageError(f"embeddings='torchrec' and sparse_sharding={self.sparse_sharding!r} both shard the "
                             "tables: TorchRec plans its own (--torchrec-sharding); drop --sparse-sharding")
        if self.embeddings == "native" and self.torchrec_sharding != "auto":
            raise UsageError(f"torchrec_sharding={self.torchrec_sharding!r} is read only with embeddings='torchrec'")
        if self.embeddings == "torchrec" and self.checkpoint_dir:
            raise UsageError("embeddings='torchrec' does not save checkpoints yet (torch's get_state_dict cannot read "
                             "TorchRec's sharded tables, nor their fused Adagrad state): drop checkpoint_dir")
        if self.torchrec_2d:
            mesh = parse_mesh(self.mesh)
            if self.embeddings != "torchrec":
                raise UsageError("torchrec_2d is TorchRec's 2D sparse parallel: it needs embeddings='torchrec'")
            if mesh.replicate < 2 or mesh.shard < 2:
                raise UsageError(f"torchrec_2d shards the tables over each S-rank group of a mesh RxS and "
                                 f"replicates them over the R groups: it needs R >= 2 and S >= 2, got mesh={self.mesh}")
            if self.torchrec_sharding == "data_parallel":
                raise UsageError("torchrec_2d with torchrec_sharding='data_parallel' would replicate the tables "
                                 "inside each sharding group too: pick a model-parallel type (or auto)")

    def __post_init__(self) -> None:
        check_field_types(self)
        _at_least(self, 1, "batch_size", "steps", "eval_batches")
        _at_least(self, 0, "warmup_steps", "eval_every", "num_workers", "checkpoint_every", "precision_min_dim")
        _seed(self)
        _positive(self, "lr")
        if self.weight_decay < 0:
            raise UsageError(f"TrainConfig.weight_decay must be >= 0, got {self.weight_decay}")
        if self.precision not in ("auto",) + PRECISIONS:
            raise UsageError(f"unknown precision {self.precision!r}; valid: auto, {', '.join(PRECISIONS)}")
        if self.precision_kernel not in PRECISION_KERNELS:
            raise UsageError(f"unknown precision_kernel {self.precision_kernel!r}; "
                             f"valid: {', '.join(PRECISION_KERNELS)}")
        for name, valid in (("balance", BALANCE_POLICIES), ("sparse_sharding", SPARSE_SHARDINGS),
                            ("backend", BACKENDS), ("ac", AC_MODES), ("ac_compress", AC_COMPRESSIONS)):
            _one_of(self, name, valid)
        parse_mesh(self.mesh)
        self._check_embeddings()
        if (self.checkpoint_every or self.resume) and not self.checkpoint_dir:
            raise UsageError("checkpoint_every and resume need checkpoint_dir")
        if self.checkpoint_dir and not (self.checkpoint_every or self.resume):
            raise UsageError(f"checkpoint_dir={self.checkpoint_dir!r} with checkpoint_every=0 and no resume: "
                             "nothing would be saved or loaded; set checkpoint_every N (or resume)")
        if self.checkpoint_every > self.steps:
            raise UsageError(f"checkpoint_every={self.checkpoint_every} exceeds steps={self.steps}: "
                             "no checkpoint would be written")
        if self.resume and self.checkpoint_overwrite:
            raise UsageError("resume and checkpoint_overwrite contradict each other: resuming keeps the checkpoints")
        if not 0.0 < self.ac_budget <= 1.0:
            raise UsageError(f"ac_budget must be in (0, 1] (a fraction of the no-AC activation bytes), "
                             f"got {self.ac_budget}")
        if self.ac_compress != "none" and self.ac not in ("none", "auto"):
            raise UsageError(f"ac_compress={self.ac_compress!r} needs ac 'none' (every block compressed) or 'auto' "
                             f"(compression one more option per block), not ac={self.ac!r}: "
                             + ("a fully checkpointed block keeps only its inputs, which the recompute needs exact"
                                if self.ac == "full" else "PyTorch 2's budget decides inside compiled graphs"))
        if self.kernel != "reference" and not self.jagged:
            raise UsageError(f"kernel={self.kernel!r} runs on the jagged layout: add jagged (--jagged); the padded "
                             "layout always runs materialised attention")
        if self.ac_budget != 1.0 and self.ac not in ("auto", "pt2"):
            raise UsageError(f"ac_budget={self.ac_budget} is read only by ac 'auto' and 'pt2', not ac={self.ac!r}")
        if self.ac_plan and self.ac != "auto":
            raise UsageError(f"ac_plan is AutoAC's solved plan: it needs ac 'auto', not ac={self.ac!r}")
        if self.ac_plan and not re.fullmatch(AC_PLAN_PATTERN, self.ac_plan):
            raise UsageError(f"ac_plan={self.ac_plan!r} must look like 'sequence:SF interaction:-- cross:F-' "
                             "(per block kind, one letter per layer: - none, S selective, F full, C compressed)")
        if "C" in self.ac_plan and self.ac_compress == "none":
            raise UsageError("ac_plan compresses blocks (C): set ac_compress to the format (e.g. mxfp8)")
        if self.compile_regions != "all":
            parse_compile_regions(self.compile_regions)
            if not self.compile:
                raise UsageError(f"compile_regions={self.compile_regions!r} is read only with compile=True")
        if self.ac == "pt2" and not self.compile:
            raise UsageError("ac='pt2' (PyTorch 2's activation memory budget) acts inside compiled "
                             "regions: it needs compile=True")


DATA_FIELDS = ("item_vocab", "action_vocab", "time_buckets", "sparse_vocab", "n_dense")   # a dataset's, in a ModelConfig


@dataclass(frozen=True)
class Preset:
    """A model, its data (the synthetic generator's config, or a dataset folder) and training settings."""

    name: str
    model: ModelConfig
    data: DataConfig | DatasetFolder
    train: TrainConfig = field(default_factory=TrainConfig)

    def __post_init__(self) -> None:
        where = f"the {self.name} preset's" if isinstance(self.data, DataConfig) else f"dataset {self.data.folder}:"
        if isinstance(self.data, DataConfig) and self.data.median_len > self.model.max_len:
            raise UsageError(f"DataConfig.median_len={self.data.median_len} exceeds the {self.name} preset's "
                             f"max_len={self.model.max_len} (histories are at most max_len events)")
        if isinstance(self.data, DatasetFolder):
            for name in DATA_FIELDS:
                if getattr(self.model, name) != getattr(self.data, name):
                    raise UsageError(f"{where} ModelConfig.{name}={getattr(self.model, name)} but the dataset's "
                                     f"{name} is {getattr(self.data, name)} (gemref.config.preset_on_dataset sets it)")
            if self.model.max_len < self.data.max_len:
                raise UsageError(f"{where} ModelConfig.max_len={self.model.max_len} is shorter than the dataset's "
                                 f"longest history, {self.data.max_len} events")
        if self.train.batch_size > self.data.n_train:
            raise UsageError(f"TrainConfig.batch_size={self.train.batch_size} exceeds {where} "
                             f"n_train={self.data.n_train} (each step draws batch_size distinct training samples)")


def preset_on_dataset(preset: Preset, data: DatasetFolder, train: TrainConfig | None = None) -> Preset:
    """The preset's architecture (widths, heads, layers, FFN, attention) and training settings
    (or `train`, when given) on a dataset: vocab sizes, feature counts and max_len from the data. A preset that cannot hold
    the data is a UsageError naming the field: histories longer than the preset's max_len (the
    longest history its architecture is sized for), an attention window beyond the data's
    longest history, a batch larger than the train split."""
    arch = preset.model
    if data.max_len > arch.max_len:
        raise UsageError(f"dataset {data.folder}: its longest history is {data.max_len} events (manifest "
                         f"dataset.max_len), more than the {preset.name} preset's ModelConfig.max_len={arch.max_len}: "
                         f"choose a preset whose max_len is >= {data.max_len} "
                         f"({', '.join(n for n, p in PRESETS.items() if p.model.max_len >= data.max_len) or 'none'}) "
                         "or convert the data with shorter histories (gemref data movielens --max-history N)")
    if arch.window is not None and arch.window > data.max_len:
        raise UsageError(f"dataset {data.folder}: ModelConfig.window={arch.window} of the {preset.name} preset is "
                         f"longer than the dataset's longest history ({data.max_len} events): it would be full "
                         "attention; choose a smaller --attention-window")
    model = replace(arch, max_len=data.max_len, **{name: getattr(data, name) for name in DATA_FIELDS})
    return replace(preset, model=model, data=data, train=train or preset.train)


PRESETS: dict[str, Preset] = {
    # Seconds on a laptop CPU: tests and CI.
    "tiny": Preset(
        "tiny",
        ModelConfig(d_model=32, n_heads=2, n_layers=2, ffn_mult=2, max_len=64, item_vocab=2000,
                    action_vocab=4, time_buckets=16, sparse_vocab=(50, 200, 1000, 100),
                    n_dense=8, fm_rank=4),
        DataConfig(n_train=24_576, n_eval=4096, shard_rows=4096, median_len=12, len_sigma=0.9),
        TrainConfig(batch_size=64, steps=300, lr=3e-3),
    ),
    # The CPU demo: long histories with a skewed length profile, a few seconds per step.
    "small": Preset(
        "small",
        ModelConfig(d_model=64, n_heads=4, n_layers=3, ffn_mult=2, max_len=512, item_vocab=20_000,
                    action_vocab=6, time_buckets=32,
                    sparse_vocab=(100, 1000, 10_000, 500, 2000, 50, 5000, 300),
                    n_dense=16, fm_rank=8),
        DataConfig(n_train=16_384, n_eval=2048, shard_rows=4096, median_len=40, len_sigma=1.1),
        TrainConfig(batch_size=64, steps=100, lr=2e-3),
    ),
    # Fills one GPU (H100/H200) in bf16.
    "base": Preset(
        "base",
        ModelConfig(d_model=512, n_heads=4, n_layers=6, ffn_mult=4, max_len=2048,
                    item_vocab=1_000_000, action_vocab=8, time_buckets=64,
                    sparse_vocab=(1000, 10_000, 100_000, 1_000_000, 5000, 50_000, 200, 20_000,
                                  100_000, 3000, 500_000, 1000, 40_000, 80, 7000, 250_000),
                    n_dense=64, fm_rank=16),
        DataConfig(n_train=262_144, n_eval=16_384, shard_rows=16_384, median_len=160, len_sigma=1.1),
        TrainConfig(batch_size=256, steps=200, lr=1e-3),
    ),
    # Multi-GPU scale (FSDP); the shape used by the scale projection.
    "large": Preset(
        "large",
        ModelConfig(d_model=1024, n_heads=8, n_layers=12, ffn_mult=4, max_len=4096,
                    item_vocab=10_000_000, action_vocab=8, time_buckets=64,
                    sparse_vocab=tuple([1_000_000] * 8 + [100_000] * 16 + [10_000] * 8),
                    n_dense=128, fm_rank=32),
        DataConfig(n_train=1_048_576, n_eval=32_768, shard_rows=32_768, median_len=300, len_sigma=1.2),
        TrainConfig(batch_size=512, steps=500, lr=5e-4),
    ),
}


def get_preset(name: str) -> Preset:
    """Look up a preset by name; unknown names raise UsageError listing the valid ones."""
    try:
        return PRESETS[name]
    except KeyError:
        raise UsageError(f"unknown preset {name!r}; valid: {', '.join(PRESETS)}") from None


def override(cfg: Any, **changes: Any) -> Any:
    """`dataclasses.replace` that rejects unknown field names with a UsageError listing valid ones."""
    valid = {f.name for f in fields(cfg)}
    unknown = sorted(set(changes) - valid)
    if unknown:
        raise UsageError(f"unknown {type(cfg).__name__} field(s) {unknown}; valid: {', '.join(sorted(valid))}")
    return replace(cfg, **changes)
