"""TrainConfig: the optimiser's settings and one section per technique.

The sections (each in its technique's config.py: gemref/autoac/config.py, ...) hold the
switches of the ladder (docs/design.md); each checks its own fields when built, and TrainConfig
keeps only the rules that span sections. A switch keeps one flat name everywhere a user writes it: the command line
(`--ac-budget`), `--set ac_budget=...` and `override(train, ac_budget=...)`; `SWITCHES` maps
each name to its section and field, and `switch_values` gives the flat view a table prints.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field, fields, replace
from typing import Any

from ..attention.config import AttentionConfig
from ..autoac.config import ActivationCheckpointConfig
from ..balance.config import BalanceConfig
from ..checkpoint.config import CheckpointConfig
from ..compile.config import CompileConfig
from ..errors import UsageError
from ..parallel.config import EmbeddingConfig, ParallelConfig
from ..precision.config import PrecisionConfig
from ..config.checks import at_least, check_seed, positive
from ..config.section import Section, flag_of
from ..config.values import check_field_types, field_types


def setting(default: Any, help: str) -> Any:
    """A TrainConfig field outside the sections (its name is its flag)."""
    return field(default=default, metadata={"help": help})


def section(cls: type) -> Any:
    return field(default_factory=cls)


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation settings and the efficiency switches, one section per technique."""

    batch_size: int = setting(64, "samples per step: the global batch, split across ranks")
    steps: int = setting(100, "optimisation steps of the run, warm-up included")
    lr: float = setting(2e-3, "AdamW learning rate")
    weight_decay: float = setting(0.01, "AdamW weight decay")
    warmup_steps: int = setting(3, "first steps left out of the timing (not an LR warm-up)")
    eval_every: int = setting(0, "evaluate every N steps (0: once at the end)")
    eval_batches: int = setting(8, "batches per evaluation")
    seed: int = setting(0, "seed of the model init and the batch order")
    num_workers: int | None = setting(None, "DataLoader worker processes (none: the device's default, "
                                      "2 on CUDA and 0 elsewhere: gemref/data/config.py default_workers)")
    # --- the ladder's switches (docs/design.md), one section per technique ---
    attention: AttentionConfig = section(AttentionConfig)                        # rungs 1-2
    compilation: CompileConfig = section(CompileConfig)                          # rung 3
    activation_checkpoint: ActivationCheckpointConfig = section(ActivationCheckpointConfig)   # rung 4
    balancing: BalanceConfig = section(BalanceConfig)                            # rung 5
    parallelism: ParallelConfig = section(ParallelConfig)                        # rung 6
    mixed_precision: PrecisionConfig = section(PrecisionConfig)                  # rung 7
    embedding_tables: EmbeddingConfig = section(EmbeddingConfig)
    checkpoint: CheckpointConfig = section(CheckpointConfig)

    def __post_init__(self) -> None:
        check_field_types(self)
        at_least(self, 1, "batch_size", "steps", "eval_batches")
        at_least(self, 0, "warmup_steps", "eval_every")
        if self.num_workers is not None and self.num_workers < 0:
            raise UsageError(f"TrainConfig.num_workers must be >= 0 or None, got {self.num_workers}")
        check_seed(self)
        positive(self, "lr")
        if self.weight_decay < 0:
            raise UsageError(f"TrainConfig.weight_decay must be >= 0, got {self.weight_decay}")
        self._check_across_sections()

    def _check_across_sections(self) -> None:
        ac, tables, ckpt = self.activation_checkpoint, self.embedding_tables, self.checkpoint
        if ac.mode == "memory_budget" and not self.compilation.enabled:
            raise UsageError("ac='memory_budget' (PyTorch 2's activation memory budget) acts inside compiled "
                             "regions: it needs compile=True")
        if ckpt.every > self.steps:
            raise UsageError(f"checkpoint_every={ckpt.every} exceeds steps={self.steps}: "
                             "no checkpoint would be written")
        # The TorchRec engine shards its tables itself: the native table sharding and checkpoints
        # (DCP of TorchRec's sharded tables is not wired) do not combine with it.
        if tables.engine == "torchrec" and self.parallelism.sparse_sharding != "none":
            raise UsageError(f"embeddings='torchrec' and sparse_sharding={self.parallelism.sparse_sharding!r} both "
                             "shard the tables: TorchRec plans its own (--torchrec-sharding); drop --sparse-sharding")
        if tables.engine == "torchrec" and ckpt.folder:
            raise UsageError("embeddings='torchrec' does not save checkpoints yet (torch's get_state_dict cannot read "
                             "TorchRec's sharded tables, nor their fused Adagrad state): drop checkpoint_dir")
        if self.parallelism.table_optimizer != "adamw" and tables.engine == "torchrec":
            raise UsageError("table_optimizer is the native tables' optimizer: TorchRec's tables train with its own "
                             "fused Adagrad; drop table_optimizer or use embeddings='native'")
        mesh, interval = self.parallelism.shape, self.parallelism.table_sync_interval
        if mesh.replicate > 1 and ckpt.every % interval:      # a checkpoint keeps one copy of the replicas
            raise UsageError(f"checkpoint_every={ckpt.every} is not a multiple of table_sync_interval={interval}: "
                             "a checkpoint keeps one copy of the table replicas, which agree only right after a sync")
        if tables.torchrec_2d and (mesh.replicate < 2 or mesh.shard < 2):
            raise UsageError(f"torchrec_2d shards the tables over each S-rank group of a mesh RxS and "
                             f"replicates them over the R groups: it needs R >= 2 and S >= 2, "
                             f"got mesh={self.parallelism.mesh}")


@functools.cache
def sections() -> dict[str, type]:
    """{TrainConfig field: its Section class}, in field order."""
    types = field_types(TrainConfig)
    return {name: tp for name, tp in types.items() if isinstance(tp, type) and issubclass(tp, Section)}


@functools.cache
def settings() -> dict[str, Any]:
    """{TrainConfig field outside the sections: its dataclasses.Field}."""
    return {f.name: f for f in fields(TrainConfig) if f.name not in sections()}


@functools.cache
def switch_fields() -> dict[str, tuple[str, Any]]:
    """{switch name: (its section's TrainConfig field, the section's dataclasses.Field)}."""
    out = {}
    for name, cls in sections().items():
        for f in fields(cls):
            out[flag_of(f)] = (name, f)
    return out


def switch_names() -> tuple[str, ...]:
    """Every name `override(train, ...)` and the command line take: settings, then the sections' switches."""
    return tuple(settings()) + tuple(switch_fields())


def switch_values(train: TrainConfig) -> dict[str, Any]:
    """The flat view: {name: value} for every setting and switch (switch_names order)."""
    out = {name: getattr(train, name) for name in settings()}
    for flag, (name, f) in switch_fields().items():
        out[flag] = getattr(getattr(train, name), f.name)
    return out


def with_switches(train: TrainConfig, **changes: Any) -> TrainConfig:
    """`train` with `changes` by flat name (a setting, a switch) or by section (a whole Section);
    an unknown name, or a section given both whole and by one of its switches, is a UsageError."""
    valid = set(switch_names()) | set(sections())
    unknown = sorted(set(changes) - valid)
    if unknown:
        raise UsageError(f"unknown TrainConfig field(s) {unknown}; valid: {', '.join(sorted(switch_names()))}")
    by_section: dict[str, dict[str, Any]] = {}
    direct = {}
    for key, value in changes.items():
        if key in switch_fields():
            name, f = switch_fields()[key]
            by_section.setdefault(name, {})[f.name] = value
        else:
            direct[key] = value
    for name, section_changes in by_section.items():
        if name in direct:
            raise UsageError(f"the {name} section is given whole and by its switches "
                             f"({', '.join(switch_fields_of(name))}): give one of them")
        direct[name] = replace(getattr(train, name), **section_changes)
    return replace(train, **direct)


def switch_fields_of(section_name: str) -> list[str]:
    """The switch names of one section."""
    return [flag for flag, (name, _) in switch_fields().items() if name == section_name]
